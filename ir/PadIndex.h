// Which input element a padded output element reads, along one axis: the
// rule of the Pad op's modes that the CPU kernel and the gradient share
// (runtime/cpu/DataMovement.cpp, passes/GradientRules.cpp; the CUDA
// device code, runtime/cuda/DeviceWindows.h, spells the same rule).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace cleave::ir {

// Input coordinate i = o - pad_begin on an axis of n > 0 elements (i may
// be outside [0, n)): itself when inside; outside, -1 for "constant" (the
// pad value), the nearest edge for "edge", the mirror image without
// repeating the edge for "reflect" (periodic with 2 (n - 1) for pads wider
// than the axis, as numpy does), i modulo n for "wrap" (PyTorch's circular
// padding). -2 for an unknown mode.
inline int64_t padSourceIndex(std::string_view mode, int64_t i, int64_t n) {
  if (i >= 0 && i < n)
    return i;
  if (mode == "constant")
    return -1;
  if (mode == "edge" || (n == 1 && mode == "reflect"))
    return std::clamp<int64_t>(i, 0, n - 1);
  if (mode == "reflect") {
    int64_t period = 2 * (n - 1), m = ((i % period) + period) % period;
    return m < n ? m : period - m;
  }
  if (mode == "wrap")
    return ((i % n) + n) % n;
  return -2;
}

} // namespace cleave::ir
