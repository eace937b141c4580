// Window geometry shared by the convolution and pooling kernels
// (ConvPool.cpp) and their gradients (GradientsConvPool.cpp): where each
// output position's window lies in the input, over any number of spatial
// dims (NCHW-style layouts, explicit strides, pads and dilations as the
// importer resolved them), the im2col matrix and its adjoint, and a conv's
// GEMM sizes. The gradients walk the windows the way the forward kernels
// do, so both use these helpers; so do the batch-folded convs
// (ConvBatchFolded.h).
#pragma once

#include "runtime/cpu/CpuKernels.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cstdint>
#include <climits>
#include <limits>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

namespace cleave::runtime::cpu {

inline int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Values of i in [0, count) with 0 <= start + i * step < limit, as [lo, hi).
// Gives the output columns an im2col row reads from the input, and the
// kernel taps of a pooling window that land inside the input.
inline std::pair<int64_t, int64_t> insideRange(int64_t start, int64_t step,
                                               int64_t count, int64_t limit) {
  // Undilated pooling taps, twice per window: no division (8% of a 3x3
  // max pool's time, docs/benchmarks.md).
  if (step == 1) {
    int64_t lo = std::max<int64_t>(0, -start),
            hi = std::min(count, limit - start);
    hi = std::max<int64_t>(hi, 0);
    return {std::min(lo, hi), hi};
  }
  int64_t lo = start >= 0 ? 0 : ceilDiv(-start, step);
  int64_t hi =
      start <= limit - 1 ? std::min(count, (limit - 1 - start) / step + 1) : 0;
  return {std::min(lo, hi), hi};
}

// Window geometry of one conv or pool whose input has shape `inShape` and
// whose output has shape `outShape` ([N, C, spatial...] both), per spatial
// dim. The shapes come from the call's operands, which a forward op and its
// gradients arrange differently; the kernels check them (the forward ones
// rely on the verifier).
struct WindowGeometry {
  using Dims = llvm::SmallVector<int64_t, 4>;
  Dims in, out, kernel, strides, padBegin, padEnd, dilations, inStrides;
  int64_t inSize = 1, outSize = 1, kernelSize = 1;

  WindowGeometry(const KernelCall &call, llvm::ArrayRef<int64_t> inShape,
                 llvm::ArrayRef<int64_t> outShape,
                 llvm::ArrayRef<int64_t> kernelDims, bool hasDilations) {
    size_t sp = inShape.size() - 2;
    in.assign(inShape.begin() + 2, inShape.end());
    out.assign(outShape.begin() + 2, outShape.end());
    kernel.assign(kernelDims.begin(), kernelDims.end());
    const auto &st = call.getInts("strides"), &pd = call.getInts("pads");
    strides.assign(st.begin(), st.end());
    padBegin.assign(pd.begin(), pd.begin() + sp);
    padEnd.assign(pd.begin() + sp, pd.end());
    if (hasDilations) {
      const auto &dl = call.getInts("dilations");
      dilations.assign(dl.begin(), dl.end());
    } else {
      dilations.assign(sp, 1);
    }
    std::vector<int64_t> s = stridesOf(in);
    inStrides.assign(s.begin(), s.end());
    inSize = elementCount(in);
    outSize = elementCount(out);
    kernelSize = elementCount(kernel);
  }
  size_t rank() const { return in.size(); }
};

// Walks the kernel taps of one pooling window that land inside the input,
// in row-major tap order, calling f(flat input offset). `start` is the
// window's first input coordinate per dim; returns false if no tap lands
// inside.
template <typename F>
bool forEachTap(const WindowGeometry &g, llvm::ArrayRef<int64_t> start, F &&f) {
  using Dims = WindowGeometry::Dims;
  size_t sp = g.rank(), last = sp - 1;
  if (sp == 2) {
    // The 2-D windows of CNN pooling, the same taps in the same order
    // without the general loop's per-window bookkeeping: a quarter of a
    // 3x3 max pool's time (docs/benchmarks.md).
    auto [lo0, hi0] =
        insideRange(start[0], g.dilations[0], g.kernel[0], g.in[0]);
    auto [lo1, hi1] =
        insideRange(start[1], g.dilations[1], g.kernel[1], g.in[1]);
    if (lo0 >= hi0 || lo1 >= hi1)
      return false;
    int64_t rowStride = g.dilations[0] * g.inStrides[0], step = g.dilations[1];
    int64_t row = start[1] + (start[0] + lo0 * g.dilations[0]) * g.inStrides[0];
    for (int64_t k0 = lo0; k0 < hi0; ++k0, row += rowStride)
      for (int64_t t = lo1; t < hi1; ++t)
        f(row + t * step);
    return true;
  }
  Dims lo(sp), hi(sp), k(sp);
  for (size_t d = 0; d < sp; ++d) {
    std::tie(lo[d], hi[d]) =
        insideRange(start[d], g.dilations[d], g.kernel[d], g.in[d]);
    if (lo[d] >= hi[d])
      return false;
    k[d] = lo[d];
  }
  int64_t step = g.dilations[last];
  while (true) {
    // Outer dims pick a row of the input; the last dim runs along it.
    int64_t row = start[last];
    for (size_t d = 0; d < last; ++d)
      row += (start[d] + k[d] * g.dilations[d]) * g.inStrides[d];
    for (int64_t t = lo[last]; t < hi[last]; ++t)
      f(row + t * step);
    size_t d = last;
    while (d-- > 0) {
      if (++k[d] < hi[d])
        break;
      k[d] = lo[d];
    }
    if (d == size_t(-1))
      return true;
  }
}

// Whether a max-pooling tap of value v takes the window from the best so
// far: PyTorch's rule, a larger value or any NaN (the first maximum wins
// ties; the last NaN wins, so a NaN propagates as in PyTorch's kernels).
template <typename T> inline bool takesMax(T v, T best) {
  return v > best || std::isnan(v);
}

// One output row `oh` of 2-D max pooling over `plane`: best[ow] the value
// the window's tap by takesMax holds (-inf where no tap lands inside) and,
// with kTaps, tap[ow] its plane offset (-1 there; 32 bits, lanes as wide
// as f32's, so the selects vectorize: planes up to 2^31 elements, the
// callers check). The taps are visited in
// the window's row-major order, but a kernel tap at a time for the whole
// row (loops over ow the compiler vectorizes), so each window still folds
// its taps in order: the same tap and value as a window-by-window walk.
template <bool kTaps, typename T>
void maxPoolRow2d(const WindowGeometry &g, const T *plane, int64_t oh, T *best,
                  int32_t *tap) {
  int64_t outW = g.out[1], width = g.in[1];
  int64_t h0 = oh * g.strides[0] - g.padBegin[0], s = g.strides[1];
  auto [i0, i1] = insideRange(h0, g.dilations[0], g.kernel[0], g.in[0]);
  for (int64_t ow = 0; ow < outW; ++ow) {
    best[ow] = -std::numeric_limits<T>::infinity();
    if constexpr (kTaps) {
      // The window's first tap inside, which keeps it if nothing takes it
      // (all -inf); -1 where none is inside.
      int64_t w0 = ow * s - g.padBegin[1];
      auto [j0, j1] = insideRange(w0, g.dilations[1], g.kernel[1], width);
      tap[ow] = i0 < i1 && j0 < j1
                    ? int32_t((h0 + i0 * g.dilations[0]) * width + w0 +
                              j0 * g.dilations[1])
                    : -1;
    }
  }
  for (int64_t i = i0; i < i1; ++i) {
    int64_t row = (h0 + i * g.dilations[0]) * width;
    for (int64_t j = 0; j < g.kernel[1]; ++j) {
      int64_t c0 = j * g.dilations[1] - g.padBegin[1];
      auto [lo, hi] = insideRange(c0, s, outW, width);
      const T *in = plane + row + c0;
      for (int64_t ow = lo; ow < hi; ++ow) {
        T v = in[ow * s];
        // From -inf, the first tap inside takes the window or ties (all
        // -inf, where tap[] already names it): the values and taps are the
        // window walk's.
        bool takes = takesMax(v, best[ow]);
        best[ow] = takes ? v : best[ow];
        if constexpr (kTaps)
          tap[ow] = takes ? int32_t(row + c0 + ow * s) : tap[ow];
      }
    }
  }
}

// Whether maxPoolRow2d's 32-bit taps reach every offset of g's planes.
inline bool maxPoolRowsFit(const WindowGeometry &g) {
  return g.rank() == 2 && g.inSize < INT32_MAX;
}

// 2-D max pooling's windows, an output row at a time (maxPoolRow2d): runs
// f(plane, oh, best, tap) for every output row of `planes` planes of x
// (tap null unless kTaps). Planes spread over threads, one plane's rows in
// order.
template <bool kTaps, typename T, typename F>
void forEachMaxPoolRow2d(const WindowGeometry &g, int64_t planes, const T *x,
                         F &&f) {
  int64_t work = std::max<int64_t>(1, g.outSize * g.kernelSize);
  parallelFor(planes, std::max<int64_t>(1, 32768 / work),
              [&](int64_t p0, int64_t p1) {
                std::vector<T> best(size_t(g.out[1]));
                std::vector<int32_t> tap(kTaps ? size_t(g.out[1]) : 0);
                for (int64_t p = p0; p < p1; ++p)
                  for (int64_t oh = 0; oh < g.out[0]; ++oh) {
                    maxPoolRow2d<kTaps>(g, x + p * g.inSize, oh, best.data(),
                                        tap.data());
                    f(p, oh, best.data(), kTaps ? tap.data() : nullptr);
                  }
              });
}

// The taps of the window starting at `start` that land inside the padded
// input: AveragePool's count with count_include_pad. The extra cells a
// ceil_mode window reaches past the end padding never count.
inline int64_t tapsInsidePadding(const WindowGeometry &g,
                                 llvm::ArrayRef<int64_t> start) {
  int64_t count = 1;
  for (size_t d = 0; d < g.rank(); ++d) {
    auto [lo, hi] = insideRange(start[d] + g.padBegin[d], 1, g.kernel[d],
                                g.in[d] + g.padBegin[d] + g.padEnd[d]);
    count *= hi - lo;
  }
  return count;
}

// Runs f(plane, output position, window start) for every output element of
// `planes` (image, channel) planes; planes are spread over threads, and one
// plane's positions run in order.
template <typename F>
void forEachWindow(const WindowGeometry &g, int64_t planes, F &&f) {
  using Dims = WindowGeometry::Dims;
  int64_t work = std::max<int64_t>(1, g.outSize * g.kernelSize);
  size_t sp = g.rank();
  parallelFor(planes, std::max<int64_t>(1, 32768 / work),
              [&](int64_t p0, int64_t p1) {
                Dims pos(sp), start(sp);
                for (int64_t p = p0; p < p1; ++p) {
                  for (size_t d = 0; d < sp; ++d) {
                    pos[d] = 0;
                    start[d] = -g.padBegin[d];
                  }
                  for (int64_t o = 0; o < g.outSize; ++o) {
                    f(p, o, llvm::ArrayRef<int64_t>(start));
                    // Step to the next output position, last dim fastest.
                    for (size_t d = sp; d-- > 0;) {
                      start[d] += g.strides[d];
                      if (++pos[d] < g.out[d])
                        break;
                      pos[d] = 0;
                      start[d] = -g.padBegin[d];
                    }
                  }
                }
              });
}

// For one kernel tap (first input coordinate start[d] per dim), calls
// f(outLine, inLine, lo, hi) for every line of output positions (all dims
// but the last fixed) that reads inside the input: output outLine + j reads
// input inLine + j * stride for j in [lo, hi).
template <typename F>
void forEachTapLine(const WindowGeometry &g, llvm::ArrayRef<int64_t> start,
                    F &&f) {
  size_t last = g.rank() - 1;
  int64_t outInner = g.out[last], outOuter = g.outSize / outInner;
  auto [lo, hi] =
      insideRange(start[last], g.strides[last], outInner, g.in[last]);
  if (lo >= hi)
    return;
  for (int64_t o = 0; o < outOuter; ++o) {
    int64_t off = 0, rest = o;
    for (size_t d = last; d-- > 0 && off >= 0;) {
      int64_t i = (rest % g.out[d]) * g.strides[d] + start[d];
      rest /= g.out[d];
      off = i < 0 || i >= g.in[d] ? -1 : off + i * g.inStrides[d];
    }
    if (off >= 0)
      f(o * outInner, off + start[last], lo, hi);
  }
}

// The first input coordinate, per spatial dim, of im2col row `row`'s tap.
inline WindowGeometry::Dims tapStart(const WindowGeometry &g, int64_t row) {
  WindowGeometry::Dims start(g.rank());
  int64_t t = row % g.kernelSize;
  for (size_t d = g.rank(); d-- > 0;) {
    start[d] = (t % g.kernel[d]) * g.dilations[d] - g.padBegin[d];
    t /= g.kernel[d];
  }
  return start;
}

// Where each kernel tap reads the input, worked out once per conv for all
// its channels: per tap, runs of output positions (along the last spatial
// dim) whose input lies inside; run r covers outputs [out, out + count),
// which read input in + j * stride for j in [0, count).
struct TapRuns {
  struct Run {
    int64_t out, in, count;
  };
  std::vector<Run> runs;
  std::vector<size_t> first; // tap t's runs: [first[t], first[t + 1])
  int64_t stride;

  explicit TapRuns(const WindowGeometry &g) : stride(g.strides.back()) {
    first.push_back(0);
    for (int64_t t = 0; t < g.kernelSize; ++t) {
      forEachTapLine(
          g, tapStart(g, t),
          [&](int64_t outLine, int64_t inLine, int64_t lo, int64_t hi) {
            runs.push_back({outLine + lo, inLine + lo * stride, hi - lo});
          });
      first.push_back(runs.size());
    }
  }
  llvm::ArrayRef<Run> ofTap(int64_t t) const {
    return llvm::ArrayRef<Run>(runs).slice(first[t], first[t + 1] - first[t]);
  }
};

// Rows [row0, row1) of the im2col matrix [Cg * kernelSize, outSize] of the
// planes at x: row (c, tap) holds the input under that tap for every output
// position, 0 in the padding. Row r starts at col + r * ld (ld >= outSize:
// the batch-folded convs put the images' matrices side by side).
template <typename T>
void im2col(const T *x, const WindowGeometry &g, const TapRuns &taps,
            int64_t row0, int64_t row1, T *col, int64_t ld) {
  int64_t s = taps.stride;
  for (int64_t row = row0; row < row1; ++row) {
    const T *plane = x + (row / g.kernelSize) * g.inSize;
    T *dst = col + row * ld;
    std::fill(dst, dst + g.outSize, T(0));
    for (const TapRuns::Run &r : taps.ofTap(row % g.kernelSize)) {
      const T *src = plane + r.in;
      T *out = dst + r.out;
      if (s == 1) // a separate loop, so the compiler can vectorize it
        for (int64_t j = 0; j < r.count; ++j)
          out[j] = src[j];
      else
        for (int64_t j = 0; j < r.count; ++j)
          out[j] = src[j * s];
    }
  }
}

// The adjoint of im2col for channels [c0, c1): adds every entry of those
// channels' rows onto the input position it was read from (taps in order);
// row r starts at col + r * ld.
template <typename T>
void col2im(const T *col, const WindowGeometry &g, const TapRuns &taps,
            int64_t c0, int64_t c1, T *x, int64_t ld) {
  int64_t s = taps.stride;
  for (int64_t row = c0 * g.kernelSize; row < c1 * g.kernelSize; ++row) {
    T *plane = x + (row / g.kernelSize) * g.inSize;
    const T *src = col + row * ld;
    for (const TapRuns::Run &r : taps.ofTap(row % g.kernelSize)) {
      T *dst = plane + r.in;
      const T *in = src + r.out;
      if (s == 1)
        for (int64_t j = 0; j < r.count; ++j)
          dst[j] += in[j];
      else
        for (int64_t j = 0; j < r.count; ++j)
          dst[j * s] += in[j];
    }
  }
}

// Conv of X [N, C, in...] with W [M, C/group, kernel...] into Y [N, M,
// out...], and the GEMM sizes of one (image, group).
struct ConvDims {
  WindowGeometry g;
  int64_t n, c, m, groups, cg, mg, rows;
};

// The ConvDims of a call with X shape x, W shape w and Y shape y, unchecked
// (the gradient kernels check them first; the forward relies on the
// verifier).
inline ConvDims convDimsOf(const KernelCall &call, llvm::ArrayRef<int64_t> x,
                           llvm::ArrayRef<int64_t> w,
                           llvm::ArrayRef<int64_t> y) {
  ConvDims d{WindowGeometry(call, x, y, w.drop_front(2), /*hasDilations=*/true),
             x[0],
             x[1],
             w[0],
             call.getInt("group"),
             0,
             0,
             0};
  d.cg = d.c / d.groups;
  d.mg = d.m / d.groups;
  d.rows = d.cg * d.g.kernelSize;
  return d;
}

} // namespace cleave::runtime::cpu
