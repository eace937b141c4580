#!/usr/bin/env python3
"""Regenerate the gradient-parity fixtures in tests/models/training/.

Run with Debian's PyTorch 1.13 / onnx 1.12 / numpy:
    /usr/bin/python3 tests/models/export_training.py

For every model it writes tests/models/training/<name>/:
    model.onnx                 training-mode export (opset 17, fixed shapes,
                               do_constant_folding=False) of a module whose
                               forward returns the scalar loss
    inputs/<input>.npy         the exact inputs (float32 / int64)
    reference/loss.npy         the loss, float32, shape ()
    reference/grad.<init>.npy  d loss / d parameter for every trainable
                               parameter, keyed by its ONNX initializer name
    reference/params.txt       those initializer names, in the order of the
                               graph's initializer list
    reference/sgd/<init>.npy   every parameter after one torch.optim.SGD step
                               (lr 0.1, momentum 0.9, Nesterov, weight decay
                               0.01) from the exported values with the f32
                               gradients above
    reference/adamw/<init>.npy the same for one torch.optim.AdamW step (lr
                               0.01, betas (0.9, 0.999), eps 1e-8, weight
                               decay 0.01)
    reference/running/<buf>.npy        (models with BatchNorm) the module's
                               running_mean / running_var after the forward
                               pass in train mode: PyTorch's update, momentum
                               0.1, running_var from the UNBIASED batch
                               variance
    reference/running_onnx/<buf>.npy   the same statistics as the ONNX
                               BatchNormalization spec (training_mode=1)
                               defines them: input * momentum + current *
                               (1 - momentum) with the node's float momentum
                               attribute and the POPULATION batch variance
    steps/                     a multi-step training fixture (write_steps),
                               after everything above and from a generator
                               of its own, so the files above are unchanged:
      data/<input>.npy         a dataset of 3 steps x 4 microbatches, N =
                               12 * B rows (B the exported batch size), the
                               inputs' dtypes; floats standard normal,
                               integers uniform in make_<model>'s range;
                               row (s * 4 + m) * B + k is sample k of
                               microbatch m of step s
      params/<init>.npy        every parameter after 3 steps of plain
                               torch.optim.SGD (lr 0.1, momentum 0.9, no
                               Nesterov, no weight decay) from the exported
                               values in train mode, float32; each step:
                               zero_grad, (loss(microbatch m) / 4).backward()
                               for m = 0..3, opt.step()
      losses.npy               float32 [3]: each step's mean microbatch loss
                               (before its update)
      buffers/<buf>.npy        (models with BatchNorm) the running statistics
                               after the 12 microbatch forwards, PyTorch's
                               rule, starting from the values in model.onnx
      buffers_onnx/<buf>.npy   the same by the ONNX rule of running_onnx/,
                               one update per microbatch forward in order,
                               rounded to float32 after each
      hyper.txt                lr, momentum, microbatches, steps, batch

References come from PyTorch autograd in float32 on the same module and
inputs in train() mode. They are also computed in float64; when the f32 and
f64 gradients of a model differ by more than F64_THRESHOLD (relative error
norm, see rel_err) the f64 references, cast to float32, are stored instead.
Everything is seeded, so two runs write identical files. See README.md.
"""

import collections
import copy
import math
import os
import shutil

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "training")
OPSET = 17
F64_THRESHOLD = 1e-5


# --------------------------------------------------------------------------
# mlp: Gemm and the common activations, cross-entropy

# The forward test models' MLP (export_models.py), returning its loss.
import export_models  # noqa: E402


class MLP(export_models.MLP):
    def __init__(self):
        super().__init__(d_hidden=24)

    def forward(self, x, labels):
        return F.cross_entropy(super().forward(x), labels)


def make_mlp():
    torch.manual_seed(11)
    model = MLP()
    x = torch.randn(8, 16)
    labels = torch.randint(0, 10, (8,))
    return model, collections.OrderedDict([("x", x), ("labels", labels)])


# --------------------------------------------------------------------------
# gpt: tiny GPT, tied embeddings, split in attention, chunk in the MLP

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.n_embd = n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("mask", mask.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)   # Split
        hs = self.n_embd // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GatedMLP(nn.Module):
    """GEGLU-style MLP: one projection chunked into value and gate."""

    def __init__(self, n_embd, hidden):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 2 * hidden)
        self.c_proj = nn.Linear(hidden, n_embd)

    def forward(self, x):
        a, g = self.c_fc(x).chunk(2, dim=-1)                  # chunk -> Split
        return self.c_proj(a * F.gelu(g))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = GatedMLP(n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TiedGPT(nn.Module):
    def __init__(self, vocab=64, block_size=16, n_layer=2, n_head=2, n_embd=32):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(
            [Block(n_embd, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight                 # tied
        # nn.Embedding starts at N(0, 1), which with the tied lm_head gives
        # logits of std ~6 and a saturated softmax; use N(0, 0.1^2).
        # LayerNorm starts at weight 1, bias 0; perturb them so that their
        # gradients (and a wrong sign or transpose) are not hidden.
        with torch.no_grad():
            self.wte.weight.normal_(0.0, 0.1)
            self.wpe.weight.normal_(0.0, 0.1)
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.add_(0.1 * torch.randn_like(m.weight))
                    m.bias.add_(0.1 * torch.randn_like(m.bias))

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def make_gpt():
    torch.manual_seed(12)
    model = TiedGPT()
    idx = torch.randint(0, 64, (2, 16))
    targets = torch.randint(0, 64, (2, 16))
    return model, collections.OrderedDict([("idx", idx), ("targets", targets)])


# --------------------------------------------------------------------------
# cnn: small ResNet, BatchNorm with batch statistics, residual adds, pooling

# The residual block is the one of the forward test models (export_models.py).
from export_models import ResidualBlock  # noqa: E402


class CNN(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        # A conv bias right before a BatchNorm has an exactly zero gradient
        # (the batch mean removes it; autograd returns rounding noise), so
        # the conv with a bias is the last one, which feeds no BatchNorm.
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2))                      # 12x12 -> 6x6
        self.block = ResidualBlock(8)
        self.pool = nn.AvgPool2d(2)              # 6x6 -> 3x3 (Pad + AveragePool)
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)       # GlobalAveragePool
        self.fc = nn.Linear(16, n_classes)
        # BatchNorm starts at weight 1, bias 0; perturb (see TiedGPT).
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.weight.add_(0.1 * torch.randn_like(m.weight))
                    m.bias.add_(0.1 * torch.randn_like(m.bias))

    def forward(self, x, labels):
        x = self.pool(self.block(self.stem(x)))
        x = F.relu(self.conv(x))
        x = torch.flatten(self.gap(x), 1)
        return F.cross_entropy(self.fc(x), labels)


def make_cnn():
    torch.manual_seed(13)
    model = CNN()
    x = torch.randn(4, 3, 12, 12)
    labels = torch.randint(0, 10, (4,))
    return model, collections.OrderedDict([("x", x), ("labels", labels)])


# --------------------------------------------------------------------------
# mlp_mse: MSE loss (Sub, Pow, ReduceMean), a Linear without bias
#
# PyTorch 1.13 cannot export aten::mse_loss (UnsupportedOperatorError at
# every opset), so the loss is spelled out; it is checked against
# F.mse_loss below.

class MLPMSE(nn.Module):
    def __init__(self, d_in=8, d_hidden=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden, bias=False)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x, y):
        h = torch.tanh(self.fc1(x))
        h = F.relu(self.fc2(h))
        return ((self.fc3(h) - y) ** 2).mean()


def make_mlp_mse():
    torch.manual_seed(14)
    model = MLPMSE()
    x = torch.randn(4, 8)
    y = torch.randn(4, 4)
    with torch.no_grad():
        h = F.relu(model.fc2(torch.tanh(model.fc1(x))))
        assert torch.allclose(model(x, y), F.mse_loss(model.fc3(h), y), rtol=1e-6, atol=0)
    return model, collections.OrderedDict([("x", x), ("y", y)])


MODELS = [("mlp", make_mlp), ("gpt", make_gpt), ("cnn", make_cnn),
          ("mlp_mse", make_mlp_mse)]

# One optimizer step per model from the exported parameters (see
# optimizer_step). The hyper-parameters are the ones the optimizer parity
# test (tests/unit/optimizer_parity_test.cpp) gives cleave.
OPTIMIZERS = collections.OrderedDict([
    ("sgd", lambda params: torch.optim.SGD(
        params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adamw", lambda params: torch.optim.AdamW(
        params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
])

# The multi-step fixture (steps/, see multi_step): STEPS optimizer steps of
# plain SGD, each accumulating the gradients of MICROBATCHES microbatches of
# the exported batch size, over a dataset drawn with its own generator
# (seeded STEPS_SEED + the model's index in MODELS), so that the RNG use of
# everything above is unchanged. STEPS_INT_RANGE: the exclusive upper bound
# of each integer input, the one make_<model> draws it with (lower bound 0).
STEPS = 3
MICROBATCHES = 4
STEPS_LR = 0.1
STEPS_MOMENTUM = 0.9
STEPS_SEED = 1000
STEPS_INT_RANGE = {
    "mlp": {"labels": 10},
    "gpt": {"idx": 64, "targets": 64},
    "cnn": {"labels": 10},
    "mlp_mse": {},
}


# --------------------------------------------------------------------------

def rel_err(g, ref):
    """max over elements |g - ref| / max(max|ref|, 1e-6)."""
    g = np.asarray(g, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-6)
    return float(np.max(np.abs(g - ref))) / scale if ref.size else 0.0


def autograd(model, inputs, dtype):
    """Loss and {parameter name: gradient} in dtype, on a copy of model."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    args = [t.to(dtype) if t.is_floating_point() else t for t in inputs.values()]
    m.zero_grad()
    loss = m(*args)
    loss.backward()
    grads = collections.OrderedDict(
        (n, p.grad.detach().clone()) for n, p in m.named_parameters())
    return loss.detach(), grads


def optimizer_step(model, inputs, make_opt, dtype):
    """{parameter name: value after one step}, on a copy of model in dtype.

    The forward and backward pass are autograd()'s (train mode, zeroed
    gradients); the optimizer starts with empty state, as cleave's does."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    args = [t.to(dtype) if t.is_floating_point() else t for t in inputs.values()]
    opt = make_opt(m.parameters())
    opt.zero_grad()
    m(*args).backward()
    opt.step()
    return collections.OrderedDict(
        (n, p.detach().clone()) for n, p in m.named_parameters())


def running_statistics(model, inputs, graph):
    """BatchNorm running statistics after one train-mode forward pass.

    Both start from the running statistics exported in model.onnx, which
    are not the module's initial 0 / 1: the exporter's tracing forward pass
    in train mode updated them once before they were written. They are
    copied into the module first.

    Returns ({buffer: PyTorch's value}, {buffer: the ONNX spec's value}),
    both float32, keyed by initializer name. PyTorch: running = (1 - 0.1) *
    running + 0.1 * batch, with the unbiased batch variance. ONNX
    (BatchNormalization-15, training_mode=1): running = input * momentum +
    current * (1 - momentum), momentum the node's float attribute (0.9 as
    float32), current_var the population variance. The batch statistics are
    taken in float64 from each BatchNorm's float32 input."""
    m = copy.deepcopy(model)
    m.train()
    bns = collections.OrderedDict(
        (n, mod) for n, mod in m.named_modules() if isinstance(mod, nn.BatchNorm2d))
    if not bns:
        return {}, {}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    with torch.no_grad():
        for n, mod in bns.items():
            for suffix in ("running_mean", "running_var"):
                getattr(mod, suffix).copy_(torch.from_numpy(inits[n + "." + suffix]))
    seen = {}
    hooks = [mod.register_forward_hook(
        lambda mod, args, out, n=n: seen.__setitem__(n, args[0].detach().clone()))
        for n, mod in bns.items()]
    before = {n: (mod.running_mean.clone(), mod.running_var.clone())
              for n, mod in bns.items()}
    with torch.no_grad():
        m(*inputs.values())
    for h in hooks:
        h.remove()
    nodes = {n.input[3]: n for n in graph.node if n.op_type == "BatchNormalization"}
    torch_ref, onnx_ref = {}, {}
    for n, mod in bns.items():
        x = seen[n].double()
        count = x.numel() // x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        mean = x.mean(dims)
        pop_var = x.var(dims, unbiased=False)
        rm0, rv0 = (t.double() for t in before[n])
        # PyTorch's update, recomputed: the unbiased variance, momentum 0.1.
        assert mod.momentum == 0.1
        assert torch.allclose(mod.running_mean.double(), 0.9 * rm0 + 0.1 * mean,
                              rtol=1e-6, atol=1e-7), n
        assert torch.allclose(mod.running_var.double(),
                              0.9 * rv0 + 0.1 * pop_var * count / (count - 1),
                              rtol=1e-6, atol=1e-7), n
        node = nodes[n + ".running_mean"]
        assert list(node.input[3:5]) == [n + ".running_mean", n + ".running_var"]
        attrs = {a.name: a for a in node.attribute}
        assert attrs["training_mode"].i == 1 and len(node.output) == 3, n
        momentum = float(attrs["momentum"].f)  # float32 0.9 = 0.8999999762
        for suffix, t_val, batch, init in (("running_mean", mod.running_mean, mean, rm0),
                                           ("running_var", mod.running_var, pop_var, rv0)):
            torch_ref[n + "." + suffix] = t_val.detach().to(torch.float32).numpy()
            onnx_ref[n + "." + suffix] = (init * momentum + batch * (1.0 - momentum)) \
                .to(torch.float32).numpy()
    return torch_ref, onnx_ref


def steps_dataset(name, inputs):
    """{input: array of STEPS * MICROBATCHES * B rows}, B the exported batch.

    Same dtypes and trailing shapes as the exported inputs; float inputs
    standard normal, integer inputs uniform in [0, STEPS_INT_RANGE). Drawn
    with a generator of its own. Row (s * MICROBATCHES + m) * B + k is
    sample k of microbatch m of step s."""
    gen = torch.Generator().manual_seed(
        STEPS_SEED + [n for n, _ in MODELS].index(name))
    ranges = STEPS_INT_RANGE[name]
    data = collections.OrderedDict()
    for k, t in inputs.items():
        shape = (STEPS * MICROBATCHES * t.shape[0],) + tuple(t.shape[1:])
        if t.is_floating_point():
            assert k not in ranges, k
            d = torch.randn(shape, generator=gen, dtype=t.dtype)
        else:
            assert int(t.min()) >= 0 and int(t.max()) < ranges[k], k
            d = torch.randint(0, ranges[k], shape, generator=gen, dtype=t.dtype)
        data[k] = d
    assert set(ranges) <= set(data), ranges
    return data


def multi_step(model, data, batch, graph, dtype):
    """STEPS steps of SGD (lr STEPS_LR, momentum STEPS_MOMENTUM, no
    Nesterov, no weight decay) on a copy of model in dtype, train mode.

    Each step: zero_grad; for each of the MICROBATCHES microbatches of B
    rows, loss = model(microbatch); (loss / MICROBATCHES).backward(); then
    opt.step(). Returns ({parameter name: value after the steps}, [mean
    microbatch loss of each step, before its update], {buffer: PyTorch's
    running statistic}, {buffer: the ONNX spec's}), the buffer dicts float32
    and empty without BatchNorm.

    The BatchNorm running statistics start from the values in model.onnx
    (see running_statistics) and are updated once per microbatch forward,
    in order. PyTorch's are the module's own. The ONNX ones follow
    running_statistics' ONNX rule (float32 momentum attribute, population
    variance, computed in float64 from the BatchNorm's input) and are
    rounded to float32 after every update, as the float32 buffers of the
    graph are."""
    m = copy.deepcopy(model).to(dtype)
    m.train()
    bns = collections.OrderedDict(
        (n, mod) for n, mod in m.named_modules() if isinstance(mod, nn.BatchNorm2d))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    nodes = {n.input[3]: n for n in graph.node if n.op_type == "BatchNormalization"}
    onnx_state, momenta = {}, {}
    with torch.no_grad():
        for n, mod in bns.items():
            for suffix in ("running_mean", "running_var"):
                a = inits[n + "." + suffix]
                getattr(mod, suffix).copy_(torch.from_numpy(a))
                onnx_state[n + "." + suffix] = torch.from_numpy(a.copy())
            attrs = {a.name: a for a in nodes[n + ".running_mean"].attribute}
            assert attrs["training_mode"].i == 1, n
            momenta[n] = float(attrs["momentum"].f)

    def onnx_update(mod, args, out, n):
        x = args[0].detach().to(torch.float32).double()
        dims = [d for d in range(x.dim()) if d != 1]
        mom = momenta[n]
        for suffix, batch in (("running_mean", x.mean(dims)),
                              ("running_var", x.var(dims, unbiased=False))):
            key = n + "." + suffix
            onnx_state[key] = (onnx_state[key].double() * mom
                               + batch * (1.0 - mom)).to(torch.float32)

    hooks = [mod.register_forward_hook(
        lambda mod, args, out, n=n: onnx_update(mod, args, out, n))
        for n, mod in bns.items()]
    opt = torch.optim.SGD(m.parameters(), lr=STEPS_LR, momentum=STEPS_MOMENTUM,
                          nesterov=False, weight_decay=0)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        step_losses = []
        for mb in range(MICROBATCHES):
            rows = slice((s * MICROBATCHES + mb) * batch,
                         (s * MICROBATCHES + mb + 1) * batch)
            args = [t[rows].to(dtype) if t.is_floating_point() else t[rows]
                    for t in data.values()]
            loss = m(*args)
            (loss / MICROBATCHES).backward()
            step_losses.append(float(loss.detach()))
        losses.append(sum(step_losses) / MICROBATCHES)
        opt.step()
    for h in hooks:
        h.remove()
    params = collections.OrderedDict(
        (n, p.detach().clone()) for n, p in m.named_parameters())
    torch_bufs = {}
    for n, mod in bns.items():
        for suffix in ("running_mean", "running_var"):
            torch_bufs[n + "." + suffix] = \
                getattr(mod, suffix).detach().to(torch.float32).numpy()
    onnx_bufs = {k: v.numpy() for k, v in onnx_state.items()}
    return params, losses, torch_bufs, onnx_bufs


def write_steps(name, model, inputs, graph, mapping, folder):
    """Write <folder>/steps/ (see the module docstring); returns report lines."""
    sdir = os.path.join(folder, "steps")
    batch = next(iter(inputs.values())).shape[0]
    assert all(t.shape[0] == batch for t in inputs.values())
    data = steps_dataset(name, inputs)
    p32, l32, tb32, ob32 = multi_step(model, data, batch, graph, torch.float32)
    p64, l64, _, ob64 = multi_step(model, data, batch, graph, torch.float64)
    for k, t in data.items():
        a = t.numpy()
        assert a.dtype == inputs[k].numpy().dtype, k
        save(os.path.join(sdir, "data", k + ".npy"), a)
    for pname, init in mapping.items():
        a = p32[pname].numpy()
        assert a.dtype == np.float32
        save(os.path.join(sdir, "params", init + ".npy"), a)
    save(os.path.join(sdir, "losses.npy"), np.asarray(l32, dtype=np.float32))
    for sub, values in (("buffers", tb32), ("buffers_onnx", ob32)):
        for buf, a in sorted(values.items()):
            assert a.dtype == np.float32, buf
            save(os.path.join(sdir, sub, buf + ".npy"), a)
    with open(os.path.join(sdir, "hyper.txt"), "w") as f:
        f.write("lr %g\nmomentum %g\nmicrobatches %d\nsteps %d\nbatch %d\n" % (
            STEPS_LR, STEPS_MOMENTUM, MICROBATCHES, STEPS, batch))
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(sdir) for f in fs)
    err, worst = max((rel_err(p32[n].numpy(), p64[n].numpy()), n) for n in p32)
    moved = max(rel_err(p32[n].numpy(), p.detach().numpy())
                for n, p in model.named_parameters())
    lines = ["steps/: %d x %d microbatches of %d, %d bytes; losses %s; "
             "params moved (rel) %.2e; f32 vs f64 max param rel err %.2e (%s)" % (
                 STEPS, MICROBATCHES, batch, size,
                 " ".join("%.6f" % v for v in l32), moved, err, worst)]
    if ob32:
        bdiff = max(rel_err(ob32[b], ob64[b]) for b in ob32)
        tdiff = max(rel_err(ob32[b], tb32[b]) for b in ob32 if b.endswith("running_var"))
        lines.append("steps/ running stats: ONNX f32 vs f64 %.2e; running_var "
                     "ONNX vs PyTorch %.2e" % (bdiff, tdiff))
    return lines


def map_params(model, graph):
    """{parameter name: initializer name}, and a list of naming surprises."""
    inits = {i.name: i for i in graph.initializer}
    mapping, notes = {}, []
    for name, p in model.named_parameters():  # tied weights appear once
        if name in inits:
            mapping[name] = name
            continue
        # renamed by the exporter: find it by value
        want = p.detach().numpy()
        hits = [i.name for i in graph.initializer
                if tuple(i.dims) == want.shape and i.data_type == onnx.TensorProto.FLOAT
                and np.array_equal(onnx.numpy_helper.to_array(i), want)]
        if len(hits) != 1:
            raise SystemExit("parameter %s: %d matching initializers %s" % (name, len(hits), hits))
        mapping[name] = hits[0]
        notes.append("parameter %s exported as initializer %s" % (name, hits[0]))
    return mapping, notes


def save(path, array):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, array, allow_pickle=False)


def build(name, make):
    model, inputs = make()
    folder = os.path.join(OUT, name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)

    # References first, on copies (the export's tracing run in train mode
    # updates BatchNorm running statistics of the module it is given).
    loss32, g32 = autograd(model, inputs, torch.float32)
    loss64, g64 = autograd(model, inputs, torch.float64)

    path = os.path.join(folder, "model.onnx")
    model.train()
    torch.onnx.export(copy.deepcopy(model), tuple(inputs.values()), path,
                      input_names=list(inputs.keys()), output_names=["loss"],
                      opset_version=OPSET, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False)
    onnx.checker.check_model(path)
    m = onnx.load(path)
    onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
    graph = m.graph

    mapping, notes = map_params(model, graph)
    param_inits = set(mapping.values())
    if len(param_inits) != len(mapping):
        raise SystemExit("%s: two parameters share an initializer" % name)

    # f32 vs f64
    diffs = {n: rel_err(g32[n].numpy(), g64[n].numpy()) for n in g32}
    worst = max(diffs.values())
    loss_diff = abs(float(loss32) - float(loss64)) / max(abs(float(loss64)), 1e-6)
    use64 = worst > F64_THRESHOLD
    loss_ref = (loss64 if use64 else loss32).to(torch.float32).numpy()
    grads = g64 if use64 else g32

    for k, t in inputs.items():
        a = t.numpy()
        assert a.dtype in (np.float32, np.int64), (k, a.dtype)
        save(os.path.join(folder, "inputs", k + ".npy"), a)
    save(os.path.join(folder, "reference", "loss.npy"), np.asarray(loss_ref, dtype=np.float32).reshape(()))
    for pname, init in mapping.items():
        save(os.path.join(folder, "reference", "grad.%s.npy" % init),
             grads[pname].to(torch.float32).numpy())
    order = [i.name for i in graph.initializer if i.name in param_inits]
    with open(os.path.join(folder, "reference", "params.txt"), "w") as f:
        f.write("".join(n + "\n" for n in order))

    # Checks: every float initializer that is a parameter has exactly one
    # reference of the same shape; graph inputs are the fixture inputs.
    ref_dir = os.path.join(folder, "reference")
    files = sorted(x for x in os.listdir(ref_dir) if x.startswith("grad."))
    assert files == sorted("grad.%s.npy" % n for n in param_inits), files
    for i in graph.initializer:
        if i.name in param_inits:
            assert i.data_type == onnx.TensorProto.FLOAT, i.name
            g = np.load(os.path.join(ref_dir, "grad.%s.npy" % i.name))
            assert g.shape == tuple(i.dims) and g.dtype == np.float32, (i.name, g.shape, i.dims)
    params = dict(model.named_parameters())
    inv = {v: k for k, v in mapping.items()}
    for i in graph.initializer:
        if i.name in param_inits:  # the exported values are the parameters
            assert np.array_equal(onnx.numpy_helper.to_array(i),
                                  params[inv[i.name]].detach().numpy()), i.name
    init_names = {i.name for i in graph.initializer}
    graph_inputs = [i.name for i in graph.input if i.name not in init_names]
    assert graph_inputs == list(inputs.keys()), graph_inputs
    assert [o.name for o in graph.output] == ["loss"]
    others = [i.name for i in graph.initializer if i.name not in param_inits]

    # One optimizer step per optimizer (f32, stored) and its f32-vs-f64
    # difference (printed), from the same parameters and inputs.
    step_diffs = {}
    for opt_name, make_opt in OPTIMIZERS.items():
        p32 = optimizer_step(model, inputs, make_opt, torch.float32)
        p64 = optimizer_step(model, inputs, make_opt, torch.float64)
        for pname, init in mapping.items():
            save(os.path.join(folder, "reference", opt_name, init + ".npy"),
                 p32[pname].numpy())
        step_diffs[opt_name] = max((rel_err(p32[n].numpy(), p64[n].numpy()), n) for n in p32)
    torch_running, onnx_running = running_statistics(model, inputs, graph)
    for sub, values in (("running", torch_running), ("running_onnx", onnx_running)):
        for buf, a in sorted(values.items()):
            assert buf in others and a.dtype == np.float32, buf
            save(os.path.join(folder, "reference", sub, buf + ".npy"), a)

    # Report
    hist = collections.Counter(n.op_type for n in graph.node)
    n_params = sum(p.numel() for p in model.parameters())
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(folder) for f in fs)
    print("%s: %d parameter tensors, %d parameters, %d nodes, model.onnx %d bytes, folder %d bytes" % (
        name, len(mapping), n_params, len(graph.node), os.path.getsize(path), size))
    print("  ops: " + ", ".join("%s %d" % kv for kv in sorted(hist.items())))
    print("  loss %.6f; f32 vs f64: loss rel %.2e, max grad rel err %.2e (%s); stored %s" % (
        float(loss32), loss_diff, worst, max(diffs, key=diffs.get), "f64->f32" if use64 else "f32"))
    print("  other initializers (not parameters): %s" % (", ".join(others) or "none"))
    for opt_name, (err, pname) in step_diffs.items():
        print("  %s step: f32 vs f64 max param rel err %.2e (%s)" % (opt_name, err, pname))
    if torch_running:
        var_diff = max(rel_err(onnx_running[b], torch_running[b])
                       for b in torch_running if b.endswith("running_var"))
        mean_diff = max(rel_err(onnx_running[b], torch_running[b])
                        for b in torch_running if b.endswith("running_mean"))
        print("  BatchNorm running stats, ONNX spec vs PyTorch: running_mean rel %.2e, "
              "running_var rel %.2e" % (mean_diff, var_diff))
    for n in notes:
        print("  note: " + n)

    # Multi-step fixture: after everything above, with its own generator.
    for line in write_steps(name, model, inputs, graph, mapping, folder):
        print("  " + line)
    return {"name": name, "worst": worst, "use64": use64}


def main():
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    results = [build(name, make) for name, make in MODELS]
    print("f32-vs-f64 max relative gradient difference: " + ", ".join(
        "%s %.2e" % (r["name"], r["worst"]) for r in results))


if __name__ == "__main__":
    main()
