// Device code of GridSample and its gradients (DeviceCode.h): the
// per-element functions of runtime/GridSample.h, which the CPU kernels
// call too, so the bits are the CPU's. f32 only. GridSample: one thread an
// output element; GridSampleGradData: one thread an (image, channel)
// plane, adding its output gradients in row-major order as the CPU does
// (no atomics; N * C threads); GridSampleGradGrid: one thread an output
// position, summing over the channels.
#pragma once

#include "runtime/GridSample.h"
#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

enum class GridSampleKind : uint8_t { Forward, GradData, GradGrid };

struct GridSampleStep {
  GridSampleKind kind = GridSampleKind::Forward;
  grid::Geometry g;
  // Forward: X, grid; GradData: dY, grid; GradGrid: dY, X, grid.
  const float *a = nullptr, *b = nullptr, *c = nullptr;
  float *out = nullptr;
  int64_t threads = 0;
};

CLEAVE_HD void gridSampleElement(const GridSampleStep &s, int64_t i) {
  switch (s.kind) {
  case GridSampleKind::Forward:
    grid::forwardElement(s.g, s.a, s.b, s.out, i);
    return;
  case GridSampleKind::GradData:
    grid::gradDataPlane(s.g, s.a, s.b, s.out, i);
    return;
  case GridSampleKind::GradGrid:
    grid::gradGridPoint(s.g, s.a, s.b, s.c, s.out, i);
    return;
  }
}

} // namespace cleave::runtime::cuda
