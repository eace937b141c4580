#!/usr/bin/env python3
"""Runs cleave-run on seeded one-byte mutations of a plan's header.

  plan_mutation_sweep.py CLEAVE_RUN PLAN.cplan [--count N] [--seed S]
                         [--jobs J] [--timeout SECONDS] [--keep DIR]

Each case replaces one byte of the plan's protobuf header (the bytes after
the preamble, where verifyPlan, verifyRunnable and the kernel checks must
catch what the format cannot) with a random value, then trains the
mutated plan for one step (--steps 1 --threads 1 --quiet). Every case must
end in one of two ways: exit 0 (the change was harmless), or exit 1 or 2
with exactly one line on stderr, `cleave-run: error: ...`. A signal, a
time-out (a hang), or any other output is a failure, kept under --keep
for reproduction. Prints the tallies; exits 1 if any case failed.
"""
import argparse
import concurrent.futures
import os
import random
import struct
import subprocess
import sys
import tempfile

MAGIC = b"CLEAVEPLAN\0"
PREAMBLE = len(MAGIC) + 4 + 8


def header_range(data):
    if not data.startswith(MAGIC) or len(data) < PREAMBLE:
        sys.exit("plan_mutation_sweep: not a cleave plan")
    (size,) = struct.unpack_from("<Q", data, len(MAGIC) + 4)
    return PREAMBLE, PREAMBLE + size


def run_case(args, data, lo, hi, index, workdir):
    rng = random.Random(f"{args.seed}:{index}")
    pos = rng.randrange(lo, hi)
    value = rng.randrange(256)
    while value == data[pos]:
        value = rng.randrange(256)
    mutated = bytearray(data)
    mutated[pos] = value
    path = os.path.join(workdir, f"case{index}.cplan")
    with open(path, "wb") as f:
        f.write(mutated)
    try:
        p = subprocess.run(
            [args.cleave_run, path, "--steps", "1", "--threads", "1", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            timeout=args.timeout)
        rc, err = p.returncode, p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        rc, err = None, ""
    if rc == 0:
        verdict = "ran"
    elif rc in (1, 2):
        lines = err.splitlines()
        ok = len(lines) == 1 and lines[0].startswith("cleave-run: error: ")
        verdict = "refused" if ok else "bad-error"
    elif rc is None:
        verdict = "hang"
    else:
        verdict = "crash"
    failed = verdict not in ("ran", "refused")
    if failed and args.keep:
        os.makedirs(args.keep, exist_ok=True)
        os.replace(path, os.path.join(args.keep, f"{verdict}-{index}.cplan"))
    else:
        os.remove(path)
    return index, pos, value, verdict, rc, err.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cleave_run")
    ap.add_argument("plan")
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--keep", default="")
    args = ap.parse_args()
    data = open(args.plan, "rb").read()
    lo, hi = header_range(data)
    tally = {}
    failures = []
    with tempfile.TemporaryDirectory() as work, \
            concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_case, args, data, lo, hi, i, work)
                   for i in range(args.count)]
        for f in concurrent.futures.as_completed(futures):
            index, pos, value, verdict, rc, err = f.result()
            tally[verdict] = tally.get(verdict, 0) + 1
            if verdict not in ("ran", "refused"):
                failures.append((index, pos, value, verdict, rc, err))
    print(f"{args.count} mutations of {hi - lo} header bytes (seed "
          f"{args.seed}): " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    for index, pos, value, verdict, rc, err in sorted(failures)[:20]:
        print(f"  case {index}: byte {pos} = {value}: {verdict} (exit {rc}) "
              f"{err[:300]!r}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
