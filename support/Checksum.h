// A 64-bit checksum of tensor bytes, fast enough for tens of gigabytes:
// plans record one per parameter blob, and a 7B model's 27 GB of weights
// are summed once when cleavec writes the plan and once when each rank
// loads its own. Four independent lanes take a 64-bit word each per
// 32-byte block (multiply, rotate, multiply: about 8 GB/s on one core,
// against 0.75 GB/s for byte-at-a-time FNV-1a); the tail, the length and a
// final avalanche make every byte and the length matter. It detects
// corruption and files that changed; it is not a cryptographic hash.
//
// The sum depends only on the bytes, not on how they are split between
// update() calls. The bytes are taken in chunks of 64 KiB: each chunk runs
// the four lanes from their initial values and is then folded, in order,
// into the running sum, so a chunk of zeros always folds the same digest
// and zeros(n) passes whole zero chunks without reading them (the holes of
// a sparse weight file: a terabyte of holes in milliseconds). Plan format 3;
// format 2 summed without chunks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cleave::support {

class BlockChecksum {
public:
  static constexpr size_t kChunkBytes = size_t(64) << 10;

  void update(const void *data, size_t bytes);
  // The same as update() with `bytes` zero bytes.
  void zeros(uint64_t bytes);
  uint64_t value() const;

private:
  void block(const uint8_t *p);
  // Takes bytes of the current chunk (at most what it lacks).
  void take(const uint8_t *p, size_t bytes);
  // The current chunk's digest, and it folded into `folded`.
  uint64_t chunkDigest() const;
  uint64_t foldChunk(uint64_t folded) const;
  void endChunk();
  static constexpr uint64_t kInitialLanes[4] = {
      0x243F6A8885A308D3ull, 0x13198A2E03707344ull, 0xA4093822299F31D0ull,
      0x082EFA98EC4E6C89ull};
  uint64_t lane_[4] = {kInitialLanes[0], kInitialLanes[1], kInitialLanes[2],
                       kInitialLanes[3]};
  uint8_t tail_[32];
  size_t tailBytes_ = 0;
  size_t chunkBytes_ = 0; // taken into the current chunk
  uint64_t folded_ = 0x452821E638D01377ull;
  uint64_t total_ = 0;
};

// The checksum of one buffer.
uint64_t blockChecksum(const void *data, size_t bytes);

// FNV-1a, 64-bit, started from `basis`: the checkpoint's sums and plan
// identity (runtime::fnv1a64 uses the standard basis). Like BlockChecksum
// it detects damage, not edits: anyone can recompute it.
// kFnv1a64BasisCleave2 is the basis cleave used before, the standard one
// with its last digit dropped: checkpoints of format 2 were summed with it
// (and are still read), and the synthetic data's per-input salt keeps it
// so that synthetic runs see the data they always saw.
constexpr uint64_t kFnv1a64Basis = 14695981039346656037ull;
constexpr uint64_t kFnv1a64BasisCleave2 = 1469598103934665603ull;
uint64_t fnv1a64(const void *data, size_t bytes, uint64_t basis);

} // namespace cleave::support
