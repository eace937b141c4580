#!/usr/bin/env python3
"""Check the committed subset of the model-zoo sweep (tests/models/sweep/ci/)
with cleave's tools, without PyTorch.

    python3 tests/models/sweep/check_ci.py [--tools build/tools] [--only a,b]
        [--work DIR] [--timeout 300] [--strict] [--device cuda-emulated]

Needs python3 with numpy (the onnxruntime venv scripts/common.sh makes,
cleave_ensure_ort_python). Every folder under ci/ is an export zoo.py wrote
(model.onnx, inputs/, reference/, reference64/, steps/); each is copied to
a scratch folder and gets the sweep's five cleave columns (imported, grads,
stages, threads, loss; see cleave_checks.py). ci/expected.json holds the
columns as the sweep recorded them when the subset was chosen: a column that
held then and fails now is a regression (exit 1); one that failed then and
holds now is reported as fixed, so that expected.json can be updated. With
--strict every column must hold. With --device, every gradient and
training run goes to that backend (cuda-emulated: the CUDA backend's
kernels on the host), against the same expectations.
"""

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from cleave_checks import COLUMNS, Tools, run_cleave  # noqa: E402

CI = os.path.join(HERE, "ci")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default=os.path.join(ROOT, "build", "tools"))
    ap.add_argument("--only", default="", help="comma-separated folder names under ci/")
    ap.add_argument("--work", default="", help="scratch folder (default: a temporary one)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cleave command")
    ap.add_argument("--strict", action="store_true", help="every column must hold")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda-emulated", "cuda"],
                    help="the backend of cleave-run and cleave-opt --run")
    args = ap.parse_args()
    with open(os.path.join(CI, "expected.json")) as f:
        expected = json.load(f)
    names = [n for n in args.only.split(",") if n] or sorted(expected)
    for n in names:
        if n not in expected or not os.path.isdir(os.path.join(CI, n)):
            ap.error("no ci folder %r" % n)
    tools = Tools(os.path.abspath(args.tools), args.timeout, args.device)
    work = args.work or tempfile.mkdtemp(prefix="cleave-sweep-ci-")
    regressions, fixed = [], []
    for n in names:
        folder = os.path.join(work, n)
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(os.path.join(CI, n), folder)
        rec = collections.OrderedDict([("exported", True)])
        try:
            run_cleave(folder, tools, rec)
        except Exception as e:  # noqa: BLE001
            rec["reason"] = "check: %s: %s" % (type(e).__name__, e)
        want = expected[n]
        marks = []
        for c in COLUMNS[1:]:
            got, had = rec.get(c) is True, want.get(c) is True
            marks.append("%s=%s" % (c, "yes" if got else "NO"))
            if had and not got or args.strict and not got:
                regressions.append("%s %s" % (n, c))
            elif got and not had:
                fixed.append("%s %s" % (n, c))
        why = next((rec[k] for k in ("reason", "grads_reason", "train_reason", "stages_reason",
                                     "threads_reason", "loss_reason") if rec.get(k)), "")
        print("%-34s %s %s" % (n, " ".join(marks), why), flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if fixed:
        print("now holding (update ci/expected.json): " + ", ".join(fixed))
    if regressions:
        print("FAILED: " + ", ".join(regressions))
        return 1
    print("ok: %d exports" % len(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
