#!/usr/bin/env python3
"""Export a Hugging Face GPT-2 (a small configuration) for training with cleave.

The module exported is GPT2LMHeadModel called as its users call it,
`model(input_ids=..., labels=...).loss`: HF's own causal-LM loss, which
shifts the labels itself. Fed from a token file (cleave-run --data
tokens:FILE), cleave gives `input_ids` the window of tokens and `labels` the
same window, because it sees the model shift them. The export is PyTorch's
default (dynamo) exporter with optimize=False, as the README says, followed
by annotate_export (nothing is frozen in GPT-2; the call records that).

    pip install torch transformers onnxscript
    python3 examples/pytorch/export_gpt2.py -o gpt2.onnx --vocab 512 \\
        --block-size 64 --batch 8

The exported batch is the microbatch; cleavec --microbatches M makes a step
of M of them. --state-dict also saves the initial weights for PyTorch
(tests/bench/gpt2_training_parity.py trains both from them).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from annotate_export import annotate_export  # noqa: E402


class WithLoss(torch.nn.Module):
    """GPT2LMHeadModel returning its own loss."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, input_ids, labels):
        return self.m(input_ids=input_ids, labels=labels).loss


def build(vocab, block_size, layers, heads, embd, seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_positions=block_size,
                        n_layer=layers, n_head=heads, n_embd=embd,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    model.train()
    return WithLoss(model)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--vocab", type=int, default=512,
                   help="embedding rows: at least the tokenizer's ids")
    p.add_argument("--block-size", type=int, default=64,
                   help="tokens per sample (the window cleave-run reads)")
    p.add_argument("--batch", type=int, default=8,
                   help="samples per microbatch")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--state-dict", help="also save the initial weights here "
                   "(torch.save of the wrapped module's state_dict)")
    args = p.parse_args()
    if args.embd % args.heads:
        sys.exit("export_gpt2.py: --embd must be a multiple of --heads")
    wrapped = build(args.vocab, args.block_size, args.layers, args.heads,
                    args.embd, args.seed)
    ids = torch.randint(0, args.vocab, (args.batch, args.block_size))
    # Two tensors: the exporter would trace one object passed twice as one
    # input.
    torch.onnx.export(wrapped, (ids, ids.clone()), args.output, dynamo=True,
                      optimize=False, input_names=["input_ids", "labels"],
                      output_names=["loss"])
    print("annotations:", annotate_export(wrapped, args.output))
    if args.state_dict:
        torch.save(wrapped.state_dict(), args.state_dict)
    print("wrote %s (GPT-2: %d layers, %d heads, width %d, %d ids, %d x %d "
          "tokens per microbatch)" % (args.output, args.layers, args.heads,
                                      args.embd, args.vocab, args.batch,
                                      args.block_size))


if __name__ == "__main__":
    main()
