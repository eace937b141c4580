#!/usr/bin/env python3
"""One training step (forward, backward, SGD update) of cleave against
PyTorch eager (and ONNX Runtime training when it is installed).

Run (after building, with Debian's PyTorch 1.13):
    /usr/bin/python3 tests/bench/train_vs_pytorch.py [--build build] [--iters 30]
        [--ort-python python3]

Models, both at batch 16 (one stage, one microbatch, the same T threads):
  * gpt-tiny: the bundled examples/gpt/gpt-tiny.onnx (2 layers, d 64, T 32;
    exported by examples/gpt/export.py), and PyTorch's GPT of
    examples/gpt/model.py with the same constructor arguments and the ONNX
    initializers loaded into it, so both start from the same weights;
  * resnet-small: the small ResNet of forward_vs_pytorch.py (32x32 RGB,
    BatchNorm with batch statistics), exported here in training mode.
Every step sees the same batch (written as .npy, given to cleave-run with
--data; one batch of samples, so every step wraps around to it).

Timed:
  * PyTorch eager: zero_grad, loss = module(inputs), loss.backward(),
    torch.optim.SGD step; median of --runs x --iters steps after 3 warm-up
    steps,
    torch.set_num_threads(T), OMP_WAIT_POLICY=PASSIVE unless --omp-default
    (see below).
  * cleave: cleavec MODEL --microbatch-size B --microbatches 1
    --optimizer sgd --lr LR -o plan, then build/tools/cleave-run plan
    --threads T --data DIR:
      --steps 3+ITERS, --runs times; the step lines' own times ("ms",
      the whole runStep) of the steps after the first 3: their median
      over all runs, and the range of the runs' medians.
  * ONNX Runtime training (tests/bench/ort_train_step.py under --ort-python,
    the pyenv interpreter with `pip install onnxruntime-training`): the same
    .onnx, artifacts with the model's own loss and SGD, train_step +
    optimizer step + lazy_reset_grad; median of --runs x --iters steps
    after 3;
    intra-op spinning off unless --omp-default.
Prints ms per step and the ratios torch/cleave and ort/cleave (above 1.0:
cleave is faster), and the losses: the first step's, and the one of step
8 (after 7 updates), which must agree between PyTorch and cleave (a note
is printed where they differ by more than 0.2%).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

# PyTorch 1.13's OpenMP workers spin between parallel regions by default;
# on this shared 2-core machine, with compile jobs on the other cores, that
# made a 2-thread training step 10-20x slower (GPT: about 500 ms instead of
# about 35 ms). cleave's pool sleeps, so by default PyTorch's workers are
# made to sleep too (read when libgomp starts, so set before importing
# torch); --omp-default keeps PyTorch's and ONNX Runtime's own waiting.
OMP_DEFAULT = "--omp-default" in sys.argv
if not OMP_DEFAULT:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnx.numpy_helper  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT  # noqa: E402
from forward_vs_pytorch import SmallResNet  # noqa: E402

SHORT_STEPS = 8   # the step whose loss (after 7 updates) is compared
WARMUP = 3        # steps before the timed ones, for every framework


def models(batch, tmp):
    """Yields (name, module, inputs, onnx path)."""
    gpt_onnx = os.path.join(ROOT, "examples", "gpt", "gpt-tiny.onnx")
    # export.py's defaults: export(output, layers=2, heads=2, embd=64, block_size=32)
    gpt = GPT(vocab=256, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.0)
    weights = {i.name: torch.from_numpy(onnx.numpy_helper.to_array(i).copy())
               for i in onnx.load(gpt_onnx).graph.initializer}
    state = gpt.state_dict()
    assert set(weights) == set(state), set(weights) ^ set(state)
    gpt.load_state_dict(weights)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 256, (batch, 32), generator=g)
    targets = torch.randint(0, 256, (batch, 32), generator=g)
    yield "gpt-tiny", gpt, {"idx": idx, "targets": targets}, gpt_onnx

    torch.manual_seed(0)
    cnn = SmallResNet()
    x = torch.randn(batch, 3, 32, 32)
    labels = torch.randint(0, 10, (batch,))
    inputs = {"x": x, "labels": labels}
    path = os.path.join(tmp, "resnet-small.onnx")
    cnn.train()
    torch.onnx.export(cnn, tuple(inputs.values()), path,
                      input_names=list(inputs), output_names=["loss"],
                      opset_version=17, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)
    # the export ran a forward in training mode, which moved the BatchNorm
    # running statistics; start PyTorch from the values the .onnx holds
    saved = {i.name: onnx.numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    with torch.no_grad():
        for k, v in cnn.state_dict().items():
            if k in saved:
                v.copy_(torch.from_numpy(saved[k].copy()))
    yield "resnet-small", cnn, inputs, path


def time_torch(model, inputs, iters, lr):
    """Median ms of a training step after 3 warm-up steps; the losses of
    steps 1 and SHORT_STEPS (each computed before that step's update)."""
    args = tuple(inputs.values())
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, times = [], []
    for i in range(3 + iters):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(*args)
        loss.backward()
        opt.step()
        dt = (time.perf_counter() - t0) * 1000
        losses.append(float(loss))
        if i >= 3:
            times.append(dt)
    return statistics.median(times), min(times), losses


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def time_cleave(tools, path, data, batch, threads, lr, runs, iters, tmp, name):
    """Per-step ms from cleave-run's step lines: the median over steps after
    WARMUP of every run (and the range of the runs' medians); the losses of
    steps 1 and SHORT_STEPS; the compiler's predicted step."""
    plan = os.path.join(tmp, name + ".cplan")
    run([os.path.join(tools, "cleavec"), path, f"--microbatch-size={batch}",
         "--microbatches=1", "--optimizer=sgd", f"--lr={lr}", "-o", plan])
    cmd = [os.path.join(tools, "cleave-run"), plan, f"--threads={threads}", f"--data={data}",
           f"--steps={WARMUP + iters}"]
    every, medians, losses = [], [], {}
    for _ in range(runs):
        out = run(cmd)
        steps = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in re.finditer(
            r"^step\s+(\d+)/\d+\s+loss (\S+)\s+\d+ samples/s\s+(\S+) ms", out, re.M)}
        ms = [steps[k][1] for k in sorted(steps) if k > WARMUP]
        every += ms
        medians.append(statistics.median(ms))
        losses = (steps[1][0], steps[SHORT_STEPS][0])
        predicted = float(re.search(r"^0\s+\S+\s+\S+\s+\d+ / \d+\s+\S+ / (\S+)$",
                                    out, re.M).group(1))
    return statistics.median(every), min(medians), max(medians), losses, predicted


def time_ort(python, path, data, params, threads, lr, iters):
    if not python:
        return None, "no --ort-python interpreter"
    cmd = [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ort_train_step.py"),
           path, data, "--params", ",".join(params), "--iters", str(iters),
           "--threads", str(threads), "--lr", str(lr)] + (["--spin"] if OMP_DEFAULT else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    fields = dict(line.split(None, 1) for line in out.stdout.splitlines() if " " in line)
    if out.returncode != 0 or "median_ms" not in fields:
        why = fields.get("unavailable") or (out.stderr.strip().splitlines() or ["?"])[-1]
        return None, why
    return fields, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--runs", type=int, default=3, help="cleave-run runs per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--omp-default", action="store_true",
                    help="leave PyTorch's OpenMP and ORT's thread spinning at their defaults")
    ap.add_argument("--ort-python", default=os.environ.get("ORT_PYTHON", shutil.which("python3")))
    args = ap.parse_args()
    tools = os.path.join(args.build, "tools")
    for t in ("cleavec", "cleave-run"):
        if not os.path.exists(os.path.join(tools, t)):
            sys.exit(f"missing {tools}/{t}: build first (ninja -C build)")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=UserWarning)  # torch.onnx.export's
    print(f"training step, batch {args.batch}, {args.threads} threads, SGD lr {args.lr}, "
          f"torch {torch.__version__} (OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
          f"ORT spinning {'on' if OMP_DEFAULT else 'off'}); torch/ort: median of {args.runs * args.iters} steps after {WARMUP}; cleave: "
          f"median of {args.runs} runs x {args.iters} steps after {WARMUP} (range of the "
          "runs' medians)")
    print(f"{'model':13} {'torch ms':>9} {'cleave ms':>10} {'(min..max)':>15} "
          f"{'ort ms':>7} {'torch/cl':>8} {'ort/cl':>7}   "
          f"loss step 1 / step {SHORT_STEPS} (torch, cleave, ort)")
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, inputs, path in models(args.batch, tmp):
            data = os.path.join(tmp, name)
            os.makedirs(data)
            for k, v in inputs.items():
                np.save(os.path.join(data, k + ".npy"), v.numpy())
            params = [n for n, _ in model.named_parameters()]
            # the measurements run one after the other, never at once
            t_ms, t_min, t_losses = time_torch(model, inputs, args.runs * args.iters, args.lr)
            c_ms, c_min, c_max, c_losses, predicted = time_cleave(
                tools, path, data, args.batch, args.threads, args.lr, args.runs,
                args.iters, tmp, name)
            ort, why = time_ort(args.ort_python, path, data, params, args.threads,
                                args.lr, args.runs * args.iters)
            if ort:
                o_ms = float(ort["median_ms"])
                o_txt, o_ratio = f"{o_ms:7.2f}", f"{o_ms / c_ms:7.2f}"
                o_loss = f"{float(ort['first_loss']):.4f}/{float(ort['step8_loss']):.4f}"
                notes.append(f"{name}: onnxruntime-training {ort['version']}")
            else:
                o_txt, o_ratio, o_loss = f"{'n/a':>7}", f"{'n/a':>7}", "n/a"
                notes.append(f"{name}: ONNX Runtime training unavailable: {why}")
            print(f"{name:13} {t_ms:9.2f} {c_ms:10.2f} {f'({c_min:.2f}..{c_max:.2f})':>15} "
                  f"{o_txt} {t_ms / c_ms:8.2f} {o_ratio}   "
                  f"{t_losses[0]:.4f}/{t_losses[SHORT_STEPS - 1]:.4f}, "
                  f"{c_losses[0]:.4f}/{c_losses[1]:.4f}, {o_loss}")
            notes.append(f"{name}: cleavec's predicted step {predicted:.2f} ms; "
                         f"PyTorch's fastest step {t_min:.2f} ms")
            for a, b, what in ((t_losses[0], c_losses[0], "first"),
                               (t_losses[SHORT_STEPS - 1], c_losses[1], f"step {SHORT_STEPS}")):
                if abs(a - b) > 2e-3 * max(1.0, abs(a)):
                    notes.append(f"{name}: {what} losses differ: torch {a:.6f} cleave {b:.6f}")
    for n in notes:
        print("  " + n)


if __name__ == "__main__":
    main()
