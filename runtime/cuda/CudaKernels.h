// The CUDA backend's own kernels, behind a plain C++ interface: the .cu
// file that defines them is built by nvcc and sees neither LLVM nor the
// IR, and CudaBackend.cpp (built by the C++ compiler) sees no CUDA C++.
// Every launcher runs on the given stream (a cudaStream_t) and returns the
// launch's cudaError_t as an int, 0 for success.
#pragma once

#include <cstdint>

namespace cleave::runtime::cuda {

enum class Unary { Relu, Neg, Abs, Exp, Log, Sqrt, Tanh, Erf, Sigmoid };
enum class Binary { Add, Sub, Mul, Div };

// y[i] = op(x[i]) for i < n.
int launchUnaryF32(Unary op, const float *x, float *y, int64_t n,
                   void *stream);
// y[i] = op(a[i or 0], b[i or 0]) for i < n: an operand of one element is
// broadcast (aScalar / bScalar), any other has n.
int launchBinaryF32(Binary op, const float *a, bool aScalar, const float *b,
                    bool bScalar, float *y, int64_t n, void *stream);

} // namespace cleave::runtime::cuda
