#!/usr/bin/env python3
"""Load the weights cleave trained back into the PyTorch module they came from.

`cleave-run PLAN.cplan ... --save trained.onnx` writes the exported model
with the trained parameters and buffers in its initializers, under the names
the exporter gave them: the module paths of the module that was exported.
That module is usually a wrapper that returns the loss (`self.m = model`),
so the names carry its prefix: `m.transformer.h.0.attn.c_attn.weight` is
`transformer.h.0.attn.c_attn.weight` of the model itself. load_trained()
finds that prefix, maps every parameter and buffer of the module you pass
(the wrapper or the model inside it) to its initializer, checks shapes and
copies the values in:

    import torch, transformers
    from load_trained import load_trained

    model = transformers.GPT2LMHeadModel(config)   # the class you exported
    report = load_trained(model, "gpt2-trained.onnx")
    print(report)        # what was loaded, and what was not
    torch.save(model.state_dict(), "gpt2-trained.pt")

Tied parameters (GPT-2's lm_head and wte) are one tensor in PyTorch and one
initializer in the export, under whichever name the exporter kept; either
name finds it. Buffers the export does not hold (BatchNorm's
num_batches_tracked, non-persistent buffers the legacy exporter wrote as
constants) keep their values and are listed in the report, and so do
parameters the exported forward never used (the exporter leaves them out:
XLNet's mask_emb). A shape that differs, or a module none of whose names
the export holds, is an error: the module is not the one exported.

From the command line (needs torch and onnx):

    python load_trained.py trained.onnx --module mypkg.models:make_model \\
        -o trained.pt

imports `make_model` from `mypkg.models`, calls it with no arguments to get
the module, loads the weights and saves its state_dict to trained.pt.
"""

import argparse
import collections
import importlib
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch


class LoadReport:
    """What load_trained() did: module names loaded (with the initializer
    each came from), buffers left as they were, initializers not used."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.parameters = collections.OrderedDict()  # module name: initializer
        self.buffers = collections.OrderedDict()
        self.buffers_kept = []        # buffers the export does not hold
        self.parameters_kept = []     # parameters the export does not hold
        self.initializers_unused = []

    def __str__(self):
        lines = ["loaded %d parameters and %d buffers (initializer prefix %r)"
                 % (len(self.parameters), len(self.buffers), self.prefix)]
        if self.parameters_kept:
            lines.append("parameters not in the export (the exported forward "
                         "does not use them), kept as they were: "
                         + ", ".join(self.parameters_kept))
        if self.buffers_kept:
            lines.append("buffers not in the export, kept as they were: "
                         + ", ".join(self.buffers_kept))
        if self.initializers_unused:
            lines.append("initializers no module tensor maps to: "
                         + ", ".join(self.initializers_unused))
        return "\n".join(lines)


def module_tensors(module):
    """[(names, tensor, is_parameter)]: each parameter and buffer once, with
    every name it has in the module (a tied parameter has several)."""
    by_id = collections.OrderedDict()
    for name, p in module.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), ([], p, True))[0].append(name)
    for name, b in module.named_buffers(remove_duplicate=False):
        by_id.setdefault(id(b), ([], b, False))[0].append(name)
    return list(by_id.values())


def find_prefix(tensors, initializer_names):
    """The prefix P for which P + name is an initializer for the most module
    names: "" when the module is the one exported, "m." (say) when it is the
    model inside the exported wrapper."""
    votes = collections.Counter()
    for names, _, _ in tensors:
        for name in names:
            for init in initializer_names:
                if init == name or init.endswith("." + name):
                    votes[init[:len(init) - len(name)]] += 1
    if not votes:
        raise ValueError("no initializer of the export is named after a "
                         "parameter or buffer of this module; is it the "
                         "module that was exported?")
    return votes.most_common(1)[0][0]


def load_trained(module, onnx_path, prefix=None):
    """Copies the initializers of `onnx_path` into `module`'s parameters
    and buffers (names mapped through `prefix`, found when None). Returns a
    LoadReport; raises ValueError when no initializer is named after the
    module's tensors or a shape differs. A parameter the exported forward
    never used (XLNet's mask_emb) is not in the export: it keeps its value
    and the report lists it."""
    model = onnx.load(onnx_path)  # external data (FILE.onnx.data) too
    inits = collections.OrderedDict(
        (t.name, t) for t in model.graph.initializer)
    tensors = module_tensors(module)
    if prefix is None:
        prefix = find_prefix(tensors, inits)
    report = LoadReport(prefix)
    used = set()
    with torch.no_grad():
        for names, tensor, is_param in tensors:
            hits = [prefix + n for n in names if prefix + n in inits]
            if not hits:
                (report.parameters_kept if is_param
                 else report.buffers_kept).append(names[0])
                continue
            init = hits[0]
            value = onnx.numpy_helper.to_array(inits[init])
            if tuple(value.shape) != tuple(tensor.shape):
                raise ValueError("%s: the module's shape is %s, initializer "
                                 "%s's is %s" % (names[0], tuple(tensor.shape),
                                                 init, tuple(value.shape)))
            tensor.copy_(torch.from_numpy(np.array(value)).to(tensor.dtype))
            used.add(init)
            (report.parameters if is_param else report.buffers)[names[0]] = init
    report.initializers_unused = [n for n in inits if n not in used]
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("onnx", help="the model cleave-run --save wrote")
    ap.add_argument("--module", required=True, metavar="PKG.MOD:FACTORY",
                    help="a function that returns the module to load into")
    ap.add_argument("--prefix", default=None,
                    help="initializer name = PREFIX + module name (default: "
                         "found from the names)")
    ap.add_argument("-o", "--output", required=True,
                    help="where to torch.save the module's state_dict")
    args = ap.parse_args()
    mod_name, _, factory = args.module.partition(":")
    if not factory:
        ap.error("--module needs PKG.MOD:FACTORY, not %r" % args.module)
    module = getattr(importlib.import_module(mod_name), factory)()
    try:
        report = load_trained(module, args.onnx, args.prefix)
    except ValueError as e:
        sys.exit("load_trained.py: error: %s" % e)
    print(report)
    torch.save(module.state_dict(), args.output)
    print("wrote", args.output)


if __name__ == "__main__":
    main()
