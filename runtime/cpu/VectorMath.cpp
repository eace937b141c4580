// exp and erf over arrays in double lanes (VectorMath.h).
#include "runtime/cpu/VectorMath.h"

#include "runtime/cpu/CpuKernels.h"

#include <cmath>
#include <cstring>

namespace cleave::runtime::cpu {
namespace {

// exp(x) lane by lane: x = k ln2 + r, e^r by its Taylor polynomial, 2^k in
// the exponent bits.

template <typename V> [[gnu::always_inline]] inline V expLanes(V x) {
  using I [[gnu::vector_size(sizeof(V))]] = int64_t;
  const V roundVector = V{} + 6755399441055744.0;
  constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 0.6931471803691238,
                   kLn2Lo = 1.9082149292705877e-10;
  constexpr double kRound = 6755399441055744.0; // 1.5 * 2^52
  V xc = x < -708.0 ? (V{} + -708.0) : x;
  xc = xc > 709.0 ? (V{} + 709.0) : xc;
  // k = x log2(e) rounded to nearest, by adding 1.5 * 2^52: k then sits in
  // the low bits of the sum's mantissa, which give 2^k below without a
  // double-to-integer conversion (AVX-512F has none for vectors).
  V shifted = xc * kLog2e + kRound;
  V k = shifted - kRound;
  V r = (xc - k * kLn2Hi) - k * kLn2Lo;
  // 1 + r + r^2/2! + ... + r^11/11!, Horner.
  V p = (V{} + 1.0 / 39916800);
  p = p * r + 1.0 / 3628800;
  p = p * r + 1.0 / 362880;
  p = p * r + 1.0 / 40320;
  p = p * r + 1.0 / 5040;
  p = p * r + 1.0 / 720;
  p = p * r + 1.0 / 120;
  p = p * r + 1.0 / 24;
  p = p * r + 1.0 / 6;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  I kBits, roundBits;
  std::memcpy(&kBits, &shifted, sizeof(kBits));
  std::memcpy(&roundBits, &roundVector, sizeof(roundBits));
  I bits = (kBits - roundBits + 1023) << 52;
  V scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  V y = p * scale;
  y = x > 709.782712893384 ? (V{} + HUGE_VAL) : y;
  y = x < -708.0 ? (V{} + 0.0) : y; // no subnormal results
  return x != x ? x : y;            // NaN stays NaN
}

// erf(x): below 0.5 in magnitude its Taylor series (ten terms, relative
// error about 1e-14 there); above, 1 - erfc(|x|) with Numerical Recipes'
// Chebyshev fit of erfc (relative error below 1.2e-7), sign restored.
template <typename V> [[gnu::always_inline]] inline V erfLanes(V x) {
  V z = x < 0.0 ? -x : x;
  V x2 = x * x;
  V s = (V{} + -1.0 / 6894720);
  s = s * x2 + 1.0 / 685440;
  s = s * x2 - 1.0 / 75600;
  s = s * x2 + 1.0 / 9360;
  s = s * x2 - 1.0 / 1320;
  s = s * x2 + 1.0 / 216;
  s = s * x2 - 1.0 / 42;
  s = s * x2 + 1.0 / 10;
  s = s * x2 - 1.0 / 3;
  s = s * x2 + 1.0;
  V small = s * x * 1.1283791670955126; // 2 / sqrt(pi)
  V t = 1.0 / (1.0 + 0.5 * z);
  V q = (V{} + 0.17087277);
  q = q * t - 0.82215223;
  q = q * t + 1.48851587;
  q = q * t - 1.13520398;
  q = q * t + 0.27886807;
  q = q * t - 0.18628806;
  q = q * t + 0.09678418;
  q = q * t + 0.37409196;
  q = q * t + 1.00002368;
  q = q * t - 1.26551223;
  V erfc = t * expLanes(q - z * z);
  V large = 1.0 - erfc;
  large = x < 0.0 ? -large : large;
  V y = z < 0.5 ? small : large;
  return x != x ? x : y;
}

// Four double lanes at a time: the same arithmetic lane for lane as eight
// (so the same bits), but erf's two branches in eight lanes did not fit
// AVX2's registers (the spills took most of GELU's time on such CPUs).
using Double4 [[gnu::vector_size(32)]] = double;
using Float4 [[gnu::vector_size(16)]] = float;

template <typename T> [[gnu::always_inline]] inline Double4 load4(const T *p) {
  if constexpr (sizeof(T) == sizeof(double)) {
    Double4 v;
    std::memcpy(&v, p, sizeof(v));
    return v;
  } else {
    Float4 f;
    std::memcpy(&f, p, sizeof(f));
    return __builtin_convertvector(f, Double4);
  }
}
template <typename T>
[[gnu::always_inline]] inline void store4(T *p, Double4 v) {
  if constexpr (sizeof(T) == sizeof(double)) {
    std::memcpy(p, &v, sizeof(v));
  } else {
    Float4 f = __builtin_convertvector(v, Float4);
    std::memcpy(p, &f, sizeof(f));
  }
}
// Loads the n < 4 elements at p (n may be 0 or negative: none), the other
// lanes `fill`.
template <typename T>
[[gnu::always_inline]] inline Double4 loadPartial4(const T *p, int64_t n,
                                                   double fill = 0) {
  double lanes[4] = {fill, fill, fill, fill};
  for (int64_t i = 0; i < n && i < 4; ++i)
    lanes[i] = double(p[i]);
  Double4 v;
  std::memcpy(&v, lanes, sizeof(v));
  return v;
}
template <typename T>
[[gnu::always_inline]] inline void storePartial4(T *p, int64_t n, Double4 v) {
  for (int64_t i = 0; i < n; ++i)
    p[i] = T(v[i]);
}

// The sum keeps eight lanes (two halves of four) and adds them in
// laneSum's tree, as it did in eight-lane vectors.
template <typename T>
CLEAVE_VECTOR_CLONES double sumExpShiftedT(const T *x, int64_t n,
                                           double shift) {
  Double4 lo = {}, hi = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo += expLanes(load4(x + i) - shift);
    hi += expLanes(load4(x + i + 4) - shift);
  }
  if (i < n) { // the missing lanes add exp(-inf) = 0
    lo += expLanes(loadPartial4(x + i, n - i, -INFINITY) - shift);
    hi += expLanes(loadPartial4(x + i + 4, n - i - 4, -INFINITY) - shift);
  }
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) +
         ((hi[0] + hi[1]) + (hi[2] + hi[3]));
}

template <typename T>
CLEAVE_VECTOR_CLONES void expShiftedT(const T *x, int64_t n, double shift,
                                      double scale, T *out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    store4(out + i, expLanes(load4(x + i) - shift) * scale);
  if (i < n)
    storePartial4(out + i, n - i,
                  expLanes(loadPartial4(x + i, n - i) - shift) * scale);
}

template <typename T>
CLEAVE_VECTOR_CLONES void erfArrayT(const T *x, int64_t n, T *out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    store4(out + i, erfLanes(load4(x + i)));
  if (i < n)
    storePartial4(out + i, n - i, erfLanes(loadPartial4(x + i, n - i)));
}

template <typename T>
CLEAVE_VECTOR_CLONES void erfGradArrayT(const T *dy, const T *x, int64_t n,
                                        T *out) {
  constexpr double k2OverSqrtPi = 1.1283791670955126;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    Double4 v = load4(x + i);
    store4(out + i, load4(dy + i) * k2OverSqrtPi * expLanes(-(v * v)));
  }
  if (i < n) {
    Double4 v = loadPartial4(x + i, n - i);
    storePartial4(out + i, n - i,
                  loadPartial4(dy + i, n - i) * k2OverSqrtPi *
                      expLanes(-(v * v)));
  }
}

} // namespace

double sumExpShifted(const float *x, int64_t n, double shift) {
  return sumExpShiftedT(x, n, shift);
}
double sumExpShifted(const double *x, int64_t n, double shift) {
  return sumExpShiftedT(x, n, shift);
}
void expShifted(const float *x, int64_t n, double shift, double scale,
                float *out) {
  expShiftedT(x, n, shift, scale, out);
}
void expShifted(const double *x, int64_t n, double shift, double scale,
                double *out) {
  expShiftedT(x, n, shift, scale, out);
}
void erfArray(const float *x, int64_t n, float *out) { erfArrayT(x, n, out); }
void erfArray(const double *x, int64_t n, double *out) { erfArrayT(x, n, out); }
void erfGradArray(const float *dy, const float *x, int64_t n, float *out) {
  erfGradArrayT(dy, x, n, out);
}
void erfGradArray(const double *dy, const double *x, int64_t n, double *out) {
  erfGradArrayT(dy, x, n, out);
}

} // namespace cleave::runtime::cpu
