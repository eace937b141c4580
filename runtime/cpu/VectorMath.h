// exp, erf, tanh, sigmoid and GELU over arrays, four lanes at a time in
// double (sums kept in eight lanes, added in laneSum's tree, CpuKernels.h),
// for the CPU kernels whose time went to one libm call per element:
// softmax and cross-entropy (exp), Erf, Tanh, Sigmoid, Gelu and their
// gradients. (In eight-lane vectors, erf's two
// branches spilled out of AVX2's registers: four lanes give the same bits
// 2 to 3 times faster there.)
//
// Accuracy: exp to about 1e-15 relative (Taylor polynomial of degree 11
// on |r| <= ln(2)/2 after r = x - k ln 2); erf to about 1e-7 absolute
// (Taylor series below 0.5, relative 1e-14; above, Numerical Recipes'
// Chebyshev erfc, relative error below 1.2e-7), within a float's rounding
// of its results; tanh to about 1e-14 relative (through exp, a Taylor
// series below 1/8); sigmoid and GELU as accurate as the exp, erf and tanh
// they are made of. exp overflows to +inf above 709.78 and gives 0 below
// -708 (no subnormal results); NaN stays NaN. Results do not depend on
// threads or on where an array starts. The f32 row exps (expShifted,
// expShiftedSum, sumExpShifted) and rowMax take 16 lanes at a time where
// the CPU has AVX-512, with the same operations lane for lane as the 8
// lanes elsewhere, so the same bits (on a 128-key attention tile, exp and
// sum 13 us against 22 us, docs/benchmarks.md). The f32 functions'
// polynomial multiply-adds are fused where the CPU has FMA (AVX2 or
// AVX-512 alike, so those two give the same bits; VectorMath.cpp).
#pragma once

#include <cstdint>

namespace cleave::runtime::cpu {

// sum over i of exp(x[i] - shift), in double. (f32: the exps in float
// lanes, shift rounded to float; sums in double.)
double sumExpShifted(const float *x, int64_t n, double shift);
double sumExpShifted(const double *x, int64_t n, double shift);

// out[i] = exp(x[i] - shift) * scale (out may be x). (f32: float lanes,
// shift and scale rounded to float.)
void expShifted(const float *x, int64_t n, double shift, double scale,
                float *out);
void expShifted(const double *x, int64_t n, double shift, double scale,
                double *out);

// out[i] = exp(x[i] - shift) in float lanes, and returns their sum in
// double: softmax's one pass of exps (the same sum as sumExpShifted).
double expShiftedSum(const float *x, int64_t n, double shift, float *out);

// The largest of x[0, n): NaN if any element is NaN, -inf if n is 0.
float rowMax(const float *x, int64_t n);
double rowMax(const double *x, int64_t n);

// out[i] = erf(x[i]).
void erfArray(const float *x, int64_t n, float *out);
void erfArray(const double *x, int64_t n, double *out);

// out[i] = dy[i] * 2 / sqrt(pi) * exp(-x[i]^2), Erf's gradient.
void erfGradArray(const float *dy, const float *x, int64_t n, float *out);
void erfGradArray(const double *dy, const double *x, int64_t n, double *out);

// out[i] = tanh(x[i]) and dy[i] * (1 - tanh(x[i])^2).
void tanhArray(const float *x, int64_t n, float *out);
void tanhArray(const double *x, int64_t n, double *out);
void tanhGradArray(const float *dy, const float *x, int64_t n, float *out);
void tanhGradArray(const double *dy, const double *x, int64_t n, double *out);

// out[i] = sigmoid(x[i]) and dy[i] * s (1 - s), s = sigmoid(x[i]).
void sigmoidArray(const float *x, int64_t n, float *out);
void sigmoidArray(const double *x, int64_t n, double *out);
void sigmoidGradArray(const float *dy, const float *x, int64_t n, float *out);
void sigmoidGradArray(const double *dy, const double *x, int64_t n,
                      double *out);

// out[i] = x[i] sigmoid(x[i]) (SiLU) and dy[i] * s (1 + x[i] (1 - s)),
// s = sigmoid(x[i]) (PyTorch's silu_backward).
void siluArray(const float *x, int64_t n, float *out);
void siluArray(const double *x, int64_t n, double *out);
void siluGradArray(const float *dy, const float *x, int64_t n, float *out);
void siluGradArray(const double *dy, const double *x, int64_t n, double *out);

// out[i] = gelu(x[i]) and dy[i] * gelu'(x[i]); the erf form, or the tanh
// approximation when tanhForm (Gelu-20's approximate = "tanh").
void geluArray(const float *x, int64_t n, bool tanhForm, float *out);
void geluArray(const double *x, int64_t n, bool tanhForm, double *out);
void geluGradArray(const float *dy, const float *x, int64_t n, bool tanhForm,
                   float *out);
void geluGradArray(const double *dy, const double *x, int64_t n, bool tanhForm,
                   double *out);

} // namespace cleave::runtime::cpu
