# Writes DIR/x.npy (a copy of the MLP's inputs) and DIR/labels.npy with every
# label out of range, so the loss stage fails while the other waits for it.
# Plain Python (no numpy): usage bad-labels.py MODELS_DIR OUT_DIR
import os
import shutil
import struct
import sys

models, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
shutil.copy(os.path.join(models, "training", "mlp", "inputs", "x.npy"), out)
header = "{'descr': '<i8', 'fortran_order': False, 'shape': (8,), }"
header += " " * (128 - 10 - len(header) - 1) + "\n"
with open(os.path.join(out, "labels.npy"), "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)))
    f.write(header.encode("latin1"))
    f.write(struct.pack("<8q", *[999] * 8))
