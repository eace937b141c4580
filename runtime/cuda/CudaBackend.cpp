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
#include "runtime/cuda/CudnnConv.h"
#include "runtime/cuda/Lowering.h"
#include "runtime/cuda/RuntimeLibrary.h"

#include "llvm/Support/FormatVariadic.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

namespace cleave::runtime {
namespace {

// The cuBLAS entry points the backend uses, from libcublas.so.13.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) setStream = nullptr;
  // Optional (graphs): a workspace of the caller's, so that no product
  // allocates during a capture.
  decltype(&cublasSetWorkspace_v2) setWorkspace = nullptr;
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
    cuda::RuntimeLibrary l({"libcublas.so.13"}, "cuBLAS");
    l.bind(c.create, "cublasCreate_v2");
    l.bind(c.destroy, "cublasDestroy_v2");
    l.bind(c.setStream, "cublasSetStream_v2");
    l.bind(c.gemmStridedBatchedEx, "cublasGemmStridedBatchedEx");
    c.error = l.error;
    c.setWorkspace = reinterpret_cast<decltype(c.setWorkspace)>(
        l.find("cublasSetWorkspace_v2"));
    return c;
  }();
  return lib;
}

// The cuBLASLt entry points the backend uses, from libcublasLt.so.13: a
// Gemm with a bias vector as one product with the bias epilogue.
struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) descCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) descDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) descSet = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layoutDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) prefCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) prefDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) prefSet = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  std::string error;
};

const CublasLt &cublasLt() {
  static const CublasLt lib = [] {
    CublasLt c;
    cuda::RuntimeLibrary l({"libcublasLt.so.13"}, "cuBLASLt");
    l.bind(c.create, "cublasLtCreate");
    l.bind(c.destroy, "cublasLtDestroy");
    l.bind(c.descCreate, "cublasLtMatmulDescCreate");
    l.bind(c.descDestroy, "cublasLtMatmulDescDestroy");
    l.bind(c.descSet, "cublasLtMatmulDescSetAttribute");
    l.bind(c.layoutCreate, "cublasLtMatrixLayoutCreate");
    l.bind(c.layoutDestroy, "cublasLtMatrixLayoutDestroy");
    l.bind(c.prefCreate, "cublasLtMatmulPreferenceCreate");
    l.bind(c.prefDestroy, "cublasLtMatmulPreferenceDestroy");
    l.bind(c.prefSet, "cublasLtMatmulPreferenceSetAttribute");
    l.bind(c.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    l.bind(c.matmul, "cublasLtMatmul");
    c.error = l.error;
    return c;
  }();
  return lib;
}

// The cuDNN entry points the backend uses, from libcudnn.so.9 (the legacy
// convolution API, deprecated in cuDNN 9 in favour of the graph API but
// present; its fixed algorithms are what keeps the bits deterministic).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
struct Cudnn {
  decltype(&cudnnCreate) create = nullptr;
  decltype(&cudnnDestroy) destroy = nullptr;
  decltype(&cudnnSetStream) setStream = nullptr;
  decltype(&cudnnGetErrorString) errorString = nullptr;
  decltype(&cudnnCreateTensorDescriptor) createTensor = nullptr;
  decltype(&cudnnSetTensorNdDescriptorEx) setTensor = nullptr;
  decltype(&cudnnDestroyTensorDescriptor) destroyTensor = nullptr;
  decltype(&cudnnCreateFilterDescriptor) createFilter = nullptr;
  decltype(&cudnnSetFilterNdDescriptor) setFilter = nullptr;
  decltype(&cudnnDestroyFilterDescriptor) destroyFilter = nullptr;
  decltype(&cudnnCreateConvolutionDescriptor) createConv = nullptr;
  decltype(&cudnnSetConvolutionNdDescriptor) setConv = nullptr;
  decltype(&cudnnSetConvolutionGroupCount) setGroups = nullptr;
  decltype(&cudnnSetConvolutionMathType) setMath = nullptr;
  decltype(&cudnnDestroyConvolutionDescriptor) destroyConv = nullptr;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) fwdWorkspace = nullptr;
  decltype(&cudnnConvolutionForward) forward = nullptr;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize) dataWorkspace =
      nullptr;
  decltype(&cudnnConvolutionBackwardData) backwardData = nullptr;
  decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize) filterWorkspace =
      nullptr;
  decltype(&cudnnConvolutionBackwardFilter) backwardFilter = nullptr;
  decltype(&cudnnAddTensor) addTensor = nullptr;
  std::string error; // why it could not be loaded
};
#pragma GCC diagnostic pop

const Cudnn &cudnn() {
  static const Cudnn lib = [] {
    Cudnn c;
    cuda::RuntimeLibrary l({"libcudnn.so.9"}, "cuDNN");
    l.bind(c.create, "cudnnCreate");
    l.bind(c.destroy, "cudnnDestroy");
    l.bind(c.setStream, "cudnnSetStream");
    l.bind(c.errorString, "cudnnGetErrorString");
    l.bind(c.createTensor, "cudnnCreateTensorDescriptor");
    l.bind(c.setTensor, "cudnnSetTensorNdDescriptorEx");
    l.bind(c.destroyTensor, "cudnnDestroyTensorDescriptor");
    l.bind(c.createFilter, "cudnnCreateFilterDescriptor");
    l.bind(c.setFilter, "cudnnSetFilterNdDescriptor");
    l.bind(c.destroyFilter, "cudnnDestroyFilterDescriptor");
    l.bind(c.createConv, "cudnnCreateConvolutionDescriptor");
    l.bind(c.setConv, "cudnnSetConvolutionNdDescriptor");
    l.bind(c.setGroups, "cudnnSetConvolutionGroupCount");
    l.bind(c.setMath, "cudnnSetConvolutionMathType");
    l.bind(c.destroyConv, "cudnnDestroyConvolutionDescriptor");
    l.bind(c.fwdWorkspace, "cudnnGetConvolutionForwardWorkspaceSize");
    l.bind(c.forward, "cudnnConvolutionForward");
    l.bind(c.dataWorkspace, "cudnnGetConvolutionBackwardDataWorkspaceSize");
    l.bind(c.backwardData, "cudnnConvolutionBackwardData");
    l.bind(c.filterWorkspace, "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    l.bind(c.backwardFilter, "cudnnConvolutionBackwardFilter");
    l.bind(c.addTensor, "cudnnAddTensor");
    c.error = l.error;
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
    // A Gemm with a bias vector through cuBLASLt's bias epilogue unless
    // CLEAVE_CUBLASLT=0; without it, the bias copy and a GEMM onto it.
    const char *lt = std::getenv("CLEAVE_CUBLASLT");
    if (!(lt && std::string(lt) == "0")) {
      const CublasLt &l = cublasLt();
      if (!l.error.empty() || l.create(&b->lt_) != CUBLAS_STATUS_SUCCESS)
        b->lt_ = nullptr;
    }
    // Convolutions through cuDNN where it takes them (CudnnConv.h) unless
    // CLEAVE_CUDNN=0; without cuDNN they stay im2col and GEMMs.
    const char *env = std::getenv("CLEAVE_CUDNN");
    if (!(env && std::string(env) == "0")) {
      const Cudnn &dnn = cudnn();
      if (dnn.error.empty() && dnn.create(&b->dnn_) == CUDNN_STATUS_SUCCESS)
        dnn.setStream(b->dnn_, b->stream_);
      else
        b->dnn_ = nullptr;
    }
    return std::unique_ptr<Backend>(std::move(b));
  }

  ~CudaBackend() override {
    printStepProfile();
    dropGraphs();
    if (blasWorkspace_)
      cudaFree(blasWorkspace_);
    if (scratch_)
      cudaFree(scratch_);
    if (nonFiniteFlag_)
      cudaFree(nonFiniteFlag_);
    if (blas_)
      cublas().destroy(blas_);
    if (dnn_)
      cudnn().destroy(dnn_);
    if (lt_)
      cublasLt().destroy(lt_);
    if (stream_)
      cudaStreamDestroy(stream_);
    if (copyStream_)
      cudaStreamDestroy(copyStream_);
    for (cudaEvent_t ev : {computeMark_, copyMark_})
      if (ev)
        cudaEventDestroy(ev);
    for (auto &b : parcels_) {
      cudaFree(b->data);
      cudaEventDestroy(b->ready);
      if (b->done)
        cudaEventDestroy(b->done);
    }
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
  void *stream() override { return stream_; }

  // Parcels between stages of this process (runtime/comm/ParcelComm.h):
  // device buffers of this backend's, each with the event its copy-in
  // records, and, once handed back, the receiver's event after its
  // copy-out, which the next copy-in waits for on this stream. Nothing
  // here waits on the host.
  // Graphs (--cuda-graphs): stream capture of the calls between
  // beginGraph and endGraph on this thread (cudaStreamCaptureModeThreadLocal:
  // the other stages' threads may allocate meanwhile), instantiated and
  // kept by id. A capture that meets a call it cannot record (a host
  // synchronisation, the scratch growing) is dropped, and the executor
  // runs the calls as usual; when the scratch memory moves, every graph
  // holding the old one is dropped (launchGraph says false).
  // Gemm + tanh Gelu as one cuBLASLt call where it takes them, else the
  // two ops' steps in a row (run).
  bool fusesGemmGelu() const override { return true; }

  bool graphs() const override { return true; }
  void beginGraph() override {
    cudaSetDevice(device_);
    if (!blasWorkspace_ && cublas().setWorkspace) {
      // cuBLAS's own workspace, set before any capture so that no product
      // allocates inside one.
      if (cudaMalloc(&blasWorkspace_, kBlasWorkspace) == cudaSuccess)
        cublas().setWorkspace(blas_, blasWorkspace_, kBlasWorkspace);
      else
        blasWorkspace_ = nullptr;
    }
    capturing_ = cudaStreamBeginCapture(stream_,
                                        cudaStreamCaptureModeThreadLocal) ==
                 cudaSuccess;
    captureSpoiled_ = !capturing_;
  }
  bool endGraph(uint64_t id) override {
    cudaSetDevice(device_);
    if (!capturing_) {
      cudaGetLastError();
      return false;
    }
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (!e && graph && !captureSpoiled_)
      e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph)
      cudaGraphDestroy(graph);
    if (e || !exec || captureSpoiled_) {
      if (exec)
        cudaGraphExecDestroy(exec);
      cudaGetLastError(); // the failed capture's error is not the run's
      return false;
    }
    graphs_[id] = exec;
    return true;
  }
  llvm::Expected<bool> launchGraph(uint64_t id) override {
    auto it = graphs_.find(id);
    if (it == graphs_.end())
      return false;
    cudaSetDevice(device_);
    if (cudaError_t e = cudaGraphLaunch(it->second, stream_))
      return cudaFail("cudaGraphLaunch", e);
    return true;
  }
  void dropGraphs() {
    for (auto &[id, exec] : graphs_)
      cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  bool parcels() const override { return true; }
  llvm::Expected<Parcel> pack(const void *src, size_t bytes) override {
    cudaSetDevice(device_);
    ParcelBuffer *b = nullptr;
    {
      std::lock_guard<std::mutex> lock(parcelMutex_);
      for (auto it = freeParcels_.begin(); it != freeParcels_.end(); ++it)
        if ((*it)->size >= bytes && (*it)->size <= 2 * bytes + 4096) {
          b = *it;
          freeParcels_.erase(it);
          break;
        }
    }
    if (!b) {
      auto fresh = std::make_unique<ParcelBuffer>();
      fresh->size = bytes ? bytes : 1;
      if (cudaError_t e = cudaMalloc(&fresh->data, fresh->size))
        return cudaFail(llvm::formatv("cannot allocate {0} bytes for a "
                                      "message",
                                      bytes),
                        e);
      if (cudaError_t e = cudaEventCreateWithFlags(&fresh->ready,
                                                   cudaEventDisableTiming)) {
        cudaFree(fresh->data);
        return cudaFail("cudaEventCreate (a message)", e);
      }
      b = fresh.get();
      std::lock_guard<std::mutex> lock(parcelMutex_);
      parcels_.push_back(std::move(fresh));
    }
    cudaError_t e = cudaSuccess;
    if (b->done) { // its last reader's copy
      e = cudaStreamWaitEvent(stream_, b->done, 0);
      cudaEventDestroy(b->done);
      b->done = nullptr;
    }
    if (!e)
      e = cudaMemcpyAsync(b->data, src, bytes, cudaMemcpyDeviceToDevice,
                          stream_);
    if (!e)
      e = cudaEventRecord(b->ready, stream_);
    if (e) {
      takeBack(b, nullptr);
      return cudaFail("packing a message", e);
    }
    return Parcel{this, b->data, bytes, b};
  }
  llvm::Error unpack(void *dst, const Parcel &p) override {
    cudaSetDevice(device_);
    // The owner is a CUDA backend of this process (the run's stages share
    // --device); its buffer may be on another GPU (a copy between GPUs).
    auto *b = static_cast<ParcelBuffer *>(p.token);
    cudaEvent_t done = nullptr;
    cudaError_t e = cudaStreamWaitEvent(stream_, b->ready, 0);
    if (!e)
      e = cudaMemcpyAsync(dst, p.data, p.bytes, cudaMemcpyDefault, stream_);
    if (!e)
      e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    if (!e)
      e = cudaEventRecord(done, stream_);
    if (e) {
      if (done)
        cudaEventDestroy(done);
      synchronize(); // nothing of ours reads it any more
      p.owner->takeBack(p.token, nullptr);
      return cudaFail("unpacking a message", e);
    }
    p.owner->takeBack(p.token, done);
    return llvm::Error::success();
  }
  void takeBack(void *token, void *done) override {
    auto *b = static_cast<ParcelBuffer *>(token);
    std::lock_guard<std::mutex> lock(parcelMutex_);
    b->done = static_cast<cudaEvent_t>(done);
    freeParcels_.push_back(b);
  }
  void synchronize() override {
    cudaSetDevice(device_);
    noteError("the stage's stream", cudaStreamSynchronize(stream_));
  }
  // The step's non-finite check on the GPU: one kernel sets a flag if any
  // element's exponent is all ones, and four bytes come back (the base
  // class's copy of every gradient to the host took 400 ms of a GPT-2-small
  // step on the H200). f32 and f64, as the base class; on a failed launch,
  // the base class's host check.
  bool allFinite(ir::DType dtype, const void *data, int64_t count) override {
    return allBuffersFinite({FiniteCheck{dtype, data, count}});
  }

  // A step's gradients: every buffer's kernel into the one flag, then one
  // copy back and one synchronization (not one per gradient).
  bool allBuffersFinite(llvm::ArrayRef<FiniteCheck> buffers) override {
    auto onHost = [&] { // the base class's copies (not this class's calls)
      for (const FiniteCheck &b : buffers)
        if (!Backend::allFinite(b.dtype, b.data, b.count))
          return false;
      return true;
    };
    cudaSetDevice(device_);
    if (!nonFiniteFlag_ &&
        cudaMalloc(&nonFiniteFlag_, sizeof(int)) != cudaSuccess) {
      nonFiniteFlag_ = nullptr;
      return onHost();
    }
    int *flag = static_cast<int *>(nonFiniteFlag_);
    if (cudaMemsetAsync(flag, 0, sizeof(int), stream_) != cudaSuccess)
      return onHost();
    for (const FiniteCheck &b : buffers) {
      bool f64 = b.dtype == ir::DType::F64;
      if ((!f64 && b.dtype != ir::DType::F32) || b.count == 0)
        continue;
      if (cuda::launchNonFinite(b.data, b.count, f64, flag, stream_) != 0)
        return onHost();
    }
    int found = 0;
    cudaMemcpyAsync(&found, flag, sizeof(int), cudaMemcpyDeviceToHost,
                    stream_);
    noteError("the non-finite check", cudaStreamSynchronize(stream_));
    return found == 0;
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
    // ConvTranspose is ConvGradData's arithmetic as a forward op.
    if (call.op == ir::OpKind::ConvTranspose)
      return run(KernelCall{ir::OpKind::ConvGradData, call.attrs, call.inputs,
                            call.outputs, call.seed});
    cudaSetDevice(device_);
    if (!pending_.empty())
      return fail(call, "an earlier " + pending_);
    if (dnn_ && (call.op == ir::OpKind::Conv ||
                 call.op == ir::OpKind::ConvGradData ||
                 call.op == ir::OpKind::ConvGradFilter)) {
      auto shape = cuda::cudnnConvShape(call);
      if (shape)
        return timed(call, "cudnn", [&] { return convolve(call, *shape); });
      llvm::consumeError(shape.takeError()); // im2col and GEMMs below
    }
    auto lower = [this](const KernelCall &c) {
      return cuda::lowerCall(c, [this](size_t bytes) { return scratch(bytes); });
    };
    // Gemm(A, B, C) with C a bias vector lowers to the bias copied into Y
    // and a GEMM onto it (beta 1): one cuBLASLt product with the bias
    // epilogue instead; with the Gelu epilogue (fusesGemmGelu: a second
    // output), GELU_AUX_BIAS, which writes the Gelu into output 1 and the
    // product and bias into output 0 (its aux matrix).
    bool gelu = call.op == ir::OpKind::Gemm && call.outputs.size() == 2 &&
                call.hasAttr(kGeluEpilogueAttr);
    if (lt_ && call.op == ir::OpKind::Gemm && call.inputs.size() == 3 &&
        call.inputs[2].data && call.getFloat("beta") == 1.0f) {
      KernelCall product{call.op, call.attrs, call.inputs,
                         call.outputs.slice(0, 1), call.seed};
      auto steps = lower(product);
      if (!steps)
        return steps.takeError();
      if (steps->size() == 2)
        if (const auto *g = std::get_if<cuda::GemmStep>(&(*steps)[1]))
          if (const TensorRef &c = call.inputs[2];
              g->batch == 1 && g->beta == 1.0f &&
              c.dtype == call.outputs[0].dtype && c.numElements() == g->n &&
              (c.rank() == 1 || (c.rank() == 2 && c.shape[0] == 1))) {
            void *geluOut = gelu ? call.outputs[1].data : nullptr;
            llvm::Error e = timed(call, gelu ? "cublaslt-bias-gelu" : "cublaslt-bias",
                                  [&] { return gemmWithBias(call, *g, c.data, geluOut); });
            if (!e || !gelu)
              return e;
            // cuBLASLt found no GELU_AUX_BIAS algorithm for this product:
            // the steps below.
            llvm::consumeError(std::move(e));
          }
    }
    auto steps = lower(call);
    if (!steps)
      return steps.takeError();
    for (const cuda::DeviceStep &step : *steps)
      if (auto e = timed(call, stepName(step),
                         [&] { return launch(call, step); }))
        return e;
    return llvm::Error::success();
  }

private:
  explicit CudaBackend(int device) : device_(device) {}

  // CLEAVE_CUDA_STEP_PROFILE=1: each device step waited for and timed, by
  // op and step kind, and the table printed to stderr when the backend
  // ends (where a GPU step's time goes; the waits make the run slower).
  template <class F>
  llvm::Error timed(const KernelCall &call, const std::string &what, F &&f) {
    if (!stepProfile_)
      return f();
    cudaStreamSynchronize(stream_);
    auto t0 = std::chrono::steady_clock::now();
    llvm::Error e = f();
    cudaStreamSynchronize(stream_);
    std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
    // The output's type and size: the same op on other shapes (a Cast of
    // a weight and of an activation) are separate rows.
    std::string key = std::string(call.info().name) + " " + what + " " +
                      std::string(ir::dtypeName(call.outputs.empty()
                                                    ? ir::DType::F32
                                                    : call.outputs[0].dtype));
    if (!call.outputs.empty())
      key += " x" + std::to_string(call.outputs[0].numElements());
    auto &[seconds, calls] = stepTimes_[key];
    seconds += took.count();
    ++calls;
    return e;
  }
  static std::string stepName(const cuda::DeviceStep &step) {
    static const char *names[] = {
        "map",     "gemm",      "reduce", "rows",     "columns",
        "loss",    "gather",    "optimizer", "im2col", "pool",
        "channels", "channel-map", "pad", "attention", "attention-grad",
        "index", "resize", "grid-sample"};
    static_assert(std::variant_size_v<cuda::DeviceStep> ==
                  sizeof names / sizeof names[0]);
    std::string n = names[step.index()];
    if (const auto *m = std::get_if<cuda::MapArgs>(&step))
      n += "#" + std::to_string(int(m->op));
    return n;
  }
  void printStepProfile() const {
    if (!stepProfile_ || stepTimes_.empty())
      return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto &[key, t] : stepTimes_) {
      rows.push_back({t.first, key});
      total += t.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "cuda steps of device %d: %.3f s in all\n", device_,
                 total);
    std::fprintf(stderr, "%10s %8s %10s  %s\n", "seconds", "calls",
                 "mean ms", "op, step, output type and elements");
    for (size_t i = 0; i < rows.size() && i < 60; ++i) {
      const auto &t = stepTimes_.at(rows[i].second);
      std::fprintf(stderr, "%10.4f %8lld %10.4f  %s\n", t.first,
                   (long long)t.second, 1e3 * t.first / double(t.second),
                   rows[i].second.c_str());
    }
  }

  static llvm::Error fail(const KernelCall &call, const llvm::Twine &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   std::string(call.info().name) + " (cuda): " +
                                       why);
  }

  // Scratch for a call's steps: one device buffer, grown (never shrunk)
  // when a call needs more; after the first step of training it stays.
  void *scratch(size_t bytes) {
    if (bytes > scratchBytes_ && capturing_) {
      // No synchronisation or free inside a capture: this one is spoiled
      // (its work never runs), and the plain run that follows grows it.
      captureSpoiled_ = true;
      return scratch_;
    }
    if (bytes > scratchBytes_) {
      dropGraphs(); // they hold the old buffer
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
    else if (auto *ix = std::get_if<cuda::IndexStep>(&step))
      err = cuda::launchIndex(*ix, stream_);
    else if (auto *rs = std::get_if<cuda::ResizeStep>(&step))
      err = cuda::launchResize(*rs, stream_);
    else if (auto *gs = std::get_if<cuda::GridSampleStep>(&step))
      err = cuda::launchGridSample(*gs, stream_);
    else if (auto *a = std::get_if<cuda::AttentionStep>(&step))
      err = cuda::launchAttention(*a, stream_);
    else if (auto *ag = std::get_if<cuda::AttentionGradStep>(&step))
      err = ag->delta ? cuda::launchAttentionGrad(*ag, stream_)
                      : int(cudaErrorMemoryAllocation);
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

  // One row-major GEMM step plus a bias over its N columns through
  // cuBLASLt (the column-major swap of cublasArgs: the bias runs along the
  // rows of cuBLAS's D, which is the epilogue's broadcast). No split-K
  // reduction scheme, so the sums are in one fixed order.
  // One cuBLASLt product with the bias epilogue into s.C; with `geluOut`,
  // GELU_AUX_BIAS: the tanh Gelu into geluOut (D) and the product and
  // bias into s.C (the aux matrix, same layout).
  llvm::Error gemmWithBias(const KernelCall &call, const cuda::GemmStep &s,
                           const void *bias, void *geluOut = nullptr) {
    const CublasLt &l = cublasLt();
    cuda::CublasGemm g = cuda::cublasArgs(s);
    cudaDataType ab = s.ab == cuda::Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType cd = s.c == cuda::Elem::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    auto done = [&](cublasStatus_t st, const char *what) -> llvm::Error {
      if (desc) l.descDestroy(desc);
      if (la) l.layoutDestroy(la);
      if (lb) l.layoutDestroy(lb);
      if (ld) l.layoutDestroy(ld);
      if (pref) l.prefDestroy(pref);
      if (st == CUBLAS_STATUS_SUCCESS)
        return llvm::Error::success();
      return fail(call, llvm::formatv("cuBLASLt {0}: status {1}", what,
                                      int(st))
                            .str());
    };
#define CLEAVE_LT(call_, what)                                                 \
  if (cublasStatus_t st = (call_); st != CUBLAS_STATUS_SUCCESS)                \
    return done(st, what);
    cublasOperation_t ta = g.transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi =
        geluOut ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    CLEAVE_LT(l.descCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              "a product descriptor");
    CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
              "transA");
    CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
              "transB");
    CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              "the bias epilogue");
    CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                        sizeof bias),
              "the bias");
    CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &cd,
                        sizeof cd),
              "the bias type");
    if (geluOut) {
      void *aux = s.C;
      int64_t auxLd = g.ldc;
      CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                          &aux, sizeof aux),
                "the Gelu's input");
      CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd,
                          sizeof auxLd),
                "the Gelu input's stride");
      CLEAVE_LT(l.descSet(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                          &cd, sizeof cd),
                "the Gelu input's type");
    }
    void *d = geluOut ? geluOut : s.C;
    CLEAVE_LT(l.layoutCreate(&la, ab, g.transa ? g.k : g.m,
                             g.transa ? g.m : g.k, g.lda),
              "A's layout");
    CLEAVE_LT(l.layoutCreate(&lb, ab, g.transb ? g.n : g.k,
                             g.transb ? g.k : g.n, g.ldb),
              "B's layout");
    CLEAVE_LT(l.layoutCreate(&ld, cd, g.m, g.n, g.ldc), "D's layout");
    CLEAVE_LT(l.prefCreate(&pref), "a preference");
    uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
    CLEAVE_LT(l.prefSet(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                        &scheme, sizeof scheme),
              "no split-K reduction");
    size_t wsBytes = size_t(32) << 20;
    CLEAVE_LT(l.prefSet(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                        &wsBytes, sizeof wsBytes),
              "the workspace limit");
    cublasLtMatmulHeuristicResult_t best{};
    int found = 0;
    CLEAVE_LT(l.heuristic(lt_, desc, la, lb, ld, ld, pref, 1, &best, &found),
              "the algorithm search");
    if (found == 0)
      return done(CUBLAS_STATUS_NOT_SUPPORTED, "the algorithm search");
    void *ws = best.workspaceSize ? scratch(best.workspaceSize) : nullptr;
    if (best.workspaceSize && !ws)
      return done(CUBLAS_STATUS_ALLOC_FAILED, "the workspace");
    float alpha = s.alpha, beta = 0.0f;
    CLEAVE_LT(l.matmul(lt_, desc, &alpha, g.A, la, g.B, lb, &beta, d, ld, d,
                       ld, &best.algo, ws, best.workspaceSize, stream_),
              "the product");
#undef CLEAVE_LT
    return done(CUBLAS_STATUS_SUCCESS, "");
  }

  // A convolution or one of its gradient parts through cuDNN, with the
  // deterministic algorithms (implicit precomputed GEMM forward, algorithm
  // 1 for both gradients), FMA math for f32 (no TF32, as the GEMMs) and
  // tensor cores for bf16, a bias added after the product.
  llvm::Error convolve(const KernelCall &call, const cuda::CudnnConvShape &s) {
    const Cudnn &d = cudnn();
    cudnnDataType_t type = s.bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    int nb = int(s.x.size());
    cudnnTensorDescriptor_t xd = nullptr, yd = nullptr, bd = nullptr;
    cudnnFilterDescriptor_t wd = nullptr;
    cudnnConvolutionDescriptor_t cd = nullptr;
    auto done = [&](cudnnStatus_t st, const char *what) -> llvm::Error {
      if (xd) d.destroyTensor(xd);
      if (yd) d.destroyTensor(yd);
      if (bd) d.destroyTensor(bd);
      if (wd) d.destroyFilter(wd);
      if (cd) d.destroyConv(cd);
      if (st == CUDNN_STATUS_SUCCESS)
        return llvm::Error::success();
      return fail(call, llvm::Twine("cuDNN ") + what + ": " +
                            d.errorString(st));
    };
#define CLEAVE_CUDNN(call_, what)                                              \
  if (cudnnStatus_t st = (call_); st != CUDNN_STATUS_SUCCESS)                  \
    return done(st, what);
    CLEAVE_CUDNN(d.createTensor(&xd), "a tensor descriptor");
    CLEAVE_CUDNN(d.createTensor(&yd), "a tensor descriptor");
    CLEAVE_CUDNN(d.createFilter(&wd), "a filter descriptor");
    CLEAVE_CUDNN(d.createConv(&cd), "a convolution descriptor");
    CLEAVE_CUDNN(d.setTensor(xd, CUDNN_TENSOR_NCHW, type, nb, s.x.data()),
                 "the image's dims");
    CLEAVE_CUDNN(d.setTensor(yd, CUDNN_TENSOR_NCHW, type, nb, s.y.data()),
                 "the output's dims");
    CLEAVE_CUDNN(d.setFilter(wd, type, CUDNN_TENSOR_NCHW, nb, s.w.data()),
                 "the filter's dims");
    CLEAVE_CUDNN(d.setConv(cd, nb - 2, s.pads.data(), s.strides.data(),
                           s.dilations.data(), CUDNN_CROSS_CORRELATION,
                           CUDNN_DATA_FLOAT),
                 "the convolution");
    CLEAVE_CUDNN(d.setGroups(cd, s.groups), "the group count");
    CLEAVE_CUDNN(d.setMath(cd, s.bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
                 "the math type");
    float one = 1.0f, zero = 0.0f;
    size_t bytes = 0;
    if (call.op == ir::OpKind::Conv) {
      auto algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
      CLEAVE_CUDNN(d.fwdWorkspace(dnn_, xd, wd, cd, yd, algo, &bytes),
                   "the forward's workspace");
      void *ws = bytes ? scratch(bytes) : nullptr;
      if (bytes && !ws)
        return done(CUDNN_STATUS_ALLOC_FAILED, "the forward's workspace");
      CLEAVE_CUDNN(d.forward(dnn_, &one, xd, call.inputs[0].data, wd,
                             call.inputs[1].data, cd, algo, ws, bytes, &zero,
                             yd, call.outputs[0].data),
                   "the forward");
      if (s.bias) {
        std::vector<int> bdims(size_t(nb), 1);
        bdims[1] = s.y[1];
        CLEAVE_CUDNN(d.createTensor(&bd), "a tensor descriptor");
        CLEAVE_CUDNN(d.setTensor(bd, CUDNN_TENSOR_NCHW, type, nb, bdims.data()),
                     "the bias's dims");
        CLEAVE_CUDNN(d.addTensor(dnn_, &one, bd, call.inputs[2].data, &one, yd,
                                 call.outputs[0].data),
                     "the bias");
      }
    } else if (call.op == ir::OpKind::ConvGradData) { // dY, W -> dX
      auto algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
      CLEAVE_CUDNN(d.dataWorkspace(dnn_, wd, yd, cd, xd, algo, &bytes),
                   "the data gradient's workspace");
      void *ws = bytes ? scratch(bytes) : nullptr;
      if (bytes && !ws)
        return done(CUDNN_STATUS_ALLOC_FAILED, "the data gradient's workspace");
      CLEAVE_CUDNN(d.backwardData(dnn_, &one, wd, call.inputs[1].data, yd,
                                  call.inputs[0].data, cd, algo, ws, bytes,
                                  &zero, xd, call.outputs[0].data),
                   "the data gradient");
    } else { // X, dY -> dW
      auto algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
      CLEAVE_CUDNN(d.filterWorkspace(dnn_, xd, yd, cd, wd, algo, &bytes),
                   "the filter gradient's workspace");
      void *ws = bytes ? scratch(bytes) : nullptr;
      if (bytes && !ws)
        return done(CUDNN_STATUS_ALLOC_FAILED,
                    "the filter gradient's workspace");
      CLEAVE_CUDNN(d.backwardFilter(dnn_, &one, xd, call.inputs[0].data, yd,
                                    call.inputs[1].data, cd, algo, ws, bytes,
                                    &zero, wd, call.outputs[0].data),
                   "the filter gradient");
    }
#undef CLEAVE_CUDNN
    return done(CUDNN_STATUS_SUCCESS, "");
  }

  void noteError(const char *what, cudaError_t e) {
    if (e != cudaSuccess && pending_.empty())
      pending_ = std::string(what) + " failed: " + cudaGetErrorString(e);
  }

  int device_;
  std::string pending_; // a failure seen where it could not be returned
  bool stepProfile_ = [] {
    const char *v = std::getenv("CLEAVE_CUDA_STEP_PROFILE");
    return v && *v && std::string(v) != "0";
  }();
  std::map<std::string, std::pair<double, int64_t>> stepTimes_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copyStream_ = nullptr;
  cudaEvent_t computeMark_ = nullptr, copyMark_ = nullptr;
  void *scratch_ = nullptr;
  size_t scratchBytes_ = 0;
  void *nonFiniteFlag_ = nullptr; // an int on the device, for allFinite
  cublasHandle_t blas_ = nullptr;
  cudnnHandle_t dnn_ = nullptr; // null: convolutions as im2col and GEMMs
  cublasLtHandle_t lt_ = nullptr; // null: a Gemm's bias as a copy
  bool capturing_ = false, captureSpoiled_ = false;
  std::map<uint64_t, cudaGraphExec_t> graphs_;
  static constexpr size_t kBlasWorkspace = size_t(32) << 20;
  void *blasWorkspace_ = nullptr;
  struct ParcelBuffer {
    void *data = nullptr;
    size_t size = 0;
    cudaEvent_t ready = nullptr; // after the copy in
    cudaEvent_t done = nullptr;  // the receiver's, after the copy out
  };
  std::mutex parcelMutex_; // takeBack comes from the receiving stage's thread
  std::vector<std::unique_ptr<ParcelBuffer>> parcels_;
  std::vector<ParcelBuffer *> freeParcels_;
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
