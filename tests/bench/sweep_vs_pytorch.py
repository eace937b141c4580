#!/usr/bin/env python3
"""One training step of the model-zoo sweep's classes (tests/models/sweep),
cleave against PyTorch 2 eager in the same run: the zoo's breadth, where
train_corpus_vs_pytorch.py measures eight classes at benchmark size.

Run (after building), with the PyTorch 2 venv of
tests/models/corpus/make-venv.sh:
    HF_HUB_OFFLINE=1 $VENV/bin/python tests/bench/sweep_vs_pytorch.py
        [--build build] [--only a,b | --family timm] [--exporter auto]
        [--batch-scale 4] [--threads 2] [--rounds 3] [--steps 5]
        [--json FILE] [--keep DIR]

Which classes: by default every registry entry (tests/models/sweep/models.py)
that trains in the sweep's results.json, that is passes its loss column,
with the README's dynamo export where that one passes, else the legacy one
(--exporter dynamo|legacy asks for one); --only names entries (then
results.json is not consulted), --family keeps one library (transformers,
torchvision, timm, torch.nn).

Each class at the sweep's own small configuration (models.py: hidden 32 and
16 tokens for transformers, 32x32 or 64x64 images), seeded as the sweep
seeds it, in train() with every dropout 0, with one batch of
--batch-scale times the sweep's microbatch rows; one stage, one
microbatch, SGD lr 0.01 (no momentum) on both sides, the same --threads.

Timing, in rounds (--rounds), each round PyTorch then cleave, never at
once: PyTorch eager runs zero_grad, loss = module(*inputs), backward,
step, --steps timed steps (3 warm-up steps before the first round);
cleave runs cleave-run PLAN --data DIR --steps 3+STEPS and its step lines'
own ms of the steps after the first 3 are kept. Printed per class: the
median step of each side over all rounds, the ratio torch/cleave (above
1.0: cleave is faster), the training FLOPs of a step
(torch.utils.flop_counter) as cleave's GFLOP/s, and both first losses
(same weights, same batch: they agree unless the step is not the same
computation). Then per family and overall: the geometric mean, the lowest
ratio and the classes below 1.0x and 1.5x. A class whose export, compile
or run fails is printed with its first error line and counted apart.

These sizes are small: a step is a few milliseconds, so the ratios weigh
per-op overhead (PyTorch's dispatcher and autograd against cleave's
compiled schedule) more than kernel speed; --batch-scale grows the
batch to move them toward the kernels.
"""

import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_vs_pytorch.py

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SWEEP = os.path.join(ROOT, "tests", "models", "sweep")
sys.path.insert(0, SWEEP)
sys.path.insert(0, HERE)

import models  # noqa: E402
from train_corpus_vs_pytorch import WARMUP, cleave_times, cpu_model, torch_step, torch_times  # noqa: E402
from zoo import export  # noqa: E402


def first_line(text):
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    return (errs or lines or ["?"])[0][:160]


def tool(cmd, timeout):
    """stdout of cmd, or raises RuntimeError with its first error line."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{os.path.basename(cmd[0])}: timed out after {timeout} s")
    if out.returncode != 0:
        raise RuntimeError(first_line(out.stderr or out.stdout))
    return out.stdout


def choose(reg, args):
    """[(entry, registry index, exporter)]."""
    index = {e.name: i for i, e in enumerate(reg)}
    by_name = {e.name: e for e in reg}
    if args.only:
        names = [n for n in args.only.split(",") if n]
        for n in names:
            if n not in by_name:
                sys.exit(f"sweep_vs_pytorch: unknown model {n!r} (zoo.py --list)")
        ex = "dynamo" if args.exporter == "auto" else args.exporter
        return [(by_name[n], index[n], ex) for n in names]
    with open(args.results) as f:
        results = json.load(f)["results"]
    todo = []
    for e in reg:
        if args.family and e.family != args.family:
            continue
        order = ["dynamo", "legacy"] if args.exporter == "auto" else [args.exporter]
        for ex in order:
            if results.get(f"{e.name}-{ex}", {}).get("loss") is True:
                todo.append((e, index[e.name], ex))
                break
    return todo


def prepare(entry, idx, args):
    """(wrapped module, inputs) as the sweep builds them, batch scaled."""
    torch.manual_seed(1000 + idx)
    gen = torch.Generator().manual_seed(1000 + idx)
    module, sample, wrapper, batch = entry.build()
    models.perturb_constant_params(module, gen)
    wrapped = wrapper(module)
    models.warm_up_batchnorm(wrapped, sample, batch, gen)
    models.no_dropout(wrapped)
    wrapped.train()
    inputs = sample(torch.Generator().manual_seed(2000 + idx), batch * args.batch_scale)
    return wrapped, inputs


def flops_of(model, inputs):
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            model(*inputs.values()).backward()
    finally:
        model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def bench_one(entry, idx, exporter, args, tools, tmp):
    name = f"{entry.name}-{exporter}"
    folder = os.path.join(tmp, name)
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    wrapped, inputs = prepare(entry, idx, args)
    path = os.path.join(folder, "model.onnx")
    try:
        export(exporter, wrapped, inputs, path)  # exports a copy of the module
    except Exception as e:  # noqa: BLE001
        raise RuntimeError("export: " + first_line(f"{type(e).__name__}: {e}"))
    for k, v in inputs.items():
        np.save(os.path.join(folder, "data", k + ".npy"), v.numpy())
    plan = os.path.join(folder, "model.cplan")
    tool([os.path.join(tools, "cleavec"), path, "--microbatches=1", "--optimizer=sgd",
          f"--lr={args.lr}", "-o", plan], args.timeout)
    flops = flops_of(wrapped, inputs)
    argv = tuple(inputs.values())
    with torch.no_grad():
        first_torch = float(wrapped(*argv))
    opt = torch.optim.SGD(wrapped.parameters(), lr=args.lr)
    eager = lambda: torch_step(wrapped, opt, argv)  # noqa: E731
    torch_times(eager, WARMUP)
    times = {"torch": [], "cleave": []}
    first_cleave = None
    for _ in range(args.rounds):
        times["torch"] += torch_times(eager, args.steps)[0]
        try:
            ms, first_cleave = cleave_times(tools, plan, os.path.join(folder, "data"),
                                            args.threads, args.steps)
        except SystemExit as e:  # cleave_times exits on a failed run
            raise RuntimeError(first_line(str(e)))
        times["cleave"] += ms
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(model=entry.name, family=entry.family, exporter=exporter,
                torch_ms=med["torch"], cleave_ms=med["cleave"],
                ratio=med["torch"] / med["cleave"], gflop=flops / 1e9,
                first_torch=first_torch, first_cleave=first_cleave,
                rows=int(next(iter(inputs.values())).shape[0]))


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summary(rows, failed):
    print()
    groups = collections.OrderedDict()
    for r in rows:
        groups.setdefault(r["family"], []).append(r)
    if len(groups) > 1:
        groups["all"] = rows
    for fam, rs in groups.items():
        ratios = [r["ratio"] for r in rs]
        low = min(rs, key=lambda r: r["ratio"])
        below1 = [r["model"] for r in rs if r["ratio"] < 1.0]
        below15 = [r["model"] for r in rs if r["ratio"] < 1.5]
        print(f"{fam}: {len(rs)} classes, geometric mean {geomean(ratios):.2f}x, "
              f"median {statistics.median(ratios):.2f}x, lowest {low['ratio']:.2f}x ({low['model']}); "
              f"below 1.5x: {len(below15)}{' (' + ', '.join(below15) + ')' if below15 else ''}; "
              f"below 1.0x: {len(below1)}")
    if failed:
        print(f"not measured: {len(failed)} ({', '.join(f'{n}: {why}' for n, why in failed)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--results", default=os.path.join(SWEEP, "results.json"),
                    help="the sweep's results, which say which classes train")
    ap.add_argument("--only", default="", help="comma-separated registry names")
    ap.add_argument("--family", default="", help="transformers, torchvision, timm or torch.nn")
    ap.add_argument("--exporter", default="auto", choices=("auto", "dynamo", "legacy"))
    ap.add_argument("--batch-scale", type=int, default=4,
                    help="rows of the batch, in the sweep's microbatches (default 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per round")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per cleave command")
    ap.add_argument("--json", metavar="FILE", help="write the rows there too")
    ap.add_argument("--keep", metavar="DIR", help="keep exports and plans there")
    args = ap.parse_args()
    if args.batch_scale < 1 or args.rounds < 1 or args.steps < 1 or args.threads < 1:
        ap.error("--batch-scale, --rounds, --steps and --threads must be positive")
    tools = os.path.join(args.build, "tools")
    for t in ("cleavec", "cleave-run"):
        if not os.path.exists(os.path.join(tools, t)):
            sys.exit(f"sweep_vs_pytorch: missing {tools}/{t}: build first (ninja -C build)")
    todo = choose(models.registry(), args)
    if not todo:
        sys.exit("sweep_vs_pytorch: no class selected")
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()}; {args.threads} threads; torch {torch.__version__}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}; "
          f"{len(todo)} classes, batch {args.batch_scale}x the sweep's microbatch")
    print(f"medians over {args.rounds} interleaved rounds x {args.steps} steps "
          f"(after {WARMUP} warm-up steps); ratio = torch ms / cleave ms", flush=True)
    print(f"{'model':34} {'exp':6} {'rows':>4} {'torch ms':>9} {'cleave ms':>10} {'torch/cl':>8} "
          f"{'GFLOP':>7} {'cl GFLOP/s':>10}   first loss torch / cleave", flush=True)
    rows, failed = [], []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        for entry, idx, exporter in todo:
            t0 = time.time()
            try:
                r = bench_one(entry, idx, exporter, args, tools, tmp)
            except Exception as e:  # noqa: BLE001 (one class's failure is its row)
                failed.append((f"{entry.name}-{exporter}", str(e)))
                print(f"{entry.name:34} {exporter:6} not measured: {e}", flush=True)
                continue
            rows.append(r)
            print(f"{r['model']:34} {exporter:6} {r['rows']:4d} {r['torch_ms']:9.2f} {r['cleave_ms']:10.2f} "
                  f"{r['ratio']:8.2f} {r['gflop']:7.3f} {r['gflop'] / r['cleave_ms'] * 1e3:10.1f}   "
                  f"{r['first_torch']:.4f} / {r['first_cleave']:.4f}   ({time.time() - t0:.0f} s)",
                  flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"cpu": cpu_model(), "threads": args.threads, "torch": torch.__version__,
                               "batch_scale": args.batch_scale, "rows": rows, "failed": failed}, f, indent=1)
    if rows:
        summary(rows, failed)


if __name__ == "__main__":
    main()
