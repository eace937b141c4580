#include "runtime/cpu/ConvBatchFolded.h"

#include "runtime/cpu/Blas.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace cleave::runtime::cpu {
namespace {

// Output positions per image up to which convs fold the batch. Above it an
// image's own GEMMs are wide enough, and the tap-by-tap paths copy less.
constexpr int64_t kMaxFoldedPositions = 256;
// The im2col elements one chunk of images may take (16 MiB of f32).
constexpr int64_t kChunkElements = int64_t(1) << 22;

// One group's products over chunks of `images` images (the last may be
// short): `count` chunks, fixed by the shape.
struct Chunking {
  int64_t images, count;
};

Chunking chunking(const ConvDims &d) {
  int64_t perImage = std::max<int64_t>(1, d.rows * d.g.outSize);
  int64_t images = std::clamp<int64_t>(kChunkElements / perImage, 1, d.n);
  return {images, ceilDiv(d.n, images)};
}

// The scratch of one group's chunk: the im2col matrix [R, NP] and the GEMM
// output (forward) or the gathered dY (gradients) [Mg, NP].
size_t scratchSize(const ConvDims &d, const Chunking &ch) {
  return size_t((d.rows + d.mg) * ch.images * d.g.outSize);
}

// Runs body(grp, scratch, inner) for every group: the groups spread over
// threads when one group's GEMM is small (depthwise convs), else one after
// another with each one's loops and GEMM spread over threads (inner true).
// The choice depends on the shape only.
template <typename T, typename F>
void forEachGroup(const ConvDims &d, const Chunking &ch, F &&body) {
  size_t size = scratchSize(d, ch);
  int64_t work = d.mg * d.rows * ch.images * d.g.outSize;
  if (d.groups > 1 && work <= kSmallGemmWork) {
    parallelFor(d.groups, 1, [&](int64_t g0, int64_t g1) {
      auto scratch = std::make_unique_for_overwrite<T[]>(size);
      for (int64_t grp = g0; grp < g1; ++grp)
        body(grp, scratch.get(), false);
    });
    return;
  }
  auto scratch = std::make_unique_for_overwrite<T[]>(size);
  for (int64_t grp = 0; grp < d.groups; ++grp)
    body(grp, scratch.get(), true);
}

// f(i0, i1) over [0, n): spread over threads when `inner`, else in one call.
template <typename F> void loop(bool inner, int64_t n, int64_t grain, F &&f) {
  if (inner)
    parallelFor(n, grain, f);
  else if (n > 0)
    f(0, n);
}

// The GEMM of a group: on the pool when `inner` (cut by the shape alone,
// Blas.h), else on the calling thread.
template <typename T>
void groupGemm(bool inner, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
               const T *a, int64_t lda, const T *b, int64_t ldb, T beta, T *c,
               int64_t ldc) {
  if (inner)
    parallelGemm<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
  else
    gemm<T>(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

// Loop grain: about this many elements moved per task.
int64_t grainFor(int64_t elements) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, elements));
}

// The group's im2col matrix of images [i0, i0 + count), rows R and
// count * P columns, image i's columns at i * P; tasks of (image, block of
// rows) with a few thousand elements each.
template <typename T>
void foldedIm2col(const ConvDims &d, const TapRuns &taps, const T *x,
                  int64_t grp, int64_t i0, int64_t count, bool inner, T *col) {
  const WindowGeometry &g = d.g;
  int64_t ld = count * g.outSize;
  int64_t block = std::max<int64_t>(1, 4096 / g.outSize);
  int64_t blocks = ceilDiv(d.rows, block);
  loop(inner, count * blocks, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t i = u / blocks, row = (u % blocks) * block;
      im2col(x + ((i0 + i) * d.c + grp * d.cg) * g.inSize, g, taps, row,
             std::min(d.rows, row + block), col + i * g.outSize, ld);
    }
  });
}

// The group's dY of images [i0, i0 + count) as [Mg, count * P].
template <typename T>
void gatherGradient(const ConvDims &d, const T *dy, int64_t grp, int64_t i0,
                    int64_t count, bool inner, T *out) {
  int64_t p = d.g.outSize, ld = count * p;
  loop(inner, count * d.mg, grainFor(p), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t i = u / d.mg, o = u % d.mg;
      std::copy_n(dy + ((i0 + i) * d.m + grp * d.mg + o) * p, p,
                  out + o * ld + i * p);
    }
  });
}

template <typename T>
void forwardAll(const ConvDims &d, const T *x, const T *w, const T *bias,
                T *y) {
  Chunking ch = chunking(d);
  TapRuns taps(d.g);
  int64_t p = d.g.outSize;
  forEachGroup<T>(d, ch, [&](int64_t grp, T *scratch, bool inner) {
    for (int64_t i0 = 0; i0 < d.n; i0 += ch.images) {
      int64_t count = std::min(ch.images, d.n - i0), ld = count * p;
      T *col = scratch, *out = scratch + d.rows * ld;
      foldedIm2col(d, taps, x, grp, i0, count, inner, col);
      groupGemm<T>(inner, false, false, d.mg, ld, d.rows,
                   w + grp * d.mg * d.rows, d.rows, col, ld, T(0), out, ld);
      loop(inner, count * d.mg, grainFor(p), [&](int64_t u0, int64_t u1) {
        for (int64_t u = u0; u < u1; ++u) {
          int64_t i = u / d.mg, o = u % d.mg;
          T add = bias ? bias[grp * d.mg + o] : T(0);
          const T *src = out + o * ld + i * p;
          T *dst = y + ((i0 + i) * d.m + grp * d.mg + o) * p;
          for (int64_t j = 0; j < p; ++j)
            dst[j] = src[j] + add;
        }
      });
    }
  });
}

template <typename T>
void gradDataAll(const ConvDims &d, const T *dy, const T *w, T *dx) {
  Chunking ch = chunking(d);
  TapRuns taps(d.g);
  const WindowGeometry &g = d.g;
  forEachGroup<T>(d, ch, [&](int64_t grp, T *scratch, bool inner) {
    for (int64_t i0 = 0; i0 < d.n; i0 += ch.images) {
      int64_t count = std::min(ch.images, d.n - i0), ld = count * g.outSize;
      T *col = scratch, *dyg = scratch + d.rows * ld;
      gatherGradient(d, dy, grp, i0, count, inner, dyg);
      groupGemm<T>(inner, true, false, d.rows, ld, d.mg,
                   w + grp * d.mg * d.rows, d.rows, dyg, ld, T(0), col, ld);
      // Each (image, channel) plane is summed by one task, taps in order.
      loop(inner, count * d.cg, grainFor(g.inSize * g.kernelSize),
           [&](int64_t u0, int64_t u1) {
             for (int64_t u = u0; u < u1; ++u) {
               int64_t i = u / d.cg, c = u % d.cg;
               T *planes = dx + ((i0 + i) * d.c + grp * d.cg) * g.inSize;
               std::fill_n(planes + c * g.inSize, g.inSize, T(0));
               col2im(col + i * g.outSize, g, taps, c, c + 1, planes, ld);
             }
           });
    }
  });
}

template <typename T>
void gradFilterAll(const ConvDims &d, const T *x, const T *dy, T *dw) {
  Chunking ch = chunking(d);
  TapRuns taps(d.g);
  forEachGroup<T>(d, ch, [&](int64_t grp, T *scratch, bool inner) {
    // The chunks' products add into dW_g in order.
    for (int64_t i0 = 0; i0 < d.n; i0 += ch.images) {
      int64_t count = std::min(ch.images, d.n - i0), ld = count * d.g.outSize;
      T *col = scratch, *dyg = scratch + d.rows * ld;
      foldedIm2col(d, taps, x, grp, i0, count, inner, col);
      gatherGradient(d, dy, grp, i0, count, inner, dyg);
      groupGemm<T>(inner, false, true, d.mg, d.rows, ld, dyg, ld, col, ld,
                   i0 ? T(1) : T(0), dw + grp * d.mg * d.rows, d.rows);
    }
  });
}

// The taps of a kernel that read inside the input at some output position
// form a box (per dim, a range of taps); the others meet only padding, as 8
// of the 9 taps of a 3x3 conv on 1x1 maps do. The conv over the box alone
// is the same conv without those zero products.
struct LiveTaps {
  ConvDims d;                 // the conv over the box
  WindowGeometry::Dims first; // the box's first tap per dim
  bool all;                   // the box is the whole kernel
};

LiveTaps liveTaps(const ConvDims &full) {
  LiveTaps t{full, {}, true};
  WindowGeometry &g = t.d.g;
  for (size_t k = 0; k < g.rank(); ++k) {
    auto live = [&](int64_t tap) {
      auto [lo, hi] = insideRange(tap * g.dilations[k] - g.padBegin[k],
                                  g.strides[k], g.out[k], g.in[k]);
      return lo < hi;
    };
    int64_t lo = 0, hi = g.kernel[k];
    while (lo < hi && !live(lo))
      ++lo;
    while (hi > lo && !live(hi - 1))
      --hi;
    t.first.push_back(lo);
    if (lo == 0 && hi == g.kernel[k])
      continue;
    t.all = false;
    g.padBegin[k] -= lo * g.dilations[k];
    g.padEnd[k] -= (g.kernel[k] - hi) * g.dilations[k];
    g.kernel[k] = hi - lo;
  }
  g.kernelSize = elementCount(g.kernel);
  t.d.rows = t.d.cg * g.kernelSize;
  return t;
}

// The kernel tap of each tap of the box, in order.
std::vector<int64_t> boxTapsInKernel(const LiveTaps &t,
                                     const WindowGeometry &full) {
  const WindowGeometry::Dims &box = t.d.g.kernel;
  std::vector<int64_t> taps;
  for (int64_t bt = 0; bt < t.d.g.kernelSize; ++bt) {
    int64_t rest = bt, tap = 0, stride = 1;
    for (size_t d = box.size(); d-- > 0;) {
      tap += (t.first[d] + rest % box[d]) * stride;
      rest /= box[d];
      stride *= full.kernel[d];
    }
    taps.push_back(tap);
  }
  return taps;
}

// The filters' taps inside the box, [M, Cg, box...].
template <typename T>
std::vector<T> boxWeights(const LiveTaps &t, const ConvDims &full, const T *w) {
  int64_t boxTaps = t.d.g.kernelSize, taps = full.g.kernelSize;
  std::vector<int64_t> at = boxTapsInKernel(t, full.g);
  std::vector<T> out(size_t(full.m * full.cg * boxTaps));
  // Spread over threads: the filters of the last stages are megabytes.
  parallelFor(full.m * full.cg, 4096 / taps + 1, [&](int64_t f0, int64_t f1) {
    for (int64_t f = f0; f < f1; ++f)
      for (int64_t bt = 0; bt < boxTaps; ++bt)
        out[size_t(f * boxTaps + bt)] = w[f * taps + at[size_t(bt)]];
  });
  return out;
}

} // namespace

bool foldsBatch(const ConvDims &d) {
  return d.g.outSize > 0 && d.g.outSize <= kMaxFoldedPositions && d.n > 1 &&
         d.rows > 0 && d.mg > 0 && fitsBlas({d.rows}) && liveTaps(d).d.rows > 0;
}

template <typename T>
void convForwardFolded(const ConvDims &d, const T *x, const T *w, const T *bias,
                       T *y) {
  LiveTaps t = liveTaps(d);
  if (t.all)
    return forwardAll(d, x, w, bias, y);
  std::vector<T> box = boxWeights(t, d, w);
  forwardAll(t.d, x, box.data(), bias, y);
}

template <typename T>
void convGradDataFolded(const ConvDims &d, const T *dy, const T *w, T *dx) {
  LiveTaps t = liveTaps(d);
  if (t.all)
    return gradDataAll(d, dy, w, dx);
  std::vector<T> box = boxWeights(t, d, w);
  gradDataAll(t.d, dy, box.data(), dx);
}

template <typename T>
void convGradFilterFolded(const ConvDims &d, const T *x, const T *dy, T *dw) {
  LiveTaps t = liveTaps(d);
  if (t.all)
    return gradFilterAll(d, x, dy, dw);
  // The taps outside the box meet only padding: their gradient is 0.
  std::vector<T> box(size_t(d.m * t.d.rows));
  gradFilterAll(t.d, x, dy, box.data());
  int64_t boxTaps = t.d.g.kernelSize, taps = d.g.kernelSize;
  std::vector<int64_t> at = boxTapsInKernel(t, d.g);
  parallelFor(d.m * d.cg, 4096 / taps + 1, [&](int64_t f0, int64_t f1) {
    std::fill(dw + f0 * taps, dw + f1 * taps, T(0));
    for (int64_t f = f0; f < f1; ++f)
      for (int64_t bt = 0; bt < boxTaps; ++bt)
        dw[f * taps + at[size_t(bt)]] = box[size_t(f * boxTaps + bt)];
  });
}

template void convForwardFolded<float>(const ConvDims &, const float *,
                                       const float *, const float *, float *);
template void convForwardFolded<double>(const ConvDims &, const double *,
                                        const double *, const double *,
                                        double *);
template void convGradDataFolded<float>(const ConvDims &, const float *,
                                        const float *, float *);
template void convGradDataFolded<double>(const ConvDims &, const double *,
                                         const double *, double *);
template void convGradFilterFolded<float>(const ConvDims &, const float *,
                                          const float *, float *);
template void convGradFilterFolded<double>(const ConvDims &, const double *,
                                           const double *, double *);

} // namespace cleave::runtime::cpu
