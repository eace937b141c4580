"""Writes a .npz whose one member, x.npy, is a deflate stream of about
4.2 MB whose zip headers claim it inflates to 4 GiB (within deflate's
1032:1 bound, so only inflating tells): a reader that takes the claim's
memory first cannot run under a 4 GB address-space limit.
    npz_claims.py OUT.npz"""
import random
import struct
import sys
import zlib

rng = random.Random(35)
payload = bytes(rng.getrandbits(8) for _ in range(4_300_000))
c = zlib.compressobj(0, zlib.DEFLATED, -15)
data = c.compress(payload) + c.flush()
claimed = 4 << 30
name = b"x.npy"
crc = zlib.crc32(payload)
# ZIP64: the sizes in the extra field, 0xffffffff in the fixed fields.
zip64 = struct.pack("<HHQQ", 1, 16, claimed, len(data))
local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 8, 0, 0, crc,
                    0xFFFFFFFF, 0xFFFFFFFF, len(name), len(zip64)) + name + zip64
central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 8, 0, 0,
                      crc, 0xFFFFFFFF, 0xFFFFFFFF, len(name), len(zip64), 0,
                      0, 0, 0, 0) + name + zip64
cd_at = len(local) + len(data)
end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), cd_at, 0)
open(sys.argv[1], "wb").write(local + data + central + end)
