// Elementwise kernels of the CUDA backend (CudaKernels.h): one grid-stride
// loop per op, 256 threads a block.
#include "runtime/cuda/CudaKernels.h"

#include <cuda_runtime.h>

namespace cleave::runtime::cuda {
namespace {

constexpr int kThreads = 256;

int blocksFor(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return int(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

__device__ float applyUnary(Unary op, float x) {
  switch (op) {
  case Unary::Relu: return x < 0.0f ? 0.0f : x;
  case Unary::Neg: return -x;
  case Unary::Abs: return fabsf(x);
  case Unary::Exp: return expf(x);
  case Unary::Log: return logf(x);
  case Unary::Sqrt: return sqrtf(x);
  case Unary::Tanh: return tanhf(x);
  case Unary::Erf: return erff(x);
  case Unary::Sigmoid:
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
  }
  return x;
}

__device__ float applyBinary(Binary op, float a, float b) {
  switch (op) {
  case Binary::Add: return a + b;
  case Binary::Sub: return a - b;
  case Binary::Mul: return a * b;
  case Binary::Div: return a / b;
  }
  return a;
}

__global__ void unaryKernel(Unary op, const float *x, float *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = applyUnary(op, x[i]);
}

__global__ void binaryKernel(Binary op, const float *a, bool aScalar,
                             const float *b, bool bScalar, float *y,
                             int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = applyBinary(op, a[aScalar ? 0 : i], b[bScalar ? 0 : i]);
}

} // namespace

int launchUnaryF32(Unary op, const float *x, float *y, int64_t n,
                   void *stream) {
  if (n == 0)
    return 0;
  unaryKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(op, x, y,
                                                                    n);
  return int(cudaGetLastError());
}

int launchBinaryF32(Binary op, const float *a, bool aScalar, const float *b,
                    bool bScalar, float *y, int64_t n, void *stream) {
  if (n == 0)
    return 0;
  binaryKernel<<<blocksFor(n), kThreads, 0, cudaStream_t(stream)>>>(
      op, a, aScalar, b, bScalar, y, n);
  return int(cudaGetLastError());
}

} // namespace cleave::runtime::cuda
