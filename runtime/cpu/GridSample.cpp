// GridSample, GridSampleGradData and GridSampleGradGrid for the CPU backend:
// the per-element functions of runtime/GridSample.h over the thread pool
// (the forward split by output elements, dX by (image, channel) planes,
// dGrid by output positions), f32 and f64.
#include "runtime/cpu/CpuKernels.h"

#include "runtime/GridSample.h"

namespace cleave::runtime::cpu {
namespace {

using ir::OpKind;

// The geometry of a call: X's shape is the forward's input (dX's for
// GridSampleGradData), the grid is [N, Ho, Wo, 2].
llvm::Expected<grid::Geometry> geometryOf(const KernelCall &c,
                                          llvm::ArrayRef<int64_t> x,
                                          llvm::ArrayRef<int64_t> g) {
  grid::Geometry geo;
  if (x.size() != 4 || g.size() != 4 || g[0] != x[0] || g[3] != 2)
    return kernelError(c, "X {0} and grid {1} must be [N, C, H, W] and "
                          "[N, Ho, Wo, 2]",
                       ir::shapeStr(x), ir::shapeStr(g));
  const std::string &mode = c.getString("mode");
  if (mode != "linear" && mode != "nearest")
    return kernelError(c, "mode '{0}' is not supported", mode);
  const std::string &pad = c.getString("padding_mode");
  if (pad == "zeros")
    geo.padding = grid::Padding::Zeros;
  else if (pad == "border")
    geo.padding = grid::Padding::Border;
  else if (pad == "reflection")
    geo.padding = grid::Padding::Reflection;
  else
    return kernelError(c, "padding_mode '{0}' is not supported", pad);
  geo.nearest = mode == "nearest";
  geo.alignCorners = c.getInt("align_corners") != 0;
  geo.n = x[0];
  geo.c = x[1];
  geo.h = x[2];
  geo.w = x[3];
  geo.ho = g[1];
  geo.wo = g[2];
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
