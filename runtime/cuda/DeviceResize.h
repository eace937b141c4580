// Device code of Resize and ResizeGrad (DeviceCode.h), modes nearest,
// linear and cubic, with the CPU kernel's formulas (runtime/cpu/Resize.cpp)
// computed per element instead of from tables: the input coordinate of
// output index o along dim d in float (PyTorch's formulas: (o + 0.5) scale
// - 0.5 for half_pixel, o scale for asymmetric and align_corners, ...),
// nearest's rounding, linear's two taps and weights, cubic's four. The lowering computes each
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

// Linear interpolates at most this many dims (2^kMaxResized corners),
// cubic half as many (4^(kMaxResized / 2)).
constexpr int kMaxResized = 4;
constexpr int kMaxCorners = 1 << kMaxResized;

struct ResizeStep {
  bool linear = false, grad = false; // linear: interpolating (linear, cubic)
  int taps = 1;                      // 1 nearest, 2 linear, 4 cubic
  float cubicA = -0.75f;
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

// The taps of output index o along dim d (linear's 2, cubic's 4): input
// indices, never decreasing, and their weights.
struct ResizeTaps {
  int64_t i[4];
  float w[4];
};
CLEAVE_HD ResizeTaps resizeTapsOf(const ResizeStep &s, int d, int64_t o) {
  float x = resizeSource(s, d, o);
  int64_t n = s.in[d];
  ResizeTaps t{};
  if (s.taps == 4) { // PyTorch's bicubic: edge reads, coefficient A
    float f = floorf(x), u = x - f, a = s.cubicA;
    float wu[4] = {u + 1.0f, u, 1.0f - u, 2.0f - u};
    for (int k = 0; k < 4; ++k) {
      int64_t i = int64_t(f) - 1 + k;
      t.i[k] = i < 0 ? 0 : i > n - 1 ? n - 1 : i;
      float v = wu[k];
      t.w[k] = k == 1 || k == 2 ? ((a + 2.0f) * v - (a + 3.0f)) * v * v + 1.0f
                                : ((a * v - 5.0f * a) * v + 8.0f * a) * v - 4.0f * a;
    }
    return t;
  }
  x = x < 0.0f ? 0.0f : x;
  int64_t i0 = int64_t(x);
  i0 = i0 < n - 1 ? i0 : n - 1;
  float lambda = x - float(i0);
  lambda = lambda < 0.0f ? 0.0f : 1.0f < lambda ? 1.0f : lambda;
  t.i[0] = i0;
  t.i[1] = i0 + 1 < n - 1 ? i0 + 1 : n - 1;
  t.w[0] = 1.0f - lambda;
  t.w[1] = lambda;
  return t;
}

// Whether dim d reads input index o for output index o, weight 1.
CLEAVE_HD bool resizeKeepsIndex(const ResizeStep &s, int d, int64_t o) {
  if (!s.linear)
    return resizeNearest(s, d, o) == o;
  ResizeTaps t = resizeTapsOf(s, d, o);
  if (s.taps == 2)
    return t.i[0] == o && t.w[1] == 0.0f;
  return t.i[1] == o && t.w[0] == 0.0f && t.w[2] == 0.0f && t.w[3] == 0.0f;
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
      taps[levels++] = resizeTapsOf(s, d, coord[d]);
    }
  }
  // Corner c's digit (base s.taps) at place levels - 1 - k picks level k's
  // tap; the values combine from the innermost level out, each node
  // v0*w0 + v1*w1 + ... as the CPU's recursion.
  int corners = 1;
  for (int k = 0; k < levels; ++k)
    corners *= s.taps;
  float v[kMaxCorners];
  for (int c = 0; c < corners; ++c) {
    int64_t off = base;
    for (int k = levels - 1, rest = c; k >= 0; --k, rest /= s.taps)
      off += taps[k].i[rest % s.taps] * stride[dims[k]];
    v[c] = load(s.x, s.xElem, off);
  }
  for (int k = levels - 1; k >= 0; --k) {
    corners /= s.taps;
    for (int c = 0; c < corners; ++c) {
      float a = v[s.taps * c] * taps[k].w[0];
      for (int t = 1; t < s.taps; ++t)
        a += v[s.taps * c + t] * taps[k].w[t];
      v[c] = a;
    }
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
    int64_t last = s.linear ? resizeTapsOf(s, d, m).i[s.taps - 1] : resizeNearest(s, d, m);
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
    int64_t first = s.linear ? resizeTapsOf(s, d, m).i[0] : resizeNearest(s, d, m);
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
      int corners = 1;
      for (int k = 0; k < levels; ++k) {
        taps[k] = resizeTapsOf(s, dims[k], j[dims[k]]);
        corners *= s.taps;
      }
      // The CPU's order: level 0's tap varies slowest.
      for (int corner = 0; corner < corners; ++corner) {
        float w = 1.0f;
        bool reads = true;
        for (int k = 0, place = corners / s.taps; k < levels && reads;
             ++k, place /= s.taps) {
          int t = (corner / place) % s.taps;
          reads = taps[k].i[t] == c[dims[k]];
          float wk = taps[k].w[t];
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
