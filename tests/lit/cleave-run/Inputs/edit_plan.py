"""Writes a copy of a .cplan whose schedule cannot complete, for the
--comm-timeout tests: the plan still loads and passes verifyPlan, but some
stage waits for a message that never comes.

usage: edit_plan.py IN OUT send-tag STAGE       the first Send of STAGE's
                                                 F program gets another tag
       edit_plan.py IN OUT step-recv-tag STAGE  the same for the first Recv
                                                 of STAGE's STEP program
       edit_plan.py IN OUT drop-step STAGE      STAGE's STEP action removed

The header is protobuf (runtime/plan.proto), edited here at the wire level
so no protobuf package is needed. Blobs sit at absolute offsets after the
header (docs/design/plan.md), so the edited header must end before the
first blob: a tag t < 64 becomes t + 64, one varint byte either way (a tag
0, which protobuf leaves out, takes two more bytes of the header's
padding).
"""
import sys

src, dst, what, stage = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
b = open(src, "rb").read()
MAGIC = 11  # "CLEAVEPLAN\0", then u32 version, u64 header length
hlen = int.from_bytes(b[MAGIC + 4:MAGIC + 12], "little")
hstart = MAGIC + 12
header = b[hstart:hstart + hlen]
data_start = (hstart + hlen + 63) // 64 * 64


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
    """[field, wire type, value] per field; length-delimited values as bytes."""
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


HEADER_STAGES, STAGE_INDEX, STAGE_PROGRAMS, STAGE_ACTIONS = 9, 1, 3, 6
PROGRAM_INSTRS, INSTR_KIND, INSTR_TAG = 1, 1, 7
SEND, RECV, ACTION_STEP = 1, 2, 4
F, STEP = 0, 3

hdr = decode(header)
stage_fields = [e for e in hdr if e[0] == HEADER_STAGES]
entry = [e for e in stage_fields if get(decode(e[2]), STAGE_INDEX) == stage][0]
st = decode(entry[2])
done = False
if what == "drop-step":
    for e in st:
        if e[0] == STAGE_ACTIONS and get(decode(e[2]), 1) == ACTION_STEP:
            st.remove(e)
            done = True
            break
else:
    phase, kind = {"send-tag": (F, SEND), "step-recv-tag": (STEP, RECV)}[what]
    programs = [e for e in st if e[0] == STAGE_PROGRAMS]
    prog = decode(programs[phase][2])
    for instr_entry in prog:
        if instr_entry[0] != PROGRAM_INSTRS:
            continue
        instr = decode(instr_entry[2])
        if get(instr, INSTR_KIND) != kind:
            continue
        if get(instr, INSTR_TAG, None) is None:
            instr.append([INSTR_TAG, 0, 0])  # tag 0 is left out of the wire
        for field in instr:
            if field[0] == INSTR_TAG:
                if field[2] >= 64:
                    sys.exit("tag %d: an edit would grow the header" % field[2])
                print("%s: stage %d tag %d -> %d" %
                      (what, stage, field[2], field[2] + 64))
                field[2] += 64
                done = True
        instr_entry[2] = encode(instr)
        break
    programs[phase][2] = encode(prog)
if not done:
    sys.exit("%s: nothing to edit on stage %d" % (what, stage))
entry[2] = encode(st)
new = encode(hdr)
if hstart + len(new) > data_start:
    sys.exit("the edited header runs into the first blob")
out = bytearray(b[:MAGIC + 4]) + len(new).to_bytes(8, "little") + new
out += bytes(data_start - len(out)) + b[data_start:]
open(dst, "wb").write(out)
