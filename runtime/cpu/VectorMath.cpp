// exp and erf over arrays in double lanes (VectorMath.h).
#include "runtime/cpu/VectorMath.h"

#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

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

// tanh(x): for |x| below 1/8 its odd Taylor series to x^11 (relative error
// about 1e-14 there), above 1 - 2 / (exp(2|x|) + 1) with the sign
// restored; exactly +-1 beyond |x| = 20.
template <typename V> [[gnu::always_inline]] inline V tanhLanes(V x) {
  V z = x < 0.0 ? -x : x;
  V x2 = x * x;
  V s = (V{} + -1382.0 / 155925);
  s = s * x2 + 62.0 / 2835;
  s = s * x2 - 17.0 / 315;
  s = s * x2 + 2.0 / 15;
  s = s * x2 - 1.0 / 3;
  s = s * x2 + 1.0;
  V small = s * x;
  V zc = z > 20.0 ? (V{} + 20.0) : z;
  V large = 1.0 - 2.0 / (expLanes(2.0 * zc) + 1.0);
  large = z > 20.0 ? (V{} + 1.0) : large;
  large = x < 0.0 ? -large : large;
  V y = z < 0.125 ? small : large;
  return x != x ? x : y;
}

// 1 / (1 + exp(-x)), exp of a non-positive argument only.
template <typename V> [[gnu::always_inline]] inline V sigmoidLanes(V x) {
  V e = expLanes(x < 0.0 ? x : -x);
  V y = x < 0.0 ? e / (1.0 + e) : 1.0 / (1.0 + e);
  return x != x ? x : y;
}

constexpr double kSqrtHalf = 0.7071067811865476;   // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327; // 1 / sqrt(2 pi)
constexpr double kGeluBeta = 0.7978845608028654;   // sqrt(2 / pi)
constexpr double kGeluKappa = 0.044715;

// GELU and its derivative (PyTorch's formulas, GeluBackward): erf form
// x Phi(x) and Phi(x) + x phi(x); tanh form 0.5 x (1 + tanh(u)) with
// u = beta (x + kappa x^3) and its derivative.
template <bool TanhForm, typename V>
[[gnu::always_inline]] inline V geluLanes(V x) {
  if constexpr (TanhForm)
    return 0.5 * x *
           (1.0 + tanhLanes(kGeluBeta * (x + kGeluKappa * x * x * x)));
  else
    return 0.5 * x * (1.0 + erfLanes(x * kSqrtHalf));
}
template <bool TanhForm, typename V>
[[gnu::always_inline]] inline V geluDerivativeLanes(V x) {
  if constexpr (TanhForm) {
    V x2 = x * x;
    V t = tanhLanes(kGeluBeta * (x + kGeluKappa * x2 * x));
    V du = kGeluBeta * (1.0 + 3.0 * kGeluKappa * x2);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
  } else {
    V cdf = 0.5 * (1.0 + erfLanes(x * kSqrtHalf));
    return cdf + x * kInvSqrt2Pi * expLanes(-0.5 * (x * x));
  }
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

// out[i] = F::value(x[i]) and out[i] = dy[i] * F::derivative(x[i]) over
// four lanes at a time. F is a struct of always-inlined static functions,
// not a lambda: a lambda would be a function of its own, compiled for the
// default target, and take its vector arguments by another ABI than the
// clone calling it.
template <typename F, typename T>
[[gnu::always_inline]] inline void mapLanes(const T *x, int64_t n, T *out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    store4(out + i, F::value(load4(x + i)));
  if (i < n)
    storePartial4(out + i, n - i, F::value(loadPartial4(x + i, n - i)));
}
template <typename F, typename T>
[[gnu::always_inline]] inline void mapGradLanes(const T *dy, const T *x,
                                                int64_t n, T *out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    store4(out + i, load4(dy + i) * F::derivative(load4(x + i)));
  if (i < n)
    storePartial4(out + i, n - i,
                  loadPartial4(dy + i, n - i) *
                      F::derivative(loadPartial4(x + i, n - i)));
}

struct TanhFn {
  [[gnu::always_inline]] static Double4 value(Double4 v) {
    return tanhLanes(v);
  }
  [[gnu::always_inline]] static Double4 derivative(Double4 v) {
    Double4 t = tanhLanes(v);
    return 1.0 - t * t;
  }
};
struct SigmoidFn {
  [[gnu::always_inline]] static Double4 value(Double4 v) {
    return sigmoidLanes(v);
  }
  [[gnu::always_inline]] static Double4 derivative(Double4 v) {
    Double4 s = sigmoidLanes(v);
    return s * (1.0 - s);
  }
};
// SiLU, x sigmoid(x); its derivative as PyTorch's silu_backward writes it,
// s (1 + x (1 - s)).
struct SiluFn {
  [[gnu::always_inline]] static Double4 value(Double4 v) {
    return v * sigmoidLanes(v);
  }
  [[gnu::always_inline]] static Double4 derivative(Double4 v) {
    Double4 s = sigmoidLanes(v);
    return s * (1.0 + v * (1.0 - s));
  }
};
template <bool TanhForm> struct GeluFn {
  [[gnu::always_inline]] static Double4 value(Double4 v) {
    return geluLanes<TanhForm>(v);
  }
  [[gnu::always_inline]] static Double4 derivative(Double4 v) {
    return geluDerivativeLanes<TanhForm>(v);
  }
};

// out = Fn::value(x) and out = dy * Fn::derivative(x) over arrays, for the
// activations without parameters (Tanh, Sigmoid, Silu).
template <class Fn, typename T>
CLEAVE_VECTOR_CLONES void activationArrayT(const T *x, int64_t n, T *out) {
  mapLanes<Fn>(x, n, out);
}
template <class Fn, typename T>
CLEAVE_VECTOR_CLONES void activationGradArrayT(const T *dy, const T *x,
                                               int64_t n, T *out) {
  mapGradLanes<Fn>(dy, x, n, out);
}
template <typename T>
CLEAVE_VECTOR_CLONES void geluArrayT(const T *x, int64_t n, bool tanhForm,
                                     T *out) {
  if (tanhForm)
    mapLanes<GeluFn<true>>(x, n, out);
  else
    mapLanes<GeluFn<false>>(x, n, out);
}
template <typename T>
CLEAVE_VECTOR_CLONES void geluGradArrayT(const T *dy, const T *x, int64_t n,
                                         bool tanhForm, T *out) {
  if (tanhForm)
    mapGradLanes<GeluFn<true>>(dy, x, n, out);
  else
    mapGradLanes<GeluFn<false>>(dy, x, n, out);
}

// --- f32 in eight float lanes ---------------------------------------------
//
// The elementwise activations of f32 tensors (Tanh, Sigmoid, Gelu and their
// gradients) are computed in float lanes, at a few float ulps
// (cpu_vector_math_test measures them). Each array function is built three
// times, for AVX-512 (16 lanes, and 8 for the tail), for AVX2 + FMA (8
// lanes) and for the baseline, and picks one by the CPU's features (GCC's
// clones cannot ask for FMA, and its "arch=" clones match CPU models, not
// features). Their polynomials' multiply-adds are fused (mulAdd) in the
// AVX-512 and AVX2 builds, which so give the same bits; the baseline rounds
// twice. The same arithmetic lane for lane whatever the array's start or
// length, so threads cannot change a bit. (Fusing took the erf GELU from
// 1.57 to 1.02 ns an element and its gradient from 2.16 to 1.52, one
// thread, hot in cache, AVX-512: its throughput is the vector units'.)

using Float8 [[gnu::vector_size(32)]] = float;
using Int8 [[gnu::vector_size(32)]] = int32_t;

// a * b + c: rounded once (a fused multiply-add) with Fma, which only the
// functions built for AVX2 + FMA or AVX-512 ask for (CLEAVE_FLOAT_LANES'
// kFma), else rounded twice. Explicit in every copy of a loop, vector body
// and tail alike, so an element's bits never depend on which copy ran it
// (the reason the runtime builds with -ffp-contract=off).
template <bool Fma, class VF>
[[gnu::always_inline]] inline VF mulAdd(VF a, VF b, VF c) {
#if defined(__clang__)
  // Clang refuses a 512-bit asm operand outside an AVX-512 function; its
  // contraction fuses in the builds with FMA (and rounds twice elsewhere).
  if constexpr (Fma) {
#pragma clang fp contract(fast)
    return a * b + c;
  }
#elif defined(__x86_64__) && defined(__GNUC__)
  // As an instruction: the intrinsics' target checks would refuse the
  // templates these are inlined through (no target of their own). The
  // 213 form overwrites a, the running value of a Horner step, and may
  // take c (a constant, mostly) from memory; the 231 form overwrote c, so
  // each step began with a register copy of its constant (no faster or
  // slower measured: the CPU renames such copies away).
  if constexpr (Fma) {
    if constexpr (sizeof(VF) == 64)
      asm("vfmadd213ps %2, %1, %0" : "+v"(a) : "v"(b), "vm"(c));
    else
      asm("vfmadd213ps %2, %1, %0" : "+x"(a) : "x"(b), "xm"(c));
    return a;
  }
#endif
  return a * b + c;
}
template <bool Fma, class VF>
[[gnu::always_inline]] inline VF mulAdd(VF a, VF b, float c) {
  return mulAdd<Fma>(a, b, VF{} + c);
}

// The two halves of the lanes' exp of d: k = round(d / ln2) (d clamped to
// where exp is finite and not subnormal), and then from the reduced
// argument r = d - k ln2, |r| <= ln2 / 2, e^r by its Taylor polynomial to
// r^7 (relative error below 2e-8) times 2^k in the exponent bits, with d's
// edges (+inf above 88.72, 0 below -87.3: no subnormal results; NaN kept).
template <class VF, class VI>
[[gnu::always_inline]] inline VI expExponentT(VF d, VF &kr) {
  VF dc = d < -87.3f ? (VF{} + -87.3f) : d;
  dc = dc > 88.7f ? (VF{} + 88.7f) : dc;
  VF kf = dc * 1.44269504f;
  VI k = __builtin_convertvector(kf + (kf < 0.0f ? -0.5f : 0.5f), VI);
  kr = __builtin_convertvector(k, VF);
  return k;
}
// e^r 2^k: the polynomial of the reduced argument, scaled in the exponent
// bits.
template <bool Fma = false, class VF, class VI>
[[gnu::always_inline]] inline VF expScaledT(VF r, VI k) {
  VF p = VF{} + 1.0f / 5040;
  p = mulAdd<Fma>(p, r, 1.0f / 720);
  p = mulAdd<Fma>(p, r, 1.0f / 120);
  p = mulAdd<Fma>(p, r, 1.0f / 24);
  p = mulAdd<Fma>(p, r, 1.0f / 6);
  p = mulAdd<Fma>(p, r, 0.5f);
  p = mulAdd<Fma>(p, r, 1.0f);
  p = mulAdd<Fma>(p, r, 1.0f);
  VI bits = (k + 127) << 23;
  VF scale;
  static_assert(sizeof(scale) == sizeof(bits));
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}
template <bool Fma = false, class VF, class VI>
[[gnu::always_inline]] inline VF expFinishT(VF d, VF r, VI k) {
  VF y = expScaledT<Fma>(r, k);
  y = d > 88.72f ? (VF{} + HUGE_VALF) : y;
  y = d < -87.3f ? (VF{} + 0.0f) : y;
  return d != d ? d : y;
}

// exp(x - shift), with x - shift taken exactly, as its float d plus the
// rounding error (Knuth's two-sum), so a large x - shift loses nothing to
// its rounding.
template <class VF, class VI, bool Fma = false>
[[gnu::always_inline]] inline VF expShiftLanesT(VF x, float shift) {
  VF d = x - shift;
  VF back = d - x;
  VF err = (x - (d - back)) + (-shift - back);
  VF kr;
  VI k = expExponentT<VF, VI>(d, kr);
  VF r = ((d - kr * 0.693145752f) - kr * 1.42860677e-6f) + err;
  return expFinishT<Fma>(d, r, k);
}
template <bool Fma = false>
[[gnu::always_inline]] inline Float8 expShiftLanesF(Float8 x, float shift) {
  return expShiftLanesT<Float8, Int8, Fma>(x, shift);
}

// 16 float lanes (AVX-512 where the CPU has it) and the int lanes of each
// width, for the templates over the lane type.
using Float16 [[gnu::vector_size(64)]] = float;
using Int16 [[gnu::vector_size(64)]] = int32_t;
template <class VF> struct IntLanesOf;
template <> struct IntLanesOf<Float8> { using type = Int8; };
template <> struct IntLanesOf<Float16> { using type = Int16; };
// exp(x): expShiftLanesT's arithmetic with no shift, so without its
// two-sum (whose error term is exactly 0 then): the same bits for every x,
// five operations a vector fewer.
template <bool Fma = false, class VF>
[[gnu::always_inline]] inline VF expLanesT(VF x) {
  using VI = typename IntLanesOf<VF>::type;
  VF kr;
  VI k = expExponentT<VF, VI>(x, kr);
  return expFinishT<Fma>(x, (x - kr * 0.693145752f) - kr * 1.42860677e-6f,
                         k);
}
// tanh(x): below 1/4 in magnitude its odd Taylor series to x^11, above
// 1 - 2 / (exp(2|x|) + 1), sign restored; +-1 from 9 on (where tanh rounds
// to +-1 in float).
template <bool Fma, class VF>
[[gnu::always_inline]] inline VF tanhLanesF(VF x) {
  VF z = x < 0.0f ? -x : x;
  VF x2 = x * x;
  VF s = VF{} + -1382.0f / 155925;
  s = mulAdd<Fma>(s, x2, 62.0f / 2835);
  s = mulAdd<Fma>(s, x2, -17.0f / 315);
  s = mulAdd<Fma>(s, x2, 2.0f / 15);
  s = mulAdd<Fma>(s, x2, -1.0f / 3);
  VF small = mulAdd<Fma>(s * x2, x, x);
  VF zc = z > 9.0f ? (VF{} + 9.0f) : z;
  VF large = 1.0f - 2.0f / (expLanesT<Fma>(2.0f * zc) + 1.0f);
  large = z >= 9.0f ? (VF{} + 1.0f) : large;
  large = x < 0.0f ? -large : large;
  VF y = z < 0.25f ? small : large;
  return x != x ? x : y;
}

template <bool Fma, class VF>
[[gnu::always_inline]] inline VF sigmoidLanesF(VF x) {
  VF e = expLanesT<Fma>(x < 0.0f ? x : -x);
  // One division for both signs: e / (1 + e) below 0, 1 / (1 + e) above.
  VF y = (x < 0.0f ? e : (VF{} + 1.0f)) / (1.0f + e);
  return x != x ? x : y;
}
// sigmoid'(x) = s (1 - s) = e / (1 + e)^2 with e = exp(-|x|): no 1 - s
// to cancel in either tail. (tanh' and the tanh GELU go through it too:
// 1 - tanh(x)^2 = 4 sigmoid'(2x), 1 + tanh(u) = 2 sigmoid(2u).)
template <bool Fma, class VF>
[[gnu::always_inline]] inline VF sigmoidDerivativeLanesF(VF x) {
  VF e = expLanesT<Fma>(x < 0.0f ? x : -x);
  VF y = e / ((1.0f + e) * (1.0f + e));
  return x != x ? x : y;
}

// exp(d) for d below ln2 / 2 (and NaN): expLanesT's arithmetic without
// the edges such a d cannot reach (the upper clamp, +inf above 88.72, the
// NaN select: a NaN d gives NaN through the polynomial), so the same bits
// for every such d in about two thirds of the operations; k = round(d /
// ln2) <= 0 there, so rounding half away from zero is d / ln2 - 1/2
// truncated.
template <bool Fma = false, class VF>
[[gnu::always_inline]] inline VF expNonPositiveLanesT(VF d) {
  using VI = typename IntLanesOf<VF>::type;
  VF dc = d < -87.3f ? (VF{} + -87.3f) : d;
  VI k = __builtin_convertvector(dc * 1.44269504f - 0.5f, VI);
  VF kr = __builtin_convertvector(k, VF);
  VF r = (d - kr * 0.693145752f) - kr * 1.42860677e-6f;
  VF y = expScaledT<Fma>(r, k);
  return d < -87.3f ? (VF{} + 0.0f) : y;
}

// |x|: the sign bit cleared (one instruction; x < 0 ? -x : x took three).
template <class VF> [[gnu::always_inline]] inline VF absLanes(VF x) {
  using VI = typename IntLanesOf<VF>::type;
  VI bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits &= 0x7fffffff;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Phi(x) = (1 + erf(x / sqrt 2)) / 2, the normal CDF, from one tail:
// Q = erfc(|x| / sqrt 2) / 2 by Numerical Recipes' Chebyshev fit of erfc
// (relative error below 1.2e-7 for every |x|, as the double lanes), Q
// itself for x < 0 (the left tail keeps its relative accuracy) and 1 - Q
// above (Q <= 1/2 there, so 1 - Q is within a float's rounding). One
// branch for every x: a Taylor series near 0 beside it cost a third more
// and was no more accurate in float. The fit's t = 1 / (1 + z / 2) is
// taken as h = t / 2 = 1 / (2 + z) with the coefficients scaled by 2^i:
// scaling by powers of two is exact, so every step rounds as the fit's
// own would, and erfc / 2 = h exp(-z^2 + q) needs no halving.
template <bool Fma, class VF>
[[gnu::always_inline]] inline VF phiLanesF(VF x) {
  VF u = x * 0.707106781f;
  VF z = absLanes(u);
  VF h = 1.0f / (z + 2.0f);
  VF q = VF{} + 0.17087277f * 512;
  q = mulAdd<Fma>(q, h, -0.82215223f * 256);
  q = mulAdd<Fma>(q, h, 1.48851587f * 128);
  q = mulAdd<Fma>(q, h, -1.13520398f * 64);
  q = mulAdd<Fma>(q, h, 0.27886807f * 32);
  q = mulAdd<Fma>(q, h, -0.18628806f * 16);
  q = mulAdd<Fma>(q, h, 0.09678418f * 8);
  q = mulAdd<Fma>(q, h, 0.37409196f * 4);
  q = mulAdd<Fma>(q, h, 1.00002368f * 2);
  q = mulAdd<Fma>(q, h, -1.26551223f);
  VF halfErfc = h * expNonPositiveLanesT<Fma>(mulAdd<Fma>(-z, z, q));
  VF y = u < 0.0f ? halfErfc : 1.0f - halfErfc;
  return x != x ? x : y;
}

constexpr float kGeluBetaF = 0.797884561f; // sqrt(2 / pi)
constexpr float kGeluKappaF = 0.044715f;

// The tanh form as x sigmoid(2u), u = beta (x + kappa x^3): the same
// function as 0.5 x (1 + tanh(u)) without its cancellation for x < 0.
template <bool TanhForm, bool Fma, class VF>
[[gnu::always_inline]] inline VF geluLanesF(VF x) {
  if constexpr (TanhForm)
    return x * sigmoidLanesF<Fma>(2.0f * kGeluBetaF *
                                  mulAdd<Fma>(kGeluKappaF * x * x, x, x));
  else
    return x * phiLanesF<Fma>(x);
}
template <bool TanhForm, bool Fma, class VF>
[[gnu::always_inline]] inline VF geluDerivativeLanesF(VF x) {
  if constexpr (TanhForm) {
    VF x2 = x * x;
    VF twoU = 2.0f * kGeluBetaF * mulAdd<Fma>(kGeluKappaF * x2, x, x);
    VF twoDu = 2.0f * kGeluBetaF * mulAdd<Fma>(x2, VF{} + 3.0f * kGeluKappaF, 1.0f);
    return mulAdd<Fma>(x * sigmoidDerivativeLanesF<Fma>(twoU), twoDu,
                       sigmoidLanesF<Fma>(twoU));
  } else {
    return mulAdd<Fma>(x * 0.398942280f,
                       expNonPositiveLanesT<Fma>(-0.5f * (x * x)),
                       phiLanesF<Fma>(x));
  }
}

// Whole vectors of lanes from and to float arrays (any alignment).
template <class VF> [[gnu::always_inline]] inline VF loadLanes(const float *p) {
  VF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <class VF>
[[gnu::always_inline]] inline void storeLanes(float *p, VF v) {
  std::memcpy(p, &v, sizeof(v));
}
[[gnu::always_inline]] inline Float16 load16(const float *p) {
  return loadLanes<Float16>(p);
}
[[gnu::always_inline]] inline void store16(float *p, Float16 v) {
  storeLanes(p, v);
}
[[gnu::always_inline]] inline Float8 load8(const float *p) {
  return loadLanes<Float8>(p);
}
[[gnu::always_inline]] inline void store8(float *p, Float8 v) {
  storeLanes(p, v);
}
[[gnu::always_inline]] inline Float8 loadPartial8(const float *p, int64_t n) {
  float lanes[8] = {};
  for (int64_t i = 0; i < n && i < 8; ++i)
    lanes[i] = p[i];
  return load8(lanes);
}
[[gnu::always_inline]] inline void storePartial8(float *p, int64_t n,
                                                 Float8 v) {
  for (int64_t i = 0; i < n; ++i)
    p[i] = v[i];
}

// out = F::value(x) and out = dy * F::derivative(x), sixteen elements per
// turn (two independent vectors, for the FMA units' latency); Wide: 32 per
// turn in two 16-lane vectors first (the same operations lane for lane,
// so the same bits).
template <typename F, bool Wide>
[[gnu::always_inline]] inline void mapLanesF(const float *x, int64_t n,
                                             float *out) {
  int64_t i = 0;
  if constexpr (Wide) {
    for (; i + 64 <= n; i += 64) {
      Float16 a = F::value(load16(x + i)), b = F::value(load16(x + i + 16));
      Float16 c = F::value(load16(x + i + 32)),
              d = F::value(load16(x + i + 48));
      store16(out + i, a);
      store16(out + i + 16, b);
      store16(out + i + 32, c);
      store16(out + i + 48, d);
    }
    for (; i + 32 <= n; i += 32) {
      Float16 a = F::value(load16(x + i)), b = F::value(load16(x + i + 16));
      store16(out + i, a);
      store16(out + i + 16, b);
    }
  }
  for (; i + 16 <= n; i += 16) {
    Float8 a = F::value(load8(x + i)), b = F::value(load8(x + i + 8));
    store8(out + i, a);
    store8(out + i + 8, b);
  }
  for (; i < n; i += 8)
    storePartial8(out + i, std::min<int64_t>(8, n - i),
                  F::value(loadPartial8(x + i, n - i)));
}
template <typename F, bool Wide>
[[gnu::always_inline]] inline void
mapGradLanesF(const float *dy, const float *x, int64_t n, float *out) {
  int64_t i = 0;
  if constexpr (Wide)
    for (; i + 32 <= n; i += 32) {
      Float16 a = load16(dy + i) * F::derivative(load16(x + i));
      Float16 b = load16(dy + i + 16) * F::derivative(load16(x + i + 16));
      store16(out + i, a);
      store16(out + i + 16, b);
    }
  for (; i + 16 <= n; i += 16) {
    Float8 a = load8(dy + i) * F::derivative(load8(x + i));
    Float8 b = load8(dy + i + 8) * F::derivative(load8(x + i + 8));
    store8(out + i, a);
    store8(out + i + 8, b);
  }
  for (; i < n; i += 8)
    storePartial8(out + i, std::min<int64_t>(8, n - i),
                  loadPartial8(dy + i, n - i) *
                      F::derivative(loadPartial8(x + i, n - i)));
}

template <bool Fma> struct TanhFnF {
  template <class VF> [[gnu::always_inline]] static VF value(VF v) {
    return tanhLanesF<Fma>(v);
  }
  template <class VF> [[gnu::always_inline]] static VF derivative(VF v) {
    return 4.0f * sigmoidDerivativeLanesF<Fma>(2.0f * v);
  }
};
template <bool Fma> struct SigmoidFnF {
  template <class VF> [[gnu::always_inline]] static VF value(VF v) {
    return sigmoidLanesF<Fma>(v);
  }
  template <class VF> [[gnu::always_inline]] static VF derivative(VF v) {
    return sigmoidDerivativeLanesF<Fma>(v);
  }
};
// x sigmoid(x) (the sigmoid lanes' value times x: the bits of Sigmoid then
// Mul) and PyTorch's derivative s (1 + x (1 - s)).
template <bool Fma> struct SiluFnF {
  template <class VF> [[gnu::always_inline]] static VF value(VF v) {
    return v * sigmoidLanesF<Fma>(v);
  }
  template <class VF> [[gnu::always_inline]] static VF derivative(VF v) {
    VF s = sigmoidLanesF<Fma>(v);
    return s * mulAdd<Fma>(v, 1.0f - s, 1.0f);
  }
};
template <bool TanhForm, bool Fma> struct GeluFnF {
  template <class VF> [[gnu::always_inline]] static VF value(VF v) {
    return geluLanesF<TanhForm, Fma>(v);
  }
  template <class VF> [[gnu::always_inline]] static VF derivative(VF v) {
    return geluDerivativeLanesF<TanhForm, Fma>(v);
  }
};

#if defined(__x86_64__) && defined(__GNUC__)
#define CLEAVE_FMA_TARGET __attribute__((target("avx2,fma")))
bool cpuHasFma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
#define CLEAVE_FMA_TARGET
bool cpuHasFma() { return false; }
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define CLEAVE_AVX512_TARGET __attribute__((target("avx512f,fma")))
bool cpuHasAvx512() {
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  return has;
}
#else
#define CLEAVE_AVX512_TARGET
bool cpuHasAvx512() { return false; }
#endif

// NAME##F(ARGS) runs the body (the macro's last arguments) built for
// AVX-512 where the CPU has it (kWide true: 16-lane vectors too), else for
// AVX2 + FMA, else for the baseline.
#define CLEAVE_FLOAT_LANES(NAME, PARAMS, ARGS, ...)                            \
  CLEAVE_AVX512_TARGET void NAME##Wide PARAMS {                                \
    [[maybe_unused]] constexpr bool kWide = true, kFma = true;                 \
    __VA_ARGS__;                                                               \
  }                                                                            \
  CLEAVE_FMA_TARGET void NAME##Fma PARAMS {                                    \
    [[maybe_unused]] constexpr bool kWide = false, kFma = true;                \
    __VA_ARGS__;                                                               \
  }                                                                            \
  void NAME##Base PARAMS {                                                     \
    [[maybe_unused]] constexpr bool kWide = false, kFma = false;               \
    __VA_ARGS__;                                                               \
  }                                                                            \
  void NAME##F PARAMS {                                                        \
    if (cpuHasAvx512())                                                        \
      NAME##Wide ARGS;                                                         \
    else if (cpuHasFma())                                                      \
      NAME##Fma ARGS;                                                          \
    else                                                                       \
      NAME##Base ARGS;                                                         \
  }

// NAME##ArrayF and NAME##GradArrayF of an activation without parameters.
#define CLEAVE_FLOAT_ACTIVATION(NAME, FN)                                      \
  CLEAVE_FLOAT_LANES(NAME##Array, (const float *x, int64_t n, float *out),     \
                     (x, n, out), mapLanesF<FN<kFma>, kWide>(x, n, out))       \
  CLEAVE_FLOAT_LANES(                                                          \
      NAME##GradArray,                                                         \
      (const float *dy, const float *x, int64_t n, float *out),                \
      (dy, x, n, out), mapGradLanesF<FN<kFma>, kWide>(dy, x, n, out))
CLEAVE_FLOAT_ACTIVATION(tanh, TanhFnF)
CLEAVE_FLOAT_ACTIVATION(sigmoid, SigmoidFnF)
CLEAVE_FLOAT_ACTIVATION(silu, SiluFnF)
#undef CLEAVE_FLOAT_ACTIVATION
CLEAVE_FLOAT_LANES(geluArray,
                   (const float *x, int64_t n, bool tanhForm, float *out),
                   (x, n, tanhForm, out),
                   tanhForm ? mapLanesF<GeluFnF<true, kFma>, kWide>(x, n, out)
                            : mapLanesF<GeluFnF<false, kFma>, kWide>(x, n, out))
CLEAVE_FLOAT_LANES(geluGradArray,
                   (const float *dy, const float *x, int64_t n, bool tanhForm,
                    float *out),
                   (dy, x, n, tanhForm, out),
                   tanhForm
                       ? mapGradLanesF<GeluFnF<true, kFma>, kWide>(dy, x, n, out)
                       : mapGradLanesF<GeluFnF<false, kFma>, kWide>(dy, x, n, out))

// exp over f32 rows for softmax, cross-entropy and Exp: float lanes, the
// sum of exps in double, in eight lanes (each float lane adds into its own
// double lane) added in the same tree as the double version's.
template <bool Fma>
[[gnu::always_inline]] inline Float8 expRowLanes(Float8 x, float shift) {
  return expShiftLanesF<Fma>(x, shift);
}
[[gnu::always_inline]] inline void addLanes(Double4 &lo, Double4 &hi,
                                            Float8 v) {
  using Float4v [[gnu::vector_size(16)]] = float;
  Float4v a, b;
  std::memcpy(&a, &v, sizeof(a));
  std::memcpy(&b, reinterpret_cast<const char *>(&v) + sizeof(a), sizeof(b));
  lo += __builtin_convertvector(a, Double4);
  hi += __builtin_convertvector(b, Double4);
}
[[gnu::always_inline]] inline double laneTree(Double4 lo, Double4 hi) {
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) +
         ((hi[0] + hi[1]) + (hi[2] + hi[3]));
}
[[gnu::always_inline]] inline Float8 loadPartial8Fill(const float *p, int64_t n,
                                                      float fill) {
  float lanes[8] = {fill, fill, fill, fill, fill, fill, fill, fill};
  for (int64_t i = 0; i < n && i < 8; ++i)
    lanes[i] = p[i];
  return load8(lanes);
}

// The rows' exps 16 lanes at a time where the CPU has AVX-512 (the same
// operations lane for lane as the 8-lane code, so the same bits; the sums
// take the two halves in the 8-lane order), the remainder in 8 lanes.
using Double8 [[gnu::vector_size(64)]] = double;

// The 8-lane sums' two accumulators as one (lanes 0-3 lo, 4-7 hi), fed each
// 16-lane vector's halves in turn: the additions of the 8-lane code. Only
// the AVX-512 builds call it; each half widened by one instruction (GCC
// builds a float-to-double conversion into 512 bits from two 256-bit ones,
// an extract and an insert: four shuffle-port operations where one does,
// and 40% of the row exps' samples under perf).
[[gnu::always_inline]] inline void addLanes(Double8 &acc, Float16 v) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  Double8 lo, hi;
  Float8 upper;
  asm("vcvtps2pd %t1, %g0" : "=v"(lo) : "v"(v));
  asm("vextractf64x4 $1, %g1, %t0" : "=v"(upper) : "v"(v));
  asm("vcvtps2pd %t1, %g0" : "=v"(hi) : "v"(upper));
  acc += lo;
  acc += hi;
#else
  acc += __builtin_convertvector(
      __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), Double8);
  acc += __builtin_convertvector(
      __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15), Double8);
#endif
}
[[gnu::always_inline]] inline void splitLanes(Double8 acc, Double4 &lo,
                                              Double4 &hi) {
  lo = __builtin_shufflevector(acc, acc, 0, 1, 2, 3);
  hi = __builtin_shufflevector(acc, acc, 4, 5, 6, 7);
}

template <bool Wide, bool Fma>
[[gnu::always_inline]] inline void
sumExpShiftedLanes(const float *x, int64_t n, float shift, double *sum) {
  Double4 lo = {}, hi = {};
  int64_t i = 0;
  if constexpr (Wide) {
    Double8 acc = {};
    for (; i + 16 <= n; i += 16)
      addLanes(acc, expShiftLanesT<Float16, Int16, Fma>(load16(x + i), shift));
    splitLanes(acc, lo, hi);
  }
  for (; i + 8 <= n; i += 8)
    addLanes(lo, hi, expRowLanes<Fma>(load8(x + i), shift));
  if (i < n) // the missing lanes add exp(-inf) = 0
    addLanes(lo, hi,
             expRowLanes<Fma>(loadPartial8Fill(x + i, n - i, -INFINITY), shift));
  *sum = laneTree(lo, hi);
}
template <bool Wide, bool Fma>
[[gnu::always_inline]] inline void expShiftedLanes(const float *x, int64_t n,
                                                   float shift, float scale,
                                                   float *out) {
  int64_t i = 0;
  if constexpr (Wide)
    for (; i + 16 <= n; i += 16)
      store16(out + i,
              expShiftLanesT<Float16, Int16, Fma>(load16(x + i), shift) * scale);
  for (; i + 8 <= n; i += 8)
    store8(out + i, expRowLanes<Fma>(load8(x + i), shift) * scale);
  if (i < n)
    storePartial8(out + i, n - i,
                  expRowLanes<Fma>(loadPartial8(x + i, n - i), shift) * scale);
}
template <bool Wide, bool Fma>
[[gnu::always_inline]] inline void expShiftedSumLanes(const float *x, int64_t n,
                                                      float shift, float *out,
                                                      double *sum) {
  Double4 lo = {}, hi = {};
  int64_t i = 0;
  if constexpr (Wide) {
    Double8 acc = {};
    for (; i + 16 <= n; i += 16) {
      Float16 e = expShiftLanesT<Float16, Int16, Fma>(load16(x + i), shift);
      store16(out + i, e);
      addLanes(acc, e);
    }
    splitLanes(acc, lo, hi);
  }
  for (; i + 8 <= n; i += 8) {
    Float8 e = expRowLanes<Fma>(load8(x + i), shift);
    store8(out + i, e);
    addLanes(lo, hi, e);
  }
  if (i < n) {
    Float8 e = expRowLanes<Fma>(loadPartial8Fill(x + i, n - i, -INFINITY), shift);
    storePartial8(out + i, n - i, e);
    addLanes(lo, hi, e);
  }
  *sum = laneTree(lo, hi);
}

// The largest of x[0, n), NaN if any is NaN, -inf for n = 0 (the order of
// the comparisons cannot change a value: max is exact).
template <bool Wide>
[[gnu::always_inline]] inline void rowMaxLanes(const float *x, int64_t n,
                                               float *out) {
  using VF = std::conditional_t<Wide, Float16, Float8>;
  constexpr int64_t kLanes = sizeof(VF) / sizeof(float);
  VF mv = VF{} + -INFINITY, nv = VF{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    VF v = loadLanes<VF>(x + i);
    mv = v > mv ? v : mv;
    nv = v != v ? v : nv; // NaN lanes kept
  }
  float m = -INFINITY;
  bool nan = false;
  for (int64_t l = 0; l < kLanes; ++l) {
    m = mv[l] > m ? mv[l] : m;
    nan = nan || nv[l] != nv[l];
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan || x[i] != x[i];
  }
  *out = nan ? NAN : m;
}

CLEAVE_FLOAT_LANES(rowMax, (const float *x, int64_t n, float *out), (x, n, out),
                   rowMaxLanes<kWide>(x, n, out))
CLEAVE_FLOAT_LANES(sumExpShifted,
                   (const float *x, int64_t n, float shift, double *sum),
                   (x, n, shift, sum),
                   sumExpShiftedLanes<kWide, kFma>(x, n, shift, sum))
CLEAVE_FLOAT_LANES(expShifted,
                   (const float *x, int64_t n, float shift, float scale,
                    float *out),
                   (x, n, shift, scale, out),
                   expShiftedLanes<kWide, kFma>(x, n, shift, scale, out))
CLEAVE_FLOAT_LANES(expShiftedSum,
                   (const float *x, int64_t n, float shift, float *out,
                    double *sum),
                   (x, n, shift, out, sum),
                   expShiftedSumLanes<kWide, kFma>(x, n, shift, out, sum))
#undef CLEAVE_FLOAT_LANES

} // namespace

bool cpuHasAvx512F() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

double sumExpShifted(const float *x, int64_t n, double shift) {
  double sum;
  sumExpShiftedF(x, n, float(shift), &sum);
  return sum;
}
double sumExpShifted(const double *x, int64_t n, double shift) {
  return sumExpShiftedT(x, n, shift);
}
void expShifted(const float *x, int64_t n, double shift, double scale,
                float *out) {
  expShiftedF(x, n, float(shift), float(scale), out);
}
double expShiftedSum(const float *x, int64_t n, double shift, float *out) {
  double sum;
  expShiftedSumF(x, n, float(shift), out, &sum);
  return sum;
}
void expShifted(const double *x, int64_t n, double shift, double scale,
                double *out) {
  expShiftedT(x, n, shift, scale, out);
}
float rowMax(const float *x, int64_t n) {
  float m;
  rowMaxF(x, n, &m);
  return m;
}
double rowMax(const double *x, int64_t n) {
  double m = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan || x[i] != x[i];
  }
  return nan ? NAN : m;
}
void erfArray(const float *x, int64_t n, float *out) { erfArrayT(x, n, out); }
void erfArray(const double *x, int64_t n, double *out) { erfArrayT(x, n, out); }
void erfGradArray(const float *dy, const float *x, int64_t n, float *out) {
  erfGradArrayT(dy, x, n, out);
}
void erfGradArray(const double *dy, const double *x, int64_t n, double *out) {
  erfGradArrayT(dy, x, n, out);
}

void tanhArray(const float *x, int64_t n, float *out) { tanhArrayF(x, n, out); }
void tanhGradArray(const float *dy, const float *x, int64_t n, float *out) {
  tanhGradArrayF(dy, x, n, out);
}
void sigmoidArray(const float *x, int64_t n, float *out) {
  sigmoidArrayF(x, n, out);
}
void sigmoidGradArray(const float *dy, const float *x, int64_t n, float *out) {
  sigmoidGradArrayF(dy, x, n, out);
}
void siluArray(const float *x, int64_t n, float *out) {
  siluArrayF(x, n, out);
}
void siluGradArray(const float *dy, const float *x, int64_t n, float *out) {
  siluGradArrayF(dy, x, n, out);
}
void siluArray(const double *x, int64_t n, double *out) {
  activationArrayT<SiluFn>(x, n, out);
}
void siluGradArray(const double *dy, const double *x, int64_t n, double *out) {
  activationGradArrayT<SiluFn>(dy, x, n, out);
}
void geluArray(const float *x, int64_t n, bool tanhForm, float *out) {
  geluArrayF(x, n, tanhForm, out);
}
void geluGradArray(const float *dy, const float *x, int64_t n, bool tanhForm,
                   float *out) {
  geluGradArrayF(dy, x, n, tanhForm, out);
}
void tanhArray(const double *x, int64_t n, double *out) {
  activationArrayT<TanhFn>(x, n, out);
}
void tanhGradArray(const double *dy, const double *x, int64_t n, double *out) {
  activationGradArrayT<TanhFn>(dy, x, n, out);
}
void sigmoidArray(const double *x, int64_t n, double *out) {
  activationArrayT<SigmoidFn>(x, n, out);
}
void sigmoidGradArray(const double *dy, const double *x, int64_t n,
                      double *out) {
  activationGradArrayT<SigmoidFn>(dy, x, n, out);
}
void geluArray(const double *x, int64_t n, bool tanhForm, double *out) {
  geluArrayT(x, n, tanhForm, out);
}
void geluGradArray(const double *dy, const double *x, int64_t n, bool tanhForm,
                   double *out) {
  geluGradArrayT(dy, x, n, tanhForm, out);
}

} // namespace cleave::runtime::cpu
