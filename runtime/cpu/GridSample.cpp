// GridSample, GridSampleGradData and GridSampleGradGrid for the CPU backend:
// the per-element functions of runtime/GridSample.h over the thread pool
// (the forward split by output elements, dX by (image, channel) planes,
// dGrid by output positions), f32 and f64.
#include "runtime/cpu/CpuKernels.h"

#include "runtime/GridSampleCall.h"

namespace cleave::runtime::cpu {
namespace {

using ir::OpKind;

// The call's geometry (runtime/GridSampleCall.h), its error named by the op.
llvm::Expected<grid::Geometry> geometryOf(const KernelCall &c,
                                          llvm::ArrayRef<int64_t> x,
                                          llvm::ArrayRef<int64_t> g) {
  auto geo = grid::geometryOf(c, x, g);
  if (!geo)
    return kernelError(c, "{0}", llvm::toString(geo.takeError()));
  return geo;
}

template <typename T> llvm::Error gridSample(const KernelCall &c) {
  const TensorRef &x = c.inputs[0], &g = c.inputs[1], &y = c.outputs[0];
  auto geo = geometryOf(c, x.shape, g.shape);
  if (!geo)
    return geo.takeError();
  const T *xs = x.as<T>(), *gs = g.as<T>();
  T *ys = y.as<T>();
  parallelFor(y.numElements(), 1 << 12, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      grid::forwardElement(*geo, xs, gs, ys, i);
  });
  return llvm::Error::success();
}

// Operands dY, grid; result dX.
template <typename T> llvm::Error gridSampleGradData(const KernelCall &c) {
  const TensorRef &dy = c.inputs[0], &g = c.inputs[1], &dx = c.outputs[0];
  auto geo = geometryOf(c, dx.shape, g.shape);
  if (!geo)
    return geo.takeError();
  const T *dys = dy.as<T>(), *gs = g.as<T>();
  T *dxs = dx.as<T>();
  int64_t positions = std::max<int64_t>(geo->ho * geo->wo, 1);
  parallelFor(geo->n * geo->c, std::max<int64_t>(1, (1 << 13) / positions),
              [&](int64_t b, int64_t e) {
                for (int64_t p = b; p < e; ++p)
                  grid::gradDataPlane(*geo, dys, gs, dxs, p);
              });
  return llvm::Error::success();
}

// Operands dY, X, grid; result dGrid.
template <typename T> llvm::Error gridSampleGradGrid(const KernelCall &c) {
  const TensorRef &dy = c.inputs[0], &x = c.inputs[1], &g = c.inputs[2],
                  &dg = c.outputs[0];
  auto geo = geometryOf(c, x.shape, g.shape);
  if (!geo)
    return geo.takeError();
  const T *dys = dy.as<T>(), *xs = x.as<T>(), *gs = g.as<T>();
  T *dgs = dg.as<T>();
  parallelFor(geo->n * geo->ho * geo->wo,
              std::max<int64_t>(1, (1 << 12) / std::max<int64_t>(geo->c, 1)),
              [&](int64_t b, int64_t e) {
                for (int64_t q = b; q < e; ++q)
                  grid::gradGridPoint(*geo, dys, xs, gs, dgs, q);
              });
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(gridSampleKernel, gridSample)
CLEAVE_FLOAT_DISPATCH(gridSampleGradDataKernel, gridSampleGradData)
CLEAVE_FLOAT_DISPATCH(gridSampleGradGridKernel, gridSampleGradGrid)

} // namespace

void registerGridSampleKernels(KernelTable &t) {
  t.add(OpKind::GridSample, gridSampleKernel, kFloatTypes);
  t.add(OpKind::GridSampleGradData, gridSampleGradDataKernel, kFloatTypes);
  t.add(OpKind::GridSampleGradGrid, gridSampleGradGridKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
