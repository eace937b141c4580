#include "runtime/cpu/ConvDepthwise.h"

#include <algorithm>
#include <vector>

namespace cleave::runtime::cpu {

// The geometry of one depthwise conv in the names the loops use. Outside
// the anonymous namespace: the exported kernels' lambdas capture it.
struct Depthwise {
  int64_t h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
  // Stride 1: the plane zero-padded, hp x wp, and the elements a tap's
  // read runs past its end.
  int64_t hp, wp, overrun;

  explicit Depthwise(const WindowGeometry &g)
      : h(g.in[0]), w(g.in[1]), oh(g.out[0]), ow(g.out[1]), kh(g.kernel[0]),
        kw(g.kernel[1]), sh(g.strides[0]), sw(g.strides[1]), ph(g.padBegin[0]),
        pw(g.padBegin[1]), dh(g.dilations[0]), dw(g.dilations[1]),
        hp(h + ph + g.padEnd[0]), wp(w + pw + g.padEnd[1]),
        overrun((kw - 1) * dw) {
    for (int64_t j = 0; j < kw; ++j) {
      int64_t start = j * dw - pw;
      auto [lo, hi] = insideRange(start, sw, ow, w);
      cols.push_back({lo, hi, start});
    }
  }

  // For tap column j: the output columns [lo, hi) that read inside the
  // input, and the input column output column 0 would read (the same for
  // every row, so worked out once).
  struct Columns {
    int64_t lo, hi, start;
  };
  std::vector<Columns> cols;
  const Columns &columns(int64_t j) const { return cols[size_t(j)]; }

  bool strideOne() const { return sh == 1 && sw == 1; }
  // Stride 1: a tap's offset in the padded plane.
  int64_t tapOffset(int64_t t) const {
    return (t / kw) * dh * wp + (t % kw) * dw;
  }
};

namespace {

// Stride 1, the ShiftedTaps idea of ConvPool.cpp on one plane: read from
// one tap's offset, the zero-padded plane lists at q = r * wp + o the input
// that tap meets at output (r, o) for o < ow (columns o >= ow are dropped).
// So every tap is one loop over oh * wp elements, long enough to vectorize
// well, where a loop per output row would be a dozen elements.
template <typename T>
void padPlane(const Depthwise &k, const T *in, T *padded) {
  std::fill_n(padded, k.hp * k.wp + k.overrun, T(0));
  for (int64_t r = 0; r < k.h; ++r)
    std::copy_n(in + r * k.w, k.w, padded + (r + k.ph) * k.wp + k.pw);
}

template <typename T>
CLEAVE_VECTOR_CLONES void forwardPlaneShifted(const Depthwise &k,
                                              const T *padded, const T *wc,
                                              T bias, T *ext, T *yp) {
  int64_t n = k.oh * k.wp;
  std::fill_n(ext, n, bias);
  for (int64_t t = 0; t < k.kh * k.kw; ++t) {
    const T *src = padded + k.tapOffset(t);
    T wv = wc[t];
    for (int64_t q = 0; q < n; ++q)
      ext[q] += wv * src[q];
  }
  for (int64_t r = 0; r < k.oh; ++r)
    std::copy_n(ext + r * k.wp, k.ow, yp + r * k.ow);
}

// dX: dY in rows wp wide (zeros past ow), each tap's products added onto
// the padded plane at its offset, taps in order; then the inside copied out.
template <typename T>
CLEAVE_VECTOR_CLONES void gradDataPlaneShifted(const Depthwise &k, const T *dyp,
                                               const T *wc, T *ext, T *padded,
                                               T *dxp) {
  int64_t n = k.oh * k.wp;
  std::fill_n(ext, n, T(0));
  for (int64_t r = 0; r < k.oh; ++r)
    std::copy_n(dyp + r * k.ow, k.ow, ext + r * k.wp);
  std::fill_n(padded, k.hp * k.wp + k.overrun, T(0));
  for (int64_t t = 0; t < k.kh * k.kw; ++t) {
    T *dst = padded + k.tapOffset(t);
    T wv = wc[t];
    for (int64_t q = 0; q < n; ++q)
      dst[q] += wv * ext[q];
  }
  for (int64_t r = 0; r < k.h; ++r)
    std::copy_n(padded + (r + k.ph) * k.wp + k.pw, k.w, dxp + r * k.w);
}

// One image's share of a channel's filter gradient: per tap, dY (rows wp
// wide, zeros past ow) times the plane at the tap's offset, added into that
// tap's oh * wp partial sums.
template <typename T>
CLEAVE_VECTOR_CLONES void gradFilterPlaneShifted(const Depthwise &k,
                                                 const T *padded, const T *ext,
                                                 T *acc) {
  int64_t n = k.oh * k.wp;
  for (int64_t t = 0; t < k.kh * k.kw; ++t) {
    const T *src = padded + k.tapOffset(t);
    T *a = acc + t * n;
    for (int64_t q = 0; q < n; ++q)
      a[q] += ext[q] * src[q];
  }
}

// Planes per task: about 32K multiply-adds each at least.
int64_t planeGrain(const Depthwise &k) {
  return std::max<int64_t>(
      1, 32768 / std::max<int64_t>(1, k.oh * k.ow * k.kh * k.kw));
}

// One (image, channel) plane: y = bias + the taps' products, taps in order.
// These loops run on whole rows, so they are built for AVX2 and AVX-512 too
// (CLEAVE_VECTOR_CLONES).
template <typename T>
CLEAVE_VECTOR_CLONES void forwardPlane(const Depthwise &k, const T *xp,
                                       const T *wc, T bias, T *yp) {
  std::fill_n(yp, k.oh * k.ow, bias);
  for (int64_t r = 0; r < k.oh; ++r)
    for (int64_t i = 0; i < k.kh; ++i) {
      int64_t ih = r * k.sh - k.ph + i * k.dh;
      if (ih < 0 || ih >= k.h)
        continue;
      T *yr = yp + r * k.ow;
      const T *xr = xp + ih * k.w;
      for (int64_t j = 0; j < k.kw; ++j) {
        const Depthwise::Columns &c = k.columns(j);
        T wv = wc[i * k.kw + j];
        const T *src = xr + c.start;
        if (k.sw == 1) // a separate loop, so the compiler can vectorize it
          for (int64_t o = c.lo; o < c.hi; ++o)
            yr[o] += wv * src[o];
        else
          for (int64_t o = c.lo; o < c.hi; ++o)
            yr[o] += wv * src[o * k.sw];
      }
    }
}

// One plane of dX: every tap's product added back onto its input, in order.
template <typename T>
CLEAVE_VECTOR_CLONES void gradDataPlane(const Depthwise &k, const T *dyp,
                                        const T *wc, T *dxp) {
  std::fill_n(dxp, k.h * k.w, T(0));
  for (int64_t r = 0; r < k.oh; ++r)
    for (int64_t i = 0; i < k.kh; ++i) {
      int64_t ih = r * k.sh - k.ph + i * k.dh;
      if (ih < 0 || ih >= k.h)
        continue;
      const T *dyr = dyp + r * k.ow;
      T *dxr = dxp + ih * k.w;
      for (int64_t j = 0; j < k.kw; ++j) {
        const Depthwise::Columns &c = k.columns(j);
        T wv = wc[i * k.kw + j];
        T *dst = dxr + c.start;
        if (k.sw == 1)
          for (int64_t o = c.lo; o < c.hi; ++o)
            dst[o] += wv * dyr[o];
        else
          for (int64_t o = c.lo; o < c.hi; ++o)
            dst[o * k.sw] += wv * dyr[o];
      }
    }
}

// One image's plane of a channel's filter gradient, added into acc: per
// tap, one partial sum per output column.
template <typename T>
CLEAVE_VECTOR_CLONES void gradFilterPlane(const Depthwise &k, const T *xp,
                                          const T *dyp, T *acc) {
  for (int64_t r = 0; r < k.oh; ++r)
    for (int64_t i = 0; i < k.kh; ++i) {
      int64_t ih = r * k.sh - k.ph + i * k.dh;
      if (ih < 0 || ih >= k.h)
        continue;
      const T *dyr = dyp + r * k.ow, *xr = xp + ih * k.w;
      for (int64_t j = 0; j < k.kw; ++j) {
        const Depthwise::Columns &c = k.columns(j);
        T *a = acc + (i * k.kw + j) * k.ow;
        const T *src = xr + c.start;
        if (k.sw == 1)
          for (int64_t o = c.lo; o < c.hi; ++o)
            a[o] += dyr[o] * src[o];
        else
          for (int64_t o = c.lo; o < c.hi; ++o)
            a[o] += dyr[o] * src[o * k.sw];
      }
    }
}

} // namespace

bool isDepthwise2d(const ConvDims &d) {
  return d.g.rank() == 2 && d.groups > 1 && d.cg == 1 && d.mg == 1 &&
         d.g.outSize > 0;
}

template <typename T>
void depthwiseForward(const ConvDims &d, const T *x, const T *w, const T *bias,
                      T *y) {
  Depthwise k(d.g);
  parallelFor(d.n * d.c, planeGrain(k), [&](int64_t p0, int64_t p1) {
    std::vector<T> padded, ext;
    if (k.strideOne()) {
      padded.resize(size_t(k.hp * k.wp + k.overrun));
      ext.resize(size_t(k.oh * k.wp));
    }
    for (int64_t p = p0; p < p1; ++p) {
      int64_t c = p % d.c;
      const T *wc = w + c * k.kh * k.kw;
      T b = bias ? bias[c] : T(0);
      if (k.strideOne()) {
        padPlane(k, x + p * k.h * k.w, padded.data());
        forwardPlaneShifted(k, padded.data(), wc, b, ext.data(),
                            y + p * k.oh * k.ow);
      } else {
        forwardPlane(k, x + p * k.h * k.w, wc, b, y + p * k.oh * k.ow);
      }
    }
  });
}

template <typename T>
void depthwiseGradData(const ConvDims &d, const T *dy, const T *w, T *dx) {
  Depthwise k(d.g);
  parallelFor(d.n * d.c, planeGrain(k), [&](int64_t p0, int64_t p1) {
    std::vector<T> padded, ext;
    if (k.strideOne()) {
      padded.resize(size_t(k.hp * k.wp + k.overrun));
      ext.resize(size_t(k.oh * k.wp));
    }
    for (int64_t p = p0; p < p1; ++p) {
      const T *dyp = dy + p * k.oh * k.ow, *wc = w + (p % d.c) * k.kh * k.kw;
      if (k.strideOne())
        gradDataPlaneShifted(k, dyp, wc, ext.data(), padded.data(),
                             dx + p * k.h * k.w);
      else
        gradDataPlane(k, dyp, wc, dx + p * k.h * k.w);
    }
  });
}

template <typename T>
void depthwiseGradFilter(const ConvDims &d, const T *x, const T *dy, T *dw) {
  Depthwise k(d.g);
  int64_t taps = k.kh * k.kw;
  int64_t grain = std::max<int64_t>(
      1, 32768 / std::max<int64_t>(1, d.n * k.oh * k.ow * taps));
  parallelFor(d.c, grain, [&](int64_t c0, int64_t c1) {
    // Per tap, one partial sum per output column (a loop the compiler
    // vectorizes), over the images in order, added up in order at the end.
    // (Stride 1: oh * wp partial sums per tap, as gradFilterPlaneShifted
    // lays them out.)
    bool shifted = k.strideOne();
    int64_t sums = shifted ? k.oh * k.wp : k.ow;
    std::vector<T> acc(size_t(taps * sums)), padded, ext;
    if (shifted) {
      padded.resize(size_t(k.hp * k.wp + k.overrun));
      ext.resize(size_t(k.oh * k.wp));
    }
    for (int64_t c = c0; c < c1; ++c) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t img = 0; img < d.n; ++img) {
        const T *xp = x + (img * d.c + c) * k.h * k.w;
        const T *dyp = dy + (img * d.c + c) * k.oh * k.ow;
        if (!shifted) {
          gradFilterPlane(k, xp, dyp, acc.data());
          continue;
        }
        padPlane(k, xp, padded.data());
        std::fill(ext.begin(), ext.end(), T(0));
        for (int64_t r = 0; r < k.oh; ++r)
          std::copy_n(dyp + r * k.ow, k.ow, ext.data() + r * k.wp);
        gradFilterPlaneShifted(k, padded.data(), ext.data(), acc.data());
      }
      for (int64_t t = 0; t < taps; ++t) {
        T sum = T(0);
        for (int64_t o = 0; o < sums; ++o)
          sum += acc[size_t(t * sums + o)];
        dw[c * taps + t] = sum;
      }
    }
  });
}

template void depthwiseForward<float>(const ConvDims &, const float *,
                                      const float *, const float *, float *);
template void depthwiseForward<double>(const ConvDims &, const double *,
                                       const double *, const double *,
                                       double *);
template void depthwiseGradData<float>(const ConvDims &, const float *,
                                       const float *, float *);
template void depthwiseGradData<double>(const ConvDims &, const double *,
                                        const double *, double *);
template void depthwiseGradFilter<float>(const ConvDims &, const float *,
                                         const float *, float *);
template void depthwiseGradFilter<double>(const ConvDims &, const double *,
                                          const double *, double *);

} // namespace cleave::runtime::cpu
