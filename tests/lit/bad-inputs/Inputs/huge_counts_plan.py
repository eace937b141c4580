"""Writes DIR/OUT.cplan: DIR/p.cplan (a fresh cleavec output) with the
header's int32 field FIELD (5: microbatches, 12: data_parallel) set to VALUE.
The header's top-level fields are re-encoded with that one changed, and the
preamble's header length follows; the blobs after it keep their bytes (their
offsets no longer line up, which the reader only checks after the header's
counts). Usage: huge_counts_plan.py DIR OUT FIELD VALUE"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "Inputs"))
from plan_wire import decode, encode, read_plan, with_header  # noqa: E402

d, out, field, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
b, header = read_plan(os.path.join(d, "p.cplan"))
fields = decode(header)
for f in fields:
    if f[0] == field and f[1] == 0:
        f[2] = value
        break
else:
    fields.append([field, 0, value])
open(os.path.join(d, out + ".cplan"), "wb").write(
    with_header(b, encode(fields), keep_blob_offsets=False))
