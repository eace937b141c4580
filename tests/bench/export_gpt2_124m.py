"""Export the 12-layer GPT-2 (124M parameters) with its loss for
tests/bench/import_gpt2_dynamo.sh.

    $VENV/bin/python tests/bench/export_gpt2_124m.py OUT.onnx

transformers GPT2LMHeadModel(GPT2Config()) at the default size (12 layers,
n_embd 768, vocab 50257, n_positions 1024), random init (seed 0), every
dropout 0, sdpa attention (the corpus's choice, transformers' default),
wrapped so the output is the next-token cross-entropy of input_ids int64
[1, 128]. PyTorch 2's default dynamo exporter with optimize=False and
external_data=True: the ~500 MB of weights go to OUT.onnx.data next to the
model, which cleavec reads from there. VENV is the one
tests/models/corpus/make-venv.sh creates (torch 2.15, transformers 5.24,
onnx 1.23.2); CPU only.
"""
import os
import sys
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers


class WithLoss(nn.Module):
    def __init__(s, m):
        super().__init__()
        s.m = m

    def forward(s, input_ids):
        logits = s.m(input_ids=input_ids).logits
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                               input_ids[:, 1:].reshape(-1))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: export_gpt2_124m.py OUT.onnx")
    path = sys.argv[1]
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  summary_first_dropout=0.0,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg)
    wrapped = WithLoss(model)
    wrapped.train()
    n = sum(p.numel() for p in wrapped.parameters())
    ids = torch.randint(0, cfg.vocab_size, (1, 128), dtype=torch.int64)
    start = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, (ids,), path, dynamo=True, optimize=False,
                          external_data=True)
    print("exported %s (%d parameters in PyTorch, %d layers, n_embd %d) in %.1f s"
          % (path, n, cfg.n_layer, cfg.n_embd, time.time() - start))
    for f in (path, path + ".data"):
        if os.path.exists(f):
            print("  %s: %d bytes" % (f, os.path.getsize(f)))


if __name__ == "__main__":
    main()
