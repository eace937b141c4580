"""Writes the bad plans of plans.test from DIR/p.cplan (a fresh cleavec
output) into DIR. Offsets follow the preamble in runtime/PlanFile.cpp."""
import os
import sys

d = sys.argv[1]
b = open(os.path.join(d, "p.cplan"), "rb").read()
magic = 11                      # "CLEAVEPLAN\0", then u32 version, u64 header
header = int.from_bytes(b[magic + 4:magic + 12], "little")
data = (magic + 12 + header + 63) // 64 * 64   # the first blob
def put(name, data_):
    open(os.path.join(d, name), "wb").write(bytes(data_))
put("empty.cplan", b"")
put("preamble.cplan", b[:16])
put("header-cut.cplan", b[:200])
put("half.cplan", b[:data + 64])
x = bytearray(b); x[magic + 12] = 0xFF; put("header-flip.cplan", x)  # a bad tag
x = bytearray(b); x[data + 8] ^= 0x01; put("blob-flip.cplan", x)
x = bytearray(b); x[magic] = 4; put("v2.cplan", x)
x = bytearray(b); x[magic + 4:magic + 12] = (2 ** 62).to_bytes(8, "little")
put("header-len.cplan", x)
