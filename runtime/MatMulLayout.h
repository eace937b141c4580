// The batch layout of a MatMul with NumPy batch broadcasting, shared by the
// CPU backend's MatMul gradients (cpu/GradientsLinalg.cpp) and the CUDA
// lowering (cuda/LowerProducts.cpp), so both sum a broadcast operand's
// gradient over the same batch entries in the same order.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <vector>

namespace cleave::runtime {

// Y[batch, m, n] = A[batchA, m, k] x B[batchB, k, n]: the matrix sizes, the
// batch counts, and per output batch entry (row-major over Y's batch dims)
// the index of the A and B matrices it reads.
struct MatMulLayout {
  int64_t m = 0, k = 0, n = 0, count = 1, countA = 1, countB = 1;
  std::vector<int64_t> matA, matB;
};

// The layout of A `a` x B `b` giving `y`, or an error without the op's name
// (callers add it): operands of rank below 2 (autodiff reshapes 1-D
// operands to 2-D), or shapes that do not give `y`.
llvm::Expected<MatMulLayout> matMulLayout(llvm::ArrayRef<int64_t> a,
                                          llvm::ArrayRef<int64_t> b,
                                          llvm::ArrayRef<int64_t> y);

} // namespace cleave::runtime
