"""check_export (examples/pytorch/annotate_export.py) on small modules
exported here: a correct export (BatchNorm in train(), its statistics put
back), one with active dropout as nn.Dropout and one as F.dropout (both
compared in eval()), one with cross_entropy's label_smoothing (which the
dynamo exporter drops and cleave reads from the node's call), and one whose
loss the legacy exporter changes (avg_pool2d's divisor_override dropped),
which must raise ExportMismatch. Then gradients: a module that detach()es a
branch (the dynamo export keeps it, the legacy export drops it), one that
computes a branch under torch.no_grad() (neither exporter records it) and
one with a straight-through torch.autograd.Function (exported by its
forward alone). argv: examples folder, cleave-opt, scratch."""
import os
import sys
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.join(sys.argv[1], "pytorch"))
from annotate_export import ExportMismatch, check_export  # noqa: E402

cleave_opt, work = sys.argv[2], sys.argv[3]


class Net(nn.Module):
    def __init__(self, dropout=0.0, smoothing=0.0, functional=0.0):
        super().__init__()
        self.conv = nn.Conv1d(2, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(8, 3)
        self.smoothing = smoothing
        self.functional = functional  # F.dropout in forward, no module

    def forward(self, x, y):
        h = self.drop(F.relu(self.bn(self.conv(x))))
        h = F.dropout(h, self.functional, training=self.training).mean(-1)
        return F.cross_entropy(self.fc(h), y, label_smoothing=self.smoothing)


torch.manual_seed(0)
args = (torch.randn(4, 2, 16), torch.tensor([0, 1, 2, 1]))
for name, net in (("plain", Net()), ("dropout", Net(dropout=0.3)),
                  ("functional", Net(functional=0.3)),
                  ("smoothing", Net(smoothing=0.1))):
    path = os.path.join(work, name + ".onnx")
    torch.onnx.export(net, args, path, dynamo=True, optimize=False,
                      verbose=False)
    before = net.bn.running_mean.clone()
    try:
        got = check_export(net, path, args, cleave_opt=cleave_opt)
        print("%s: agree %s, statistics kept %s, still training %s" % (
            name, abs(got[0] - got[1]) <= 1e-4 * abs(got[0]),
            torch.equal(before, net.bn.running_mean), net.training))
    except ExportMismatch as e:
        print("%s: mismatch: %s" % (name, str(e).split(":")[0]))


class DivisorPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x, y):
        h = F.avg_pool2d(torch.tanh(self.conv(x)), 2, divisor_override=3)
        return F.cross_entropy(self.fc(h.flatten(1)), y)


path = os.path.join(work, "divisor-legacy.onnx")
images = (torch.randn(4, 2, 4, 4), torch.tensor([0, 1, 2, 1]))
net = DivisorPool()
torch.onnx.export(net, images, path, dynamo=False, opset_version=17,
                  training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
try:
    got = check_export(net, path, images, cleave_opt=cleave_opt)
    print("divisor-legacy: agree %s" % (abs(got[0] - got[1]) <= 1e-4 * abs(got[0])))
except ExportMismatch as e:
    print("divisor-legacy: mismatch: %s" % str(e).split(":")[0])


class Detached(nn.Module):
    """A branch detached (RAFT's refinement, target networks) and a
    straight-through rounding written with detach() (VQ-VAE)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 3)

    def forward(self, x, y):
        h = torch.tanh(self.a(x))
        q = h + (torch.round(3 * h) / 3 - h).detach()
        return F.cross_entropy(self.b(q * h.detach()), y)


class NoGrad(Detached):
    def forward(self, x, y):
        h = torch.tanh(self.a(x))
        with torch.no_grad():
            t = self.a(x * 2)
        return F.cross_entropy(self.b(h * t), y)


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        return g


class CustomBackward(Detached):
    def forward(self, x, y):
        return F.cross_entropy(self.b(RoundSTE.apply(3 * self.a(x)) / 3), y)


args = (torch.randn(6, 4), torch.tensor([0, 1, 2, 1, 0, 2]))
for name, net, dynamo in (("detach-dynamo", Detached(), True),
                          ("detach-legacy", Detached(), False),
                          ("no_grad-dynamo", NoGrad(), True),
                          ("autograd-function-dynamo", CustomBackward(), True)):
    path = os.path.join(work, name + ".onnx")
    if dynamo:
        torch.onnx.export(net, args, path, dynamo=True, optimize=False, verbose=False)
    else:
        torch.onnx.export(net, args, path, dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False)
    try:
        got = check_export(net, path, args, cleave_opt=cleave_opt)
        print("%s: agree %s" % (name, abs(got[0] - got[1]) <= 1e-4 * abs(got[0])))
    except ExportMismatch as e:
        print("%s: mismatch: %s" % (name, str(e).split(" differs")[0]))
