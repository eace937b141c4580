"""Writes DIR/OUT.cplan: DIR/p.cplan (a fresh cleavec output) with the
header's int32 field FIELD (5: microbatches, 12: data_parallel) set to VALUE.
The header's top-level fields are re-encoded with that one changed, and the
preamble's header length follows; the blobs after it keep their bytes (their
offsets no longer line up, which the reader only checks after the header's
counts). Usage: huge_counts_plan.py DIR OUT FIELD VALUE"""
import os
import sys

d, out, field, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b = open(os.path.join(d, "p.cplan"), "rb").read()
magic = 11                      # "CLEAVEPLAN\0", then u32 version, u64 header
start = magic + 12
length = int.from_bytes(b[magic + 4:start], "little")
header = b[start:start + length]


def varint(buf, i):
    v, shift = 0, 0
    while True:
        c = buf[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def encode(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        if v:
            out.append(c | 0x80)
        else:
            out.append(c)
            return bytes(out)


new, i, found = bytearray(), 0, False
while i < len(header):
    key, j = varint(header, i)
    num, wire = key >> 3, key & 7
    if wire == 0:
        _, k = varint(header, j)
    elif wire == 1:
        k = j + 8
    elif wire == 2:
        n, k = varint(header, j)
        k += n
    elif wire == 5:
        k = j + 4
    else:
        sys.exit("unexpected wire type %d" % wire)
    if num == field and wire == 0:
        new += encode(key) + encode(value)
        found = True
    else:
        new += header[i:k]
    i = k
if not found:
    new += encode(field << 3) + encode(value)
x = b[:magic + 4] + len(new).to_bytes(8, "little") + bytes(new) + b[start + length:]
open(os.path.join(d, out + ".cplan"), "wb").write(x)
