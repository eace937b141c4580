// The CPU backend: host memory, a dispatch table filled by the kernel files,
// and the thread count shared by the kernels' thread pool and OpenBLAS.
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/ConvOneDnn.h"
#include "runtime/cpu/ThreadPool.h"

#include "llvm/ADT/SmallVector.h"

#include <thread>

namespace cleave::runtime {

const ir::Attribute &KernelCall::attr(std::string_view name) const {
  return ir::attrOrDefault(info(), attrs, name);
}

namespace cpu {

std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    s[i - 1] = s[i] * shape[i];
  return s;
}

// The pool parallelFor uses; one per process, sized by the last backend
// created (all backends in a process share the cores anyway).
static std::unique_ptr<ThreadPool> &pool() {
  static std::unique_ptr<ThreadPool> p;
  return p;
}

void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &f) {
  int threads = pool() ? pool()->size() : 1;
  if (n <= grain || threads <= 1) {
    if (n > 0)
      f(0, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  pool()->run(chunks, [&](int64_t c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    if (b < e)
      f(b, e);
  });
}

void parallelTasks(int64_t n, const std::function<void(int64_t)> &f) {
  if (!pool() || pool()->size() <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i)
      f(i);
    return;
  }
  pool()->run(n, f);
}

void addCombinedGradients(KernelTable &t) {
  for (const ir::OpInfo &info : ir::allOps()) {
    if (!info.split)
      continue;
    const ir::GradientSplit split = *info.split;
    // A combined op with a kernel of its own (BatchNorm's: one pass for
    // both results) keeps it.
    if (t.find(split.combined))
      continue;
    const KernelEntry *parts[2] = {t.find(split.data.kind),
                                   t.find(split.weight.kind)};
    if (!parts[0] || !parts[1])
      continue;
    assert(parts[0]->dtypes == parts[1]->dtypes &&
           "the parts of a combined gradient take different types");
    KernelFn fns[2] = {parts[0]->fn, parts[1]->fn};
    t.add(
        split.combined,
        [split, fns](const KernelCall &call) -> llvm::Error {
          for (unsigned output = 0; output < 2; ++output) {
            llvm::SmallVector<TensorRef, 5> inputs;
            for (unsigned i : split.part(output).operands)
              inputs.push_back(call.inputs[i]);
            KernelCall sub{call.op, call.attrs, inputs,
                           call.outputs.slice(output, 1), call.seed};
            if (auto e = fns[output](sub))
              return e;
          }
          return llvm::Error::success();
        },
        parts[0]->dtypes);
  }
}

namespace {
class CpuBackend : public Backend {
public:
  explicit CpuBackend(int threads) {
    if (threads <= 0)
      threads = std::max(1u, std::thread::hardware_concurrency());
    if (!pool() || pool()->size() != threads)
      pool() = std::make_unique<ThreadPool>(threads);
    blas().setThreads(1); // the pool parallelizes GEMMs (Blas.h)
    registerElementwiseKernels(table_);
    registerReductionKernels(table_);
    registerDataMovementKernels(table_);
    registerScatterElementsKernels(table_);
    registerCumSumKernels(table_);
    registerAttentionKernels(table_);
    registerDftKernels(table_);
    registerResizeKernels(table_);
    registerGridSampleKernels(table_);
    registerTileKernels(table_);
    registerLinalgKernels(table_);
    registerConvPoolKernels(table_);
    registerNormalizationKernels(table_);
    registerGradientKernels(table_);
    registerLinalgGradientKernels(table_);
    registerNormalizationGradientKernels(table_);
    registerConvPoolGradientKernels(table_);
    registerOptimizerKernels(table_);
    addCombinedGradients(table_); // last: it reads the parts' kernels
  }

  std::string_view name() const override { return "cpu"; }

  void *allocate(size_t bytes) override {
    size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    return std::aligned_alloc(64, rounded);
  }
  void release(void *p) override { std::free(p); }
  void copyToDevice(void *dst, const void *src, size_t n) override {
    if (n)
      std::memcpy(dst, src, n);
  }
  void copyToHost(void *dst, const void *src, size_t n) override {
    if (n)
      std::memcpy(dst, src, n);
  }

  // In place, in blocks over the pool (a boolean, so the cut cannot change
  // the answer): allBuffersFinite of the one buffer.
  bool allFinite(ir::DType dtype, const void *data, int64_t count) override {
    return allBuffersFinite({FiniteCheck{dtype, data, count}});
  }

  // The buffers as one range of elements (f32 and f64 ones; the others
  // count as empty), cut in blocks over the pool; a block may span
  // buffers.
  bool allBuffersFinite(llvm::ArrayRef<FiniteCheck> buffers) override {
    std::vector<int64_t> start(buffers.size() + 1, 0);
    for (size_t i = 0; i < buffers.size(); ++i) {
      ir::DType t = buffers[i].dtype;
      bool checked = t == ir::DType::F32 || t == ir::DType::F64;
      start[i + 1] = start[i] + (checked ? buffers[i].count : 0);
    }
    std::atomic<bool> finite{true};
    parallelFor(start.back(), 1 << 16, [&](int64_t b, int64_t e) {
      // The last buffer starting at or before b holds it (empty ones
      // share their start with the next).
      size_t i = size_t(std::upper_bound(start.begin(), start.end() - 1, b) -
                        start.begin()) - 1;
      for (; b < e && i < buffers.size(); ++i) {
        int64_t end = std::min(e, start[i + 1]);
        if (end <= b)
          continue;
        const FiniteCheck &buf = buffers[i];
        const auto *bytes = static_cast<const uint8_t *>(buf.data) +
                            size_t(b - start[i]) * ir::dtypeSize(buf.dtype);
        if (!allFiniteOnHost(buf.dtype, bytes, end - b))
          finite.store(false, std::memory_order_relaxed);
        b = end;
      }
    });
    return finite.load();
  }

  // The blocks' sums on the pool, then added in block order: the bits of
  // sumOfSquaresOnHost for any thread count.
  double sumOfSquares(ir::DType dtype, const void *data, int64_t count,
                      double scale) override {
    size_t width = ir::dtypeSize(dtype);
    int64_t blocks = (count + kSquaresBlock - 1) / kSquaresBlock;
    std::vector<double> partial(static_cast<size_t>(blocks));
    const auto *bytes = static_cast<const uint8_t *>(data);
    parallelFor(blocks, 16, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k)
        partial[size_t(k)] = blockSumOfSquares(
            dtype, bytes + size_t(k * kSquaresBlock) * width,
            std::min(kSquaresBlock, count - k * kSquaresBlock), scale);
    });
    double total = 0;
    for (double p : partial)
      total += p;
    return total;
  }

  bool supports(ir::OpKind op, ir::DType dtype) const override {
    const KernelEntry *e = table_.find(op);
    return e && (handles(*e, dtype) || widens(*e, dtype));
  }

  llvm::Error run(const KernelCall &call) override {
    const KernelEntry *e = table_.find(call.op);
    if (!e)
      return kernelError(call, "no CPU kernel");
    ir::DType dt = call.inputs.empty() ? ir::DType::F32
                                       : call.inputs[0].dtype;
    if (handles(*e, dt))
      return e->fn(call);
    if (widens(*e, dt))
      return runWidened(*e, call);
    return kernelError(call, "the CPU kernel does not handle {0} inputs",
                       ir::dtypeName(dt));
  }

private:
  static bool handles(const KernelEntry &e, ir::DType dt) {
    return std::find(e.dtypes.begin(), e.dtypes.end(), dt) != e.dtypes.end();
  }
  // 16-bit floats reach f32-only kernels widened (runWidened).
  static bool widens(const KernelEntry &e, ir::DType dt) {
    return (dt == ir::DType::BF16 || dt == ir::DType::F16) &&
           handles(e, ir::DType::F32);
  }

  // Runs an f32 kernel on a call with f16/bf16 tensors: those inputs are
  // widened into f32 scratch (exactly), the kernel computes in f32, and its
  // 16-bit outputs are rounded back to nearest even. The products of
  // `--precision bf16` run this way on the CPU: bf16 operands, f32
  // arithmetic, a bf16 result, as a GPU's tensor cores do.
  static llvm::Error runWidened(const KernelEntry &e, const KernelCall &call) {
    // Scratch kept per thread (each stage's executor has its own) and
    // reused, so the steady state allocates nothing.
    thread_local std::vector<std::vector<float>> scratch;
    size_t n = call.inputs.size() + call.outputs.size();
    if (scratch.size() < n)
      scratch.resize(n);
    auto narrow = [](ir::DType t) {
      return t == ir::DType::BF16 || t == ir::DType::F16;
    };
    auto widen = [&](const TensorRef &t, size_t slot, bool load) {
      if (!narrow(t.dtype))
        return t;
      std::vector<float> &buf = scratch[slot];
      int64_t count = t.numElements();
      if (buf.size() < size_t(count))
        buf.resize(count);
      if (load) {
        const uint16_t *src = t.as<uint16_t>();
        float *dst = buf.data();
        bool bf = t.dtype == ir::DType::BF16;
        parallelFor(count, 1 << 14, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i)
            dst[i] = bf ? ir::bf16ToFloat(src[i]) : ir::halfToFloat(src[i]);
        });
      }
      return TensorRef{ir::DType::F32, t.shape, buf.data()};
    };
    llvm::SmallVector<TensorRef, 6> inputs, outputs;
    for (size_t i = 0; i < call.inputs.size(); ++i)
      inputs.push_back(widen(call.inputs[i], i, /*load=*/true));
    for (size_t i = 0; i < call.outputs.size(); ++i)
      outputs.push_back(
          widen(call.outputs[i], call.inputs.size() + i, /*load=*/false));
    KernelCall wide{call.op, call.attrs, inputs, outputs, call.seed};
    if (auto err = e.fn(wide))
      return err;
    for (size_t i = 0; i < call.outputs.size(); ++i) {
      const TensorRef &t = call.outputs[i];
      if (!narrow(t.dtype))
        continue;
      const float *src = outputs[i].as<float>();
      uint16_t *dst = t.as<uint16_t>();
      bool bf = t.dtype == ir::DType::BF16;
      parallelFor(t.numElements(), 1 << 14, [&](int64_t b, int64_t e) {
        for (int64_t j = b; j < e; ++j)
          dst[j] = bf ? ir::floatToBf16(src[j]) : ir::floatToHalf(src[j]);
      });
    }
    return llvm::Error::success();
  }

  cpu::KernelTable table_;
};
} // namespace
} // namespace cpu

std::unique_ptr<Backend> createCpuBackend(int threads) {
  // CLEAVE_GEMM and CLEAVE_CONV are read (and a bad value refused) before
  // any work starts, not at a step's first product or convolution.
  cpu::defaultGemmLibrary();
  cpu::defaultConvLibrary();
  return std::make_unique<cpu::CpuBackend>(threads);
}

} // namespace cleave::runtime
