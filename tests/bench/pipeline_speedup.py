#!/usr/bin/env python3
"""Measured against simulated pipeline step times, and the speedups of the
2BP / zero-bubble schedules over 1F1B.

Run (after building; any Python 3, it only drives the tools):
    python3 tests/bench/pipeline_speedup.py [--build build] [--microbatch-size 16]
        [--microbatches 4] [--steps 40] [--rounds 3] [--layer-depth 2]

The bundled GPT (examples/gpt/gpt-tiny.onnx), 2 stages, M microbatches,
SGD, one kernel thread per stage (cleave-run --threads 1: one core per
stage on a 2-core machine):
  1. the split: cleavec --schedule 1f1b (analytic cost model), a 10-step
     cleave-run --profile of that plan, and cleavec --cost-model
     profile:... chooses the split every plan below keeps (--split-at);
     the schedules below are built for that profile's costs too, as a
     user who profiles and compiles again gets them;
  2. --rounds rounds, each running every schedule once (interleaved, so
     drift of the shared machine's load hits all alike). Per schedule S:
     cleavec --schedule S --split-at ... --cost-model profile:(1.)
     --emit=schedule-csv -o S.csv (the
     order of actions S makes depends on the costs it is built for, so the
     CSV pins it); cleavec --schedule csv:S.csv --split-at ... -o S.cplan;
     cleave-run S.cplan --steps N --threads 1 --profile S.json: "measured"
     is the run's median step (the step lines' ms of steps 2..N; bursts of
     other work on the shared machine push a mean up) and the profile holds
     each op's mean over the same steps; cleavec
     --schedule csv:S.csv --split-at ... --cost-model profile:S.json: its
     "one isolated step" is "simulated" (cleave-run finishes a step on every
     stage before the next, so it runs isolated steps; the "step time" of
     steps that overlap can be shorter). So the simulator is fed the profile of the
     same plan, from the same run, and simulates the order that ran.
  Per round: measured/simulated per schedule, and measured speedup over
  1f1b divided by simulated speedup. Printed: the median over rounds (and
  min..max), and how much of the machine the runs had (each profile's
  "cores": the worst rank's wait for a core a step, the cores other
  processes kept busy).
With --overlap: steps overlap (cleave-run --overlap-steps --on-nan=off) and
"simulated" is the schedule's steady state, cleavec's "step time"; zb-h2
joins the one-stage-per-rank list.
With --chunks 2: 2 ranks x 2 stages each (cleavec --stages 2 --chunks 2),
the schedules with several stages per rank, speedups over
interleaved-1f1b; the 4-stage split comes from an interleaved-1f1b
profile the same way.
With --neighbour N: N CPU-bound processes (a busy loop each) run for the
whole benchmark, as data loading or another job would on a training
machine; the rounds measure the schedules beside them.
The bar: measured speedup / simulated speedup >= 0.9 for zb-h1 and
1f1b-2bp, and measured within 10% of simulated for every schedule.
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
CHUNKED = ["interleaved-1f1b", "interleaved-1f1b-2bp", "zb-v", "v-half", "v-min", "dualpipe-v"]


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


class Bench:
    def __init__(self, args, out_dir):
        self.args, self.dir = args, out_dir
        self.tools = os.path.join(args.build, "tools")
        # per run: worst rank's core wait ms, other cores busy, other
        # processes' threads running or waiting for a core (the profile's
        # "cores")
        self.waits, self.others, self.runnable = [], [], []
        self.schedules = CHUNKED if args.chunks > 1 else SCHEDULES
        if args.overlap and args.chunks == 1:
            self.schedules = SCHEDULES + ["zb-h2"]

    def compile(self, schedule, plan, cost_model=None, split=None, emit=None):
        a = self.args
        cmd = [os.path.join(self.tools, "cleavec"), a.model,
               f"--microbatch-size={a.microbatch_size}", f"--microbatches={a.microbatches}",
               "--stages=2", f"--schedule={schedule}", "--optimizer=sgd", f"--lr={a.lr}",
               f"--layer-depth={a.layer_depth}", "-o", plan]
        if cost_model:
            cmd.append(f"--cost-model={cost_model}")
        if split:
            cmd.append(f"--split-at={split}")
        if a.chunks > 1 and not schedule.startswith("csv:"):
            cmd.append(f"--chunks={a.chunks}")
        if emit:
            cmd.append(f"--emit={emit}")
            return run(cmd)
        out = run(cmd)
        # cleave-run ends each step on every stage before the next: the
        # isolated step is the prediction of what it measures.
        times = re.search(r"^step time (\S+) s \(one isolated step: ([\d.e+-]+)\)",
                          out, re.M)
        sim = float(times.group(2)) * 1000
        self.steady = float(times.group(1)) * 1000
        stages = re.findall(r"^(\d+)\s+(\S+)\.\.(\S+)\s+[\d.]+ \S*B\s+([\d.]+ \S+)\s+"
                            r"([\d.]+ \S+)\s+([\d.]+ \S+)", out, re.M)
        return sim, stages

    def train(self, plan, steps, profile):
        cmd = [os.path.join(self.tools, "cleave-run"), plan, "--threads=1",
               f"--steps={steps}", f"--profile={profile}"]
        if self.args.overlap:
            cmd += ["--overlap-steps", "--on-nan=off"]
        cmd += self.args.run_flag
        out = run(cmd)
        ms = [float(m.group(2)) for m in re.finditer(
            r"^step\s+(\d+)/\d+\s+loss \S+\s+\d+ samples/s\s+(\S+) ms", out, re.M)
              if int(m.group(1)) > 1]
        # How much of the machine the run had (the profile's "cores").
        cores = json.load(open(profile)).get("cores", {})
        self.waits.append(max((w["seconds"] for w in cores.get("core_wait", [])),
                              default=0) * 1000)
        if "other_cores" in cores:
            self.others.append(cores["other_cores"])
        if "other_runnable" in cores:
            self.runnable.append(cores["other_runnable"])
        return statistics.median(ms)

    def split(self):
        base = os.path.join(self.dir, "split-analytic.cplan")
        first = self.schedules[0]
        self.compile(first, base)
        prof = self.split_profile = os.path.join(self.dir, "split-profile.json")
        self.train(base, 10, prof)
        _, stages = self.compile(first, base, "profile:" + prof)
        return ",".join(st[1] for st in stages[1:]), stages

    def round(self, k, split):
        meas, sim = {}, {}
        for s in self.schedules:
            # The schedule's order of actions depends on the costs it was
            # built for; the CSV pins the one that runs for the simulation.
            csv = os.path.join(self.dir, f"{s}.csv")
            self.compile(s, csv, "profile:" + self.split_profile, split, emit="schedule-csv")
            plan = os.path.join(self.dir, f"{s}.cplan")
            prof = os.path.join(self.dir, f"{s}.{k}.json")
            self.compile("csv:" + csv, plan, split=split)
            meas[s] = self.train(plan, self.args.steps, prof)
            sim[s], _ = self.compile("csv:" + csv, os.path.join(self.dir, f"{s}.sim.cplan"),
                                     "profile:" + prof, split)
            if self.args.overlap:  # against the steady state
                sim[s] = self.steady
        return meas, sim


def spread(xs, fmt="{:.2f}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}..{fmt.format(max(xs))})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "gpt", "gpt-tiny.onnx"))
    ap.add_argument("--microbatch-size", type=int, default=16)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--layer-depth", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--overlap", action="store_true",
                    help="cleave-run --overlap-steps --on-nan=off, against the "
                         "simulated steady state (step time) instead of one "
                         "isolated step; adds zb-h2")
    ap.add_argument("--chunks", type=int, default=1,
                    help="2: 2 ranks x 2 stages, the schedules with several stages per rank")
    ap.add_argument("--keep", help="folder to keep the plans and the profiles in")
    ap.add_argument("--neighbour", type=int, default=0,
                    help="CPU-bound busy processes running alongside (default 0)")
    ap.add_argument("--run-flag", action="append", default=[], metavar="FLAG",
                    help="one more cleave-run flag for every run (repeatable), "
                         "e.g. --run-flag=--pin-threads=off")
    args = ap.parse_args()
    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                  for _ in range(args.neighbour)]
    try:
        measure(args)
    finally:
        for p in neighbours:
            p.kill()


def measure(args):
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or tmp
        os.makedirs(out_dir, exist_ok=True)
        bench = Bench(args, out_dir)
        split, stages = bench.split()
        rounds = [bench.round(k, split) for k in range(args.rounds)]
    layout = "2 stages" if args.chunks == 1 else f"2 ranks x {args.chunks} stages"
    print(f"gpt-tiny, {layout} split at {split} (layer depth {args.layer_depth}; "
          + "; ".join(f"stage {i}: {a}..{b}, profiled F/B/W {f} / {bb} / {w}"
                      for i, a, b, f, bb, w in stages)
          + f"), {args.microbatches} microbatches of {args.microbatch_size}, 1 thread per "
          f"rank, {args.steps} steps per run, median (min..max) of {args.rounds} rounds; "
          "each run's simulation is fed that run's own --profile"
          + (f"; {args.neighbour} busy neighbour process(es)" if args.neighbour else "")
          + (f"; cleave-run {' '.join(args.run_flag)}" if args.run_flag else "")
          + f"; CLEAVE_GEMM={os.environ.get('CLEAVE_GEMM', 'auto')}")
    if bench.waits:
        print("cores: a rank's wait for a core, ms a step (worst rank, per run): "
              + spread(bench.waits, "{:.3f}")
              + ("; other processes busy, cores: " + spread(bench.others)
                 if bench.others else "")
              + ("; wanted (running or waiting for a core): " + spread(bench.runnable)
                 if bench.runnable else ""))
    base = bench.schedules[0]
    w = max(len(s) for s in bench.schedules)
    print(f"\n{'schedule':{w}} {'measured ms':>21} {'simulated ms':>21} {'meas/sim':>18} "
          f"{'meas speedup':>18} {'sim speedup':>18} {'ratio':>18}")
    for s in bench.schedules:
        m = [r[0][s] for r in rounds]
        sm = [r[1][s] for r in rounds]
        ms = [r[0][base] / r[0][s] for r in rounds]
        ss = [r[1][base] / r[1][s] for r in rounds]
        print(f"{s:{w}} {spread(m):>21} {spread(sm):>21} "
              f"{spread([a / b for a, b in zip(m, sm)]):>18} {spread(ms, '{:.3f}'):>18} "
              f"{spread(ss, '{:.3f}'):>18} "
              f"{spread([a / b for a, b in zip(ms, ss)], '{:.3f}'):>18}")


if __name__ == "__main__":
    main()
