#!/usr/bin/env python3
"""What cleavec predicts for a step without a profile, against what
cleave-run measures, for the fixed `cpu` device profile and the measured
`host` one (cleavec's default), with and without its per-op timing.

Run (after building; any Python 3, it only drives the tools):
    python3 tests/bench/predicted_vs_measured.py [--build build]
        [--rounds 3] [--steps 8] [--case NAME:MODEL:FLAGS[:DATA] ...]
        [--profiles cpu,rates,host]

Per case and round, interleaved: cleavec MODEL FLAGS -o P.cplan with
CLEAVE_DEVICE_PROFILE=cpu, =host with CLEAVE_HOST_OP_TIMES=0 (`rates`:
the measured GEMM rate and bandwidth only) and =host (each distinct op
also timed with its kernel; so `host` is measured anew each round, as a
user's compile measures it), then cleave-run P.cplan --steps N [--data
DATA]; the run's stage table gives the measured mean step and the plan's
prediction. Printed per case and profile: predicted ms, measured ms
(median of the rounds, min..max) and measured / predicted.

The default cases are the corpus models the repository carries (no
PyTorch needed): GPT-2 and LLaMA (dynamo exports), 2 stages, 4
microbatches. Larger models: export them first, e.g.
    python examples/gpt/export.py -o /tmp/ng512.onnx --layers 4 --heads 4 \\
        --embd 256 --block-size 512 --batch 4
and pass --case ng512:/tmp/ng512.onnx:"--microbatch-size 4".
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "models", "corpus")
DEFAULT_CASES = [
    "gpt2-2st:" + os.path.join(CORPUS, "gpt2-dynamo", "model.onnx") +
    ":--stages 2 --microbatches 4",
    "llama-2st:" + os.path.join(CORPUS, "llama-dynamo", "model.onnx") +
    ":--stages 2 --microbatches 4",
]
ROW = re.compile(r"^\d+\s+[\d.]+\s+[\d.]+\s+\d+\s*/\s*\d+\s+([\d.]+)\s*/\s*([\d.]+)")


PROFILES = ("cpu", "rates", "host")


def step(build, profile, model, flags, data, steps, work):
    plan = os.path.join(work, profile + ".cplan")
    env = dict(os.environ, CLEAVE_DEVICE_PROFILE="host" if profile == "rates"
               else profile)
    if profile == "rates":
        env["CLEAVE_HOST_OP_TIMES"] = "0"
    subprocess.run([os.path.join(build, "tools", "cleavec"), model, *flags,
                    "-o", plan], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = [os.path.join(build, "tools", "cleave-run"), plan,
           "--steps", str(steps), "--quiet"]
    if data:
        run.append("--data=" + data)
    out = subprocess.run(run, env=env, check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            return float(m.group(1)), float(m.group(2))
    sys.exit("no stage table in cleave-run's output:\n" + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--case", action="append",
                    help="NAME:MODEL:FLAGS[:DATA] (cleavec flags, "
                    "space-separated; DATA: cleave-run's --data)")
    ap.add_argument("--profiles", default=",".join(PROFILES),
                    help="which of " + ", ".join(PROFILES) + " (comma-separated)")
    a = ap.parse_args()
    profiles = a.profiles.split(",")
    cases = [(c.split(":", 3) + [""])[:4] for c in (a.case or DEFAULT_CASES)]
    got = {}  # (case, profile) -> [(measured, predicted)]
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.rounds):
            for name, model, flags, data in cases:
                for profile in profiles:
                    got.setdefault((name, profile), []).append(
                        step(a.build, profile, model, flags.split(), data,
                             a.steps, work))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"{'case':<12} {'profile':<7} {'predicted ms':>13} "
          f"{'measured ms (min..max)':>28} {'meas/pred (min..max)':>24}")
    for name, *_ in cases:
        for profile in profiles:
            runs = got[(name, profile)]
            meas = [m for m, _ in runs]
            ratio = [m / p for m, p in runs]
            pred = statistics.median(p for _, p in runs)
            print(f"{name:<12} {profile:<7} {pred:>13.3f} "
                  f"{statistics.median(meas):>10.3f} ({min(meas):.3f}..{max(meas):.3f})"
                  f"{statistics.median(ratio):>10.2f} ({min(ratio):.2f}..{max(ratio):.2f})")


if __name__ == "__main__":
    main()
