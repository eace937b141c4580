// Device code of Gather and GatherGrad (DeviceCode.h).
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

// --- gather and its gradient ------------------------------------------------------

// Gather along an axis: out[(o * n + k) * inner + i] = data[(o * dim +
// idx[k]) * inner + i], a negative index counting from the end. An index
// out of range reads nothing and writes 0 (cleave-run checks index inputs
// against the plan before they reach a kernel).
struct GatherStep {
  const void *data = nullptr;
  Elem elem = Elem::F32;
  const void *idx = nullptr;
  Elem idxElem = Elem::I64;
  void *out = nullptr;
  int64_t outer = 1, n = 0, dim = 0, inner = 1;
  bool grad = false; // GatherGrad: out is dX, data is dY
  int64_t padding = -1; // GatherGrad: the index whose row gets nothing
};

CLEAVE_HD int64_t gatherIndex(const GatherStep &s, int64_t k) {
  int64_t v = loadInt(s.idx, s.idxElem, k);
  return v < 0 ? v + s.dim : v;
}

// Gather: element i of the output.
CLEAVE_HD void gatherElement(const GatherStep &s, int64_t i) {
  int64_t in = i % s.inner, k = (i / s.inner) % s.n, o = i / (s.inner * s.n);
  int64_t v = gatherIndex(s, k);
  if (v < 0 || v >= s.dim) {
    store(s.out, s.elem, i, 0.0f);
    return;
  }
  mapCopyElement(s.data, (o * s.dim + v) * s.inner + in, s.out, i,
                 elemSize(s.elem));
}

// GatherGrad: column c = (o, i) of dX, which is zero before: adds dY[o, k,
// i] into dX[o, idx[k], i] for k in increasing order, in f32, as the CPU.
CLEAVE_HD void gatherGradColumn(const GatherStep &s, int64_t c) {
  int64_t in = c % s.inner, o = c / s.inner;
  for (int64_t k = 0; k < s.n; ++k) {
    int64_t v = gatherIndex(s, k);
    if (v < 0 || v >= s.dim || v == s.padding)
      continue;
    int64_t dst = (o * s.dim + v) * s.inner + in;
    float acc = load(s.out, s.elem, dst) +
                load(s.data, s.elem, (o * s.n + k) * s.inner + in);
    store(s.out, s.elem, dst, acc);
  }
}

} // namespace cleave::runtime::cuda
