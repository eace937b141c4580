#!/usr/bin/env python3
"""PyTorch's gradients under cleave's `--precision bf16` semantics.

Run with Debian's PyTorch 1.13 / onnx 1.12 / numpy, after
export_training.py (it rebuilds the same seeded models):
    /usr/bin/python3 tests/models/export_bf16_reference.py

For every model of export_training.py it writes
tests/models/training/<name>/reference_bf16/:
    loss.npy, grad.<init>.npy   the loss and the gradients when every
                                matrix product and convolution (F.linear,
                                F.conv2d, torch.matmul / @) reads bf16 casts
                                of its f32 operands and its bf16 result is
                                cast back to f32 at once, everything else in
                                f32 (docs/design/precision.md)

The parameters stay f32 (master weights); autograd differentiates the casts,
as cleave's autodiff does. PyTorch's bf16 CPU GEMMs sum in f32 and round
once, as cleave's do, so the two differ only in the order of the sums.
"""

import collections
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export_training  # noqa: E402


def in_bf16(fn):
    def cast(a):
        if torch.is_tensor(a) and a.dtype == torch.float32:
            return a.to(torch.bfloat16)
        return a

    def wrapped(*args, **kwargs):
        out = fn(*[cast(a) for a in args],
                 **{k: cast(v) for k, v in kwargs.items()})
        return out.to(torch.float32)
    return wrapped


class Bf16Products:
    """Within the block, products and convolutions run as cleave's bf16."""
    NAMES = [(F, "linear"), (F, "conv2d"), (torch, "matmul"),
             (torch.Tensor, "__matmul__")]

    def __enter__(self):
        self.saved = [(mod, name, getattr(mod, name)) for mod, name in self.NAMES]
        for mod, name, fn in self.saved:
            setattr(mod, name, in_bf16(fn))

    def __exit__(self, *exc):
        for mod, name, fn in self.saved:
            setattr(mod, name, fn)


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for name, make in export_training.MODELS:
        model, inputs = make()
        folder = os.path.join(export_training.OUT, name)
        graph = onnx.load(os.path.join(folder, "model.onnx")).graph
        mapping, _ = export_training.map_params(model, graph)
        with Bf16Products():
            loss, grads = export_training.autograd(model, inputs, torch.float32)
        out = os.path.join(folder, "reference_bf16")
        export_training.save(os.path.join(out, "loss.npy"),
                             np.asarray(loss.numpy(), dtype=np.float32).reshape(()))
        worst = (0.0, "")
        for pname, init in mapping.items():
            g = grads[pname].to(torch.float32).numpy()
            export_training.save(os.path.join(out, "grad.%s.npy" % init), g)
            ref = np.load(os.path.join(folder, "reference", "grad.%s.npy" % init))
            worst = max(worst, (export_training.rel_err(g, ref), init))
        ref_loss = float(np.load(os.path.join(folder, "reference", "loss.npy")))
        print("%s: bf16 loss %.6f (f32 %.6f); bf16 vs f32 gradients: max "
              "relative error %.3g (%s)" % (name, float(loss), ref_loss,
                                            worst[0], worst[1]))


if __name__ == "__main__":
    main()
