// What the CUDA backend makes of a kernel call: a short list of device
// steps, each one a kernel launch (a strided map, a GEMM, a row op, ...).
// Lowering is plain C++ over the kernel contract (runtime/Kernel.h) and the
// structs of DeviceCode.h, built on every machine: the CUDA backend launches
// the steps on a GPU, and the emulated backend (`--device cuda-emulated`)
// runs the very same steps on the host, so the lowering of every op, and
// whole training runs through it, are tested where no GPU is.
#pragma once

#include "runtime/Kernel.h"
#include "runtime/cuda/DeviceCode.h"

#include "llvm/Support/Error.h"

#include <functional>
#include <memory>
#include <variant>
#include <vector>

namespace cleave::runtime::cuda {

// A row-major GEMM, batched with strides (elements):
//   C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b],  b < batch,
// op(A) is [m, k] (A stored [k, m] when transA), op(B) is [k, n]; lda, ldb,
// ldc are row strides. A and B share one element type; C has its own (the
// sums are f32 either way). The CUDA backend hands it to cuBLAS as the
// column-major product C^T = op(B)^T op(A)^T (cublasArgs).
struct GemmStep {
  bool transA = false, transB = false;
  int64_t m = 0, n = 0, k = 0;
  const void *A = nullptr, *B = nullptr;
  void *C = nullptr;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t strideA = 0, strideB = 0, strideC = 0;
  int64_t batch = 1;
  float alpha = 1, beta = 0;
  Elem ab = Elem::F32, c = Elem::F32;
};

// The same product as cuBLAS's column-major arguments.
struct CublasGemm {
  bool transa, transb; // CUBLAS_OP_T where true
  int64_t m, n, k;
  const void *A, *B; // cuBLAS's A is the step's B and its B the step's A
  int64_t lda, ldb, ldc, strideA, strideB, strideC;
};
CublasGemm cublasArgs(const GemmStep &s);

using DeviceStep =
    std::variant<MapArgs, GemmStep, ReduceStep, RowStep, ColumnStep, LossStep,
                 GatherStep, OptimizerStep, Im2colStep, PoolStep, ChannelStep,
                 ChannelMapStep, PadStep, AttentionStep, AttentionGradStep,
                 IndexStep, ResizeStep, GridSampleStep>;

// Backend memory a call's steps may use as scratch (row statistics, the
// loss's partial sums, a conv's column matrices), valid until the next call
// is lowered. One request per call: a second may move the first.
using Scratch = std::function<void *(size_t bytes)>;

// The steps of `call`, in order, or an error naming the op and what the
// CUDA backend does not handle (an op, an element type, a shape).
llvm::Expected<std::vector<DeviceStep>> lowerCall(const KernelCall &call,
                                                  const Scratch &scratch);

// True when lowerCall handles `op` with first inputs of `dtype`.
bool lowers(ir::OpKind op, ir::DType dtype);

// Runs steps on the host, one element (or row) at a time: the emulated
// backend, and the reference the CUDA unit tests compare a GPU against.
void runStepsOnHost(const std::vector<DeviceStep> &steps);

// A backend in host memory that runs every kernel call through lowerCall
// and runStepsOnHost: the CUDA backend's arithmetic without a GPU.
std::unique_ptr<Backend> createCudaEmulatedBackend();

} // namespace cleave::runtime::cuda
