// The parts of the backend interface (Kernel.h) every backend shares.
#include "runtime/Kernel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

namespace cleave::runtime {

// Whether the largest of `count` words' magnitude bits (the word less its
// sign bit) stays below `infinity`, the all-ones exponent.
template <typename Word>
static bool magnitudesBelow(const void *data, int64_t count, Word infinity) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  const Word magnitude = ~(Word(1) << (8 * sizeof(Word) - 1));
  // 16 bytes a turn in vector lanes (x86-64's baseline width): a word is
  // not finite when its exponent bits are all set, so the lanes collect
  // that test with an or. The loop of words (a running maximum) read 2.4
  // GB/s on one thread of an Intel Xeon, these lanes 9.5 to 10 (the
  // memory's 12 to 14); 64-byte lanes, lowered for 16-byte registers,
  // 2.4 again.
  using Signed = std::make_signed_t<Word>;
  using Lanes [[gnu::vector_size(16)]] = Signed;
  constexpr int64_t kLanes = int64_t(16 / sizeof(Word));
  const Signed exponent = Signed(infinity);
  Lanes any = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    Lanes w;
    std::memcpy(&w, bytes + sizeof(Word) * size_t(i), sizeof w);
    any |= (w & exponent) == exponent;
  }
  for (int64_t k = 0; k < kLanes; ++k)
    if (any[k])
      return false;
  Word most = 0;
  for (; i < count; ++i) {
    Word w;
    std::memcpy(&w, bytes + sizeof(Word) * size_t(i), sizeof(Word));
    most = std::max<Word>(most, w & magnitude);
  }
  return most < infinity;
}

bool allFiniteOnHost(ir::DType dtype, const void *data, int64_t count) {
  if (dtype == ir::DType::F32)
    return magnitudesBelow<uint32_t>(data, count, 0x7f800000u);
  if (dtype == ir::DType::F64)
    return magnitudesBelow<uint64_t>(data, count, 0x7ff0000000000000ull);
  return true;
}

template <typename T>
static double squares(const T *x, int64_t n, double scale) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = double(x[i]) * scale;
    sum += v * v;
  }
  return sum;
}

double blockSumOfSquares(ir::DType dtype, const void *data, int64_t count,
                         double scale) {
  if (dtype == ir::DType::F64)
    return squares(static_cast<const double *>(data), count, scale);
  return squares(static_cast<const float *>(data), count, scale);
}

double sumOfSquaresOnHost(ir::DType dtype, const void *data, int64_t count,
                          double scale) {
  size_t width = ir::dtypeSize(dtype);
  double total = 0;
  for (int64_t b = 0; b < count; b += kSquaresBlock)
    total += blockSumOfSquares(
        dtype, static_cast<const uint8_t *>(data) + size_t(b) * width,
        std::min(kSquaresBlock, count - b), scale);
  return total;
}

double Backend::sumOfSquares(ir::DType dtype, const void *data, int64_t count,
                             double scale) {
  std::vector<uint8_t> host(size_t(count) * ir::dtypeSize(dtype));
  copyToHost(host.data(), data, host.size());
  return sumOfSquaresOnHost(dtype, host.data(), count, scale);
}

llvm::Expected<Backend::Parcel> Backend::pack(const void *, size_t) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "the " + std::string(name()) +
                                     " backend has no parcels");
}

llvm::Error Backend::unpack(void *, const Parcel &) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "the " + std::string(name()) +
                                     " backend has no parcels");
}

void *Backend::allocateHost(size_t bytes) {
  return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
}

void Backend::releaseHost(void *ptr) { std::free(ptr); }

bool Backend::allFinite(ir::DType dtype, const void *data, int64_t count) {
  if (dtype != ir::DType::F32 && dtype != ir::DType::F64)
    return true;
  std::vector<uint8_t> host(size_t(count) * ir::dtypeSize(dtype));
  copyToHost(host.data(), data, host.size());
  return allFiniteOnHost(dtype, host.data(), count);
}

bool Backend::allBuffersFinite(llvm::ArrayRef<FiniteCheck> buffers) {
  for (const FiniteCheck &b : buffers)
    if (!allFinite(b.dtype, b.data, b.count))
      return false;
  return true;
}

} // namespace cleave::runtime
