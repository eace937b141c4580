"""A .cplan's protobuf header (runtime/plan.proto) at the wire level, for the
lit tests that edit plans without a protobuf package: read the header out of
a plan, decode a message into [field, wire type, value] entries (varints as
ints, length-delimited values as bytes), encode them back, and write a plan
with a new header."""
import sys

MAGIC = 11  # "CLEAVEPLAN\0", then u32 version, u64 header length
HEADER_START = MAGIC + 12


def read_plan(path):
    """(the file's bytes, the header's bytes)."""
    b = open(path, "rb").read()
    length = int.from_bytes(b[MAGIC + 4:HEADER_START], "little")
    return b, b[HEADER_START:HEADER_START + length]


def varint(buf, i):
    v = shift = 0
    while True:
        c = buf[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def put_varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        out.append(c | (0x80 if v else 0))
        if not v:
            return bytes(out)


def decode(buf):
    """[field, wire type, value] per field, in order."""
    fields, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            sys.exit("unexpected wire type %d" % wt)
        fields.append([f, wt, v])
    return fields


def encode(fields):
    out = bytearray()
    for f, wt, v in fields:
        out += put_varint(f << 3 | wt)
        if wt == 0:
            out += put_varint(v)
        elif wt == 2:
            out += put_varint(len(v)) + v
        else:
            out += v
    return bytes(out)


def get(fields, f, default=0):
    for g, _, v in fields:
        if g == f:
            return v
    return default


def with_header(b, header, keep_blob_offsets):
    """The plan `b` with `header` in place of its own. With
    `keep_blob_offsets` the blobs stay where they were (the new header must
    fit before the first); otherwise they follow the new header as they are
    (their offsets then no longer line up)."""
    old = int.from_bytes(b[MAGIC + 4:HEADER_START], "little")
    out = bytearray(b[:MAGIC + 4]) + len(header).to_bytes(8, "little") + header
    if not keep_blob_offsets:
        return bytes(out + b[HEADER_START + old:])
    data_start = (HEADER_START + old + 63) // 64 * 64
    if len(out) > data_start:
        sys.exit("the edited header runs into the first blob")
    return bytes(out + bytes(data_start - len(out)) + b[data_start:])
