// The kernel interface every backend implements (CPU now, CUDA later).
//
// A kernel call names an op from the IR's op vocabulary (ir/Ops.def), its
// attributes (with the declared defaults), read-only input tensors and
// output tensors whose buffers the caller has already allocated with their
// final shapes. Kernels never allocate outputs and never see a graph: the
// executor (the reference interpreter today, the Plan executor later) owns
// memory and order. The same contract holds for every backend: buffers are
// dense, row-major, in the backend's memory; f16/bf16 are stored as raw
// 16-bit values.
#pragma once

#include "ir/Attribute.h"
#include "ir/OpInfo.h"
#include "ir/Type.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>

namespace cleave::runtime {

// A dense row-major tensor in a backend's memory. Does not own the data.
struct TensorRef {
  ir::DType dtype = ir::DType::F32;
  llvm::ArrayRef<int64_t> shape;
  void *data = nullptr;

  int64_t numElements() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  size_t rank() const { return shape.size(); }
  template <typename T> T *as() const { return static_cast<T *>(data); }
};

struct KernelCall {
  ir::OpKind op;
  const ir::AttrMap &attrs;
  llvm::ArrayRef<TensorRef> inputs;
  llvm::ArrayRef<TensorRef> outputs;
  // Seed for ops that draw random numbers (Dropout in training mode); the
  // executor derives it from the step, microbatch and op so runs repeat.
  uint64_t seed = 0;

  const ir::OpInfo &info() const { return ir::opInfo(op); }
  // Attribute value or the op's declared default.
  const ir::Attribute &attr(std::string_view name) const;
  bool hasAttr(std::string_view name) const { return attrs.count(name); }
  int64_t getInt(std::string_view n) const { return attr(n).getInt(); }
  float getFloat(std::string_view n) const { return attr(n).getFloat(); }
  // A float attribute for arithmetic on data of type T: on float64 data the
  // decimal the producer wrote (ir::decimalWidened), else the float.
  template <typename T> double getFloatFor(std::string_view n) const {
    float f = getFloat(n);
    return std::is_same_v<T, double> ? ir::decimalWidened(f) : double(f);
  }
  const std::string &getString(std::string_view n) const {
    return attr(n).getString();
  }
  const std::vector<int64_t> &getInts(std::string_view n) const {
    return attr(n).getInts();
  }
};

class Backend {
public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // Memory in the backend's address space, aligned to at least 64 bytes.
  virtual void *allocate(size_t bytes) = 0;
  virtual void release(void *ptr) = 0;
  // Copies between host memory and backend memory (plain memcpy on CPU).
  virtual void copyToDevice(void *dst, const void *src, size_t bytes) = 0;
  virtual void copyToHost(void *dst, const void *src, size_t bytes) = 0;

  // Activation offload (plans with Offload and Fetch, runtime/Plan.h): a
  // backend with a memory of its own copies to host memory and back. A
  // backend whose memory is the host's has nowhere to offload to and
  // refuses such plans (offloads() false, the default).
  virtual bool offloads() const { return false; }
  // Host memory the copies go to (pinned where that speeds them up).
  virtual void *allocateHost(size_t bytes);
  virtual void releaseHost(void *ptr);
  // Start a copy to the host after the work issued so far (offload), or
  // back from it (fetch); copies run in the order started. Work issued
  // after waitForCopies() sees every copy started before it done. By
  // default the copies are copyToHost/copyToDevice, done when they return.
  virtual void offload(void *host, const void *device, size_t bytes) {
    copyToHost(host, device, bytes);
  }
  virtual void fetch(void *device, const void *host, size_t bytes) {
    copyToDevice(device, host, bytes);
  }
  virtual void waitForCopies() {}
  // Returns once the work issued so far has finished (a device backend's
  // stream): what moves its memory by other means (NCCL on a stream of its
  // own) starts after it. Nothing to wait for on the CPU.
  virtual void synchronize() {}
  // The CUDA stream the backend's work runs on (a cudaStream_t), for a
  // transport that orders its own copies against that work (NCCL's
  // channels, runtime/cuda/Nccl.h); null where there is none.
  virtual void *stream() { return nullptr; }

  // Messages between the stages of one process without host copies
  // (runtime/comm/ParcelComm.h). pack copies `bytes` of this backend's
  // memory at `src` into a parcel of its own after the work issued so far,
  // and never waits; unpack copies a parcel (packed by this backend or
  // another of its kind in the process) into `dst` before the work issued
  // after it, and hands the parcel back to its owner (takeBack), which
  // reuses it once `done` (an event of the unpacking backend's; null: at
  // once) has passed. Backends whose memory is the host's read messages in
  // place and have none (parcels() false; pack and unpack fail).
  struct Parcel {
    Backend *owner = nullptr;
    void *data = nullptr;
    size_t bytes = 0;
    void *token = nullptr; // the owner's
  };
  virtual bool parcels() const { return false; }

  // Graphs of kernels (cleave-run --cuda-graphs, the executor's runs of
  // kernel instructions, docs/design/cuda.md): between beginGraph and
  // endGraph, run() records the calls' work instead of doing it; endGraph
  // keeps it as graph `id` and returns true, or keeps nothing and returns
  // false where the backend could not record it all (the executor then
  // runs the calls as usual). launchGraph runs graph `id` after the work
  // issued so far, or returns false where the backend no longer has it (it
  // may drop its graphs, as when its scratch memory moves). graphs()
  // false: no graphs (the default).
  virtual bool graphs() const { return false; }

  // A Gemm with a bias whose result only a tanh Gelu right after it reads
  // first, as one call (cuBLASLt's GELU_AUX_BIAS epilogue): the executor
  // gives the Gemm the Gelu's output as a second output and the attribute
  // kGeluEpilogueAttr, and drops the Gelu (StageExecutor::create). The
  // first output keeps the Gemm's result (the Gelu's gradient reads it).
  virtual bool fusesGemmGelu() const { return false; }
  virtual void beginGraph() {}
  virtual bool endGraph(uint64_t id) {
    (void)id;
    return false;
  }
  virtual llvm::Expected<bool> launchGraph(uint64_t id) {
    (void)id;
    return false;
  }
  virtual llvm::Expected<Parcel> pack(const void *src, size_t bytes);
  virtual llvm::Error unpack(void *dst, const Parcel &parcel);
  virtual void takeBack(void *token, void *done) { (void)token, (void)done; }

  // True if the backend has a kernel for `op` with inputs of `dtype` (the
  // element type of the first input).
  virtual bool supports(ir::OpKind op, ir::DType dtype) const = 0;
  // Runs one kernel. Errors name the op and what is wrong (an index out of
  // range, an unsupported element type); they are bad input, not crashes.
  virtual llvm::Error run(const KernelCall &call) = 0;

  // Whether `count` values of `dtype` in backend memory are all finite
  // (f32 and f64; other types are not checked and count as finite): the
  // non-finite check before each update. By default a copy to the host and
  // allFiniteOnHost; the CPU backend reads in place on its threads.
  virtual bool allFinite(ir::DType dtype, const void *data, int64_t count);
  // One buffer of allBuffersFinite.
  struct FiniteCheck {
    ir::DType dtype;
    const void *data;
    int64_t count;
  };
  // Whether every buffer is all finite, as allFinite on each in turn (the
  // default). The CPU backend reads them all as one range cut over its
  // threads: one fork and join for a step's gradients, not one each (a
  // ResNet-18 step's 62 took 3.3 ms, the same bytes in one pass 2.7).
  virtual bool allBuffersFinite(llvm::ArrayRef<FiniteCheck> buffers);
  // The sum of (x * scale)^2 over `count` f32 or f64 values in backend
  // memory, in double, with one decomposition whatever runs it: per block
  // of kSquaresBlock elements in order, then the blocks' sums in order
  // (--clip-grad-norm). By default a copy to the host and
  // sumOfSquaresOnHost; the CPU backend sums the blocks on its threads.
  virtual double sumOfSquares(ir::DType dtype, const void *data, int64_t count,
                              double scale);
};

// Whether a backend's memory is host memory: messages and inputs are then
// read and written in place, and otherwise staged through host buffers
// (the emulated CUDA backend counts as a device, so that its runs check
// the staging).
inline bool hostMemory(const Backend &b) { return b.name() == "cpu"; }

// The attribute of a Gemm that also applies a tanh Gelu to its result
// into its second output (Backend::fusesGemmGelu).
inline constexpr const char *kGeluEpilogueAttr = "gelu_epilogue";

inline constexpr int64_t kSquaresBlock = 4096;
// One block's (or any range's) sum of (x * scale)^2, in order.
double blockSumOfSquares(ir::DType dtype, const void *data, int64_t count,
                         double scale);
// Backend::sumOfSquares on host memory, on the calling thread.
double sumOfSquaresOnHost(ir::DType dtype, const void *data, int64_t count,
                          double scale);

// The same on host memory, on the calling thread: the largest magnitude's
// bits below the exponent's all-ones pattern, one max over the words
// (vectorized, no branch per element).
bool allFiniteOnHost(ir::DType dtype, const void *data, int64_t count);

// The CPU backend (runtime/cpu): OpenBLAS for GEMM and convolution, a thread pool
// for everything else. `threads` 0 means all cores.
std::unique_ptr<Backend> createCpuBackend(int threads = 0);

} // namespace cleave::runtime
