// exp and erf over arrays in Double8 lanes (VectorMath.h).
#include "runtime/cpu/VectorMath.h"

#include "runtime/cpu/CpuKernels.h"

#include <cmath>
#include <cstring>

namespace cleave::runtime::cpu {
namespace {

using Int8 [[gnu::vector_size(64)]] = int64_t;

[[gnu::always_inline]] inline Double8 splat(double v) { return Double8{} + v; }

// exp(x) lane by lane: x = k ln2 + r, e^r by its Taylor polynomial, 2^k in
// the exponent bits.
const Double8 kRoundVector = Double8{} + 6755399441055744.0;

[[gnu::always_inline]] inline Double8 exp8(Double8 x) {
  constexpr double kLog2e = 1.4426950408889634, kLn2Hi = 0.6931471803691238,
                   kLn2Lo = 1.9082149292705877e-10;
  constexpr double kRound = 6755399441055744.0; // 1.5 * 2^52
  Double8 xc = x < -708.0 ? splat(-708.0) : x;
  xc = xc > 709.0 ? splat(709.0) : xc;
  // k = x log2(e) rounded to nearest, by adding 1.5 * 2^52: k then sits in
  // the low bits of the sum's mantissa, which give 2^k below without a
  // double-to-integer conversion (AVX-512F has none for vectors).
  Double8 shifted = xc * kLog2e + kRound;
  Double8 k = shifted - kRound;
  Double8 r = (xc - k * kLn2Hi) - k * kLn2Lo;
  // 1 + r + r^2/2! + ... + r^11/11!, Horner.
  Double8 p = splat(1.0 / 39916800);
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
  Int8 kBits, roundBits;
  std::memcpy(&kBits, &shifted, sizeof(kBits));
  std::memcpy(&roundBits, &kRoundVector, sizeof(roundBits));
  Int8 bits = (kBits - roundBits + 1023) << 52;
  Double8 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  Double8 y = p * scale;
  y = x > 709.782712893384 ? splat(HUGE_VAL) : y;
  y = x < -708.0 ? splat(0.0) : y; // no subnormal results
  return x != x ? x : y;           // NaN stays NaN
}

// erf(x): below 0.5 in magnitude its Taylor series (ten terms, relative
// error about 1e-14 there); above, 1 - erfc(|x|) with Numerical Recipes'
// Chebyshev fit of erfc (relative error below 1.2e-7), sign restored.
[[gnu::always_inline]] inline Double8 erf8(Double8 x) {
  Double8 z = x < 0.0 ? -x : x;
  Double8 x2 = x * x;
  Double8 s = splat(-1.0 / 6894720);
  s = s * x2 + 1.0 / 685440;
  s = s * x2 - 1.0 / 75600;
  s = s * x2 + 1.0 / 9360;
  s = s * x2 - 1.0 / 1320;
  s = s * x2 + 1.0 / 216;
  s = s * x2 - 1.0 / 42;
  s = s * x2 + 1.0 / 10;
  s = s * x2 - 1.0 / 3;
  s = s * x2 + 1.0;
  Double8 small = s * x * 1.1283791670955126; // 2 / sqrt(pi)
  Double8 t = 1.0 / (1.0 + 0.5 * z);
  Double8 q = splat(0.17087277);
  q = q * t - 0.82215223;
  q = q * t + 1.48851587;
  q = q * t - 1.13520398;
  q = q * t + 0.27886807;
  q = q * t - 0.18628806;
  q = q * t + 0.09678418;
  q = q * t + 0.37409196;
  q = q * t + 1.00002368;
  q = q * t - 1.26551223;
  Double8 erfc = t * exp8(q - z * z);
  Double8 large = 1.0 - erfc;
  large = x < 0.0 ? -large : large;
  Double8 y = z < 0.5 ? small : large;
  return x != x ? x : y;
}

template <typename T>
[[gnu::always_inline]] inline void store8(T *p, Double8 v) {
  if constexpr (sizeof(T) == sizeof(double)) {
    std::memcpy(p, &v, sizeof(v));
  } else {
    Float8 f = __builtin_convertvector(v, Float8);
    std::memcpy(p, &f, sizeof(f));
  }
}

// Loads the n < 8 elements at p, the other lanes `fill`.
template <typename T>
[[gnu::always_inline]] inline Double8 loadPartial(const T *p, int64_t n,
                                                  double fill) {
  double lanes[8];
  for (int i = 0; i < 8; ++i)
    lanes[i] = i < n ? double(p[i]) : fill;
  Double8 v;
  std::memcpy(&v, lanes, sizeof(v));
  return v;
}
template <typename T>
[[gnu::always_inline]] inline void storePartial(T *p, int64_t n, Double8 v) {
  for (int i = 0; i < n; ++i)
    p[i] = T(v[i]);
}

template <typename T>
CLEAVE_VECTOR_CLONES double sumExpShiftedT(const T *x, int64_t n,
                                           double shift) {
  Double8 s = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    s += exp8(loadDouble8(x + i) - shift);
  if (i < n) // the missing lanes add exp(-inf) = 0
    s += exp8(loadPartial(x + i, n - i, -INFINITY) - shift);
  return laneSum(s);
}

template <typename T>
CLEAVE_VECTOR_CLONES void expShiftedT(const T *x, int64_t n, double shift,
                                      double scale, T *out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    store8(out + i, exp8(loadDouble8(x + i) - shift) * scale);
  if (i < n)
    storePartial(out + i, n - i,
                 exp8(loadPartial(x + i, n - i, 0.0) - shift) * scale);
}

template <typename T>
CLEAVE_VECTOR_CLONES void erfArrayT(const T *x, int64_t n, T *out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    store8(out + i, erf8(loadDouble8(x + i)));
  if (i < n)
    storePartial(out + i, n - i, erf8(loadPartial(x + i, n - i, 0.0)));
}

template <typename T>
CLEAVE_VECTOR_CLONES void erfGradArrayT(const T *dy, const T *x, int64_t n,
                                        T *out) {
  constexpr double k2OverSqrtPi = 1.1283791670955126;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Double8 v = loadDouble8(x + i);
    store8(out + i, loadDouble8(dy + i) * k2OverSqrtPi * exp8(-(v * v)));
  }
  if (i < n) {
    Double8 v = loadPartial(x + i, n - i, 0.0);
    storePartial(out + i, n - i,
                 loadPartial(dy + i, n - i, 0.0) * k2OverSqrtPi *
                     exp8(-(v * v)));
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
