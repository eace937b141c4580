"""The planner's recomputation and offload on a LLaMA-7B-shaped model,
predicted: 4 and 8 pipeline stages under ZB-H1, bf16 products with f32
master weights and AdamW, on the h200 and a100 device profiles, keeping
every activation (--recompute none --offload none) against the planner's
choice under the device's memory (--mem-cap MEMORY) with recomputation
alone (--offload none) and with offload as well (--offload auto), and
against offloading every layer (--offload all).

    python3 tests/bench/llama7b_recompute.py [--build build] [--out FILE.md]

Needs no GPU and no weights (the committed graph over a sparse weight file;
cleavec only plans), so every figure is the analytic cost model's
prediction, not a measurement. Prints a Markdown table: per plan the
recomputation chosen, the predicted step, and each stage's planned peak.
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama7b_model import llama7b_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMORY = {"h200": "141GB", "a100": "80GB"}


def plan(cleavec, model, profile, stages, m, extra):
    run = subprocess.run(
        [cleavec, model, "--stages", str(stages), "--microbatches", str(m),
         "--schedule", "zb-h1", "--precision", "bf16", "--optimizer", "adamw",
         "--device-profile", profile] + extra,
        capture_output=True, text=True)
    if run.returncode != 0:
        why = run.stderr.strip().split("\n")[-1]
        m = re.search(r"smallest cap that fits is ([0-9.]+ [KMGT]iB)", why)
        return None, "no fit" + (f" (needs {m.group(1)})" if m else "")
    out = run.stdout
    step = float(re.search(r"^step time ([0-9.e+-]+) s", out, re.M).group(1))
    rows = re.findall(r"^\s+(\d+)\s+([0-9.]+)%\s+(\d+)\s+(\d+)$", out, re.M)
    peaks = [int(r[3]) / 2**30 for r in rows]
    choice = "none"
    off = re.search(r"^offload: (\d+) value\(s\), ([0-9.]+ [KMGT]?i?B) per "
                    r"microbatch", out, re.M)
    m1 = re.search(r"^recompute: chosen per stage under --mem-cap: (.*?) \(",
                   out, re.M)
    eased = re.search(r"; (\d+) layer\(s\) with less", out)
    m2 = re.search(r"^recompute: (\w+) on every layer", out, re.M)
    if m1:
        stages_ = m1.group(1).split(";")[0]
        kinds = set(x.split(" ", 1)[1] for x in stages_.split(", "))
        choice = ("every stage " + kinds.pop() if len(kinds) == 1
                  else "per stage: " + stages_)
        if eased:
            choice += f", {eased.group(1)} layers kept"
    elif m2:
        choice = m2.group(1)
    if off and choice == "none":
        choice = "offload"
    if off:
        choice += f" ({off.group(2)} per microbatch to the host)"
    return (step, peaks, choice), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    cleavec = os.path.join(args.build, "tools", "cleavec")
    with llama7b_model() as model:
        lines = ["| device | stages | plan | chosen | step (s) | "
                 "peak per stage (GiB) | within memory |",
                 "| --- | ---: | --- | --- | ---: | --- | --- |"]
        for profile in ("a100", "h200"):
            cap = MEMORY[profile]
            for stages in (4, 8):
                for label, extra in (
                        ("keep everything",
                         ["--recompute", "none", "--offload", "none"]),
                        ("planner, recompute only, --mem-cap " + cap,
                         ["--mem-cap", cap, "--offload", "none"]),
                        ("planner, --mem-cap " + cap, ["--mem-cap", cap]),
                        ("--offload all", ["--offload", "all"])):
                    r, why = plan(cleavec, model, profile, stages,
                                  args.microbatches, extra)
                    if r is None:
                        lines.append(f"| {profile} | {stages} | {label} | | "
                                     f"| | {why} |")
                        continue
                    step, peaks, choice = r
                    limit = float(cap[:-2]) * 1e9 / 2**30
                    fits = "yes" if max(peaks) <= limit else \
                        f"no ({cap})"
                    lines.append(
                        f"| {profile} | {stages} | {label} | {choice} | "
                        f"{step:.3f} | "
                        + ", ".join(f"{p:.1f}" for p in peaks)
                        + f" | {fits} |")
        table = "\n".join(lines) + "\n"
        print(table, end="")
        if args.out:
            with open(args.out, "w") as f:
                f.write(table)


if __name__ == "__main__":
    main()
