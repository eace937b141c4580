// Small helpers the plan's reader, checker and printer share.
#pragma once

#include "ir/DType.h"
#include "ir/Type.h"

#include "llvm/ADT/ArrayRef.h"

#include <optional>
#include <string>

namespace cleave::runtime {

// Byte size of a dense tensor, or nullopt for a negative dimension or an
// overflow.
inline std::optional<int64_t> denseBytes(ir::DType dtype,
                                         llvm::ArrayRef<int64_t> shape) {
  int64_t n = int64_t(ir::dtypeSize(dtype));
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return std::nullopt;
  return n;
}

// "f32[2,3]".
inline std::string typeText(ir::DType dtype, llvm::ArrayRef<int64_t> shape) {
  return ir::TensorType(dtype, ir::Shape(shape.begin(), shape.end())).str();
}

} // namespace cleave::runtime
