#!/usr/bin/env python3
"""Export the example GPT (model.py) to ONNX as a training graph.

The graph takes "idx" and "targets" (int64, [batch, block_size]) and returns
the scalar cross-entropy "loss". Export is seeded and therefore deterministic.

Examples:
    python3 export.py -o gpt-tiny.onnx --layers 2 --heads 2 --embd 64 --block-size 32
    python3 export.py -o /tmp/gpt-85m.onnx --layers 12 --heads 12 --embd 768 \
        --block-size 1024 --external-data
"""

import argparse
import inspect
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import GPT  # noqa: E402


def export(output, layers=2, heads=2, embd=64, block_size=32, seed=0,
           opset=17, external_data=False, batch=2, vocab=256):
    torch.manual_seed(seed)
    model = GPT(vocab=vocab, block_size=block_size, n_layer=layers,
                n_head=heads, n_embd=embd, dropout=0.0)
    model.train()

    idx = torch.randint(0, vocab, (batch, block_size), dtype=torch.long)
    targets = torch.randint(0, vocab, (batch, block_size), dtype=torch.long)

    output = os.path.abspath(output)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    # PyTorch 2.9 and later default to the dynamo exporter, which ignores
    # training=, and with opset_version=17 writes Split nodes of opset 18;
    # this script's graph is the TorchScript exporter's.
    legacy = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        legacy["dynamo"] = False
    torch.onnx.export(
        model,
        (idx, targets),
        output,
        input_names=["idx", "targets"],
        output_names=["loss"],
        dynamic_axes={"idx": {0: "batch"}, "targets": {0: "batch"}},
        opset_version=opset,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        **legacy,
    )

    if external_data:
        import onnx
        # torch writes >2 GB models with external data on its own; load with
        # whatever it wrote, then re-save everything into one .data file.
        m = onnx.load(output)
        location = os.path.basename(output) + ".data"
        data_path = os.path.join(os.path.dirname(output), location)
        if os.path.exists(data_path):
            os.remove(data_path)
        onnx.save_model(m, output, save_as_external_data=True,
                        all_tensors_to_one_file=True, location=location,
                        size_threshold=0)
    return output


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", default="gpt.onnx", help="output .onnx path")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab", type=int, default=256,
                   help="token ids (256: bytes; match examples/tokenize.py's)")
    p.add_argument("--batch", type=int, default=2, help="microbatch rows")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--external-data", action="store_true",
                   help="store all weights in <output basename>.data next to the model")
    args = p.parse_args(argv)
    out = export(args.output, layers=args.layers, heads=args.heads,
                 embd=args.embd, block_size=args.block_size, seed=args.seed,
                 opset=args.opset, external_data=args.external_data,
                 batch=args.batch, vocab=args.vocab)
    print(out)


if __name__ == "__main__":
    main()
