#!/usr/bin/env python3
"""Regenerate the small ONNX test models in this folder.

Run with Debian's PyTorch 1.13 / onnx 1.12:
    /usr/bin/python3 tests/models/export_models.py

Every model is exported with do_constant_folding=False from seeded modules,
so the output is deterministic. See README.md for what each model exercises.
"""

import collections
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
from model import GPT  # noqa: E402

TRAINING = torch.onnx.TrainingMode.TRAINING
EVAL = torch.onnx.TrainingMode.EVAL
OPSET = 17


def export(model, args, name, input_names, output_names, training,
           dynamic_axes=None, opset=OPSET):
    path = os.path.join(HERE, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model.train(training == TRAINING)
    torch.onnx.export(model, args, path,
                      input_names=input_names, output_names=output_names,
                      dynamic_axes=dynamic_axes, opset_version=opset,
                      training=training, do_constant_folding=False)
    return path


# --------------------------------------------------------------------------
# MLP: Gemm + the common activations, cross-entropy loss (training graph)

class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, n_classes=10):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, d_hidden), nn.ReLU(),
            nn.Linear(d_hidden, d_hidden), nn.Tanh(),
            nn.Linear(d_hidden, d_hidden), nn.Sigmoid(),
            nn.Linear(d_hidden, d_hidden), nn.GELU(),  # exact (erf) GELU
            nn.Linear(d_hidden, n_classes),
        )

    def forward(self, x):
        return self.net(x)


class MLPLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = MLP()

    def forward(self, x, labels):
        return F.cross_entropy(self.mlp(x), labels)


def export_mlp():
    torch.manual_seed(1)
    model = MLPLoss()
    x = torch.randn(4, 16)
    labels = torch.randint(0, 10, (4,))
    return export(model, (x, labels), "mlp.onnx", ["x", "labels"], ["loss"],
                  TRAINING, dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}})


def export_mlp_infer():
    torch.manual_seed(2)
    model = MLP()
    x = torch.randn(4, 16)
    return export(model, (x,), "mlp_infer.onnx", ["x"], ["logits"], EVAL)


# --------------------------------------------------------------------------
# CNN: small ResNet-style network, BatchNorm and Dropout in training mode

class ResidualBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(ch)
        self.conv2 = nn.Conv2d(ch, ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ch)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + x)


class CNN(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2))                      # 16x16 -> 8x8
        self.block = ResidualBlock(8)
        self.pool = nn.AvgPool2d(2)              # 8x8 -> 4x4
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)       # -> GlobalAveragePool
        self.flatten = nn.Flatten()
        self.dropout = nn.Dropout(0.1)
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x, labels):
        x = self.pool(self.block(self.stem(x)))
        x = self.flatten(self.gap(self.conv(x)))
        logits = self.fc(self.dropout(x))
        return F.cross_entropy(logits, labels)


def export_cnn():
    torch.manual_seed(3)
    model = CNN()
    x = torch.randn(2, 3, 16, 16)
    labels = torch.randint(0, 10, (2,))
    return export(model, (x, labels), "cnn.onnx", ["x", "labels"], ["loss"], TRAINING)


# --------------------------------------------------------------------------
# Elementwise / shape / reduction ops, fixed shapes, inference graph

class Elementwise(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(6, 4))

    def forward(self, a, b, ids):
        # a, b: [2, 3, 4] float; ids: [3] int64 in [0, 6)
        pos = torch.abs(b) + 1.0                        # Abs, Add (>= 1)
        x = (a + b) * (a - b) / pos                     # Add, Sub, Mul, Div
        x = x + torch.pow(pos, 0.5) - torch.sqrt(pos)   # Pow, Sqrt
        x = x + torch.log(pos) - torch.exp(-pos)        # Log, Exp, Neg
        x = torch.clamp(x, min=-3.0, max=3.0)           # Clip
        x = torch.minimum(x, a) + torch.maximum(x, b)   # Min, Max
        x = torch.where(a > b, x, -x)                   # Greater, Where
        x = x + (a > 0).to(torch.float32)               # Cast
        x = x + a[:, :1, :].expand(2, 3, 4)             # Slice, Expand
        t = x.transpose(1, 2)                           # Transpose -> [2, 4, 3]
        t = t.reshape(2, 12)                            # Reshape
        u = torch.cat([t, t * 2.0], dim=1)              # Concat -> [2, 24]
        u = u.unsqueeze(1).squeeze(1)                   # Unsqueeze, Squeeze
        m = u.mean(dim=1, keepdim=True)                 # ReduceMean
        s = u.sum(dim=1, keepdim=True)                  # ReduceSum
        u = (u - m) / (s.abs() + 1.0)
        p1, p2 = torch.split(u, 12, dim=1)              # Split
        probs = torch.softmax(p1, dim=-1) + torch.log_softmax(p2, dim=-1)
        emb = torch.index_select(self.table, 0, ids)    # Gather -> [3, 4]
        e = emb.sum(dim=0, keepdim=True)                # [1, 4]
        y = x[:, 1:3, :] + e                            # Slice with start/end
        return probs, y


def export_elementwise():
    torch.manual_seed(4)
    model = Elementwise()
    a = torch.randn(2, 3, 4)
    b = torch.randn(2, 3, 4)
    ids = torch.tensor([0, 5, 2], dtype=torch.long)
    return export(model, (a, b, ids), "elementwise.onnx", ["a", "b", "ids"],
                  ["probs", "y"], EVAL)


# --------------------------------------------------------------------------
# Tiny GPTs (examples/gpt/model.py)

def _gpt(seed, block_size=16):
    torch.manual_seed(seed)
    model = GPT(vocab=256, block_size=block_size, n_layer=1, n_head=2, n_embd=32)
    idx = torch.randint(0, 256, (2, block_size))
    targets = torch.randint(0, 256, (2, block_size))
    return model, (idx, targets)


def export_gpt_opset13():
    model, args = _gpt(5)
    return export(model, args, "gpt_opset13.onnx", ["idx", "targets"], ["loss"],
                  TRAINING, dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}},
                  opset=13)


def export_gpt_tiny_ext():
    model, args = _gpt(6)
    path = export(model, args, os.path.join("gpt_tiny_ext", "model.onnx"),
                  ["idx", "targets"], ["loss"], TRAINING,
                  dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}})
    m = onnx.load(path)
    location = "model.onnx.data"
    data_path = os.path.join(os.path.dirname(path), location)
    if os.path.exists(data_path):
        os.remove(data_path)  # onnx appends to an existing data file
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return path


# --------------------------------------------------------------------------

def report(path):
    onnx.checker.check_model(path)  # by path: also checks external data
    m = onnx.load(path)
    onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    hist = collections.Counter(n.op_type for n in m.graph.node)
    size = os.path.getsize(path)
    extra = ""
    data = path + ".data"
    if os.path.exists(data):
        extra = " + %s %d bytes" % (os.path.basename(data), os.path.getsize(data))
    print("%s: %d bytes%s, opset %d, %d nodes" % (
        os.path.relpath(path, ROOT), size, extra, m.opset_import[0].version, len(m.graph.node)))
    print("  " + ", ".join("%s %d" % kv for kv in sorted(hist.items())))


# --------------------------------------------------------------------------
# A tied embedding and a skip connection across layers (stage graphs)

class TiedSkip(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.l1 = nn.Linear(8, 8)
        self.l2 = nn.Linear(8, 8)
        self.l3 = nn.Linear(8, 8)

    def forward(self, idx, targets):
        x0 = self.emb(idx)                      # layer emb
        h = torch.relu(self.l1(x0))             # layer l1
        h = torch.relu(self.l2(h))              # layer l2
        h = self.l3(h) + x0                     # layer l3, skip from emb
        logits = h @ self.emb.weight.t()        # tied with the embedding
        return F.cross_entropy(logits.reshape(-1, 16), targets.reshape(-1))


def export_tied_skip():
    torch.manual_seed(7)
    model = TiedSkip()
    idx = torch.randint(0, 16, (2, 4))
    targets = torch.randint(0, 16, (2, 4))
    return export(model, (idx, targets), "tied_skip.onnx", ["idx", "targets"],
                  ["loss"], TRAINING)


def main():
    paths = [export_mlp(), export_mlp_infer(), export_cnn(), export_elementwise(),
             export_gpt_opset13(), export_gpt_tiny_ext(), export_tied_skip()]
    for p in paths:
        report(p)


if __name__ == "__main__":
    main()
