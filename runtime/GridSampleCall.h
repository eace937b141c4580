// The geometry of a GridSample call (runtime/GridSample.h) from its
// attributes and shapes, read once for both backends: the CPU kernels
// (runtime/cpu/GridSample.cpp) and the CUDA lowering
// (runtime/cuda/LowerResize.cpp). Host code only.
#pragma once

#include "runtime/GridSample.h"
#include "runtime/Kernel.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

namespace cleave::runtime::grid {

// X's shape `x` (the forward's input; dX's for GridSampleGradData) and the
// grid's `g`, [N, C, H, W] and [N, Ho, Wo, 2]; an error (without the op's
// name, which each backend adds) when they or the attributes do not fit.
inline llvm::Expected<Geometry> geometryOf(const KernelCall &c,
                                           llvm::ArrayRef<int64_t> x,
                                           llvm::ArrayRef<int64_t> g) {
  auto bad = [](const std::string &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), why);
  };
  if (x.size() != 4 || g.size() != 4 || g[0] != x[0] || g[3] != 2)
    return bad("X " + ir::shapeStr(x) + " and grid " + ir::shapeStr(g) +
               " must be [N, C, H, W] and [N, Ho, Wo, 2]");
  Geometry geo;
  const std::string &mode = c.getString("mode");
  if (mode != "linear" && mode != "nearest")
    return bad("mode '" + mode + "' is not supported");
  const std::string &pad = c.getString("padding_mode");
  if (pad == "zeros")
    geo.padding = Padding::Zeros;
  else if (pad == "border")
    geo.padding = Padding::Border;
  else if (pad == "reflection")
    geo.padding = Padding::Reflection;
  else
    return bad("padding_mode '" + pad + "' is not supported");
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

} // namespace cleave::runtime::grid
