"""Copies a float32 .npy file, setting element INDEX (flat) to NaN (or to
VALUE, a float such as inf).

usage: poison_npy.py IN.npy OUT.npy INDEX [VALUE]   (no NumPy needed)
"""
import struct
import sys

src, dst, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
value = float(sys.argv[4]) if len(sys.argv) > 4 else float("nan")
data = bytearray(open(src, "rb").read())
assert data[:6] == b"\x93NUMPY" and b"'<f4'" in data[:128], "not a float32 .npy"
major = data[6]
header = struct.unpack("<H" if major == 1 else "<I",
                       data[8:10] if major == 1 else data[8:12])[0]
start = (10 if major == 1 else 12) + header + 4 * index
data[start:start + 4] = struct.pack("<f", value)
open(dst, "wb").write(bytes(data))
