#include "support/Checksum.h"

#include <algorithm>
#include <cstring>

namespace cleave::support {

static constexpr uint64_t kMul1 = 0x9E3779B97F4A7C15ull; // 2^64 / golden ratio
static constexpr uint64_t kMul2 = 0xC2B2AE3D27D4EB4Full;

static inline uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

static inline uint64_t mixWord(uint64_t lane, uint64_t word) {
  return rotl(lane ^ (word * kMul1), 31) * kMul2;
}

// The running sum after a chunk with digest `digest`: order-dependent.
static inline uint64_t foldDigest(uint64_t folded, uint64_t digest) {
  return rotl(folded ^ (digest * kMul2), 29) * kMul1 + kMul2;
}

static inline uint64_t load64(const uint8_t *p) {
  uint64_t w;
  std::memcpy(&w, p, 8); // little-endian hosts only, like the plan format
  return w;
}

void BlockChecksum::block(const uint8_t *p) {
  lane_[0] = mixWord(lane_[0], load64(p));
  lane_[1] = mixWord(lane_[1], load64(p + 8));
  lane_[2] = mixWord(lane_[2], load64(p + 16));
  lane_[3] = mixWord(lane_[3], load64(p + 24));
}

void BlockChecksum::update(const void *data, size_t bytes) {
  const auto *p = static_cast<const uint8_t *>(data);
  total_ += bytes;
  while (bytes) {
    size_t n = std::min(bytes, kChunkBytes - chunkBytes_);
    take(p, n);
    p += n;
    bytes -= n;
  }
}

void BlockChecksum::zeros(uint64_t bytes) {
  static const uint8_t zero[kChunkBytes] = {};
  // The digest of a whole chunk of zeros, computed once.
  static const uint64_t zeroChunk = [] {
    BlockChecksum c;
    for (size_t i = 0; i < kChunkBytes; i += 32)
      c.block(zero + i);
    return c.chunkDigest();
  }();
  total_ += bytes;
  // The rest of the current chunk, then whole chunks (folding one is a
  // function of the running sum alone), then the start of the last.
  if (chunkBytes_) {
    size_t n = size_t(std::min<uint64_t>(bytes, kChunkBytes - chunkBytes_));
    take(zero, n);
    bytes -= n;
  }
  for (; bytes >= kChunkBytes; bytes -= kChunkBytes)
    folded_ = foldDigest(folded_, zeroChunk);
  take(zero, size_t(bytes));
}

void BlockChecksum::take(const uint8_t *p, size_t bytes) {
  chunkBytes_ += bytes;
  if (tailBytes_) {
    size_t n = std::min(bytes, 32 - tailBytes_);
    std::memcpy(tail_ + tailBytes_, p, n);
    tailBytes_ += n;
    p += n;
    bytes -= n;
    if (tailBytes_ < 32)
      return;
    block(tail_);
    tailBytes_ = 0;
  }
  for (; bytes >= 32; p += 32, bytes -= 32)
    block(p);
  std::memcpy(tail_, p, bytes);
  tailBytes_ = bytes;
  if (chunkBytes_ == kChunkBytes)
    endChunk();
}

uint64_t BlockChecksum::chunkDigest() const {
  uint64_t h = rotl(lane_[0], 1) + rotl(lane_[1], 7) + rotl(lane_[2], 12) +
               rotl(lane_[3], 18);
  for (uint64_t lane : lane_)
    h = (h ^ mixWord(0, lane)) * kMul1 + kMul2;
  // The tail byte by byte (only a last, partial chunk has one).
  for (size_t i = 0; i < tailBytes_; ++i)
    h = rotl(h ^ (tail_[i] * kMul2), 11) * kMul1;
  return h;
}

uint64_t BlockChecksum::foldChunk(uint64_t folded) const {
  return foldDigest(folded, chunkDigest());
}

void BlockChecksum::endChunk() {
  folded_ = foldChunk(folded_);
  for (int i = 0; i < 4; ++i)
    lane_[i] = kInitialLanes[i];
  tailBytes_ = 0;
  chunkBytes_ = 0;
}

uint64_t BlockChecksum::value() const {
  uint64_t h = chunkBytes_ ? foldChunk(folded_) : folded_;
  h ^= total_ * kMul2;
  // Avalanche: every input bit reaches every output bit.
  h ^= h >> 33;
  h *= kMul2;
  h ^= h >> 29;
  h *= kMul1;
  h ^= h >> 32;
  return h;
}

uint64_t blockChecksum(const void *data, size_t bytes) {
  BlockChecksum c;
  c.update(data, bytes);
  return c.value();
}

uint64_t fnv1a64(const void *data, size_t bytes, uint64_t basis) {
  const auto *p = static_cast<const uint8_t *>(data);
  uint64_t h = basis;
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

} // namespace cleave::support
