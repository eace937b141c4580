#include "runtime/cpu/ConvBatchFolded.h"

#include "runtime/cpu/Blas.h"

#include <algorithm>
#include <memory>

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
// count * P columns, image i's columns at i * P.
template <typename T>
void foldedIm2col(const ConvDims &d, const T *x, int64_t grp, int64_t i0,
                  int64_t count, bool inner, T *col) {
  const WindowGeometry &g = d.g;
  int64_t ld = count * g.outSize;
  loop(inner, count * d.rows, grainFor(g.outSize), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      int64_t i = u / d.rows, row = u % d.rows;
      im2col(x + ((i0 + i) * d.c + grp * d.cg) * g.inSize, g, row, row + 1,
             col + i * g.outSize, ld);
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

} // namespace

bool foldsBatch(const ConvDims &d) {
  return d.g.outSize > 0 && d.g.outSize <= kMaxFoldedPositions && d.n > 1 &&
         d.rows > 0 && d.mg > 0 && fitsBlas({d.rows});
}

template <typename T>
void convForwardFolded(const ConvDims &d, const T *x, const T *w, const T *bias,
                       T *y) {
  Chunking ch = chunking(d);
  int64_t p = d.g.outSize;
  forEachGroup<T>(d, ch, [&](int64_t grp, T *scratch, bool inner) {
    for (int64_t i0 = 0; i0 < d.n; i0 += ch.images) {
      int64_t count = std::min(ch.images, d.n - i0), ld = count * p;
      T *col = scratch, *out = scratch + d.rows * ld;
      foldedIm2col(d, x, grp, i0, count, inner, col);
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
void convGradDataFolded(const ConvDims &d, const T *dy, const T *w, T *dx) {
  Chunking ch = chunking(d);
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
               col2im(col + i * g.outSize, g, c, c + 1, planes, ld);
             }
           });
    }
  });
}

template <typename T>
void convGradFilterFolded(const ConvDims &d, const T *x, const T *dy, T *dw) {
  Chunking ch = chunking(d);
  forEachGroup<T>(d, ch, [&](int64_t grp, T *scratch, bool inner) {
    // The chunks' products add into dW_g in order.
    for (int64_t i0 = 0; i0 < d.n; i0 += ch.images) {
      int64_t count = std::min(ch.images, d.n - i0), ld = count * d.g.outSize;
      T *col = scratch, *dyg = scratch + d.rows * ld;
      foldedIm2col(d, x, grp, i0, count, inner, col);
      gatherGradient(d, dy, grp, i0, count, inner, dyg);
      groupGemm<T>(inner, false, true, d.mg, d.rows, ld, dyg, ld, col, ld,
                   i0 ? T(1) : T(0), dw + grp * d.mg * d.rows, d.rows);
    }
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
