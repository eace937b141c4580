// Shape arithmetic shared by the IR's type rules and the runtime's kernels:
// plain integers, no IR types, so both can include it (ir/Type.h and
// ir/TypeRules.h re-export these names in cleave::ir).
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>

namespace cleave::support {

// "[2,3]".
std::string shapeStr(llvm::ArrayRef<int64_t> shape);
// Checks dims are non-negative and the element count fits comfortably in
// int64 (and in memory addressing); names the offending dim.
llvm::Error checkShape(llvm::ArrayRef<int64_t> shape);
// Output length of ONNX Slice on one axis of size `dim` (starts/ends clamped
// as the ONNX spec says). Also returns the clamped start.
int64_t sliceLength(int64_t dim, int64_t start, int64_t end, int64_t step,
                    int64_t *clampedStart = nullptr);

} // namespace cleave::support
