#!/usr/bin/env python3
"""GPT-2-small training step on one GPU: cleave (--precision bf16, cleave-run
--device cuda) against PyTorch eager with bf16 autocast, the bar of issue 8
(docs/design/cuda.md). Two halves, because the GPU machine has PyTorch but
no ONNX or protobuf C++ libraries:

  here (any PyTorch 2.x, e.g. ~/.cache/cleave/torch2-venv/bin/python):
    tests/bench/gpt2_small_gpu.py prepare --out DIR [--batch 8] [--tiny]
  writes DIR/gpt2.onnx (+ .data): examples/gpt/model.py's GPT at GPT-2-small
  size (12 layers, 12 heads, d 768, vocab 50257, sequence 1024, 124M
  parameters with the untied lm_head: 163M), and DIR/data/{idx,targets}.npy
  (one batch). tools/gpu-check.sh bundle then compiles it
  (cleavec --precision bf16) into the bundle.

  on the GPU machine (PyTorch 2.x with CUDA):
    tests/bench/gpt2_small_gpu.py torch --data DIR/data [--steps 20]
  builds the same model with the same weights in PyTorch, and times eager
  training steps (zero_grad, forward under torch.autocast(bfloat16),
  backward, SGD step): prints the median step in ms, the loss, and the
  measured peak of a large bf16 GEMM (for MFU and GEMM efficiency).

--tiny (tools/gpu-check.sh dry-run): the same code at 2 layers, 2 heads, d 64,
vocab 256, sequence 64, and `torch --device cpu` times it on the CPU, so the
script's every line runs on a machine without a GPU.

Weights: every weight matrix is one seeded block of 4096 normal(0, 0.02)
values, tiled (LayerNorm weights 1, biases 0). That keeps the plan, about
650 MB of f32 parameters, compressible to a few MB, so it fits the 64 MiB a
device session can carry; the values do not change what a step costs.
Both frameworks start from the same weights and see the same batch.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
from model import GPT  # noqa: E402

CONFIG = dict(vocab=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768,
              dropout=0.0)
TINY = dict(vocab=256, block_size=64, n_layer=2, n_head=2, n_embd=64,
            dropout=0.0)


def make_model():
    model = GPT(**CONFIG)
    gen = torch.Generator().manual_seed(0)
    block = torch.randn(4096, generator=gen) * 0.02
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                n = p.numel()
                p.copy_(block.repeat(math.ceil(n / block.numel()))[:n].view_as(p))
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.fill_(1.0)
    return model


def prepare(args):
    if args.tiny:
        CONFIG.update(TINY)
    os.makedirs(os.path.join(args.out, "data"), exist_ok=True)
    model = make_model()
    model.train()
    gen = torch.Generator().manual_seed(1)
    T = CONFIG["block_size"]
    idx = torch.randint(0, CONFIG["vocab"], (args.batch, T), generator=gen)
    targets = torch.randint(0, CONFIG["vocab"], (args.batch, T), generator=gen)
    np.save(os.path.join(args.out, "data", "idx.npy"), idx.numpy())
    np.save(os.path.join(args.out, "data", "targets.npy"), targets.numpy())
    path = os.path.join(args.out, "gpt2.onnx")
    extra = {}
    # The TorchScript exporter (training mode): PyTorch 2.9 and later
    # default to the dynamo one.
    if "dynamo" in torch.onnx.export.__code__.co_varnames:
        extra["dynamo"] = False
    torch.onnx.export(model, (idx[:1], targets[:1]), path,
                      input_names=["idx", "targets"], output_names=["loss"],
                      dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}},
                      opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, **extra)
    import onnx
    m = onnx.load(path)
    location = "gpt2.onnx.data"
    if os.path.exists(os.path.join(args.out, location)):
        os.remove(os.path.join(args.out, location))
    onnx.save_model(m, path, save_as_external_data=True,
                    all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    n = sum(p.numel() for p in model.parameters())
    print("wrote %s: %.1fM parameters; data: batch %d x %d" % (
        path, n / 1e6, args.batch, T))


def gemm_peak(device):
    if device != "cuda":
        return 0.0  # a dry run: no GPU peak to measure
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        t = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / statistics.median(times)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def bench_torch(args):
    device = args.device
    idx = torch.from_numpy(np.load(os.path.join(args.data, "idx.npy"))).to(device)
    targets = torch.from_numpy(np.load(os.path.join(args.data, "targets.npy"))).to(device)
    model = make_model().to(device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    times, losses = [], []
    for step in range(3 + args.steps):
        sync(device)
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(idx, targets)
        loss.backward()
        opt.step()
        sync(device)
        if step >= 3:
            times.append(time.perf_counter() - t)
        losses.append(float(loss))
    peak = gemm_peak(device)
    n = sum(p.numel() for p in model.parameters())
    tokens = idx.numel()
    step = statistics.median(times)
    result = {
        "torch": torch.__version__,
        "device": (torch.cuda.get_device_name() if device == "cuda"
                   else "cpu (dry run)"),
        "batch": list(idx.shape), "parameters": n, "median_step_ms": step * 1e3,
        "first_loss": losses[0], "last_loss": losses[-1],
        "bf16_gemm_peak_tflops": peak / 1e12,
        # 6 N per token for forward + backward of the weights' products.
        "model_tflops_per_s": 6 * n * tokens / step / 1e12,
    }
    print(json.dumps(result, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true")
    t = sub.add_parser("torch")
    t.add_argument("--data", required=True)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--device", default="cuda")
    t.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    if args.tiny:
        CONFIG.update(TINY)
    prepare(args) if args.mode == "prepare" else bench_torch(args)


if __name__ == "__main__":
    main()
