#!/usr/bin/env python3
"""Tokenize a text file into cleave-run's token-file format.

Writes the token ids as one flat little-endian stream: uint16 when every id
fits (vocabularies up to 65536, cleave-run --data tokens:FILE), else uint32
(--data tokens32:FILE), the format nanoGPT's prepare.py and Megatron's
indexed datasets use. The last --val-fraction of the tokens go to a second
file for --eval-data.

The tokenizer comes from PyPI's `tokenizers` (HF):
  --tokenizer NAME      a pretrained one (e.g. gpt2; from the HF hub or its
                        local cache)
  --train-bpe VOCAB     a byte-level BPE of VOCAB ids trained on the text
                        itself (no download; VOCAB >= 257 and within the
                        model's embedding table)

Example (the bundled GPT has a 256-entry table; export a larger one with
examples/gpt/export.py for a real vocabulary):
  pip install tokenizers
  python3 examples/tokenize.py input.txt --train-bpe 512 -o data/corpus
  # wrote data/corpus.train.bin, data/corpus.val.bin (uint16)
  cleave-run model.cplan --data tokens:data/corpus.train.bin \\
      --eval-data tokens:data/corpus.val.bin --eval-every 100
"""

import argparse
import os
import struct
import sys


def tokenizer_for(args, text):
    try:
        from tokenizers import ByteLevelBPETokenizer, Tokenizer
    except ImportError:
        sys.exit("tokenize.py: needs the 'tokenizers' package "
                 "(pip install tokenizers)")
    if args.tokenizer:
        return Tokenizer.from_pretrained(args.tokenizer)
    if args.train_bpe < 257:
        sys.exit("tokenize.py: --train-bpe needs at least 257 ids "
                 "(the 256 bytes and one merge)")
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([text], vocab_size=args.train_bpe,
                            min_frequency=2, show_progress=False)
    return tok


def write(path, ids):
    wide = max(ids, default=0) >= 1 << 16
    with open(path, "wb") as f:
        f.write(struct.pack("<%d%s" % (len(ids), "I" if wide else "H"), *ids))
    return "tokens32" if wide else "tokens"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("text")
    p.add_argument("-o", "--output", required=True,
                   help="prefix: writes PREFIX.train.bin and PREFIX.val.bin")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokenizer")
    which.add_argument("--train-bpe", type=int)
    p.add_argument("--val-fraction", type=float, default=0.1)
    args = p.parse_args()
    if not 0 <= args.val_fraction < 1:
        sys.exit("tokenize.py: --val-fraction must be in [0, 1)")
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    tok = tokenizer_for(args, text)
    ids = tok.encode(text).ids
    cut = len(ids) - int(len(ids) * args.val_fraction)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    for part, chunk in (("train", ids[:cut]), ("val", ids[cut:])):
        if not chunk:
            continue
        path = "%s.%s.bin" % (args.output, part)
        kind = write(path, chunk)
        print("wrote %s: %d tokens, ids below %d (--data %s:%s)"
              % (path, len(chunk), max(chunk) + 1, kind, path))


if __name__ == "__main__":
    main()
