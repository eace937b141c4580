#!/usr/bin/env python3
"""Record in an exported ONNX file what PyTorch's exporters leave out of it.

Three things the module says about training are not in every export:

- which parameters have requires_grad=False (the sinusoidal position table
  of Marian, Pegasus and RoFormer, a layer frozen for fine-tuning): both
  exporters keep them as initializers like any other, and the dynamo
  exporter's signature calls them PARAMETERs, so cleave would train them;
- an nn.Embedding's padding_idx, whose row never gets a gradient: the dynamo
  exporter records it only in a node's metadata (cleave reads it there), the
  legacy exporter drops it with a warning;
- which initializers are parameters at all: the legacy exporter records
  none (cleave would guess from names and sizes, and hold a one-element
  parameter such as a Conv1d(3, 1)'s bias or a learned temperature).

annotate_export() writes all three into the file's metadata, and cleavec trains
as PyTorch does:

    import torch
    from annotate_export import annotate_export

    wrapped = WithLoss(model)
    torch.onnx.export(wrapped, args, "model.onnx", dynamo=True, optimize=False)
    print(annotate_export(wrapped, "model.onnx"))   # what it recorded

Pass the module you exported: the names are its parameter paths, which are
the initializer names.

check_export() then runs the module and cleave's reading of the file on the
same inputs and compares their losses: an exporter that leaves out part of
what the module computes would otherwise train another loss in silence.

    print(check_export(wrapped, "model.onnx", args))  # raises on a mismatch

The keys are `cleave.frozen` (one parameter name a line),
`cleave.padding_idx` (one `name index` a line, every name of a tied
weight) and `cleave.parameters` (one parameter name a line). A module
with nothing to record gets empty lists, so the call is safe on every
export; `--freeze REGEX` on cleavec holds parameters by hand.
"""

import os
import shutil
import subprocess
import tempfile

import numpy as np
import onnx
import torch

FROZEN = "cleave.frozen"
PADDING = "cleave.padding_idx"
PARAMETERS = "cleave.parameters"


def frozen_names(module):
    """Every name of every parameter with requires_grad=False (tied
    parameters under each of their names)."""
    return [n for n, p in module.named_parameters(remove_duplicate=False)
            if not p.requires_grad]


def parameter_names(module):
    """Every name of every parameter (tied ones under each name): what a
    legacy export, which has no signature, trains."""
    return [n for n, _ in module.named_parameters(remove_duplicate=False)]


def padding_rows(module):
    """[(parameter name, padding_idx)] for every nn.Embedding with a
    padding_idx, under every name its weight has (a tied output layer)."""
    names = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    rows = []
    for m in module.modules():
        if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None:
            idx = m.padding_idx % m.num_embeddings
            rows += [(n, idx) for n in names.get(id(m.weight), [])]
    return rows


def annotate_export(module, path):
    """Writes frozen_names(module), padding_rows(module) and
    parameter_names(module) into the metadata of the ONNX file at `path`
    (replacing earlier ones) and returns the first two, and how many
    parameter names, as a dict. External weight files are left as they
    are."""
    frozen, padding = frozen_names(module), padding_rows(module)
    params = parameter_names(module)
    model = onnx.load(path, load_external_data=False)
    kept = [p for p in model.metadata_props
            if p.key not in (FROZEN, PADDING, PARAMETERS)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, lines in ((FROZEN, frozen), (PADDING, ["%s %d" % r for r in padding]),
                       (PARAMETERS, params)):
        if lines:
            entry = model.metadata_props.add()
            entry.key = key
            entry.value = "\n".join(lines)
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return {"frozen": frozen, "padding_idx": dict(padding), "parameters": len(params)}


class ExportMismatch(Exception):
    """The export computes another loss than the module."""


def _cleave_opt(path):
    if path:
        return path
    for candidate in (os.environ.get("CLEAVE_OPT"), shutil.which("cleave-opt"),
                      os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   "..", "..", "build", "tools", "cleave-opt")):
        if candidate and os.path.exists(candidate):
            return candidate
    raise FileNotFoundError("cleave-opt not found: pass cleave_opt=, set "
                            "CLEAVE_OPT, or put build/tools on PATH")


def _gradient_gap(cleave, torch_grads, initializers):
    """(worst relative difference, its parameter name) between cleave's
    gradients {initializer: array} and PyTorch's {parameter name: array}
    over the parameters the file holds as initializers of the same name (a
    parameter cleave does not train, having found no gradient path to it,
    counts as a zero gradient): per tensor max|g - g_torch| over the
    tensor's max|g_torch|, or over 1e-4 of the model's largest where the
    tensor's is below that (a gradient that is zero but for rounding)."""
    common = [n for n in torch_grads if n in initializers]
    scale = max([float(np.max(np.abs(torch_grads[n]))) for n in common
                 if torch_grads[n].size] + [1e-30])
    worst, name = 0.0, None
    for n in common:
        ref = torch_grads[n].astype(np.float64)
        g = cleave[n].astype(np.float64) if n in cleave else np.zeros_like(ref)
        if ref.size == 0:
            continue
        own = float(np.max(np.abs(ref)))
        gap = float(np.max(np.abs(g - ref))) / max(own, 1e-4 * scale)
        if not np.isfinite(gap):
            gap = float("inf")
        if gap > worst:
            worst, name = gap, n
    return worst, name


def check_export(module, path, args, cleave_opt=None, rtol=1e-4, grads=True,
                 grad_rtol=1e-2):
    """The loss `module(*args)` computes and the loss cleave computes from
    the export at `path` on the same inputs (`cleave-opt PATH --run`), as
    (module_loss, export_loss); ExportMismatch (one line) when they differ
    by more than `rtol` of the module's. The module runs without gradients
    and its buffers (BatchNorm statistics) are put back afterwards. A module
    in train() with an active dropout (random masks on both sides) is
    compared in eval() on both sides (`--module-mode=eval`): the same
    function, without the randomness. Dropout is found as an nn.Dropout
    module, or as a loss that moves between two runs on the same inputs
    (F.dropout called in forward, as HF's OPT and BART do).

    With `grads` (the default), the parameters' gradients too: PyTorch's
    backward of the module's loss against the gradients cleave derives
    from the file (`cleave-opt PATH --passes=gradients --run`); a tensor
    that differs by more than `grad_rtol` of its largest element raises
    ExportMismatch. The loss can agree while the gradients do not: the
    legacy exporter drops detach(), neither exporter records
    torch.no_grad() inside forward, and a custom torch.autograd.Function
    is exported by its forward alone, so cleave would differentiate what
    the module's backward does not."""
    modes = {m: m.training for m in module.modules()}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}

    def restore():  # the BatchNorm statistics a run in train() moved
        with torch.no_grad():
            for n, b in module.named_buffers():
                b.copy_(buffers[n])

    def loss():
        with torch.no_grad():
            value = float(module(*args))
        restore()
        return value

    torch_grads = {}
    try:
        dropout = module.training and any(
            isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
            for m in module.modules())
        want = None if dropout else loss()
        if module.training and not dropout and loss() != want:
            dropout = True  # random numbers drawn in forward: F.dropout
        if dropout:
            module.eval()
            want = loss()
        if grads:
            params = list(module.named_parameters(remove_duplicate=False))
            saved = [(p, None if p.grad is None else p.grad.clone()) for _, p in params]
            for _, p in params:
                p.grad = None
            try:
                module(*args).backward()
                for n, p in params:
                    if p.requires_grad:
                        torch_grads[n] = (np.zeros(tuple(p.shape), np.float32) if p.grad is None
                                          else p.grad.detach().cpu().numpy())
            finally:
                for p, g in saved:
                    p.grad = g
    finally:
        for m, training in modes.items():
            m.training = training
        restore()
    model = onnx.load(path, load_external_data=False)
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    if len(names) != len(args):
        raise ValueError("the export has %d inputs (%s), %d args given" % (
            len(names), ", ".join(names), len(args)))
    work = tempfile.mkdtemp(prefix="cleave-check-")
    mode = ["--module-mode=eval"] if dropout else []
    try:
        os.makedirs(os.path.join(work, "in"))
        for name, a in zip(names, args):
            np.save(os.path.join(work, "in", name + ".npy"),
                    a.detach().cpu().numpy())
        out = os.path.join(work, "out")
        run = subprocess.run([_cleave_opt(cleave_opt), path, "--run",
                              "--inputs=" + os.path.join(work, "in"),
                              "--outputs=" + out] + mode,
                             capture_output=True, text=True)
        if run.returncode:
            raise ExportMismatch("cleave could not run the export: " +
                                 (run.stderr.strip().splitlines() or ["?"])[-1])
        loss_name = model.graph.output[0].name
        got = float(np.load(os.path.join(out, loss_name + ".npy")))
        cleave_grads = {}
        if grads and abs(got - want) <= rtol * max(abs(want), 1e-12):
            gout = os.path.join(work, "grads")
            run = subprocess.run([_cleave_opt(cleave_opt), path, "--passes=gradients",
                                  "--run", "--inputs=" + os.path.join(work, "in"),
                                  "--outputs=" + gout] + mode,
                                 capture_output=True, text=True)
            if run.returncode:
                raise ExportMismatch("cleave could not differentiate the export: " +
                                     (run.stderr.strip().splitlines() or ["?"])[-1])
            for f in os.listdir(gout):
                if f.startswith("grad.") and f.endswith(".npy"):
                    cleave_grads[f[5:-4]] = np.load(os.path.join(gout, f))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not abs(got - want) <= rtol * max(abs(want), 1e-12):
        raise ExportMismatch(
            "the export computes loss %.8g where the module computes %.8g "
            "(relative difference %.2e): the file does not compute what the "
            "module does (an argument the exporter dropped?); cleave would "
            "train the file's loss" % (got, want, abs(got - want) / max(abs(want), 1e-12)))
    if grads:
        gap, worst = _gradient_gap(cleave_grads, torch_grads, inits)
        if gap > grad_rtol:
            raise ExportMismatch(
                "the gradient cleave derives from the file for '%s' differs "
                "from PyTorch's by %.2e of its largest element: the module "
                "stops or replaces a gradient the file does not record "
                "(detach() in a legacy export, torch.no_grad() inside "
                "forward, a custom autograd.Function's backward); cleave "
                "would train another gradient" % (worst, gap))
    return want, got
