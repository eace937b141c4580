// The parts of the backend interface (Kernel.h) every backend shares.
#include "runtime/Kernel.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace cleave::runtime {

bool allFiniteOnHost(ir::DType dtype, const void *data, int64_t count) {
  const auto *bytes = static_cast<const uint8_t *>(data);
  if (dtype == ir::DType::F32) {
    uint32_t most = 0;
    for (int64_t i = 0; i < count; ++i) {
      uint32_t w;
      std::memcpy(&w, bytes + 4 * i, 4);
      most = std::max<uint32_t>(most, w & 0x7fffffffu);
    }
    return most < 0x7f800000u;
  }
  if (dtype == ir::DType::F64) {
    uint64_t most = 0;
    for (int64_t i = 0; i < count; ++i) {
      uint64_t w;
      std::memcpy(&w, bytes + 8 * i, 8);
      most = std::max<uint64_t>(most, w & 0x7fffffffffffffffull);
    }
    return most < 0x7ff0000000000000ull;
  }
  return true;
}

bool Backend::allFinite(ir::DType dtype, const void *data, int64_t count) {
  if (dtype != ir::DType::F32 && dtype != ir::DType::F64)
    return true;
  std::vector<uint8_t> host(size_t(count) * ir::dtypeSize(dtype));
  copyToHost(host.data(), data, host.size());
  return allFiniteOnHost(dtype, host.data(), count);
}

} // namespace cleave::runtime
