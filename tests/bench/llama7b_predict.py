"""The 2BP paper's setting, predicted: a LLaMA-7B-shaped model on 4
pipeline stages, bf16 products with f32 master weights and AdamW, for each
schedule cleave has and microbatch counts 4 to 32, on the h200 and a100
device profiles (passes/Cost.cpp names their datasheet figures).

    python3 tests/bench/llama7b_predict.py [--build build] [--out FILE.md]

Needs no GPU and no weights: the graph is the committed
tests/models/llama/7b/model.onnx (make_llama.py --preset 7b --graph-only)
over a sparse weight file, and cleavec only plans (no -o), so every row is
the analytic cost model's prediction, not a measurement. Prints a Markdown
table: predicted step, tokens per second, the mean bubble over stages,
the largest stage's peak memory against the device's memory, and for
each 2BP schedule its throughput over the same schedule without 2BP.
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama7b_model import llama7b_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ = 2048  # tokens per microbatch (batch 1)
# Device memory, from the same datasheets as the profiles.
MEMORY = {"h200": 141e9, "a100": 80e9}
SCHEDULES = ["gpipe", "gpipe-2bp", "1f1b", "1f1b-2bp", "zb-h1", "zb-h2"]
BASELINE = {"gpipe-2bp": "gpipe", "1f1b-2bp": "1f1b", "zb-h1": "1f1b",
            "zb-h2": "1f1b"}


def plan(cleavec, model, profile, schedule, m, stages):
    out = subprocess.run(
        [cleavec, model, "--stages", str(stages), "--microbatches", str(m),
         "--schedule", schedule, "--precision", "bf16", "--optimizer",
         "adamw", "--device-profile", profile],
        check=True, capture_output=True, text=True).stdout
    step = float(re.search(r"^step time ([0-9.e+-]+) s", out, re.M).group(1))
    rows = re.findall(r"^\s+(\d+)\s+([0-9.]+)%\s+(\d+)\s+(\d+)$", out, re.M)
    bubbles = [float(r[1]) for r in rows]
    peaks = [int(r[3]) for r in rows]
    held = [int(r[2]) for r in rows]
    return step, sum(bubbles) / len(bubbles), max(peaks), max(held)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    cleavec = os.path.join(args.build, "tools", "cleavec")
    with llama7b_model() as model:
        lines = ["| device | schedule | M | step (s) | tokens/s | mean bubble "
                 "| peak activations (mb) | largest stage peak | fits | "
                 "2BP / same without |",
                 "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- "
                 "| ---: |"]
        for profile in ("h200", "a100"):
            steps = {}
            for schedule in SCHEDULES:
                for m in (4, 8, 16, 32):
                    step, bubble, peak, held = plan(cleavec, model, profile,
                                                    schedule, m, args.stages)
                    steps[schedule, m] = step
                    base = BASELINE.get(schedule)
                    ratio = ("%.2fx" % (steps[base, m] / step)
                             if base else "")
                    lines.append(
                        "| %s | %s | %d | %.3f | %.0f | %.1f%% | %d | %.1f GB "
                        "| %s | %s |" %
                        (profile, schedule, m, step, m * SEQ / step, bubble,
                         held, peak / 1e9,
                         "yes" if peak <= MEMORY[profile] else
                         "no (%.0f GB)" % (MEMORY[profile] / 1e9), ratio))
                    print(lines[-1], flush=True)
        table = "\n".join(lines) + "\n"
        if args.out:
            with open(args.out, "w") as f:
                f.write(table)


if __name__ == "__main__":
    sys.exit(main())
