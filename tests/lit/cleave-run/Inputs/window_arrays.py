"""Writes a token file of ROWS windows of T tokens (and one token more) and,
beside it, the .npy arrays a model's inputs would get from it when fed by
hand: INPUT=window (the token ids), INPUT=next (the window one token later),
INPUT=ones (an attention mask). Used to check that --data tokens:FILE fills
each input as the model uses it.

    window_arrays.py OUT_DIR ROWS T VOCAB input_ids=window labels=window ...
"""
import os
import random
import struct
import sys


def npy(path, rows, t, values):
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d, %d), }" % (
        rows, t)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
        f.write(header.encode("latin1"))
        f.write(struct.pack("<%dq" % len(values), *values))


def main():
    out, rows, t, vocab = sys.argv[1], *map(int, sys.argv[2:5])
    r = random.Random(3)
    ids = [r.randrange(vocab) for _ in range(rows * t + 1)]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<%dH" % len(ids), *ids))
    for spec in sys.argv[5:]:
        name, what = spec.split("=")
        shift = {"window": 0, "next": 1}.get(what)
        values = [1] * (rows * t) if what == "ones" else [
            ids[w * t + j + shift] for w in range(rows) for j in range(t)]
        npy(os.path.join(out, name + ".npy"), rows, t, values)


main()
