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
#include "runtime/cuda/Lowering.h"

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
  // The C entry point (the header adds a C++ overload of the same name).
  cublasStatus_t (*gemmStridedBatchedEx)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
      const void *, const void *, cudaDataType, int, long long, const void *,
      cudaDataType, int, long long, const void *, void *, cudaDataType, int,
      long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
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
    sym(c.gemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
    return c;
  }();
  return lib;
}

llvm::Error cudaFail(const llvm::Twine &what, cudaError_t e) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 what + ": " + cudaGetErrorString(e));
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
    // Offload copies: their own stream, ordered against the compute by
    // events that carry no timing.
    if (cudaError_t e = cudaStreamCreateWithFlags(&b->copyStream_,
                                                  cudaStreamNonBlocking))
      return cudaFail("cudaStreamCreate (copies)", e);
    for (cudaEvent_t *ev : {&b->computeMark_, &b->copyMark_})
      if (cudaError_t e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming))
        return cudaFail("cudaEventCreate", e);
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
    if (scratch_)
      cudaFree(scratch_);
    if (blas_)
      cublas().destroy(blas_);
    if (stream_)
      cudaStreamDestroy(stream_);
    if (copyStream_)
      cudaStreamDestroy(copyStream_);
    for (cudaEvent_t ev : {computeMark_, copyMark_})
      if (ev)
        cudaEventDestroy(ev);
  }

  std::string_view name() const override { return "cuda"; }

  void *allocate(size_t bytes) override {
    void *p = nullptr;
    cudaSetDevice(device_);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
      return nullptr;
    return p;
  }
  // The CUDA runtime's current device is per host thread, and each stage
  // executor runs on a thread of its own: every entry point selects this
  // backend's device first (a cheap call), so stage s works on GPU s
  // whichever thread calls.
  void release(void *ptr) override {
    cudaSetDevice(device_);
    if (ptr)
      cudaFree(ptr);
  }
  // Copies wait for the stream, so a kernel that failed while running (an
  // error CUDA reports only at a synchronization) is seen here; the copy
  // interface returns nothing, so the error is kept and the next kernel
  // call returns it.
  void copyToDevice(void *dst, const void *src, size_t bytes) override {
    cudaSetDevice(device_);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
    noteError("a copy to the device", cudaStreamSynchronize(stream_));
  }
  void copyToHost(void *dst, const void *src, size_t bytes) override {
    cudaSetDevice(device_);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_);
    noteError("a copy to the host", cudaStreamSynchronize(stream_));
  }

  bool supports(ir::OpKind op, ir::DType dtype) const override {
    return cuda::lowers(op, dtype);
  }

  // Activation offload: pinned host frames, copies on the copy stream. A
  // copy starts after the compute work issued before it (computeMark_);
  // waitForCopies makes the compute stream wait for every copy started.
  bool offloads() const override { return true; }
  void *allocateHost(size_t bytes) override {
    cudaSetDevice(device_);
    void *p = nullptr;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) !=
        cudaSuccess)
      return nullptr;
    return p;
  }
  void releaseHost(void *ptr) override {
    if (ptr)
      cudaFreeHost(ptr);
  }
  void offload(void *host, const void *device, size_t bytes) override {
    copyAfterCompute(host, device, bytes, cudaMemcpyDeviceToHost);
  }
  void fetch(void *device, const void *host, size_t bytes) override {
    copyAfterCompute(device, host, bytes, cudaMemcpyHostToDevice);
  }
  void waitForCopies() override {
    cudaSetDevice(device_);
    noteError("an offload copy's event", cudaEventRecord(copyMark_, copyStream_));
    noteError("a wait for offload copies",
              cudaStreamWaitEvent(stream_, copyMark_, 0));
  }

  llvm::Error run(const KernelCall &call) override {
    cudaSetDevice(device_);
    if (!pending_.empty())
      return fail(call, "an earlier " + pending_);
    auto steps = cuda::lowerCall(call, [this](size_t bytes) {
      return scratch(bytes);
    });
    if (!steps)
      return steps.takeError();
    for (const cuda::DeviceStep &step : *steps)
      if (auto e = launch(call, step))
        return e;
    return llvm::Error::success();
  }

private:
  explicit CudaBackend(int device) : device_(device) {}

  static llvm::Error fail(const KernelCall &call, const llvm::Twine &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   std::string(call.info().name) + " (cuda): " +
                                       why);
  }

  // Scratch for a call's steps: one device buffer, grown (never shrunk)
  // when a call needs more; after the first step of training it stays.
  void *scratch(size_t bytes) {
    if (bytes > scratchBytes_) {
      if (scratch_) {
        cudaStreamSynchronize(stream_);
        cudaFree(scratch_);
        scratch_ = nullptr;
        scratchBytes_ = 0;
      }
      if (cudaMalloc(&scratch_, bytes) == cudaSuccess)
        scratchBytes_ = bytes;
    }
    return scratch_;
  }

  llvm::Error launch(const KernelCall &call, const cuda::DeviceStep &step) {
    int err = 0;
    if (auto *m = std::get_if<cuda::MapArgs>(&step))
      err = cuda::launchMap(*m, stream_);
    else if (auto *g = std::get_if<cuda::GemmStep>(&step))
      return gemm(call, *g);
    else if (auto *r = std::get_if<cuda::ReduceStep>(&step))
      err = cuda::launchReduce(*r, stream_);
    else if (auto *row = std::get_if<cuda::RowStep>(&step))
      err = row->stats && !scratch_ ? int(cudaErrorMemoryAllocation)
                                    : cuda::launchRows(*row, stream_);
    else if (auto *c = std::get_if<cuda::ColumnStep>(&step))
      err = cuda::launchColumns(*c, stream_);
    else if (auto *l = std::get_if<cuda::LossStep>(&step))
      err = cuda::launchLoss(*l, stream_);
    else if (auto *ga = std::get_if<cuda::GatherStep>(&step))
      err = cuda::launchGather(*ga, stream_);
    else if (auto *o = std::get_if<cuda::OptimizerStep>(&step))
      err = cuda::launchOptimizer(*o, stream_);
    else if (auto *pad = std::get_if<cuda::PadStep>(&step))
      err = cuda::launchPad(*pad, stream_);
    else if (auto *cols = std::get_if<cuda::Im2colStep>(&step))
      err = cuda::launchIm2col(*cols, stream_);
    else if (auto *pool = std::get_if<cuda::PoolStep>(&step))
      err = cuda::launchPool(*pool, stream_);
    else if (auto *ch = std::get_if<cuda::ChannelStep>(&step))
      err = cuda::launchChannels(*ch, stream_);
    else if (auto *cm = std::get_if<cuda::ChannelMapStep>(&step))
      err = cuda::launchChannelMap(*cm, stream_);
    if (err)
      return fail(call, cudaGetErrorString(cudaError_t(err)));
    return llvm::Error::success();
  }

  // A row-major GEMM step through cuBLAS's column-major GemmEx (the
  // argument swap is cublasArgs, tested on the host): f32 or bf16 operands,
  // f32 sums.
  llvm::Error gemm(const KernelCall &call, const cuda::GemmStep &s) {
    if (s.m == 0 || s.n == 0)
      return llvm::Error::success();
    cuda::CublasGemm g = cuda::cublasArgs(s);
    auto type = [](cuda::Elem e) {
      return e == cuda::Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    };
    cublasStatus_t st = cublas().gemmStridedBatchedEx(
        blas_, g.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
        g.transb ? CUBLAS_OP_T : CUBLAS_OP_N, int(g.m), int(g.n), int(g.k),
        &s.alpha, g.A, type(s.ab), int(g.lda), g.strideA, g.B, type(s.ab),
        int(g.ldb), g.strideB, &s.beta, s.C, type(s.c), int(g.ldc), g.strideC,
        int(s.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      return fail(call, llvm::formatv("cuBLAS status {0}", int(st)).str());
    return llvm::Error::success();
  }

  void copyAfterCompute(void *dst, const void *src, size_t bytes,
                        cudaMemcpyKind kind) {
    cudaSetDevice(device_);
    noteError("an offload copy's event", cudaEventRecord(computeMark_, stream_));
    noteError("an offload copy's wait",
              cudaStreamWaitEvent(copyStream_, computeMark_, 0));
    noteError("an offload copy",
              cudaMemcpyAsync(dst, src, bytes, kind, copyStream_));
  }

  void noteError(const char *what, cudaError_t e) {
    if (e != cudaSuccess && pending_.empty())
      pending_ = std::string(what) + " failed: " + cudaGetErrorString(e);
  }

  int device_;
  std::string pending_; // a failure seen where it could not be returned
  cudaStream_t stream_ = nullptr;
  cudaStream_t copyStream_ = nullptr;
  cudaEvent_t computeMark_ = nullptr, copyMark_ = nullptr;
  void *scratch_ = nullptr;
  size_t scratchBytes_ = 0;
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
