// Reduction kernels for the CPU backend: ReduceSum, ReduceMean, ReduceMax
// over any set of axes (empty `axes` = all), with or without keepdims.
//
// The input is viewed as groups of kept and reduced dims (dims of size 1
// dropped, neighbours with the same role merged); the output lists the kept
// groups in the same order, so keepdims never changes the loops. Two loop
// shapes cover every case:
//   - innermost group reduced: each output element folds contiguous runs,
//     one per combination of the outer reduced dims (last-axis sums,
//     per-row statistics);
//   - innermost group kept: each output row accumulates whole input rows
//     elementwise, vectorizably (bias gradients summed over the batch,
//     per-channel statistics).
// A reduction to one value folds fixed-size blocks in parallel and combines
// the partial results in order, so the result does not depend on the thread
// count. f32, f16 and bf16 sums accumulate in double; integer sums wrap.
#include "runtime/cpu/CpuKernels.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

namespace cleave::runtime::cpu {
namespace {

using ir::DType;
using ir::OpKind;

// Half and BFloat load as f32 (Elem in CpuKernels.h).
template <typename T> auto load(T v) { return Elem<T>::load(v); }
template <typename T, typename C> T store(C v) {
  return Elem<T>::store(typename Elem<T>::Compute(v));
}

enum class Kind { Sum, Mean, Max };

// The fold of one reduction over elements of storage type T: an
// accumulator type, its start value, how one element or a partial result is
// folded in, and how the result is stored.
// The sum of p[0..n) in double, in a fixed order: eight lanes
// (DoubleLanes), built for AVX-512 (Wide) and as CLEAVE_VECTOR_CLONES for
// the others; the same bits in each.
template <typename T, bool Wide>
[[gnu::always_inline]] inline double sumLanesOf(const T *p, int64_t n) {
  DoubleLanes<Wide> s = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    s += loadDouble8W<Wide>(p + i);
  double tail = 0;
  for (; i < n; ++i)
    tail += double(p[i]);
  return laneSum(s) + tail;
}
template <typename T>
CLEAVE_WIDE_TARGET double sumLanesWide(const T *p, int64_t n) {
  return sumLanesOf<T, true>(p, n);
}
template <typename T>
CLEAVE_VECTOR_CLONES double sumLanesNarrow(const T *p, int64_t n) {
  return sumLanesOf<T, false>(p, n);
}
template <typename T> double sumLanes(const T *p, int64_t n) {
  return cpuHasAvx512F() ? sumLanesWide(p, n) : sumLanesNarrow(p, n);
}

template <typename T, Kind K> struct Fold {
  using C = decltype(load(T{}));
  static constexpr bool kInt = std::is_integral_v<C>;
  // Sums: double for floats, uint64 (wrapping) for integers; Max: C.
  using Acc = std::conditional_t<K == Kind::Max, C,
                                 std::conditional_t<kInt, uint64_t, double>>;

  static Acc init() {
    if constexpr (K != Kind::Max)
      return Acc(0);
    else if constexpr (kInt)
      return std::numeric_limits<C>::lowest();
    else
      return -std::numeric_limits<C>::infinity();
  }
  static Acc add(Acc acc, Acc x) {
    if constexpr (K == Kind::Max)
      return (x > acc || x != x) ? x : acc; // NaN sticks
    else
      return acc + x;
  }
  static Acc lift(T v) {
    if constexpr (K != Kind::Max && kInt)
      return Acc(int64_t(v)); // sign-extend, then wrap modulo 2^64
    else
      return Acc(load(v));
  }
  // `count` elements were folded into acc. ReduceMax of nothing is -inf
  // (lowest for integers); ReduceMean of nothing is NaN (0 for integers).
  static T finish(Acc acc, int64_t count) {
    if constexpr (K == Kind::Mean && kInt)
      return store<T>(count ? int64_t(acc) / count : 0);
    else if constexpr (K == Kind::Mean)
      return store<T>(acc / double(count));
    else if constexpr (kInt)
      return store<T>(int64_t(acc));
    else
      return store<T>(acc);
  }

  // Folds a contiguous run with independent accumulators, so that the adds
  // pipeline instead of waiting on each other (float sums: eight lanes, in
  // the CPU's widest vectors).
  static Acc run(const T *x, int64_t n, Acc acc) {
    if constexpr (K != Kind::Max &&
                  (std::is_same_v<T, float> || std::is_same_v<T, double>))
      return acc + sumLanes(x, n);
    Acc a0 = init(), a1 = init(), a2 = init(), a3 = init();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      a0 = add(a0, lift(x[i]));
      a1 = add(a1, lift(x[i + 1]));
      a2 = add(a2, lift(x[i + 2]));
      a3 = add(a3, lift(x[i + 3]));
    }
    for (; i < n; ++i)
      a0 = add(a0, lift(x[i]));
    return add(acc, add(add(a0, a1), add(a2, a3)));
  }
};

constexpr int64_t kBlock = 1 << 15; // elements per partial result
constexpr int64_t kTile = 512;      // output elements per kept-inner tile

// The input as alternating kept / reduced groups.
struct ReducePlan {
  llvm::SmallVector<int64_t, 6> dims;
  llvm::SmallVector<bool, 6> reduced;
  llvm::SmallVector<int64_t, 6> strides; // contiguous input strides
  int64_t count = 1;                     // input elements per output element
};

ReducePlan planReduce(llvm::ArrayRef<int64_t> shape,
                      llvm::ArrayRef<bool> isReduced) {
  ReducePlan p;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (isReduced[d])
      p.count *= shape[d];
    if (shape[d] == 1)
      continue;
    if (!p.dims.empty() && p.reduced.back() == isReduced[d]) {
      p.dims.back() *= shape[d];
    } else {
      p.dims.push_back(shape[d]);
      p.reduced.push_back(isReduced[d]);
    }
  }
  p.strides.resize(p.dims.size());
  int64_t run = 1;
  for (size_t d = p.dims.size(); d-- > 0;) {
    p.strides[d] = run;
    run *= p.dims[d];
  }
  return p;
}

// Input offsets of every combination of the groups in [0, end) with role
// `reduced`, in row-major order.
std::vector<int64_t> groupOffsets(const ReducePlan &p, size_t end,
                                  bool reduced) {
  std::vector<int64_t> offs{0};
  for (size_t d = 0; d < end; ++d) {
    if (p.reduced[d] != reduced)
      continue;
    std::vector<int64_t> next;
    next.reserve(offs.size() * p.dims[d]);
    for (int64_t o : offs)
      for (int64_t i = 0; i < p.dims[d]; ++i)
        next.push_back(o + i * p.strides[d]);
    offs = std::move(next);
  }
  return offs;
}

template <typename T, Kind K>
void reduceTyped(const TensorRef &in, const TensorRef &out,
                 const ReducePlan &p) {
  using F = Fold<T, K>;
  using Acc = typename F::Acc;
  const T *x = in.as<T>();
  T *y = out.as<T>();
  int64_t outputs = out.numElements();
  if (outputs == 0)
    return;
  if (p.count == 0) {
    std::fill(y, y + outputs, F::finish(F::init(), 0));
    return;
  }
  size_t r = p.dims.size();

  // Everything to one value: fixed blocks, partials combined in order.
  if (outputs == 1) {
    int64_t n = in.numElements();
    std::vector<Acc> partial((n + kBlock - 1) / kBlock);
    parallelFor(int64_t(partial.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        partial[i] = F::run(x + i * kBlock,
                            std::min(kBlock, n - i * kBlock), F::init());
    });
    Acc acc = F::init();
    for (Acc v : partial)
      acc = F::add(acc, v);
    y[0] = F::finish(acc, p.count);
    return;
  }

  if (p.reduced.back()) {
    // Innermost group reduced: output o folds runs of length `len` starting
    // at keptOffs[o] + each of runOffs.
    int64_t len = p.dims.back();
    std::vector<int64_t> runOffs = groupOffsets(p, r - 1, true);
    std::vector<int64_t> keptOffs = groupOffsets(p, r - 1, false);
    int64_t grain = std::max<int64_t>(1, kBlock / p.count);
    parallelFor(outputs, grain, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        Acc acc = F::init();
        for (int64_t ro : runOffs)
          acc = F::run(x + keptOffs[o] + ro, len, acc);
        y[o] = F::finish(acc, p.count);
      }
    });
    return;
  }

  // Innermost group kept: output rows of `width` elements, each the
  // elementwise fold of the input rows at rowOffs[row] + each of redOffs.
  // Work items are tiles of a row, so one wide row still spreads out.
  int64_t width = p.dims.back();
  std::vector<int64_t> redOffs = groupOffsets(p, r - 1, true);
  std::vector<int64_t> rowOffs = groupOffsets(p, r - 1, false);
  int64_t tilesPerRow = (width + kTile - 1) / kTile;
  int64_t items = int64_t(rowOffs.size()) * tilesPerRow;
  int64_t grain = std::max<int64_t>(1, kBlock / (kTile * p.count));
  parallelFor(items, grain, [&](int64_t b, int64_t e) {
    Acc acc[kTile];
    for (int64_t item = b; item < e; ++item) {
      int64_t row = item / tilesPerRow;
      int64_t t0 = item % tilesPerRow * kTile;
      int64_t n = std::min(kTile, width - t0);
      std::fill(acc, acc + n, F::init());
      for (int64_t ro : redOffs) {
        const T *src = x + rowOffs[row] + ro + t0;
        for (int64_t j = 0; j < n; ++j)
          acc[j] = F::add(acc[j], F::lift(src[j]));
      }
      T *dst = y + row * width + t0;
      for (int64_t j = 0; j < n; ++j)
        dst[j] = F::finish(acc[j], p.count);
    }
  });
}

template <Kind K> llvm::Error reduce(const KernelCall &c) {
  const TensorRef &in = c.inputs[0], &out = c.outputs[0];
  int64_t rank = in.rank();
  std::vector<bool> isReduced(rank, c.getInts("axes").empty());
  for (int64_t a : c.getInts("axes")) {
    if (a < -rank || a >= rank)
      return kernelError(c, "axis {0} is out of range for rank {1}", a, rank);
    isReduced[a < 0 ? a + rank : a] = true;
  }
  llvm::SmallVector<bool, 6> flags(isReduced.begin(), isReduced.end());
  ReducePlan p = planReduce(in.shape, flags);
  switch (in.dtype) {
  case DType::F64:
    reduceTyped<double, K>(in, out, p);
    break;
  case DType::F16:
    reduceTyped<Half, K>(in, out, p);
    break;
  case DType::BF16:
    reduceTyped<BFloat, K>(in, out, p);
    break;
  case DType::I64:
    reduceTyped<int64_t, K>(in, out, p);
    break;
  case DType::I32:
    reduceTyped<int32_t, K>(in, out, p);
    break;
  case DType::I8:
    reduceTyped<int8_t, K>(in, out, p);
    break;
  default:
    reduceTyped<float, K>(in, out, p);
    break;
  }
  return llvm::Error::success();
}

// Calls `run` with a value of the C++ type of `dtype`, the half types
// included (the index kernels read every numeric type).
template <typename F> void numericDispatch(DType dtype, F &&run) {
  switch (dtype) {
  case DType::F64: run(double{}); break;
  case DType::F16: run(Half{}); break;
  case DType::BF16: run(BFloat{}); break;
  case DType::I64: run(int64_t{}); break;
  case DType::I32: run(int32_t{}); break;
  case DType::I8: run(int8_t{}); break;
  default: run(float{}); break;
  }
}

// TopKIndices along one axis: [outer, len, inner] -> [outer, k, inner]
// indices (i64) of the k largest (smallest) in order; NaN first when
// largest (PyTorch's topk ranks NaN above every number), the lower index
// first among equal values. A stable sort of each slice's indices.
llvm::Error topKIndices(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  auto lanes = axisLanes(call, X.shape);
  if (!lanes)
    return lanes.takeError();
  const int64_t axis = lanes->axis, outer = lanes->outer, len = lanes->len,
                inner = lanes->inner;
  const int64_t k = call.getInt("k");
  if (k < 0 || k > len)
    return kernelError(call, "k {0} is not within the {1} elements of axis {2}",
                       k, len, axis);
  const bool largest = call.getInt("largest") != 0;
  int64_t *out = call.outputs[0].as<int64_t>();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T *x = X.as<T>();
    parallelFor(outer * inner, 1024 / std::max<int64_t>(1, len),
                [&](int64_t b, int64_t e) {
                  std::vector<int64_t> order(static_cast<size_t>(len));
                  std::vector<double> v(static_cast<size_t>(len));
                  for (int64_t p = b; p < e; ++p) {
                    int64_t o = p / inner, i = p % inner;
                    for (int64_t j = 0; j < len; ++j) {
                      v[j] = double(load(x[(o * len + j) * inner + i]));
                      order[j] = j;
                    }
                    // a before b: NaN first when largest, last when not.
                    auto before = [&](int64_t a, int64_t c) {
                      bool na = std::isnan(v[a]), nc = std::isnan(v[c]);
                      if (na || nc)
                        return largest ? na && !nc : nc && !na;
                      return largest ? v[a] > v[c] : v[a] < v[c];
                    };
                    std::stable_sort(order.begin(), order.end(), before);
                    for (int64_t j = 0; j < k; ++j)
                      out[(o * k + j) * inner + i] = order[j];
                  }
                });
  };
  numericDispatch(X.dtype, run);
  return llvm::Error::success();
}

// ArgMax / ArgMin along one axis: [outer, len, inner] -> [outer, inner]
// indices (i64). A NaN wins (PyTorch's rule), the first of equal ones
// unless select_last_index.
template <bool Max> llvm::Error argReduce(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  auto lanes = axisLanes(call, X.shape);
  if (!lanes)
    return lanes.takeError();
  const int64_t axis = lanes->axis, outer = lanes->outer, len = lanes->len,
                inner = lanes->inner;
  if (len == 0 && outer * inner > 0)
    return kernelError(call, "axis {0} has no elements", axis);
  bool last = call.getInt("select_last_index");
  int64_t *out = call.outputs[0].as<int64_t>();
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T *x = X.as<T>();
    parallelFor(outer * inner, 4096 / std::max<int64_t>(1, len),
                [&](int64_t b, int64_t e) {
                  for (int64_t p = b; p < e; ++p) {
                    int64_t o = p / inner, i = p % inner, best = 0;
                    double bv = double(load(x[o * len * inner + i]));
                    for (int64_t k = 1; k < len; ++k) {
                      double v = double(load(x[(o * len + k) * inner + i]));
                      if (std::isnan(bv))
                        break;
                      bool better = std::isnan(v) ||
                                    (Max ? v > bv : v < bv) ||
                                    (last && v == bv);
                      if (better) {
                        best = k;
                        bv = v;
                      }
                    }
                    out[p] = best;
                  }
                });
  };
  numericDispatch(X.dtype, run);
  return llvm::Error::success();
}

} // namespace

void registerReductionKernels(KernelTable &t) {
  const std::vector<DType> types = {DType::F32, DType::F64, DType::F16,
                                    DType::BF16, DType::I64, DType::I32,
                                    DType::I8};
  t.add(OpKind::ReduceSum, reduce<Kind::Sum>, types);
  t.add(OpKind::ReduceMean, reduce<Kind::Mean>, types);
  t.add(OpKind::ReduceMax, reduce<Kind::Max>, types);
  t.add(OpKind::ArgMax, argReduce<true>, types);
  t.add(OpKind::ArgMin, argReduce<false>, types);
  t.add(OpKind::TopKIndices, topKIndices, types);
}

} // namespace cleave::runtime::cpu
