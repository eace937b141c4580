#include "runtime/cpu/ConvDepthwise.h"

#include <algorithm>
#include <vector>

namespace cleave::runtime::cpu {
namespace {

// The geometry of one depthwise conv in the names the loops use.
struct Depthwise {
  int64_t h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;

  explicit Depthwise(const WindowGeometry &g)
      : h(g.in[0]), w(g.in[1]), oh(g.out[0]), ow(g.out[1]), kh(g.kernel[0]),
        kw(g.kernel[1]), sh(g.strides[0]), sw(g.strides[1]), ph(g.padBegin[0]),
        pw(g.padBegin[1]), dh(g.dilations[0]), dw(g.dilations[1]) {}

  // Calls f(output row, input row, tap row) for every tap row of every
  // output row that lands inside the input, in order.
  template <typename F> void forEachRow(F &&f) const {
    for (int64_t r = 0; r < oh; ++r)
      for (int64_t i = 0; i < kh; ++i) {
        int64_t ih = r * sh - ph + i * dh;
        if (ih >= 0 && ih < h)
          f(r, ih, i);
      }
  }
  // For tap column j: the output columns [lo, hi) that read inside the
  // input, and the input column output column 0 would read.
  struct Columns {
    int64_t lo, hi, start;
  };
  Columns columns(int64_t j) const {
    int64_t start = j * dw - pw;
    auto [lo, hi] = insideRange(start, sw, ow, w);
    return {lo, hi, start};
  }
};

// Planes per task: about 32K multiply-adds each at least.
int64_t planeGrain(const Depthwise &k) {
  return std::max<int64_t>(
      1, 32768 / std::max<int64_t>(1, k.oh * k.ow * k.kh * k.kw));
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
  int64_t planes = d.n * d.c;
  parallelFor(planes, planeGrain(k), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int64_t c = p % d.c;
      const T *xp = x + p * k.h * k.w, *wc = w + c * k.kh * k.kw;
      T *yp = y + p * k.oh * k.ow;
      std::fill_n(yp, k.oh * k.ow, bias ? bias[c] : T(0));
      k.forEachRow([&](int64_t r, int64_t ih, int64_t i) {
        T *yr = yp + r * k.ow;
        const T *xr = xp + ih * k.w;
        for (int64_t j = 0; j < k.kw; ++j) {
          auto [lo, hi, start] = k.columns(j);
          T wv = wc[i * k.kw + j];
          if (k.sw == 1) // a separate loop, so the compiler can vectorize it
            for (int64_t o = lo; o < hi; ++o)
              yr[o] += wv * xr[start + o];
          else
            for (int64_t o = lo; o < hi; ++o)
              yr[o] += wv * xr[start + o * k.sw];
        }
      });
    }
  });
}

template <typename T>
void depthwiseGradData(const ConvDims &d, const T *dy, const T *w, T *dx) {
  Depthwise k(d.g);
  int64_t planes = d.n * d.c;
  parallelFor(planes, planeGrain(k), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      int64_t c = p % d.c;
      const T *dyp = dy + p * k.oh * k.ow, *wc = w + c * k.kh * k.kw;
      T *dxp = dx + p * k.h * k.w;
      std::fill_n(dxp, k.h * k.w, T(0));
      k.forEachRow([&](int64_t r, int64_t ih, int64_t i) {
        const T *dyr = dyp + r * k.ow;
        T *dxr = dxp + ih * k.w;
        for (int64_t j = 0; j < k.kw; ++j) {
          auto [lo, hi, start] = k.columns(j);
          T wv = wc[i * k.kw + j];
          if (k.sw == 1)
            for (int64_t o = lo; o < hi; ++o)
              dxr[start + o] += wv * dyr[o];
          else
            for (int64_t o = lo; o < hi; ++o)
              dxr[start + o * k.sw] += wv * dyr[o];
        }
      });
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
    // vectorizes), added up in order at the end.
    std::vector<T> acc(size_t(taps * k.ow));
    for (int64_t c = c0; c < c1; ++c) {
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t img = 0; img < d.n; ++img) {
        const T *xp = x + (img * d.c + c) * k.h * k.w;
        const T *dyp = dy + (img * d.c + c) * k.oh * k.ow;
        k.forEachRow([&](int64_t r, int64_t ih, int64_t i) {
          const T *dyr = dyp + r * k.ow, *xr = xp + ih * k.w;
          for (int64_t j = 0; j < k.kw; ++j) {
            auto [lo, hi, start] = k.columns(j);
            T *a = acc.data() + (i * k.kw + j) * k.ow;
            if (k.sw == 1)
              for (int64_t o = lo; o < hi; ++o)
                a[o] += dyr[o] * xr[start + o];
            else
              for (int64_t o = lo; o < hi; ++o)
                a[o] += dyr[o] * xr[start + o * k.sw];
          }
        });
      }
      for (int64_t t = 0; t < taps; ++t) {
        T sum = T(0);
        for (int64_t o = 0; o < k.ow; ++o)
          sum += acc[size_t(t * k.ow + o)];
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
