// Internal to the CPU backend: the kernel function type, the dispatch table
// each kernel file fills in, and helpers shared by the kernels.
//
// Each family of kernels lives in its own file and registers itself through
// one `register...Kernels` function called by CpuBackend.cpp. A kernel gets
// the call (inputs, outputs, attributes) and returns an llvm::Error for bad
// data (an index out of range); shapes were checked by the IR verifier.
#pragma once

#include <cmath>

#include "runtime/Kernel.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstring>
#include <type_traits>
#include <utility>
#include <functional>
#include <map>
#include <vector>

namespace cleave::runtime::cpu {

// A std::function so that a combined gradient op's kernel can carry its
// parts (addCombinedGradients).
using KernelFn = std::function<llvm::Error(const KernelCall &call)>;

struct KernelEntry {
  KernelFn fn;
  // Element types (of input 0) the kernel handles.
  std::vector<ir::DType> dtypes;
};

class KernelTable {
public:
  void add(ir::OpKind op, KernelFn fn, std::vector<ir::DType> dtypes) {
    entries_[size_t(op)] = KernelEntry{std::move(fn), std::move(dtypes)};
  }
  const KernelEntry *find(ir::OpKind op) const {
    auto it = entries_.find(size_t(op));
    return it == entries_.end() ? nullptr : &it->second;
  }

private:
  std::map<size_t, KernelEntry> entries_;
};

// Registers the kernel of every combined gradient op (MatMulGrad, ...; the
// op records' splits, ir/Ops.def) whose two parts have kernels in `t`: it
// runs the data part into output 0 and then the weight part into output 1,
// each on the inputs the split picks, with the combined op's attributes. So
// the combined op's results are the split form's bits, and error messages
// name the combined op. Kernel files register only the parts.
void addCombinedGradients(KernelTable &t);

// One per kernel file.
void registerElementwiseKernels(KernelTable &t);
void registerReductionKernels(KernelTable &t);
void registerDataMovementKernels(KernelTable &t);
void registerScatterElementsKernels(KernelTable &t);
void registerCumSumKernels(KernelTable &t);
void registerAttentionKernels(KernelTable &t);
void registerDftKernels(KernelTable &t);
void registerResizeKernels(KernelTable &t);
void registerGridSampleKernels(KernelTable &t);
void registerTileKernels(KernelTable &t);
void registerLinalgKernels(KernelTable &t);
void registerConvPoolKernels(KernelTable &t);
// The Conv kernel itself (f32, f64), for gradients that are convolutions.
llvm::Error convForward(const KernelCall &call);
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
// kernel families registered with kFloatTypes only). Template arguments
// after the element type may follow: CLEAVE_FLOAT_DISPATCH(k, softmax, true)
// runs softmax<double, true> or softmax<float, true>.
#define CLEAVE_FLOAT_DISPATCH(kernel, fn, ...)                                 \
  llvm::Error kernel(const KernelCall &call) {                                 \
    return call.inputs[0].dtype == ir::DType::F64                              \
               ? fn<double __VA_OPT__(, ) __VA_ARGS__>(call)                   \
               : fn<float __VA_OPT__(, ) __VA_ARGS__>(call);                   \
  }

// Loops that convert every element to double run two at a time in the
// baseline's SSE2. Marked with this, they are built also for AVX2 and
// AVX-512 (GCC picks the clone for the CPU when the program loads) and
// take 4 or 8 at a time. Clang (the CLEAVE_FUZZ build) cannot multiversion
// templates: there they are built once, for the baseline; so they are under
// ThreadSanitizer, whose instrumented resolvers would run before its
// runtime starts.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&        \
    !defined(__SANITIZE_THREAD__)
#define CLEAVE_VECTOR_CLONES                                                   \
  __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLEAVE_VECTOR_CLONES
#endif

// Eight elements as doubles in one vector, for loops marked
// CLEAVE_VECTOR_CLONES (written as loops over eight scalar lanes, such sums
// came out of GCC assembling vectors element by element). The helpers are
// always inlined into their callers' clones, so passing the vectors by
// value changes no ABI (GCC's -Wpsabi note, off for the CPU kernels).
using Double8 [[gnu::vector_size(64)]] = double;
using Float8 [[gnu::vector_size(32)]] = float;
[[gnu::always_inline]] inline Double8 loadDouble8(const double *p) {
  Double8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
[[gnu::always_inline]] inline Double8 loadDouble8(const float *p) {
  Float8 v;
  std::memcpy(&v, p, sizeof(v));
  return __builtin_convertvector(v, Double8);
}
// Row kernels built twice instead of as CLEAVE_VECTOR_CLONES where a loop
// widens floats to doubles: GCC builds a Float8-to-Double8 conversion into
// 512 bits from two 256-bit ones, an extract and an insert (four
// shuffle-port operations where vcvtps2pd zmm, ymm is one), and a clone
// cannot know which instruction set it is built for. The kernel's loop is
// a template on Wide; its AVX-512 build (CLEAVE_WIDE_TARGET, Wide true)
// runs where the CPU has AVX-512F (cpuHasAvx512F), the clones of its other
// build elsewhere. Both builds do the same operations in the same order:
// the same bits.
#if defined(__x86_64__) && defined(__GNUC__)
#define CLEAVE_WIDE_TARGET __attribute__((target("avx512f")))
#else
#define CLEAVE_WIDE_TARGET
#endif
bool cpuHasAvx512F();

// The two builds of a row kernel whose loop is NAME##Lanes<TARGS..., Wide>:
// NAME##Wide (CLEAVE_WIDE_TARGET, Wide true) and NAME##Narrow
// (CLEAVE_VECTOR_CLONES, Wide false). TPARAMS and TARGS in parentheses.
#define CLEAVE_UNPAREN(...) __VA_ARGS__
#define CLEAVE_WIDE_BUILDS(NAME, TPARAMS, TARGS, PARAMS, ARGS)                \
  template <CLEAVE_UNPAREN TPARAMS>                                            \
  CLEAVE_WIDE_TARGET void NAME##Wide PARAMS {                                  \
    NAME##Lanes<CLEAVE_UNPAREN TARGS, true> ARGS;                              \
  }                                                                            \
  template <CLEAVE_UNPAREN TPARAMS>                                            \
  CLEAVE_VECTOR_CLONES void NAME##Narrow PARAMS {                              \
    NAME##Lanes<CLEAVE_UNPAREN TARGS, false> ARGS;                             \
  }

// Eight doubles as two vectors of four: Double8 in the builds for CPUs
// without AVX-512 (Wide false). There GCC 12 keeps a 64-byte vector
// variable in memory and moves its halves through general registers at
// every add (a LayerNorm row ran at 8 cycles an element on an AVX2 CPU),
// while a struct of two 32-byte vectors lives in two registers. Each
// operation is Double8's lane for lane, so the same bits.
using Double4 [[gnu::vector_size(32)]] = double;
struct DoublePair {
  Double4 lo, hi;
  [[gnu::always_inline]] double operator[](int i) const {
    return i < 4 ? lo[i] : hi[i - 4];
  }
};
#define CLEAVE_PAIR_OP(OP)                                                     \
  [[gnu::always_inline]] inline DoublePair operator OP(DoublePair a,           \
                                                       DoublePair b) {         \
    return {a.lo OP b.lo, a.hi OP b.hi};                                       \
  }                                                                            \
  [[gnu::always_inline]] inline DoublePair operator OP(DoublePair a,           \
                                                       double b) {             \
    return {a.lo OP b, a.hi OP b};                                             \
  }                                                                            \
  [[gnu::always_inline]] inline DoublePair operator OP(double a,               \
                                                       DoublePair b) {         \
    return {a OP b.lo, a OP b.hi};                                             \
  }                                                                            \
  [[gnu::always_inline]] inline DoublePair &operator OP##=(DoublePair &a,      \
                                                           DoublePair b) {     \
    return a = a OP b;                                                         \
  }
CLEAVE_PAIR_OP(+)
CLEAVE_PAIR_OP(-)
CLEAVE_PAIR_OP(*)
CLEAVE_PAIR_OP(/)
#undef CLEAVE_PAIR_OP

// Eight doubles in the lanes of a build: Double8 where Wide, else a pair.
template <bool Wide>
using DoubleLanes = std::conditional_t<Wide, Double8, DoublePair>;

// Four floats widened, written element by element: GCC 12 converts a
// whole Float4 in two halves and an insert, these in one vcvtps2pd.
[[gnu::always_inline]] inline Double4 widen4(const float *p) {
  return Double4{p[0], p[1], p[2], p[3]};
}
[[gnu::always_inline]] inline Double4 load4(const double *p) {
  Double4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// loadDouble8 in a build's lanes; in a Wide build as one instruction
// (GCC's workaround: Clang picks that instruction itself, and refuses a
// 512-bit asm operand in a function not built for AVX-512).
template <bool Wide>
[[gnu::always_inline]] inline DoubleLanes<Wide> loadDouble8W(const float *p) {
  if constexpr (Wide) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    Float8 v;
    std::memcpy(&v, p, sizeof(v));
    Double8 d;
    asm("vcvtps2pd %t1, %g0" : "=v"(d) : "v"(v));
    return d;
#else
    return loadDouble8(p);
#endif
  } else {
    return {widen4(p), widen4(p + 4)};
  }
}
template <bool Wide>
[[gnu::always_inline]] inline DoubleLanes<Wide> loadDouble8W(const double *p) {
  if constexpr (Wide)
    return loadDouble8(p);
  else
    return {load4(p), load4(p + 4)};
}

// Stores eight doubles as floats or doubles.
[[gnu::always_inline]] inline void storeLanes8(float *p, Double8 v) {
  Float8 f = __builtin_convertvector(v, Float8);
  std::memcpy(p, &f, sizeof(f));
}
[[gnu::always_inline]] inline void storeLanes8(double *p, Double8 v) {
  std::memcpy(p, &v, sizeof(v));
}
[[gnu::always_inline]] inline void storeLanes8(float *p, DoublePair v) {
  using Float4 [[gnu::vector_size(16)]] = float;
  Float4 lo = __builtin_convertvector(v.lo, Float4),
         hi = __builtin_convertvector(v.hi, Float4);
  std::memcpy(p, &lo, sizeof(lo));
  std::memcpy(p + 4, &hi, sizeof(hi));
}
[[gnu::always_inline]] inline void storeLanes8(double *p, DoublePair v) {
  std::memcpy(p, &v.lo, sizeof(v.lo));
  std::memcpy(p + 4, &v.hi, sizeof(v.hi));
}

// The lanes summed in a fixed tree.
[[gnu::always_inline]] inline double laneSum(Double8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
[[gnu::always_inline]] inline double laneSum(DoublePair v) {
  return ((v.lo[0] + v.lo[1]) + (v.lo[2] + v.lo[3])) +
         ((v.hi[0] + v.hi[1]) + (v.hi[2] + v.hi[3]));
}

// HardSigmoid with PyTorch's constants (alpha the float nearest 1/6, beta
// 1/2): computed as PyTorch computes F.hardsigmoid, min(max(x + 3, 0), 6)
// / 6, and differentiated with its test on x at the kinks.
inline bool isPyTorchHardSigmoid(float alpha, float beta) {
  return alpha == 1.0f / 6.0f && beta == 0.5f;
}

// Row-major strides of a shape.
std::vector<int64_t> stridesOf(llvm::ArrayRef<int64_t> shape);

inline int64_t elementCount(llvm::ArrayRef<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

// A tensor of `shape` viewed as [outer, len, inner] around the call's
// `axis` attribute (negative counts from the end); an error naming the
// call when the axis is outside the shape. The index kernels' lanes
// (CumSum, ArgMax/ArgMin, TopKIndices).
struct AxisLanes {
  int64_t axis, outer, len, inner;
};
inline llvm::Expected<AxisLanes> axisLanes(const KernelCall &call,
                                           llvm::ArrayRef<int64_t> shape) {
  int64_t rank = shape.size(), axis = call.getInt("axis");
  if (axis < -rank || axis >= rank)
    return kernelError(call, "axis {0} is out of range for shape {1}", axis,
                       ir::shapeStr(shape));
  if (axis < 0)
    axis += rank;
  return AxisLanes{axis, elementCount(shape.take_front(axis)), shape[axis],
                   elementCount(shape.drop_front(axis + 1))};
}

// The "axis" attribute, a negative one counted from the end.
inline int64_t normalizedAxis(const KernelCall &call, size_t rank) {
  int64_t axis = call.getInt("axis");
  return axis < 0 ? axis + int64_t(rank) : axis;
}

// Runs f(begin, end) over [0, n) split across the backend's threads when n
// is large enough to pay for it (ThreadPool.h underneath).
// kGrain is the grain for a cheap pass over elements (a copy, an add):
// below it, one thread.
constexpr int64_t kGrain = 1 << 14;
void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &f);

// Runs f(i) for each i in [0, n) as its own task, taken by whichever
// thread is free next: for a few large tasks (GEMM blocks), where a worker
// that wakes late (an idle vCPU took 0.1 to 2 ms to wake here) still takes
// its share instead of leaving the caller a whole range to run alone.
void parallelTasks(int64_t n, const std::function<void(int64_t)> &f);

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

// --- Float operands of any float type, as doubles ----------------------------

// Element i of a float tensor of any float type.
inline double loadDouble(const TensorRef &t, int64_t i) {
  switch (t.dtype) {
  case ir::DType::F64:
    return t.as<double>()[i];
  case ir::DType::F16:
    return ir::halfToFloat(t.as<uint16_t>()[i]);
  case ir::DType::BF16:
    return ir::bf16ToFloat(t.as<uint16_t>()[i]);
  default:
    return t.as<float>()[i];
  }
}

// Parameter-like operands (scale, running statistics, class weights) may be
// another float type than the data in ONNX, so kernels read them as doubles.
inline std::vector<double> readDoubles(const TensorRef &t) {
  std::vector<double> v(t.numElements());
  for (int64_t i = 0; i < int64_t(v.size()); ++i)
    v[i] = loadDouble(t, i);
  return v;
}

inline void storeDouble(const TensorRef &t, int64_t i, double v) {
  switch (t.dtype) {
  case ir::DType::F64:
    t.as<double>()[i] = v;
    break;
  case ir::DType::F16:
    t.as<uint16_t>()[i] = ir::floatToHalf(float(v));
    break;
  case ir::DType::BF16:
    t.as<uint16_t>()[i] = ir::floatToBf16(float(v));
    break;
  default:
    t.as<float>()[i] = float(v);
  }
}

// The value of a one-element tensor of any numeric type (a learning rate, a
// step count).
inline double scalarAsDouble(const TensorRef &t) {
  if (t.dtype == ir::DType::F16 || t.dtype == ir::DType::BF16)
    return loadDouble(t, 0);
  return dispatchType(t.dtype, [&](auto v) {
    return double(t.as<decltype(v)>()[0]);
  });
}

// `t` broadcast (NumPy, unidirectionally) to `shape`, as doubles; an error
// if it does not broadcast (Normalization.cpp).
llvm::Expected<std::vector<double>>
broadcastDoubles(const KernelCall &call, const TensorRef &t,
                 llvm::ArrayRef<int64_t> shape);

// The view of a tensor of `shape` that Slice reads and SliceGrad writes:
// the flat offset of its first element, and per dim its length and its
// stride in elements (negative for a negative step); an error for a bad
// axis or a 0 step (DataMovement.cpp).
struct SliceView {
  int64_t start = 0;
  std::vector<int64_t> lengths, strides;
  // Per axis: the first index read and the step (0 and 1 where not sliced).
  std::vector<int64_t> first, steps;
};
llvm::Expected<SliceView> sliceView(const KernelCall &call,
                                    llvm::ArrayRef<int64_t> shape);

// The indices of Gather (and GatherGrad) as int64 in [0, dim), negative ones
// wrapped; an error for another type than i64 or i32 or an index out of
// range (DataMovement.cpp).
llvm::Expected<std::vector<int64_t>>
gatherIndices(const KernelCall &call, const TensorRef &idx, int64_t dim);

// ScatterND into data shaped `dataShape`: the flat offset of the slice each
// index tuple (the last dim of idx) addresses, negative indices wrapped; an
// error for another index type than i64 or i32, a tuple longer than the
// rank or an index out of range (DataMovement.cpp).
llvm::Expected<std::vector<int64_t>>
scatterNDOffsets(const KernelCall &call, llvm::ArrayRef<int64_t> dataShape,
                 const TensorRef &idx);

// The sum of n terms in double: sixteen running sums (two vectors of eight
// lanes, vec(i) giving terms i..i+7) over the first multiple of 16 terms,
// one(i) for the rest, added in a fixed tree, so the bits depend on n
// alone. Sixteen chains keep the adds pipelined (four running sums held
// LayerNorm's rows to about a cycle a term at any vector width).
template <typename V, typename S>
[[gnu::always_inline]] inline double sumLanes16(int64_t n, V &&vec, S &&one) {
  using Lanes = std::decay_t<decltype(vec(int64_t(0)))>;
  Lanes a = {}, b = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a += vec(i);
    b += vec(i + 8);
  }
  double tail = 0;
  for (; i < n; ++i)
    tail += one(i);
  return laneSum(a + b) + tail;
}

// Two sums of sumLanes16 in one pass, each with its own accumulators in
// sumLanes16's order (the bits of two calls); vec(i) and one(i) return
// both terms as a pair.
template <typename V, typename S>
[[gnu::always_inline]] inline std::pair<double, double>
sumLanes16Pair(int64_t n, V &&vec, S &&one) {
  using Lanes = std::decay_t<decltype(vec(int64_t(0)).first)>;
  Lanes a0 = {}, b0 = {}, a1 = {}, b1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    auto [x0, x1] = vec(i);
    auto [y0, y1] = vec(i + 8);
    a0 += x0;
    a1 += x1;
    b0 += y0;
    b1 += y1;
  }
  double tail0 = 0, tail1 = 0;
  for (; i < n; ++i) {
    auto [t0, t1] = one(i);
    tail0 += t0;
    tail1 += t1;
  }
  return {laneSum(a0 + b0) + tail0, laneSum(a1 + b1) + tail1};
}

// One normalized row's statistics: its mean and 1 / sqrt(variance + eps).
struct RowStats {
  double mean, inv;
};

// LayerNormalization's row statistics (biased variance, two passes), the
// one formula of the forward and gradient kernels, so the gradients see
// the forward's bits and no thread count changes a bit. Inlined into the
// kernels' row functions, which are built for AVX2 and AVX-512 too
// (CLEAVE_VECTOR_CLONES): the same operations, more doubles a vector.
template <typename T, bool Wide = false>
[[gnu::always_inline]] inline RowStats
layerNormRowStats(const T *x, int64_t size, double eps) {
  double sum = sumLanes16(
      size, [&](int64_t i) { return loadDouble8W<Wide>(x + i); },
      [&](int64_t i) { return double(x[i]); });
  double mean = size ? sum / double(size) : 0.0;
  double sq = sumLanes16(
      size,
      [&](int64_t i) {
        auto d = loadDouble8W<Wide>(x + i) - mean;
        return d * d;
      },
      [&](int64_t i) {
        double d = double(x[i]) - mean;
        return d * d;
      });
  return {mean, 1.0 / std::sqrt((size ? sq / double(size) : 0.0) + eps)};
}

// 1 / sqrt(mean(x[0..size)^2) + eps) of one RMSNormalization row (the
// forward and gradient kernels' one formula, as above).
template <typename T, bool Wide = false>
[[gnu::always_inline]] inline double rmsRowInv(const T *x, int64_t size,
                                               double eps) {
  double sq = sumLanes16(
      size,
      [&](int64_t i) {
        auto v = loadDouble8W<Wide>(x + i);
        return v * v;
      },
      [&](int64_t i) { return double(x[i]) * double(x[i]); });
  return 1.0 / std::sqrt((size ? sq / double(size) : 0.0) + eps);
}

// GatherElements along `axis` of data shaped `dataShape` by `idx`: for each
// position of idx (row-major), the flat offset of the element of data it
// reads; errors as gatherIndices, and for idx larger than data in another
// dim (DataMovement.cpp).
llvm::Expected<std::vector<int64_t>>
gatherElementsOffsets(const KernelCall &call, llvm::ArrayRef<int64_t> dataShape,
                      const TensorRef &idx, int64_t axis);

} // namespace cleave::runtime::cpu
