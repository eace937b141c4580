// Tile for the CPU backend: the input repeated along each dim. Moves
// elements as bytes, so every type is handled alike: each output row (all
// dims but the last) is the input row it repeats, copied once per repeat
// of the last dim. Threads split the rows. (The gradient is a ReduceSum
// over the tiles: passes/GradientRules.cpp.)
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>

namespace cleave::runtime::cpu {
namespace {

llvm::Error tile(const KernelCall &c) {
  const TensorRef &x = c.inputs[0], &y = c.outputs[0];
  size_t rank = x.rank();
  if (y.numElements() == 0)
    return llvm::Error::success();
  if (rank == 0) {
    std::memcpy(y.data, x.data, ir::dtypeSize(x.dtype));
    return llvm::Error::success();
  }
  size_t unit = ir::dtypeSize(x.dtype);
  int64_t inRow = x.shape[rank - 1], outRow = y.shape[rank - 1];
  int64_t rows = y.numElements() / outRow;
  std::vector<int64_t> strides = stridesOf(x.shape);
  const char *src = x.as<char>();
  char *dst = y.as<char>();
  parallelFor(rows, std::max<int64_t>(1, (1 << 16) / (outRow * unit)),
              [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  // The input row: each outer coordinate modulo its dim.
                  int64_t rest = r, off = 0;
                  for (size_t d = rank - 1; d-- > 0;) {
                    off += (rest % y.shape[d]) % x.shape[d] * strides[d];
                    rest /= y.shape[d];
                  }
                  char *out = dst + r * outRow * unit;
                  for (int64_t k = 0; k < outRow; k += inRow)
                    std::memcpy(out + k * unit, src + off * unit,
                                inRow * unit);
                }
              });
  return llvm::Error::success();
}

} // namespace

void registerTileKernels(KernelTable &t) {
  t.add(ir::OpKind::Tile, tile, kAllTypes);
}

} // namespace cleave::runtime::cpu
