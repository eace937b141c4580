// ScatterElements and its gradients (ScatterElementsGradData,
// ScatterElementsGradUpdates) for the CPU backend.
//
// Position p of indices (row-major) addresses one element of data along
// `axis`, the flat offset gatherElementsOffsets computes for GatherElements
// too. The scatters run serially over p, so repeated indices resolve in
// index order (the last write wins, reductions combine in order) whatever
// the thread count.
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

using ir::DType;
using ir::OpKind;

// The offsets into a tensor shaped `shape` that `idx` addresses along the
// call's axis.
llvm::Expected<std::vector<int64_t>>
elementOffsets(const KernelCall &c, llvm::ArrayRef<int64_t> shape,
               const TensorRef &idx) {
  int64_t rank = shape.size(), axis = c.getInt("axis");
  if (axis < -rank || axis >= rank)
    return kernelError(c, "axis {0} is out of range for shape {1}", axis,
                       ir::shapeStr(shape));
  return gatherElementsOffsets(c, shape, idx, axis < 0 ? axis + rank : axis);
}

template <typename T>
void combine(T *out, const T *upd, llvm::ArrayRef<int64_t> offsets,
             const std::string &red) {
  int64_t n = offsets.size();
  if (red == "add")
    for (int64_t p = 0; p < n; ++p)
      out[offsets[p]] = T(out[offsets[p]] + upd[p]);
  else if (red == "mul")
    for (int64_t p = 0; p < n; ++p)
      out[offsets[p]] = T(out[offsets[p]] * upd[p]);
  else if (red == "max")
    for (int64_t p = 0; p < n; ++p)
      out[offsets[p]] = std::max(out[offsets[p]], upd[p]);
  else
    for (int64_t p = 0; p < n; ++p)
      out[offsets[p]] = std::min(out[offsets[p]], upd[p]);
}

// out = data; then, for p in order, out[offset[p]] = updates[p] (none) or
// combined with it (add, mul, max, min). Reduction none moves bytes, so it
// takes every type; the reductions take the numeric types.
llvm::Error scatterElements(const KernelCall &c) {
  const TensorRef &data = c.inputs[0], &idx = c.inputs[1],
                  &upd = c.inputs[2], &out = c.outputs[0];
  if (upd.dtype != data.dtype || upd.shape != idx.shape)
    return kernelError(c, "updates {0} do not match indices {1}",
                       ir::shapeStr(upd.shape), ir::shapeStr(idx.shape));
  const std::string &red = c.getString("reduction");
  bool none = red == "none";
  if (!none && red != "add" && red != "mul" && red != "max" && red != "min")
    return kernelError(c, "unknown reduction '{0}'", red);
  if (!none && (data.dtype == DType::F16 || data.dtype == DType::BF16 ||
                data.dtype == DType::Bool))
    return kernelError(c, "reduction '{0}' is not supported for {1}", red,
                       ir::dtypeName(data.dtype));
  auto offsets = elementOffsets(c, data.shape, idx);
  if (!offsets)
    return offsets.takeError();
  size_t unit = ir::dtypeSize(data.dtype);
  if (out.data != data.data && data.numElements())
    std::memcpy(out.data, data.data, size_t(data.numElements()) * unit);
  if (none) {
    char *dst = out.as<char>();
    const char *src = upd.as<char>();
    for (size_t p = 0; p < offsets->size(); ++p)
      std::memcpy(dst + (*offsets)[p] * unit, src + p * unit, unit);
    return llvm::Error::success();
  }
  dispatchType(data.dtype, [&](auto v) {
    using T = decltype(v);
    if constexpr (!std::is_same_v<T, bool>)
      combine(out.as<T>(), upd.as<T>(), *offsets, red);
  });
  return llvm::Error::success();
}

// dData = dY with every element a position of indices wrote set to 0.
template <typename T>
llvm::Error scatterElementsGradData(const KernelCall &c) {
  const TensorRef &dY = c.inputs[0], &idx = c.inputs[1], &dX = c.outputs[0];
  auto offsets = elementOffsets(c, dY.shape, idx);
  if (!offsets)
    return offsets.takeError();
  const T *dy = dY.as<T>();
  T *dx = dX.as<T>();
  if (dx != dy)
    std::copy(dy, dy + dY.numElements(), dx);
  for (int64_t off : *offsets)
    dx[off] = T(0);
  return llvm::Error::success();
}

// dUpdates[p] = dY[offset[p]] where p was the last position to write that
// element, 0 where a later one overwrote it.
template <typename T>
llvm::Error scatterElementsGradUpdates(const KernelCall &c) {
  const TensorRef &dY = c.inputs[0], &idx = c.inputs[1], &dU = c.outputs[0];
  auto offsets = elementOffsets(c, dY.shape, idx);
  if (!offsets)
    return offsets.takeError();
  const T *dy = dY.as<T>();
  T *du = dU.as<T>();
  // Two positions write one element only if they share their lane (every
  // coordinate but the axis's). With few positions a lane (a row written
  // at a time: one), each looks at the later ones of its lane; otherwise a
  // flag per element of dY, positions from the last.
  int64_t rank = idx.rank(), axis = c.getInt("axis");
  if (axis < 0)
    axis += rank;
  const int64_t along = idx.shape[axis],
                inner = elementCount(idx.shape.drop_front(axis + 1));
  const int64_t n = int64_t(offsets->size());
  if (along <= 16) {
    for (int64_t p = 0; p < n; ++p) {
      const int64_t off = (*offsets)[p], k = (p / inner) % along;
      bool later = false;
      for (int64_t q = p + inner, j = k + 1; j < along && !later;
           q += inner, ++j)
        later = (*offsets)[q] == off;
      du[p] = later ? T(0) : dy[off];
    }
    return llvm::Error::success();
  }
  std::vector<char> written(dY.numElements(), 0);
  for (int64_t p = n; p-- > 0;) {
    int64_t off = (*offsets)[p];
    du[p] = written[off] ? T(0) : dy[off];
    written[off] = 1;
  }
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(gradDataKernel, scatterElementsGradData)
CLEAVE_FLOAT_DISPATCH(gradUpdatesKernel, scatterElementsGradUpdates)

} // namespace

void registerScatterElementsKernels(KernelTable &t) {
  t.add(OpKind::ScatterElements, scatterElements, kAllTypes);
  t.add(OpKind::ScatterElementsGradData, gradDataKernel, kFloatTypes);
  t.add(OpKind::ScatterElementsGradUpdates, gradUpdatesKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
