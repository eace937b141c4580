#!/usr/bin/env python3
"""Record in an exported ONNX file what PyTorch's exporters leave out of it.

Two things the module says about training are not in any export:

- which parameters have requires_grad=False (the sinusoidal position table
  of Marian, Pegasus and RoFormer, a layer frozen for fine-tuning): both
  exporters keep them as initializers like any other, and the dynamo
  exporter's signature calls them PARAMETERs, so cleave would train them;
- an nn.Embedding's padding_idx, whose row never gets a gradient: the dynamo
  exporter records it only in a node's metadata (cleave reads it there), the
  legacy exporter drops it with a warning.

annotate_export() writes both into the file's metadata, and cleavec trains
as PyTorch does:

    import torch
    from annotate_export import annotate_export

    wrapped = WithLoss(model)
    torch.onnx.export(wrapped, args, "model.onnx", dynamo=True, optimize=False)
    print(annotate_export(wrapped, "model.onnx"))   # what it recorded

Pass the module you exported: the names are its parameter paths, which are
the initializer names. The keys are `cleave.frozen` (one parameter name a
line) and `cleave.padding_idx` (one `name index` a line, every name of a
tied weight). A module with nothing to record gets empty lists, so the call
is safe on every export; `--freeze REGEX` on cleavec holds parameters by
hand.
"""

import os

import onnx
import torch

FROZEN = "cleave.frozen"
PADDING = "cleave.padding_idx"


def frozen_names(module):
    """Every name of every parameter with requires_grad=False (tied
    parameters under each of their names)."""
    return [n for n, p in module.named_parameters(remove_duplicate=False)
            if not p.requires_grad]


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
    """Writes frozen_names(module) and padding_rows(module) into the
    metadata of the ONNX file at `path` (replacing earlier ones) and returns
    them as a dict. External weight files are left as they are."""
    frozen, padding = frozen_names(module), padding_rows(module)
    model = onnx.load(path, load_external_data=False)
    kept = [p for p in model.metadata_props if p.key not in (FROZEN, PADDING)]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, lines in ((FROZEN, frozen), (PADDING, ["%s %d" % r for r in padding])):
        if lines:
            entry = model.metadata_props.add()
            entry.key = key
            entry.value = "\n".join(lines)
    tmp = path + ".tmp"
    onnx.save(model, tmp)
    os.replace(tmp, path)
    return {"frozen": frozen, "padding_idx": dict(padding)}
