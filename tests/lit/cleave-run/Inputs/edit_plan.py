"""Writes a copy of a .cplan whose schedule cannot complete, for the
--comm-timeout tests: the plan still loads and passes verifyPlan, but some
stage waits for a message that never comes.

usage: edit_plan.py IN OUT send-tag STAGE       the first Send of STAGE's
                                                 F program gets another tag
       edit_plan.py IN OUT step-recv-tag STAGE  the same for the first Recv
                                                 of STAGE's STEP program
       edit_plan.py IN OUT drop-step STAGE      STAGE's STEP action removed
       edit_plan.py IN OUT w-batch-scratch STAGE
                                                 STAGE's W batching scratch
                                                 one byte larger (the record
                                                 no longer matches)

The header is protobuf (runtime/plan.proto), edited here at the wire level
so no protobuf package is needed. Blobs sit at absolute offsets after the
header (docs/design/plan.md), so the edited header must end before the
first blob: a tag t < 64 becomes t + 64, one varint byte either way (a tag
0, which protobuf leaves out, takes two more bytes of the header's
padding).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "Inputs"))
from plan_wire import decode, encode, get, read_plan, with_header  # noqa: E402

src, dst, what, stage = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
b, header = read_plan(src)

HEADER_STAGES, STAGE_INDEX, STAGE_PROGRAMS, STAGE_ACTIONS = 9, 1, 3, 6
PROGRAM_INSTRS, INSTR_KIND, INSTR_TAG = 1, 1, 7
SEND, RECV, ACTION_STEP = 1, 2, 4
F, STEP = 0, 3

hdr = decode(header)
stage_fields = [e for e in hdr if e[0] == HEADER_STAGES]
entry = [e for e in stage_fields if get(decode(e[2]), STAGE_INDEX) == stage][0]
st = decode(entry[2])
done = False
STAGE_W_BATCH_SCRATCH = 17
if what == "w-batch-scratch":
    for e in st:
        if e[0] == STAGE_W_BATCH_SCRATCH and e[2] % 128 != 127:
            e[2] += 1  # the same varint length
            done = True
elif what == "drop-step":
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
open(dst, "wb").write(with_header(b, encode(hdr), keep_blob_offsets=True))
