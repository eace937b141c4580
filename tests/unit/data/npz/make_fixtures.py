#!/usr/bin/env python3
"""Writes the .npz fixtures of tests/unit/npz_test.cpp (run from anywhere;
the files land next to this script). Needs numpy."""
import os
import zipfile

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))


def arrays():
    return {
        "net.0.weight": (np.arange(6, dtype=np.float32) * 0.5 - 1).reshape(2, 3),
        "f64": np.array([1.5, -2.25, 1e300, 0.0], dtype=np.float64),
        "i64": np.array([[-1, 2**40], [3, -(2**62)]], dtype=np.int64),
        "i32": np.array([7, -8, 2**31 - 1], dtype=np.int32),
        "mask": np.array([True, False, False, True, True]),
        "scalar": np.float32(3.25),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


np.savez(os.path.join(here, "arrays.npz"), **arrays())
np.savez_compressed(os.path.join(here, "arrays_compressed.npz"), **arrays())
np.savez(os.path.join(here, "positional.npz"),
         np.array([1, 2], dtype=np.int64), np.array([[0.5]], dtype=np.float32))
np.savez(os.path.join(here, "uint8.npz"), ok=np.zeros(2, dtype=np.float32),
         bytes=np.array([1, 2, 3], dtype=np.uint8))
with zipfile.ZipFile(os.path.join(here, "not_npy.npz"), "w") as z:
    z.writestr(zipfile.ZipInfo("notes.txt", date_time=(1980, 1, 1, 0, 0, 0)),
               "not an array")

# Full ZIP64 layout (64-bit end record, sizes and offsets in the central
# directory's extra field), as zipfile writes for archives over 4 GiB.
_limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
zipfile.ZIP64_LIMIT = zipfile.ZIP_FILECOUNT_LIMIT = 0
try:
    np.savez(os.path.join(here, "zip64.npz"),
             w=np.array([[1.0, -2.0]], dtype=np.float32),
             n=np.array([5, 6, 7], dtype=np.int64))
finally:
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = _limits
