// Device code of Resize and ResizeGrad (DeviceCode.h), modes nearest and
// linear, with the CPU kernel's formulas (runtime/cpu/Resize.cpp) computed
// per element instead of from tables: the input coordinate of output index
// o along dim d in float (PyTorch's formulas: (o + 0.5) scale - 0.5 for
// half_pixel, o scale for asymmetric and align_corners, ...), nearest's
// rounding, linear's two taps and weights. The lowering computes each
// dim's scale and whether the dim maps every index to itself (then it is
// read straight, as the CPU skips it) with the same functions.
//
// Resize: one thread an output element; linear interpolates the resized
// dims in the CPU's nesting (the outermost last). ResizeGrad: one thread
// an input element, which finds along each dim the output indices that
// read it (a binary search: the taps grow with the index) and adds their
// gradients in the CPU's order (outputs row-major, then each output's
// corners, the first tap before the second, outermost dim first), so the
// sums are the CPU's bits and need no atomics.
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

enum class ResizeCoord : uint8_t {
  HalfPixel,
  PytorchHalfPixel,
  AlignCorners,
  Asymmetric,
  TfHalfPixelForNN
};
enum class ResizeRound : uint8_t { PreferFloor, PreferCeil, Floor, Ceil };

// Linear interpolates at most this many dims (2^kMaxResized corners).
constexpr int kMaxResized = 4;

struct ResizeStep {
  bool linear = false, grad = false;
  ResizeCoord coord = ResizeCoord::HalfPixel;
  ResizeRound round = ResizeRound::PreferFloor;
  const void *x = nullptr; // Resize: the input; ResizeGrad: dY
  Elem xElem = Elem::F32;
  void *out = nullptr; // Resize: the output; ResizeGrad: dX
  Elem outElem = Elem::F32;
  int rank = 0;
  // The input's dims (dX's for the gradient) and the output's (dY's).
  int64_t in[kMaxRank] = {}, outDims[kMaxRank] = {};
  float scale[kMaxRank] = {};     // input units per output unit
  bool identity[kMaxRank] = {};   // read straight
  int64_t threads = 0;
};

// The input coordinate of output index o along dim d.
CLEAVE_HD float resizeSource(const ResizeStep &s, int d, int64_t o) {
  float scale = s.scale[d];
  switch (s.coord) {
  case ResizeCoord::AlignCorners:
  case ResizeCoord::Asymmetric: return float(o) * scale;
  case ResizeCoord::TfHalfPixelForNN: return (float(o) + 0.5f) * scale;
  case ResizeCoord::PytorchHalfPixel:
    if (s.outDims[d] <= 1)
      return 0.0f;
    break;
  case ResizeCoord::HalfPixel: break;
  }
  return (float(o) + 0.5f) * scale - 0.5f;
}

// Nearest's input index of output index o along dim d.
CLEAVE_HD int64_t resizeNearest(const ResizeStep &s, int d, int64_t o) {
  float x = resizeSource(s, d, o);
  float r = s.round == ResizeRound::Floor        ? floorf(x)
            : s.round == ResizeRound::Ceil       ? ceilf(x)
            : s.round == ResizeRound::PreferCeil ? floorf(x + 0.5f)
                                                 : ceilf(x - 0.5f);
  int64_t i = int64_t(r), n = s.in[d];
  return i < 0 ? 0 : i > n - 1 ? n - 1 : i;
}

// Linear's taps of output index o along dim d: input indices i0 <= i1
// and their weights.
struct ResizeTaps {
  int64_t i0, i1;
  float w0, w1;
};
CLEAVE_HD ResizeTaps resizeLinearTaps(const ResizeStep &s, int d, int64_t o) {
  float x = resizeSource(s, d, o);
  x = x < 0.0f ? 0.0f : x;
  int64_t n = s.in[d], i0 = int64_t(x);
  i0 = i0 < n - 1 ? i0 : n - 1;
  float lambda = x - float(i0);
  lambda = lambda < 0.0f ? 0.0f : 1.0f < lambda ? 1.0f : lambda;
  return {i0, i0 + 1 < n - 1 ? i0 + 1 : n - 1, 1.0f - lambda, lambda};
}

// Whether dim d reads input index o for output index o, weight 1.
CLEAVE_HD bool resizeKeepsIndex(const ResizeStep &s, int d, int64_t o) {
  if (!s.linear)
    return resizeNearest(s, d, o) == o;
  ResizeTaps t = resizeLinearTaps(s, d, o);
  return t.i0 == o && t.w1 == 0.0f;
}

// Resize: output element p.
CLEAVE_HD void resizeElement(const ResizeStep &s, int64_t p) {
  int64_t coord[kMaxRank], stride[kMaxRank];
  int64_t rest = p, step = 1;
  for (int d = s.rank - 1; d >= 0; --d) {
    coord[d] = rest % s.outDims[d];
    rest /= s.outDims[d];
    stride[d] = step;
    step *= s.in[d];
  }
  if (!s.linear) {
    int64_t off = 0;
    for (int d = 0; d < s.rank; ++d)
      off += resizeNearest(s, d, coord[d]) * stride[d];
    mapCopyElement(s.x, off, s.out, p, elemSize(s.xElem));
    return;
  }
  int64_t base = 0;
  int levels = 0, dims[kMaxResized];
  ResizeTaps taps[kMaxResized];
  for (int d = 0; d < s.rank; ++d) {
    if (s.identity[d]) {
      base += coord[d] * stride[d];
    } else {
      dims[levels] = d;
      taps[levels++] = resizeLinearTaps(s, d, coord[d]);
    }
  }
  // Corner c's bit (levels - 1 - k) picks tap i1 of level k; the values
  // combine from the innermost level out, each node a*w0 + b*w1 as the
  // CPU's recursion.
  float v[1 << kMaxResized];
  for (int c = 0; c < (1 << levels); ++c) {
    int64_t off = base;
    for (int k = 0; k < levels; ++k) {
      bool second = (c >> (levels - 1 - k)) & 1;
      off += (second ? taps[k].i1 : taps[k].i0) * stride[dims[k]];
    }
    v[c] = load(s.x, s.xElem, off);
  }
  for (int k = levels - 1; k >= 0; --k)
    for (int c = 0; c < (1 << k); ++c) {
      float a = v[2 * c] * taps[k].w0;
      a += v[2 * c + 1] * taps[k].w1;
      v[c] = a;
    }
  store(s.out, s.outElem, p, v[0]);
}

// The output indices along dim d that read input index c: [*lo, *hi]
// (empty when lo > hi). The taps never decrease with the output index.
CLEAVE_HD void resizeReaders(const ResizeStep &s, int d, int64_t c,
                             int64_t *lo, int64_t *hi) {
  int64_t o = s.outDims[d];
  if (s.identity[d]) {
    *lo = *hi = c;
    return;
  }
  // The first index whose last tap is >= c.
  int64_t a = 0, b = o;
  while (a < b) {
    int64_t m = (a + b) / 2;
    int64_t last = s.linear ? resizeLinearTaps(s, d, m).i1 : resizeNearest(s, d, m);
    if (last >= c)
      b = m;
    else
      a = m + 1;
  }
  *lo = a;
  // The last index whose first tap is <= c.
  a = 0;
  b = o;
  while (a < b) {
    int64_t m = (a + b) / 2;
    int64_t first = s.linear ? resizeLinearTaps(s, d, m).i0 : resizeNearest(s, d, m);
    if (first <= c)
      a = m + 1;
    else
      b = m;
  }
  *hi = a - 1;
}

// ResizeGrad: input element q (of dX).
CLEAVE_HD void resizeGradElement(const ResizeStep &s, int64_t q) {
  int64_t c[kMaxRank], lo[kMaxRank], hi[kMaxRank], j[kMaxRank],
      outStride[kMaxRank];
  int64_t rest = q, step = 1;
  bool any = true;
  for (int d = s.rank - 1; d >= 0; --d) {
    c[d] = rest % s.in[d];
    rest /= s.in[d];
    outStride[d] = step;
    step *= s.outDims[d];
    resizeReaders(s, d, c[d], &lo[d], &hi[d]);
    any = any && lo[d] <= hi[d];
    j[d] = lo[d];
  }
  float acc = 0.0f;
  int levels = 0, dims[kMaxRank];
  for (int d = 0; d < s.rank; ++d)
    if (!s.identity[d])
      dims[levels++] = d;
  while (any) {
    int64_t p = 0;
    for (int d = 0; d < s.rank; ++d)
      p += j[d] * outStride[d];
    float gv = load(s.x, s.xElem, p);
    if (!s.linear) {
      acc += gv;
    } else {
      ResizeTaps taps[kMaxRank];
      for (int k = 0; k < levels; ++k)
        taps[k] = resizeLinearTaps(s, dims[k], j[dims[k]]);
      for (int corner = 0; corner < (1 << levels); ++corner) {
        float w = 1.0f;
        bool reads = true;
        for (int k = 0; k < levels && reads; ++k) {
          bool second = (corner >> (levels - 1 - k)) & 1;
          reads = (second ? taps[k].i1 : taps[k].i0) == c[dims[k]];
          float wk = second ? taps[k].w1 : taps[k].w0;
          w = k ? w * wk : wk;
        }
        if (reads)
          acc += w * gv;
      }
    }
    // The next output index, row-major within the ranges.
    int d = s.rank - 1;
    for (; d >= 0; --d) {
      if (++j[d] <= hi[d])
        break;
      j[d] = lo[d];
    }
    any = d >= 0;
  }
  store(s.out, s.outElem, q, acc);
}

} // namespace cleave::runtime::cuda
