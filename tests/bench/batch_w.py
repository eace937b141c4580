#!/usr/bin/env python3
"""W batching (cleave-run --batch-w) against plain W actions, on the CPU.

Run (after building; any Python 3, it only drives the tools):
    python3 tests/bench/batch_w.py [--build build] [--microbatch-size 2]
        [--microbatches 8] [--steps 30] [--rounds 5] [--precision f32]

The bundled GPT (examples/gpt/gpt-tiny.onnx), 2 stages, M microbatches of
B samples, SGD, one kernel thread per stage. For each schedule with runs
of adjacent W actions (gpipe-2bp: all M of them at the end of each stage;
zb-h1: the last few), --rounds rounds each run the plan once without and
once with --batch-w (interleaved, so drift of the shared machine's load
hits both alike). Measured: the median step (the step lines' ms of steps
2..N). Printed per schedule: the median over rounds of both, the ratio
plain / batched (above 1: batching is faster), and the final losses (they
agree up to the order of the sums). Small microbatches are where batching
pays: a weight gradient's GEMM has B x T rows of depth, and batching k
microbatches gives it k times as many.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
    return r.stdout


def median_step(out):
    ms = [float(m.group(1)) for m in re.finditer(r"^step +\d+/\d+ .* ([0-9.]+) ms", out, re.M)]
    return statistics.median(ms[1:])


def last_loss(out):
    return re.search(r"^done: .* -> ([0-9.]+)", out, re.M).group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--microbatch-size", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precision", default="f32")
    args = ap.parse_args()
    tools = os.path.join(args.build, "tools")
    model = os.path.join(ROOT, "examples", "gpt", "gpt-tiny.onnx")
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in ["gpipe-2bp", "zb-h1"]:
            plan = os.path.join(tmp, schedule + ".cplan")
            run([os.path.join(tools, "cleavec"), model, "--microbatch-size",
                 str(args.microbatch_size), "--stages", "2", "--microbatches",
                 str(args.microbatches), "--schedule", schedule, "--precision",
                 args.precision, "-o", plan])
            base = [os.path.join(tools, "cleave-run"), plan, "--steps",
                    str(args.steps), "--threads", "1"]
            plain, batched, losses = [], [], []
            for _ in range(args.rounds):
                a = run(base)
                b = run(base + ["--batch-w"])
                plain.append(median_step(a))
                batched.append(median_step(b))
                losses = [last_loss(a), last_loss(b)]
            p, b = statistics.median(plain), statistics.median(batched)
            print("%-10s B=%d M=%d %s: plain %.3f ms, --batch-w %.3f ms per step "
                  "(median of %d rounds; ranges %.3f..%.3f, %.3f..%.3f); "
                  "plain / batched %.3f; final loss %s / %s" % (
                      schedule, args.microbatch_size, args.microbatches,
                      args.precision, p, b, args.rounds, min(plain), max(plain),
                      min(batched), max(batched), p / b, losses[0], losses[1]))


if __name__ == "__main__":
    main()
