// CumSum for the CPU backend: running sums along one axis.
//
// Threads split the lanes (every position off the axis), and each lane is
// summed in order along the axis, so no element's sum depends on the
// thread count. Floats accumulate in double and round once per element, as
// PyTorch's CPU cumsum does; integers wrap like two's complement hardware.
// The gradient is a CumSum too (of dY, the direction reversed).
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

using ir::DType;

template <typename T>
void cumSumLanes(const T *x, T *y, int64_t outer, int64_t dim, int64_t inner,
                 bool exclusive, bool reverse) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double,
                                 uint64_t>;
  int64_t lanes = outer * inner;
  parallelFor(lanes, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(dim, 1)),
              [&](int64_t b, int64_t e) {
                for (int64_t lane = b; lane < e; ++lane) {
                  int64_t base = (lane / inner) * dim * inner + lane % inner;
                  Acc acc = 0;
                  for (int64_t k = 0; k < dim; ++k) {
                    int64_t j = base + (reverse ? dim - 1 - k : k) * inner;
                    Acc v = Acc(x[j]);
                    if (!exclusive)
                      acc += v;
                    y[j] = T(acc);
                    if (exclusive)
                      acc += v;
                  }
                }
              });
}

llvm::Error cumSum(const KernelCall &c) {
  const TensorRef &x = c.inputs[0], &y = c.outputs[0];
  auto lanes = axisLanes(c, x.shape);
  if (!lanes)
    return lanes.takeError();
  const int64_t outer = lanes->outer, dim = lanes->len, inner = lanes->inner;
  bool exclusive = c.getInt("exclusive") != 0, reverse = c.getInt("reverse") != 0;
  dispatchType(x.dtype, [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_same_v<T, bool>)
      cumSumLanes(x.as<T>(), y.as<T>(), outer, dim, inner, exclusive, reverse);
  });
  return llvm::Error::success();
}

} // namespace

void registerCumSumKernels(KernelTable &t) {
  t.add(ir::OpKind::CumSum, cumSum, kNumericTypes);
}

} // namespace cleave::runtime::cpu
