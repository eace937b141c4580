"""Compares the step losses of two cleave-run outputs (files of its "step
N/M  loss X" lines): prints the largest relative difference and exits 1
when it is above TOL or when the runs have different steps.

usage: compare_losses.py REFERENCE.txt OTHER.txt TOL
"""
import re
import sys


def losses(path):
    with open(path) as f:
        return [float(m.group(1)) for m in
                (re.search(r"^step +\d+/\d+ +loss ([-0-9.eE+]+)", line) for line in f)
                if m]


ref, got, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
if not ref or len(ref) != len(got):
    sys.exit("compare_losses: %d against %d step losses" % (len(ref), len(got)))
worst = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ref, got))
print("%d steps, largest relative loss difference %.2e" % (len(ref), worst))
sys.exit(0 if worst <= tol else 1)
