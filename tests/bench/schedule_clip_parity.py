#!/usr/bin/env python3
"""cleave against PyTorch over a long run with the training recipe of
issue 32: AdamW with weight-decay groups (no decay on 1-D parameters),
linear warm-up + cosine decay to a floor (HF's
get_cosine_with_min_lr_schedule_with_warmup), clip_grad_norm_, 4
microbatches per step, on the committed MLP (tests/models/training/mlp:
its weights, its dataset read with wrap-around as cleave-run reads it),
cleave on 2 stages (ZB-H1). Prints the largest per-step differences of the
loss, the gradient norm and the lr; exits 1 above the float32-noise bar.

  python3 tests/bench/schedule_clip_parity.py [--build build] [--steps 200]

Needs torch, transformers, onnx (the PyTorch venv of docs/design/pytorch2.md).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "models", "training", "mlp")
LR, WARMUP, MIN_LR, CLIP, WD, M, B = 0.01, 20, 0.001, 0.5, 0.01, 4, 8


class MLP(nn.Module):  # tests/models/export_training.py's, d_hidden 24
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 24), nn.Tanh(),
            nn.Linear(24, 24), nn.Sigmoid(), nn.Linear(24, 24), nn.GELU(),
            nn.Linear(24, 10))

    def forward(self, x, labels):
        return F.cross_entropy(self.net(x), labels)


def torch_run(steps):
    model = MLP()
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in
             onnx.load(os.path.join(FIXTURE, "model.onnx")).graph.initializer}
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(inits[n].copy()))
    x = torch.from_numpy(np.load(os.path.join(FIXTURE, "steps/data/x.npy")))
    y = torch.from_numpy(np.load(os.path.join(FIXTURE, "steps/data/labels.npy")))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    spared = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": spared, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8)
    sched = transformers.get_cosine_with_min_lr_schedule_with_warmup(
        opt, num_warmup_steps=WARMUP, num_training_steps=steps, min_lr=MIN_LR)
    out = []
    n = x.shape[0]
    for s in range(steps):
        opt.zero_grad()
        losses = []
        for m in range(M):
            rows = [((s * M + m) * B + r) % n for r in range(B)]
            loss = model(x[rows], y[rows])
            (loss / M).backward()
            losses.append(float(loss.detach()))
        lr = opt.param_groups[0]["lr"]
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()
        sched.step()
        out.append((sum(losses) / M, norm, lr))
    return out


def cleave_run(build, steps, tmp):
    tools = os.path.join(build, "tools")
    plan = os.path.join(tmp, "p.cplan")
    subprocess.run([os.path.join(tools, "cleavec"),
                    os.path.join(FIXTURE, "model.onnx"), "--stages", "2",
                    "--microbatches", str(M), "--schedule", "zb-h1",
                    "--optimizer", "adamw", "--weight-decay", str(WD),
                    "--no-decay", "1-d", "-o", plan], check=True,
                   stdout=subprocess.DEVNULL)
    log = os.path.join(tmp, "run.jsonl")
    subprocess.run([os.path.join(tools, "cleave-run"), plan, "--steps",
                    str(steps), "--threads", "1", "--data",
                    os.path.join(FIXTURE, "steps/data"), "--lr", str(LR),
                    "--warmup-steps", str(WARMUP), "--lr-decay", "cosine",
                    "--min-lr", str(MIN_LR), "--clip-grad-norm", str(CLIP),
                    "--log", log, "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)
    with open(log) as f:
        return [(r["loss"], r["grad_norm"], r["lr"]) for r in map(json.loads, f)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    ref = torch_run(args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        got = cleave_run(args.build, args.steps, tmp)
    rel = lambda a, b: abs(a - b) / max(abs(b), 1e-12)
    worst = [max(rel(g[k], r[k]) for g, r in zip(got, ref)) for k in range(3)]
    clipped = sum(1 for r in ref if r[1] > CLIP)
    print("%d steps (%d clipped by torch): largest relative difference of the "
          "loss %.2e, the grad norm %.2e, the lr %.2e; losses %.4f -> %.4f "
          "(torch %.4f -> %.4f)" % (len(got), clipped, worst[0], worst[1],
                                    worst[2], got[0][0], got[-1][0],
                                    ref[0][0], ref[-1][0]))
    return 0 if len(got) == args.steps and max(worst) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
