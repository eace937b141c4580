#include "support/Limits.h"

#include <thread>

namespace cleave::support {

SizeLimits standardLimits() {
  unsigned hw = std::thread::hardware_concurrency();
  return {hw ? 4 * int64_t(hw) : 1024, 4096, int64_t(1) << 20,
          int64_t(1) << 40};
}

SizeLimits largeLimits() {
  return {int64_t(1) << 16, int64_t(1) << 20, int64_t(1) << 24,
          int64_t(1) << 62};
}

} // namespace cleave::support
