// Internal to the CPU backend: the kernel function type, the dispatch table
// each kernel file fills in, and helpers shared by the kernels.
//
// Each family of kernels lives in its own file and registers itself through
// one `register...Kernels` function called by CpuBackend.cpp. A kernel gets
// the call (inputs, outputs, attributes) and returns an llvm::Error for bad
// data (an index out of range); shapes were checked by the IR verifier.
#pragma once

#include "runtime/Kernel.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstring>
#include <functional>
#include <map>
#include <vector>

namespace cleave::runtime::cpu {

using KernelFn = llvm::Error (*)(const KernelCall &call);

struct KernelEntry {
  KernelFn fn = nullptr;
  // Element types (of input 0) the kernel handles.
  std::vector<ir::DType> dtypes;
};

class KernelTable {
public:
  void add(ir::OpKind op, KernelFn fn, std::vector<ir::DType> dtypes) {
    entries_[size_t(op)] = KernelEntry{fn, std::move(dtypes)};
  }
  const KernelEntry *find(ir::OpKind op) const {
    auto it = entries_.find(size_t(op));
    return it == entries_.end() ? nullptr : &it->second;
  }

private:
  std::map<size_t, KernelEntry> entries_;
};

// One per kernel file.
void registerElementwiseKernels(KernelTable &t);
void registerReductionKernels(KernelTable &t);
void registerDataMovementKernels(KernelTable &t);
void registerLinalgKernels(KernelTable &t);
void registerConvPoolKernels(KernelTable &t);
void registerNormalizationKernels(KernelTable &t);
// Gradient and optimizer kernels (Gradients*.cpp, Optimizers.cpp).
void registerGradientKernels(KernelTable &t);
void registerLinalgGradientKernels(KernelTable &t);
void registerNormalizationGradientKernels(KernelTable &t);
void registerConvPoolGradientKernels(KernelTable &t);
void registerOptimizerKernels(KernelTable &t);

// Raw 16-bit float storage; the math on them runs in f32.
struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

// How an element of storage type T is loaded into the type its math runs
// in (Compute), and stored back.
template <typename T> struct Elem {
  using Compute = T;
  static T load(T v) { return v; }
  static T store(T v) { return v; }
};
template <> struct Elem<Half> {
  using Compute = float;
  static float load(Half h) { return ir::halfToFloat(h.bits); }
  static Half store(float f) { return Half{ir::floatToHalf(f)}; }
};
template <> struct Elem<BFloat> {
  using Compute = float;
  static float load(BFloat h) { return ir::bf16ToFloat(h.bits); }
  static BFloat store(float f) { return BFloat{ir::floatToBf16(f)}; }
};

// Type lists for registration.
inline const std::vector<ir::DType> kFloatTypes = {ir::DType::F32,
                                                   ir::DType::F64};
inline const std::vector<ir::DType> kAllTypes = {
    ir::DType::F32, ir::DType::F64, ir::DType::F16, ir::DType::BF16,
    ir::DType::I64, ir::DType::I32, ir::DType::I8,  ir::DType::Bool};
inline const std::vector<ir::DType> kNumericTypes = {
    ir::DType::F32, ir::DType::F64, ir::DType::I64, ir::DType::I32,
    ir::DType::I8};

template <typename... Ts>
llvm::Error kernelError(const KernelCall &call, const char *fmt,
                        Ts &&...vals) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      std::string(call.info().name) + ": " +
          llvm::formatv(fmt, std::forward<Ts>(vals)...).str());
}

// Defines `kernel`, which runs the template `fn` on f32 or f64 inputs (for
// kernel families registered with kFloatTypes only).
#define CLEAVE_FLOAT_DISPATCH(kernel, fn)                                      \
  llvm::Error kernel(const KernelCall &call) {                                 \
    return call.inputs[0].dtype == ir::DType::F64 ? fn<double>(call)           \
                                                  : fn<float>(call);           \
  }

// Row-major strides of a shape.
std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape);

// Runs f(begin, end) over [0, n) split across the backend's threads when n
// is large enough to pay for it (ThreadPool.h underneath).
void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &f);

// Calls `f` with a value of the C++ type matching `dtype` (float, double,
// int64_t, int32_t, int8_t, bool); f16/bf16 are not dispatched here.
template <typename F> auto dispatchType(ir::DType dtype, F &&f) {
  switch (dtype) {
  case ir::DType::F64:
    return f(double{});
  case ir::DType::I64:
    return f(int64_t{});
  case ir::DType::I32:
    return f(int32_t{});
  case ir::DType::I8:
    return f(int8_t{});
  case ir::DType::Bool:
    return f(bool{});
  default:
    return f(float{});
  }
}

} // namespace cleave::runtime::cpu
