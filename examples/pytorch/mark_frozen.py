#!/usr/bin/env python3
"""Record in an exported ONNX file which parameters the module does not train.

PyTorch's exporters keep a parameter whose `requires_grad` is False (the
sinusoidal position table of Marian, Pegasus and RoFormer, a layer frozen for
fine-tuning) as an initializer like any other, and neither records that it is
frozen: the dynamo exporter's signature calls it a PARAMETER. cleave would
train it. mark_frozen() writes the names of those parameters into the file's
metadata (key `cleave.frozen`, one name a line), and cleavec keeps them fixed
as PyTorch does:

    import torch
    from mark_frozen import mark_frozen

    wrapped = WithLoss(model)
    torch.onnx.export(wrapped, args, "model.onnx", dynamo=True, optimize=False)
    print(mark_frozen(wrapped, "model.onnx"))   # the names it recorded

Pass the module you exported (the names are its parameter paths, which are
the initializer names). A module with no frozen parameter gets an empty list,
so the call is safe on every export. `--freeze REGEX` on cleavec does the
same by hand.
"""

import os

import onnx

KEY = "cleave.frozen"


def frozen_names(module):
    """Every name of every parameter with requires_grad=False (tied
    parameters under each of their names)."""
    return [n for n, p in module.named_parameters(remove_duplicate=False)
            if not p.requires_grad]


def mark_frozen(module, path):
    """Writes frozen_names(module) into the metadata of the ONNX file at
    `path` (replacing an earlier list) and returns them. External weight
    files are left as they are."""
    names = frozen_names(module)
    model = onnx.load(path, load_external_data=False)
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if names:
        entry = model.metadata_props.add()
        entry.key = KEY
        entry.value = "\n".join(names)
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return names
