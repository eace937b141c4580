#include "support/ShapeMath.h"

#include <algorithm>

namespace cleave::support {

std::string shapeStr(llvm::ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i)
      s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

llvm::Error checkShape(llvm::ArrayRef<int64_t> shape) {
  // 2^48 elements is far beyond any real tensor and keeps byte sizes of every
  // dtype well inside int64.
  const int64_t limit = int64_t(1) << 48;
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "dimension " + std::to_string(i) + " is negative (" +
              std::to_string(shape[i]) + ")");
    if (shape[i] > limit || (shape[i] && n > limit / shape[i]))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "shape " + shapeStr(shape) +
                                         " has too many elements");
    n *= shape[i];
  }
  return llvm::Error::success();
}

int64_t sliceLength(int64_t dim, int64_t start, int64_t end, int64_t step,
                    int64_t *clampedStart) {
  if (start < 0)
    start += dim;
  if (end < 0)
    end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
  } else {
    start = std::clamp<int64_t>(start, 0, dim - 1);
    end = std::clamp<int64_t>(end, -1, dim - 1);
  }
  if (clampedStart)
    *clampedStart = start;
  // Written so that steps near the int64 limits cannot overflow: start and
  // end are clamped to [-1, dim], so their difference is small.
  if (step > 0)
    return end > start ? (end - start - 1) / step + 1 : 0;
  uint64_t down = uint64_t(0) - uint64_t(step);
  return start > end ? int64_t(uint64_t(start - end - 1) / down + 1) : 0;
}

} // namespace cleave::support
