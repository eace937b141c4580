#!/usr/bin/env python3
"""Measured against simulated pipeline step times, and the speedups of the
2BP / zero-bubble schedules over 1F1B.

Run (after building; any Python 3, it only drives the tools):
    python3 tests/bench/pipeline_speedup.py [--build build] [--microbatch-size 16]
        [--microbatches 4] [--steps 40] [--rounds 3]

The bundled GPT (examples/gpt/gpt-tiny.onnx), 2 stages, M microbatches,
SGD, one kernel thread per stage (cleave-run --threads 1: one core per
stage on a 2-core machine):
  1. cleavec --stages 2 --schedule 1f1b -o 1f1b-analytic.cplan, then
     cleave-run --steps 10 --profile prof.json on it: measured per-op times
     of the last step (per op and phase, so one profile serves every
     schedule);
  2. for each schedule (1f1b, 1f1b-2bp, zb-h1): cleavec --stages 2
     --schedule S --cost-model profile:prof.json -o S.cplan; its printed
     "step time" is the simulated step;
  3. --rounds rounds, each running every schedule's plan once (interleaved,
     so drift of the shared machine's load hits all alike):
     cleave-run S.cplan --steps N --threads 1; the cumulative samples/s of
     its per-step lines give the elapsed time after each step, and the
     measured step is the mean of steps 6..N (start-up and warm-up left
     out). The figure per schedule is the median over rounds.
  (cleave-run's profile times kernels only; the link model of
  --device-profile cpu prices the messages.)
Prints per schedule: measured ms (median, and min..max over rounds),
simulated ms, measured/simulated, measured and simulated speedup over
1f1b, and measured speedup / simulated speedup. The bar: that ratio >= 0.9
and measured within 10% of simulated.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEDULES = ["1f1b", "1f1b-2bp", "zb-h1"]
WARMUP = 5


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def compile_plan(tools, model, args, schedule, plan, cost_model=None):
    cmd = [os.path.join(tools, "cleavec"), model, f"--microbatch-size={args.microbatch_size}",
           f"--microbatches={args.microbatches}", "--stages=2", f"--schedule={schedule}",
           "--optimizer=sgd", f"--lr={args.lr}", "-o", plan]
    if cost_model:
        cmd.append(f"--cost-model={cost_model}")
    out = run(cmd)
    sim = float(re.search(r"^step time (\S+) s", out, re.M).group(1)) * 1000
    split = re.findall(r"^(\d+)\s+(\S+\.\.\S+|\S+)\s+[\d.]+ \S*B\s+([\d.]+ \S+)\s+([\d.]+ \S+)"
                       r"\s+([\d.]+ \S+)", out, re.M)
    return sim, split


PHASES = {"F": "fwd", "B": "B", "W": "W", "STEP": "opt"}


def measure(tools, plan, args):
    out = run([os.path.join(tools, "cleave-run"), plan, "--threads=1", f"--steps={args.steps}"])
    samples = args.microbatch_size * args.microbatches
    elapsed = {}
    for m in re.finditer(r"^step\s+(\d+)/\d+\s+loss \S+\s+(\d+) samples/s", out, re.M):
        k, rate = int(m.group(1)), float(m.group(2))
        elapsed[k] = samples * k / rate
    return (elapsed[args.steps] - elapsed[WARMUP]) / (args.steps - WARMUP) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "gpt", "gpt-tiny.onnx"))
    ap.add_argument("--microbatch-size", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--keep", help="folder to keep the plans and the profile in")
    args = ap.parse_args()
    tools = os.path.join(args.build, "tools")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or tmp
        os.makedirs(out_dir, exist_ok=True)
        base = os.path.join(out_dir, "1f1b-analytic.cplan")
        analytic, _ = compile_plan(tools, args.model, args, "1f1b", base)
        prof = os.path.join(out_dir, "prof.json")
        run([os.path.join(tools, "cleave-run"), base, "--threads=1", "--steps=10", "--quiet",
             f"--profile={prof}"])
        plans, sim, stages = {}, {}, {}
        for s in SCHEDULES:
            plans[s] = os.path.join(out_dir, s + ".cplan")
            sim[s], split = compile_plan(tools, args.model, args, s, plans[s], "profile:" + prof)
            if s == "1f1b":
                stages["profile"] = "; ".join(f"stage {i}: {layers}, F/B/W {f} / {b} / {w}"
                                              for i, layers, f, b, w in split)
        meas = {s: [] for s in SCHEDULES}
        for _ in range(args.rounds):
            for s in SCHEDULES:
                meas[s].append(measure(tools, plans[s], args))
    print(f"gpt-tiny, 2 stages, {args.microbatches} microbatches of {args.microbatch_size}, "
          f"1 thread per stage, mean of steps {WARMUP + 1}..{args.steps}, median of "
          f"{args.rounds} rounds; simulated with the measured profile of 1f1b's last step "
          f"(analytic model's 1f1b: {analytic:.2f} ms)")
    m0 = statistics.median(meas["1f1b"])
    for what, sims in (("profile", sim),):
        print(f"\nsimulated with the {what} ({stages[what]})")
        print(f"{'schedule':9} {'measured ms':>11} {'(min..max)':>15} {'simulated ms':>12} "
              f"{'meas/sim':>8} {'meas speedup':>12} {'sim speedup':>11} {'ratio':>6}")
        for s in SCHEDULES:
            m = statistics.median(meas[s])
            mspeed, sspeed = m0 / m, sims["1f1b"] / sims[s]
            print(f"{s:9} {m:11.2f} {f'({min(meas[s]):.2f}..{max(meas[s]):.2f})':>15} "
                  f"{sims[s]:12.2f} {m / sims[s]:8.2f} {mspeed:12.3f} {sspeed:11.3f} "
                  f"{mspeed / sspeed:6.3f}")


if __name__ == "__main__":
    main()
