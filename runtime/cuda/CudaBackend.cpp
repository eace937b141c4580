// The CUDA backend (CudaBackend.h). Everything runs on the backend's one
// stream; copies to and from the host wait for it, so the executor sees
// the same order of effects as on the CPU.
//
// Nothing of CUDA loads unless a CUDA backend is asked for: the CUDA
// runtime is linked statically (it starts at its first call), and cuBLAS
// is opened with dlopen then. Linked the usual way, the CUDA libraries
// cost every cleave-run 0.1 s and 200 MB at start, --device cpu included.
#include "runtime/cuda/CudaBackend.h"

#include "runtime/cuda/CudaKernels.h"

#include "llvm/Support/FormatVariadic.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <optional>

namespace cleave::runtime {
namespace {

// The cuBLAS entry points the backend uses, from libcublas.so.13.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) setStream = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemmStridedBatched = nullptr;
  std::string error; // why it could not be loaded
};

const Cublas &cublas() {
  static const Cublas lib = [] {
    Cublas c;
    void *h = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      c.error = std::string("cannot load cuBLAS: ") + dlerror();
      return c;
    }
    auto sym = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(
          dlsym(h, name));
      if (!fn && c.error.empty())
        c.error = std::string("cuBLAS lacks ") + name;
    };
    sym(c.create, "cublasCreate_v2");
    sym(c.destroy, "cublasDestroy_v2");
    sym(c.setStream, "cublasSetStream_v2");
    sym(c.sgemm, "cublasSgemm_v2");
    sym(c.sgemmStridedBatched, "cublasSgemmStridedBatched");
    return c;
  }();
  return lib;
}

llvm::Error cudaFail(const llvm::Twine &what, cudaError_t e) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 what + ": " + cudaGetErrorString(e));
}

std::optional<cuda::Unary> unaryOf(ir::OpKind op) {
  using ir::OpKind;
  switch (op) {
  case OpKind::Relu: return cuda::Unary::Relu;
  case OpKind::Neg: return cuda::Unary::Neg;
  case OpKind::Abs: return cuda::Unary::Abs;
  case OpKind::Exp: return cuda::Unary::Exp;
  case OpKind::Log: return cuda::Unary::Log;
  case OpKind::Sqrt: return cuda::Unary::Sqrt;
  case OpKind::Tanh: return cuda::Unary::Tanh;
  case OpKind::Erf: return cuda::Unary::Erf;
  case OpKind::Sigmoid: return cuda::Unary::Sigmoid;
  default: return std::nullopt;
  }
}

std::optional<cuda::Binary> binaryOf(ir::OpKind op) {
  using ir::OpKind;
  switch (op) {
  case OpKind::Add: return cuda::Binary::Add;
  case OpKind::Sub: return cuda::Binary::Sub;
  case OpKind::Mul: return cuda::Binary::Mul;
  case OpKind::Div: return cuda::Binary::Div;
  default: return std::nullopt;
  }
}

class CudaBackend final : public Backend {
public:
  static llvm::Expected<std::unique_ptr<Backend>> create(int device) {
    auto count = cudaDeviceCount();
    if (!count)
      return count.takeError();
    if (device < 0 || device >= *count)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("CUDA device {0} does not exist ({1} visible)",
                        device, *count));
    std::unique_ptr<CudaBackend> b(new CudaBackend(device));
    if (cudaError_t e = cudaSetDevice(device))
      return cudaFail("cudaSetDevice", e);
    if (cudaError_t e = cudaStreamCreate(&b->stream_))
      return cudaFail("cudaStreamCreate", e);
    const Cublas &blas = cublas();
    if (!blas.error.empty())
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     blas.error);
    if (blas.create(&b->blas_) != CUBLAS_STATUS_SUCCESS)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "cublasCreate failed");
    blas.setStream(b->blas_, b->stream_);
    return std::unique_ptr<Backend>(std::move(b));
  }

  ~CudaBackend() override {
    if (blas_)
      cublas().destroy(blas_);
    if (stream_)
      cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "cuda"; }

  void *allocate(size_t bytes) override {
    void *p = nullptr;
    cudaSetDevice(device_);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
      return nullptr;
    return p;
  }
  void release(void *ptr) override {
    if (ptr)
      cudaFree(ptr);
  }
  void copyToDevice(void *dst, const void *src, size_t bytes) override {
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
    cudaStreamSynchronize(stream_);
  }
  void copyToHost(void *dst, const void *src, size_t bytes) override {
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
    cudaStreamSynchronize(stream_);
  }

  bool supports(ir::OpKind op, ir::DType dtype) const override {
    if (op == ir::OpKind::Identity)
      return true;
    return dtype == ir::DType::F32 &&
           (unaryOf(op) || binaryOf(op) || op == ir::OpKind::MatMul);
  }

  llvm::Error run(const KernelCall &call) override {
    if (!supports(call.op, call.inputs.empty() ? ir::DType::F32
                                               : call.inputs[0].dtype))
      return fail(call, "no CUDA kernel for this op and element type");
    int err = 0;
    if (call.op == ir::OpKind::Identity) {
      const TensorRef &in = call.inputs[0];
      size_t bytes = size_t(in.numElements()) * ir::dtypeSize(in.dtype);
      err = int(cudaMemcpyAsync(call.outputs[0].data, in.data, bytes,
                                cudaMemcpyDeviceToDevice, stream_));
    } else if (auto u = unaryOf(call.op)) {
      err = cuda::launchUnaryF32(*u, call.inputs[0].as<float>(),
                                 call.outputs[0].as<float>(),
                                 call.outputs[0].numElements(), stream_);
    } else if (auto bin = binaryOf(call.op)) {
      const TensorRef &a = call.inputs[0], &b = call.inputs[1],
                      &y = call.outputs[0];
      int64_t n = y.numElements();
      auto fits = [&](const TensorRef &t) {
        return t.numElements() == n || t.numElements() == 1;
      };
      if (!fits(a) || !fits(b))
        return cannotBroadcast(call, a, b, "only a one-element operand");
      err = cuda::launchBinaryF32(*bin, a.as<float>(), a.numElements() == 1,
                                  b.as<float>(), b.numElements() == 1,
                                  y.as<float>(), n, stream_);
    } else {
      return matMul(call);
    }
    if (err)
      return fail(call, cudaGetErrorString(cudaError_t(err)));
    return llvm::Error::success();
  }

private:
  explicit CudaBackend(int device) : device_(device) {}

  static llvm::Error fail(const KernelCall &call, const llvm::Twine &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   std::string(call.info().name) + " (cuda): " +
                                       why);
  }
  static llvm::Error cannotBroadcast(const KernelCall &call,
                                     const TensorRef &a, const TensorRef &b,
                                     const char *what) {
    return fail(call, llvm::formatv("operands {0} and {1}: the CUDA backend "
                                    "broadcasts {2} so far",
                                    ir::shapeStr(a.shape),
                                    ir::shapeStr(b.shape), what)
                          .str());
  }

  // MatMul of A [..., M, K] and B [K, N] (one GEMM, A's leading dims as
  // rows) or B [..., K, N] with A's batch dims (strided batched). Row-major
  // C = A B is column-major C^T = B^T A^T: cuBLAS gets B first.
  llvm::Error matMul(const KernelCall &call) {
    const TensorRef &A = call.inputs[0], &B = call.inputs[1],
                    &C = call.outputs[0];
    if (A.rank() < 2 || B.rank() < 2)
      return fail(call, "the CUDA backend multiplies matrices (rank >= 2) "
                        "only so far");
    int64_t k = A.shape.back(), n = B.shape.back();
    int64_t m = A.shape[A.rank() - 2];
    int64_t batch = A.numElements() / (m * k);
    int64_t bBatch = B.numElements() / (k * n);
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t st;
    if (bBatch == 1) {
      st = cublas().sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m * batch),
                       int(k), &alpha, B.as<float>(), int(n), A.as<float>(),
                       int(k), &beta, C.as<float>(), int(n));
    } else if (bBatch == batch) {
      st = cublas().sgemmStridedBatched(
          blas_, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &alpha,
          B.as<float>(), int(n), k * n, A.as<float>(), int(k), m * k, &beta,
          C.as<float>(), int(n), m * n, int(batch));
    } else {
      return cannotBroadcast(call, A, B, "no batch dims");
    }
    if (st != CUBLAS_STATUS_SUCCESS)
      return fail(call, llvm::formatv("cuBLAS status {0}", int(st)).str());
    return llvm::Error::success();
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

} // namespace

llvm::Expected<int> cudaDeviceCount() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::Twine("no usable CUDA device (") +
            (e != cudaSuccess ? cudaGetErrorString(e)
                              : "the CUDA runtime sees no device") +
            ")");
  return count;
}

llvm::Expected<std::unique_ptr<Backend>> createCudaBackend(int device) {
  return CudaBackend::create(device);
}

} // namespace cleave::runtime
