// The CPU backend: host memory, a dispatch table filled by the kernel files,
// and the thread count shared by the kernels' thread pool and OpenBLAS.
#include "runtime/cpu/CpuKernels.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include "runtime/cpu/Blas.h"
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

void addSplitGradient(KernelTable &t, ir::OpKind combined, GradientPart first,
                      GradientPart second,
                      const std::vector<ir::DType> &dtypes) {
  t.add(first.op, first.fn, dtypes);
  t.add(second.op, second.fn, dtypes);
  t.add(
      combined,
      [first, second](const KernelCall &call) -> llvm::Error {
        auto runPart = [&](const GradientPart &part, size_t output) {
          llvm::SmallVector<TensorRef, 5> inputs;
          for (int i : part.inputs)
            inputs.push_back(call.inputs[i]);
          KernelCall sub{call.op, call.attrs, inputs,
                         call.outputs.slice(output, 1), call.seed};
          return part.fn(sub);
        };
        if (auto e = runPart(first, 0))
          return e;
        return runPart(second, 1);
      },
      dtypes);
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
    registerLinalgKernels(table_);
    registerConvPoolKernels(table_);
    registerNormalizationKernels(table_);
    registerGradientKernels(table_);
    registerLinalgGradientKernels(table_);
    registerNormalizationGradientKernels(table_);
    registerConvPoolGradientKernels(table_);
    registerOptimizerKernels(table_);
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

  bool supports(ir::OpKind op, ir::DType dtype) const override {
    const KernelEntry *e = table_.find(op);
    return e && std::find(e->dtypes.begin(), e->dtypes.end(), dtype) !=
                    e->dtypes.end();
  }

  llvm::Error run(const KernelCall &call) override {
    const KernelEntry *e = table_.find(call.op);
    if (!e)
      return kernelError(call, "no CPU kernel");
    ir::DType dt = call.inputs.empty() ? ir::DType::F32
                                       : call.inputs[0].dtype;
    if (std::find(e->dtypes.begin(), e->dtypes.end(), dt) == e->dtypes.end())
      return kernelError(call, "the CPU kernel does not handle {0} inputs",
                         ir::dtypeName(dt));
    return e->fn(call);
  }

private:
  cpu::KernelTable table_;
};
} // namespace
} // namespace cpu

std::unique_ptr<Backend> createCpuBackend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

} // namespace cleave::runtime
