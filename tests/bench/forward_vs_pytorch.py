#!/usr/bin/env python3
"""Forward-pass speed of cleave's CPU backend against PyTorch eager.

Run (after building, with Debian's PyTorch 1.13):
    /usr/bin/python3 tests/bench/forward_vs_pytorch.py [--build build] [--iters 30]

For each model -- the bundled example GPT (examples/gpt/model.py, the
gpt-tiny configuration) and a small ResNet-style CNN -- at batch 8, this
script builds the PyTorch module, exports it to ONNX (training mode, as
cleave compiles it), writes the inputs as .npy, then in the same run times
  * PyTorch eager: module(inputs) under torch.no_grad(), torch.set_num_threads(T)
  * cleave: build/tests/cleave-bench-forward (import once, interpreter once,
    the same inputs, T threads)
and prints median milliseconds per forward and the ratio torch/cleave
(above 1.0: cleave is faster). It also prints both losses, which must agree.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
from model import GPT  # noqa: E402


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    """Two stages of residual blocks on 32x32 RGB images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.stage1 = nn.Sequential(Block(16), Block(16))
        self.down = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(32), nn.ReLU())
        self.stage2 = nn.Sequential(Block(32), Block(32))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x, labels):
        h = self.stage2(self.down(self.stage1(self.stem(x))))
        logits = self.fc(torch.flatten(self.pool(h), 1))
        return F.cross_entropy(logits, labels)


def models(batch):
    torch.manual_seed(0)
    gpt = GPT(vocab=256, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.0)
    idx = torch.randint(0, 256, (batch, 32))
    targets = torch.randint(0, 256, (batch, 32))
    yield "gpt-tiny", gpt, {"idx": idx, "targets": targets}
    torch.manual_seed(0)
    cnn = SmallResNet()
    x = torch.randn(batch, 3, 32, 32)
    labels = torch.randint(0, 10, (batch,))
    yield "resnet-small", cnn, {"x": x, "labels": labels}


def time_torch(model, inputs, iters):
    args = tuple(inputs.values())
    with torch.no_grad():
        for _ in range(3):
            loss = model(*args)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            loss = model(*args)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), float(loss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    bench = os.path.join(args.build, "tests", "cleave-bench-forward")
    if not os.path.exists(bench):
        sys.exit(f"missing {bench}: build first (ninja -C build cleave-bench-forward)")
    torch.set_num_threads(args.threads)
    print(f"batch {args.batch}, {args.threads} threads, {args.iters} timed iterations, "
          f"torch {torch.__version__}")
    print(f"{'model':14} {'torch ms':>9} {'cleave ms':>10} {'ratio':>6}   losses (torch / cleave)")
    worst = None
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, inputs in models(args.batch):
            model.train()  # the exported training graph: BatchNorm uses batch statistics
            path = os.path.join(tmp, name + ".onnx")
            torch.onnx.export(model, tuple(inputs.values()), path,
                              input_names=list(inputs), output_names=["loss"],
                              opset_version=17, do_constant_folding=False,
                              training=torch.onnx.TrainingMode.TRAINING)
            data = os.path.join(tmp, name)
            os.makedirs(data)
            for k, v in inputs.items():
                np.save(os.path.join(data, k + ".npy"), v.numpy())
            torch_ms, torch_loss = time_torch(model, inputs, args.iters)
            out = subprocess.run([bench, path, "--inputs", data, "--iters", str(args.iters),
                                  "--threads", str(args.threads)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{name}: cleave-bench-forward failed: {out.stderr.strip()}")
            fields = dict(line.split() for line in out.stdout.splitlines())
            cleave_ms = float(fields["median_ms"])
            cleave_loss = float(fields["output0"])
            ratio = torch_ms / cleave_ms
            worst = ratio if worst is None else min(worst, ratio)
            print(f"{name:14} {torch_ms:9.3f} {cleave_ms:10.3f} {ratio:6.2f}   "
                  f"{torch_loss:.6f} / {cleave_loss:.6f}")
            if abs(torch_loss - cleave_loss) > 1e-3 * max(1.0, abs(torch_loss)):
                sys.exit(f"{name}: losses differ")
    print(f"lowest ratio torch/cleave: {worst:.2f} (target >= 1.0)")


if __name__ == "__main__":
    main()
