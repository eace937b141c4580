// Gradient kernels for the CPU backend that are elementwise, reduce along
// one axis, or move data: UnaryGrad, SumTo, SoftmaxGrad, LogSoftmaxGrad,
// SoftmaxCrossEntropyLossGrad, DropoutGrad, GatherGrad, GatherElementsGrad,
// ScatterNDGradData, ScatterNDGradUpdates, SliceGrad.
// docs/design/training.md gives the formulas.
//
// Every reduction runs in a fixed order per output element (sums in
// double), and threads split the outputs, never a sum, so the results are
// the same bits whatever the thread count.
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/VectorMath.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

// --- UnaryGrad -------------------------------------------------------------

// dX[i] = grad(dY[i], X[i]) over all elements.
template <typename T, typename F>
llvm::Error mapGradient(const KernelCall &call, F grad) {
  const T *dy = call.inputs[0].as<T>(), *x = call.inputs[1].as<T>();
  T *dx = call.outputs[0].as<T>();
  parallelFor(call.outputs[0].numElements(), kGrain,
              [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i)
                  dx[i] = grad(dy[i], x[i]);
              });
  return llvm::Error::success();
}

// Masks (relu, clip) select dY or 0 rather than multiply, so an infinite dY
// where the mask is off gives 0, not NaN.
// dX = arrayFn(dY, X) in chunks over threads (VectorMath.h's lane-wise
// functions: the chunks do not change a bit).
template <typename T, typename F>
llvm::Error mapGradientArrays(const KernelCall &call, F arrayFn) {
  const T *dy = call.inputs[0].as<T>(), *x = call.inputs[1].as<T>();
  T *dx = call.outputs[0].as<T>();
  parallelFor(
      call.outputs[0].numElements(), 1 << 12,
      [&](int64_t b, int64_t e) { arrayFn(dy + b, x + b, e - b, dx + b); });
  return llvm::Error::success();
}

template <typename T> llvm::Error unaryGrad(const KernelCall &call) {
  const std::string &fn = call.getString("fn");
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (fn == "tanh")
      return mapGradientArrays<T>(call,
                                  [](const T *dy, const T *x, int64_t n,
                                     T *dx) { tanhGradArray(dy, x, n, dx); });
    if (fn == "sigmoid")
      return mapGradientArrays<T>(
          call, [](const T *dy, const T *x, int64_t n, T *dx) {
            sigmoidGradArray(dy, x, n, dx);
          });
    if (fn == "silu")
      return mapGradientArrays<T>(
          call, [](const T *dy, const T *x, int64_t n, T *dx) {
            siluGradArray(dy, x, n, dx);
          });
    // Gelu in f64 keeps libm's erf and tanh below, as its forward does.
    bool gelu = fn == "gelu" || fn == "gelu_tanh";
    if (gelu && std::is_same_v<T, float>) {
      bool tanhForm = fn == "gelu_tanh";
      return mapGradientArrays<T>(
          call, [tanhForm](const T *dy, const T *x, int64_t n, T *dx) {
            geluGradArray(dy, x, n, tanhForm, dx);
          });
    }
  }
  if (fn == "abs")
    return mapGradient<T>(call, [](T dy, T x) {
      return x > 0 ? dy : x < 0 ? T(-dy) : T(0);
    });
  if (fn == "clip") {
    T lo = T(call.getFloat("min")), hi = T(call.getFloat("max"));
    return mapGradient<T>(
        call, [=](T dy, T x) { return x >= lo && x <= hi ? dy : T(0); });
  }
  if (fn == "erf") {
    const T *dy = call.inputs[0].as<T>(), *x = call.inputs[1].as<T>();
    T *dx = call.outputs[0].as<T>();
    parallelFor(call.outputs[0].numElements(), 1 << 12,
                [&](int64_t b, int64_t e) {
                  erfGradArray(dy + b, x + b, e - b, dx + b);
                });
    return llvm::Error::success();
  }
  if (fn == "exp")
    return mapGradient<T>(call, [](T dy, T x) { return T(dy * std::exp(x)); });
  if (fn == "sin")
    return mapGradient<T>(call, [](T dy, T x) { return T(dy * std::cos(x)); });
  if (fn == "cos")
    return mapGradient<T>(call, [](T dy, T x) { return T(-dy * std::sin(x)); });
  // The trigonometric and hyperbolic functions, PyTorch's derivatives:
  // tan' = 1 + tan^2, asin' = 1 / sqrt(1 - x^2), acos' its negative,
  // atan' = 1 / (1 + x^2), sinh' = cosh, cosh' = sinh,
  // asinh' = 1 / sqrt(x^2 + 1), acosh' = 1 / (sqrt(x - 1) sqrt(x + 1)),
  // atanh' = 1 / (1 - x^2).
  if (fn == "tan")
    return mapGradient<T>(call, [](T dy, T x) {
      T t = std::tan(x);
      return T(dy * (T(1) + t * t));
    });
  if (fn == "asin")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy / std::sqrt(T(1) - x * x));
    });
  if (fn == "acos")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(-dy / std::sqrt(T(1) - x * x));
    });
  if (fn == "atan")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy / (T(1) + x * x));
    });
  if (fn == "sinh")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy * std::cosh(x));
    });
  if (fn == "cosh")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy * std::sinh(x));
    });
  if (fn == "asinh")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy / std::sqrt(x * x + T(1)));
    });
  if (fn == "acosh")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy / (std::sqrt(x - T(1)) * std::sqrt(x + T(1))));
    });
  if (fn == "atanh")
    return mapGradient<T>(call, [](T dy, T x) {
      return T(dy / (T(1) - x * x));
    });
  // Gelu, PyTorch's backward formulas (GeluBackward): erf form
  // dY * (Phi(x) + x * phi(x)); tanh form through the derivative of
  // 0.5 x (1 + tanh(beta (x + kappa x^3))).
  if (fn == "gelu")
    return mapGradient<T>(call, [](T dy, T x) {
      const T kAlpha = T(0.7071067811865476); // 1 / sqrt(2)
      const T kBeta = T(0.3989422804014327);  // 1 / sqrt(2 pi)
      T cdf = T(0.5) * (T(1) + std::erf(x * kAlpha));
      T pdf = kBeta * std::exp(x * x * T(-0.5));
      return T(dy * (cdf + x * pdf));
    });
  if (fn == "gelu_tanh")
    return mapGradient<T>(call, [](T dy, T x) {
      const T kBeta = T(0.7978845608028654); // sqrt(2 / pi)
      const T kKappa = T(0.044715);
      T xSq = x * x, xCube = xSq * x;
      T inner = kBeta * (x + kKappa * xCube);
      T tanhInner = std::tanh(inner);
      T left = T(0.5) * x, right = T(1) + tanhInner;
      T leftDerivative = T(0.5) * right;
      T tanhDerivative = T(1) - tanhInner * tanhInner;
      T innerDerivative = kBeta * (T(1) + T(3) * kKappa * xSq);
      T rightDerivative = left * tanhDerivative * innerDerivative;
      return T(dy * (leftDerivative + rightDerivative));
    });
  // HardSigmoid: alpha inside (0, 1) of alpha x + beta, 0 at and past the
  // kinks; at PyTorch's constants, PyTorch's test on x (-3 < x < 3).
  if (fn == "hard_sigmoid") {
    float alpha = call.getFloat("alpha"), beta = call.getFloat("beta");
    T a = T(alpha), b = T(beta);
    if (isPyTorchHardSigmoid(alpha, beta))
      return mapGradient<T>(call, [=](T dy, T x) {
        return x > T(-3) && x < T(3) ? T(dy * a) : T(0);
      });
    return mapGradient<T>(call, [=](T dy, T x) {
      T v = a * x + b;
      return v > T(0) && v < T(1) ? T(dy * a) : T(0);
    });
  }
  // HardSwish, PyTorch's hardswish_backward: 0 up to -3 (included),
  // dY (x / 3 + 1/2) below 3, dY from 3 on.
  if (fn == "hard_swish")
    return mapGradient<T>(call, [](T dy, T x) {
      if (x <= T(-3))
        return T(0);
      return x < T(3) ? T(dy * (x / T(3) + T(0.5))) : dy;
    });
  if (fn == "leaky_relu") {
    T alpha = T(call.getFloatFor<T>("alpha"));
    return mapGradient<T>(call,
                          [=](T dy, T x) { return x > 0 ? dy : T(dy * alpha); });
  }
  if (fn == "log")
    return mapGradient<T>(call, [](T dy, T x) { return T(dy / x); });
  if (fn == "reciprocal")
    return mapGradient<T>(call, [](T dy, T x) { return T(-dy / (x * x)); });
  if (fn == "relu")
    return mapGradient<T>(call, [](T dy, T x) { return x > 0 ? dy : T(0); });
  if (fn == "sigmoid")
    return mapGradient<T>(call, [](T dy, T x) {
      T s = T(1) / (T(1) + std::exp(-x));
      return T(dy * s * (T(1) - s));
    });
  if (fn == "silu")
    return mapGradient<T>(call, [](T dy, T x) {
      T s = T(1) / (T(1) + std::exp(-x));
      return T(dy * s * (T(1) + x * (T(1) - s)));
    });
  if (fn == "sqrt")
    return mapGradient<T>(call,
                          [](T dy, T x) { return T(dy / (T(2) * std::sqrt(x))); });
  if (fn == "tanh")
    return mapGradient<T>(call, [](T dy, T x) {
      T t = std::tanh(x);
      return T(dy * (T(1) - t * t));
    });
  return kernelError(call, "unknown fn '{0}'", fn);
}

// --- SumTo ----------------------------------------------------------------

// A run of adjacent dims of X that are all kept (present in the result) or
// all reduced; dims of size 1 are dropped, so runs of one kind merge.
struct DimRun {
  int64_t size;
  int64_t stride; // in X's elements
  bool kept;
};

llvm::SmallVector<DimRun, 6> sumToRuns(llvm::ArrayRef<int64_t> in,
                                       llvm::ArrayRef<int64_t> out) {
  std::vector<int64_t> strides = stridesOf(in);
  size_t lead = in.size() - out.size();
  llvm::SmallVector<DimRun, 6> runs;
  for (size_t d = 0; d < in.size(); ++d) {
    if (in[d] == 1)
      continue;
    bool kept = d >= lead && out[d - lead] == in[d];
    if (!runs.empty() && runs.back().kept == kept) {
      runs.back().size *= in[d];
      runs.back().stride = strides[d];
    } else {
      runs.push_back({in[d], strides[d], kept});
    }
  }
  return runs;
}

// X's offset of index `i` over the runs of one kind (row-major).
int64_t runOffset(llvm::ArrayRef<DimRun> runs, int64_t i) {
  int64_t off = 0;
  for (size_t r = runs.size(); r-- > 0;) {
    off += (i % runs[r].size) * runs[r].stride;
    i /= runs[r].size;
  }
  return off;
}

// acc[j] += x[offsets[q] + j] for j in [0, n), rows q in [q0, q1) in
// order, in double; built for AVX2 and AVX-512 too (the baseline's SSE2
// added two doubles at a time: a bias gradient was 2% of a BERT step).
template <typename T>
CLEAVE_VECTOR_CLONES void addRowsToDoubles(const T *x, const int64_t *offsets,
                                           int64_t q0, int64_t q1, int64_t n,
                                           double *acc) {
  for (int64_t q = q0; q < q1; ++q) {
    const T *src = x + offsets[q];
    for (int64_t j = 0; j < n; ++j)
      acc[j] += src[j];
  }
}

// Each output element sums its inputs in row-major order of the reduced
// dims. The innermost run is contiguous: when kept, a block of neighbouring
// outputs accumulates whole input rows; when reduced, each output sums
// contiguous runs of input.
template <typename T> llvm::Error sumTo(const KernelCall &call) {
  const TensorRef &X = call.inputs[0], &Y = call.outputs[0];
  if (X.rank() < Y.rank())
    return kernelError(call, "shape {0} has more dims than the operand {1}",
                       ir::shapeStr(Y.shape), ir::shapeStr(X.shape));
  for (size_t d = 0; d < Y.rank(); ++d) {
    int64_t xd = X.shape[X.rank() - Y.rank() + d];
    if (Y.shape[d] != xd && Y.shape[d] != 1)
      return kernelError(call, "shape {0} does not broadcast to {1}",
                         ir::shapeStr(Y.shape), ir::shapeStr(X.shape));
  }
  const T *x = X.as<T>();
  T *y = Y.as<T>();
  int64_t outCount = Y.numElements();
  if (X.numElements() == 0) {
    std::fill(y, y + outCount, T(0));
    return llvm::Error::success();
  }
  llvm::SmallVector<DimRun, 6> runs = sumToRuns(X.shape, Y.shape);
  bool innerKept = runs.empty() || runs.back().kept;
  int64_t inner = runs.empty() ? 1 : runs.back().size;
  llvm::SmallVector<DimRun, 6> outerKept, outerReduced;
  for (size_t r = 0; r + 1 < runs.size(); ++r)
    (runs[r].kept ? outerKept : outerReduced).push_back(runs[r]);
  int64_t keptInner = innerKept ? inner : 1;
  int64_t reducedInner = innerKept ? 1 : inner;
  int64_t rows = outCount / keptInner;
  int64_t reductions = X.numElements() / outCount / reducedInner;
  std::vector<int64_t> reducedOff(reductions);
  for (int64_t q = 0; q < reductions; ++q)
    reducedOff[q] = runOffset(outerReduced, q);

  constexpr int64_t block = 256; // outputs accumulated together
  int64_t blocks = (keptInner + block - 1) / block;
  // Few output blocks over a long reduction (a bias gradient: [M, N] to
  // [N] with N <= 1024) would leave threads idle: the reduction is cut
  // into pieces of kPieceRows rows (fixed by the shape), each summed into
  // its own partials, and the pieces added in order.
  constexpr int64_t kPieceRows = 128;
  if (innerKept && rows == 1 && blocks <= 4 && reductions >= 4 * kPieceRows) {
    int64_t pieces = (reductions + kPieceRows - 1) / kPieceRows;
    std::vector<double> partial(size_t(pieces * keptInner));
    parallelFor(pieces * blocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t item = b; item < e; ++item) {
        int64_t piece = item / blocks;
        int64_t j0 = (item % blocks) * block,
                j1 = std::min(keptInner, j0 + block);
        double *acc = partial.data() + piece * keptInner;
        std::fill(acc + j0, acc + j1, 0.0);
        int64_t q1 = std::min(reductions, (piece + 1) * kPieceRows);
        addRowsToDoubles(x + j0, reducedOff.data(), piece * kPieceRows, q1,
                         j1 - j0, acc + j0);
      }
    });
    for (int64_t j = 0; j < keptInner; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < pieces; ++p)
        sum += partial[size_t(p * keptInner + j)];
      y[j] = T(sum);
    }
    return llvm::Error::success();
  }
  int64_t work = reductions * reducedInner * std::min(block, keptInner);
  parallelFor(rows * blocks, std::max<int64_t>(1, kGrain / work),
              [&](int64_t b, int64_t e) {
                double acc[block];
                for (int64_t item = b; item < e; ++item) {
                  int64_t row = item / blocks;
                  int64_t j0 = (item % blocks) * block,
                          j1 = std::min(keptInner, j0 + block);
                  int64_t rowOff = runOffset(outerKept, row) + j0;
                  std::fill(acc, acc + (j1 - j0), 0.0);
                  if (innerKept)
                    addRowsToDoubles(x + rowOff, reducedOff.data(), 0,
                                     reductions, j1 - j0, acc);
                  else
                    for (int64_t q = 0; q < reductions; ++q) {
                      const T *src = x + rowOff + reducedOff[q];
                      for (int64_t t = 0; t < reducedInner; ++t)
                        acc[0] += src[t];
                    }
                  for (int64_t j = j0; j < j1; ++j)
                    y[row * keptInner + j] = T(acc[j - j0]);
                }
              });
  return llvm::Error::success();
}

// --- SoftmaxGrad, LogSoftmaxGrad ------------------------------------------

// Calls f(base, inner, len) for every lane along `axis` of `shape`: the
// lane's elements are base + j * inner for j in [0, len). Lanes are spread
// over threads.
template <typename F>
void forEachLane(llvm::ArrayRef<int64_t> shape, int64_t axis, F &&f) {
  int64_t len = shape[axis], inner = elementCount(shape.drop_front(axis + 1));
  int64_t lanes = elementCount(shape.take_front(axis)) * inner;
  parallelFor(lanes, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, len)),
              [&](int64_t l0, int64_t l1) {
                for (int64_t l = l0; l < l1; ++l)
                  f((l / inner) * len * inner + l % inner, inner, len);
              });
}

// Softmax: dX = Y * (dY - sum(dY * Y)). LogSoftmax: dX = dY - exp(Y) *
// sum(dY). Y is the forward result.
template <typename T, bool Log> llvm::Error softmaxGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0];
  int64_t axis = normalizedAxis(call, dY.rank());
  if (axis < 0 || axis >= int64_t(dY.rank()))
    return kernelError(call, "axis {0} is out of range for {1}",
                       call.getInt("axis"), ir::shapeStr(dY.shape));
  const T *dy = dY.as<T>(), *y = call.inputs[1].as<T>();
  T *dx = call.outputs[0].as<T>();
  forEachLane(dY.shape, axis,
              [&](int64_t base, int64_t inner, int64_t len) {
                double sum = 0;
                for (int64_t j = 0; j < len; ++j) {
                  int64_t i = base + j * inner;
                  sum += Log ? double(dy[i]) : double(dy[i]) * y[i];
                }
                for (int64_t j = 0; j < len; ++j) {
                  int64_t i = base + j * inner;
                  dx[i] = Log ? T(dy[i] - std::exp(double(y[i])) * sum)
                              : T(y[i] * (dy[i] - sum));
                }
              });
  return llvm::Error::success();
}

// --- SoftmaxCrossEntropyLossGrad ------------------------------------------

// Labels as int64 (any integer type).
std::vector<int64_t> readLabels(const TensorRef &L) {
  std::vector<int64_t> labels(L.numElements());
  dispatchType(L.dtype, [&](auto v) {
    const auto *p = L.as<decltype(v)>();
    for (size_t i = 0; i < labels.size(); ++i)
      labels[i] = int64_t(p[i]);
  });
  return labels;
}

// The row times a scale in T.
template <typename T>
CLEAVE_VECTOR_CLONES void scaleRow(T *x, int64_t n, double scale) {
  const T s = T(scale);
  for (int64_t j = 0; j < n; ++j)
    x[j] *= s;
}

// (dL, scores [N, C, d...], labels [N, d...][, weights [C]]). Per position
// not ignored: dS = (softmax(S) - onehot(label)) * w[label] * dL (dL per
// position for reduction "none", else the scalar), divided by the summed
// weights of the positions not ignored for "mean". Ignored positions get 0.
template <typename T> llvm::Error softmaxCrossEntropyGrad(const KernelCall &call) {
  const TensorRef &dL = call.inputs[0], &S = call.inputs[1];
  if (S.rank() < 2)
    return kernelError(call, "scores must have rank >= 2 ([N, C, ...]), got "
                             "{0}",
                       ir::shapeStr(S.shape));
  int64_t classes = S.shape[1], inner = elementCount(S.shape.drop_front(2));
  int64_t lanes = S.shape[0] * inner;
  std::vector<int64_t> labels = readLabels(call.inputs[2]);
  if (int64_t(labels.size()) != lanes)
    return kernelError(call, "labels {0} do not match scores {1}",
                       ir::shapeStr(call.inputs[2].shape),
                       ir::shapeStr(S.shape));
  const std::string &reduction = call.getString("reduction");
  if (reduction == "none" ? dL.numElements() != lanes : dL.numElements() != 1)
    return kernelError(call, "incoming gradient {0} does not fit reduction "
                             "'{1}' of scores {2}",
                       ir::shapeStr(dL.shape), reduction,
                       ir::shapeStr(S.shape));
  std::optional<int64_t> ignore;
  if (call.hasAttr("ignore_index"))
    ignore = call.getInt("ignore_index");
  auto ignored = [&](int64_t l) { return ignore && labels[l] == *ignore; };
  for (int64_t l = 0; l < lanes; ++l)
    if (!ignored(l) && (labels[l] < 0 || labels[l] >= classes))
      return kernelError(call, "label {0} at position {1} is out of range "
                               "[0, {2})",
                         labels[l], l, classes);
  std::vector<double> weights = call.inputs.size() == 4
                                    ? readDoubles(call.inputs[3])
                                    : std::vector<double>(classes, 1.0);
  double divisor = 1;
  if (reduction == "mean") {
    divisor = 0;
    for (int64_t l = 0; l < lanes; ++l)
      if (!ignored(l))
        divisor += weights[labels[l]];
  }

  const T *s = S.as<T>();
  T *ds = call.outputs[0].as<T>();
  forEachLane(S.shape, 1, [&](int64_t base, int64_t step, int64_t len) {
    int64_t l = (base / (len * step)) * step + base % step;
    if (ignored(l)) {
      for (int64_t j = 0; j < len; ++j)
        ds[base + j * step] = T(0);
      return;
    }
    double coef = loadDouble(dL, reduction == "none" ? l : 0) *
                  weights[labels[l]] / divisor;
    double max = -INFINITY, sum = 0;
    if (step == 1) { // classes contiguous: max and exp in vector lanes
      // The exps once, then scaled by coef / sum rounded as expShifted
      // rounds its scale: expShifted's bits with half its exps.
      max = rowMax(s + base, len); // NaN where one is: the exps are then
      if constexpr (std::is_same_v<T, float>) {
        sum = expShiftedSum(s + base, len, max, ds + base);
        scaleRow(ds + base, len, coef / sum);
      } else {
        sum = sumExpShifted(s + base, len, max);
        expShifted(s + base, len, max, coef / sum, ds + base);
      }
      ds[base + labels[l]] = T(ds[base + labels[l]] - coef);
      return;
    }
    for (int64_t j = 0; j < len; ++j)
      max = std::max(max, double(s[base + j * step]));
    for (int64_t j = 0; j < len; ++j)
      sum += std::exp(double(s[base + j * step]) - max);
    for (int64_t j = 0; j < len; ++j) {
      double p = std::exp(double(s[base + j * step]) - max) / sum;
      ds[base + j * step] = T((p - (j == labels[l] ? 1.0 : 0.0)) * coef);
    }
  });
  return llvm::Error::success();
}

// --- DropoutGrad ----------------------------------------------------------

// dX = dY / (1 - ratio) where the mask (the forward op's bool result) kept
// the element, else 0 (selected, so ratio 1 gives 0 rather than NaN).
template <typename T> llvm::Error dropoutGrad(const KernelCall &call) {
  const TensorRef &M = call.inputs[1];
  if (M.dtype != ir::DType::Bool || M.shape != call.inputs[0].shape)
    return kernelError(call, "the mask must be bool and shaped like the "
                             "gradient {0}, not {1} {2}",
                       ir::shapeStr(call.inputs[0].shape),
                       ir::dtypeName(M.dtype), ir::shapeStr(M.shape));
  const T *dy = call.inputs[0].as<T>();
  const bool *mask = M.as<bool>();
  T *dx = call.outputs[0].as<T>();
  T scale = T(1.0 / (1.0 - double(call.getFloat("ratio"))));
  parallelFor(call.outputs[0].numElements(), kGrain,
              [&](int64_t b, int64_t e) {
                for (int64_t i = b; i < e; ++i)
                  dx[i] = mask[i] ? T(dy[i] * scale) : T(0);
              });
  return llvm::Error::success();
}

// --- GatherGrad -----------------------------------------------------------

// dX = zeros(shape) (or the sum operand acc: Ops.def); dX[o, index[k], i]
// += dY[o, k, i], except for the index padding_idx (PyTorch's embedding
// row that never trains). Threads split the (o, i) positions, and each adds
// its k in order, so repeated indices sum in a fixed order. acc may be dX's
// own bytes (the memory plan's in-place sums).
template <typename T> llvm::Error gatherGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &idx = call.inputs[1],
                  &dX = call.outputs[0];
  int64_t axis = normalizedAxis(call, dX.rank());
  if (axis < 0 || axis >= int64_t(dX.rank()))
    return kernelError(call, "axis {0} is out of range for shape {1}",
                       call.getInt("axis"), ir::shapeStr(dX.shape));
  int64_t dim = dX.shape[axis], n = idx.numElements();
  int64_t outer = elementCount(dX.shape.take_front(axis));
  int64_t inner = elementCount(dX.shape.drop_front(axis + 1));
  if (dY.numElements() != outer * n * inner)
    return kernelError(call, "gradient {0} does not match shape {1} gathered "
                             "by indices {2}",
                       ir::shapeStr(dY.shape), ir::shapeStr(dX.shape),
                       ir::shapeStr(idx.shape));
  auto index = gatherIndices(call, idx, dim);
  if (!index)
    return index.takeError();
  int64_t padding = call.getInt("padding_idx");
  const T *dy = dY.as<T>();
  T *dx = dX.as<T>();
  const T *acc = call.inputs.size() > 2 ? call.inputs[2].as<T>() : nullptr;
  parallelFor(outer * inner,
              std::max<int64_t>(64, kGrain / std::max<int64_t>(1, n)),
              [&](int64_t b, int64_t e) {
                for (int64_t p = b; p < e;) {
                  int64_t o = p / inner, i0 = p % inner;
                  int64_t i1 = std::min(inner, i0 + (e - p));
                  T *dst = dx + o * dim * inner;
                  if (!acc)
                    for (int64_t r = 0; r < dim; ++r)
                      std::fill(dst + r * inner + i0, dst + r * inner + i1,
                                T(0));
                  else if (acc != dx)
                    for (int64_t r = 0; r < dim; ++r) {
                      const T *from = acc + (o * dim + r) * inner;
                      std::copy(from + i0, from + i1, dst + r * inner + i0);
                    }
                  for (int64_t k = 0; k < n; ++k) {
                    if ((*index)[k] == padding)
                      continue;
                    const T *src = dy + (o * n + k) * inner;
                    T *row = dst + (*index)[k] * inner;
                    for (int64_t i = i0; i < i1; ++i)
                      row[i] += src[i];
                  }
                  p += i1 - i0;
                }
              });
  return llvm::Error::success();
}

// --- GatherElementsGrad ---------------------------------------------------

// dX = zeros(shape); dX[offset[p]] += dY[p] for every position p of dY
// (the indices' shape). Two positions add to the same element only if they
// agree in every dim but `axis`, so threads split those lanes and each adds
// its positions along the axis in order: the bits do not depend on the
// thread count.
template <typename T> llvm::Error gatherElementsGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &idx = call.inputs[1],
                  &dX = call.outputs[0];
  int64_t rank = dX.rank(), axis = call.getInt("axis");
  if (axis < -rank || axis >= rank)
    return kernelError(call, "axis {0} is out of range for shape {1}", axis,
                       ir::shapeStr(dX.shape));
  if (axis < 0)
    axis += rank;
  if (dY.shape != idx.shape)
    return kernelError(call, "gradient {0} and indices {1} differ",
                       ir::shapeStr(dY.shape), ir::shapeStr(idx.shape));
  auto offsets = gatherElementsOffsets(call, dX.shape, idx, axis);
  if (!offsets)
    return offsets.takeError();
  const T *dy = dY.as<T>();
  T *dx = dX.as<T>();
  std::fill(dx, dx + dX.numElements(), T(0));
  int64_t n = idx.shape[axis];
  int64_t inner = elementCount(idx.shape.drop_front(axis + 1));
  int64_t lanes = n ? idx.numElements() / n : 0;
  parallelFor(lanes, std::max<int64_t>(64, kGrain / std::max<int64_t>(1, n)),
              [&](int64_t b, int64_t e) {
                for (int64_t l = b; l < e; ++l) {
                  int64_t o = l / inner, i = l % inner;
                  for (int64_t k = 0; k < n; ++k) {
                    int64_t p = (o * n + k) * inner + i;
                    dx[(*offsets)[p]] += dy[p];
                  }
                }
              });
  return llvm::Error::success();
}

// --- ScatterNDGradData, ScatterNDGradUpdates --------------------------------

// ScatterND (reduction none) wrote each tuple's slice over data, the later
// tuple winning: data's gradient is dY where no tuple wrote, the updates'
// is dY's slice for the tuple that wrote it last, zero for the overwritten.
struct ScatterSlices {
  std::vector<int64_t> offsets;
  int64_t slice;
};

llvm::Expected<ScatterSlices> scatterSlices(const KernelCall &call,
                                            const TensorRef &dY,
                                            const TensorRef &idx) {
  auto offsets = scatterNDOffsets(call, dY.shape, idx);
  if (!offsets)
    return offsets.takeError();
  return ScatterSlices{std::move(*offsets),
                       elementCount(dY.shape.drop_front(idx.shape.back()))};
}

template <typename T> llvm::Error scatterNDGradData(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &idx = call.inputs[1],
                  &dX = call.outputs[0];
  auto s = scatterSlices(call, dY, idx);
  if (!s)
    return s.takeError();
  const T *dy = dY.as<T>();
  T *dx = dX.as<T>();
  if (dx != dy) // the memory plan may give dX dY's bytes (MemoryPlan.h)
    std::copy(dy, dy + dY.numElements(), dx);
  for (int64_t off : s->offsets)
    std::fill(dx + off, dx + off + s->slice, T(0));
  return llvm::Error::success();
}

template <typename T>
llvm::Error scatterNDGradUpdates(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &idx = call.inputs[1],
                  &dU = call.outputs[0];
  auto s = scatterSlices(call, dY, idx);
  if (!s)
    return s.takeError();
  int64_t tuples = s->offsets.size(), slice = s->slice;
  if (dU.numElements() != tuples * slice)
    return kernelError(call, "updates {0} do not match indices {1} into {2}",
                       ir::shapeStr(dU.shape), ir::shapeStr(idx.shape),
                       ir::shapeStr(dY.shape));
  if (slice == 0)
    return llvm::Error::success();
  const T *dy = dY.as<T>();
  T *du = dU.as<T>();
  // Offsets are multiples of the slice: off / slice names the slice.
  std::vector<char> written(dY.numElements() / slice, 0);
  for (int64_t t = tuples; t-- > 0;) {
    int64_t off = s->offsets[t];
    char &w = written[off / slice];
    if (!w)
      std::copy(dy + off, dy + off + slice, du + t * slice);
    else
      std::fill(du + t * slice, du + (t + 1) * slice, T(0));
    w = 1;
  }
  return llvm::Error::success();
}

// --- SliceGrad ------------------------------------------------------------

// dX = zeros(shape) with dY written where Slice read from, one pass over
// dX a row (its last axis) at a time, rows split over the threads: a row
// the slice did not read is zeroed; a row it read gets its dY row (one copy
// when the last axis is not stepped) and zeros around it. (A fill of all
// of dX on one thread, then a scatter element by element, took 3.2 ms of a
// GPT-2 step at T 1024 for the logits' shift.) With the sum operand acc
// (Ops.def), acc's rows take the zeros' place and dY is added to them;
// where acc is dX's own bytes only the rows the slice read are touched.
template <typename T> llvm::Error sliceGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &dX = call.outputs[0];
  auto view = sliceView(call, dX.shape);
  if (!view)
    return view.takeError();
  const int64_t rank = dX.rank();
  const std::vector<int64_t> &lengths = view->lengths;
  if (llvm::ArrayRef<int64_t>(lengths) != dY.shape)
    return kernelError(call, "gradient {0} does not match the slice {1} of {2}",
                       ir::shapeStr(dY.shape), ir::shapeStr(lengths),
                       ir::shapeStr(dX.shape));
  const T *dy = dY.as<T>();
  T *dx = dX.as<T>();
  const T *acc = call.inputs.size() > 1 ? call.inputs[1].as<T>() : nullptr;
  if (rank == 0) {
    dx[0] = acc ? T(acc[0] + dy[0]) : dy[0];
    return llvm::Error::success();
  }
  const std::vector<int64_t> &first = view->first, &step = view->steps;
  const int64_t cols = dX.shape[rank - 1], rows = dX.numElements() /
                                                  std::max<int64_t>(1, cols);
  const int64_t len = lengths[rank - 1], c0 = first[rank - 1],
                cstep = step[rank - 1];
  const std::vector<int64_t> dyStrides = stridesOf(lengths);
  const bool unitSteps =
      std::all_of(step.begin(), step.end() - 1, [](int64_t s) { return s == 1; });
  // dY's rows into their rows of dX, added or written, rows split over the
  // threads: row r of dY is dX's row at first + k * step per dim, found by
  // an odometer over dY's outer dims (no divisions per row).
  const std::vector<int64_t> dxStrides = stridesOf(dX.shape);
  auto scatterRows = [&](bool add) {
    const int64_t dyRows = dY.numElements() / std::max<int64_t>(1, len);
    parallelFor(
        dyRows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, len)),
        [&](int64_t r0, int64_t r1) {
          std::vector<int64_t> k(size_t(rank - 1));
          int64_t at = c0;
          for (int64_t d = rank - 1, rest = r0; d-- > 0;) {
            k[size_t(d)] = rest % lengths[d];
            rest /= lengths[d];
            at += (first[d] + k[size_t(d)] * step[d]) * dxStrides[d];
          }
          for (int64_t r = r0; r < r1; ++r) {
            const T *src = dy + r * len;
            if (add)
              for (int64_t j = 0; j < len; ++j)
                dx[at + j * cstep] = T(dx[at + j * cstep] + src[j]);
            else
              for (int64_t j = 0; j < len; ++j)
                dx[at + j * cstep] = src[j];
            for (int64_t d = rank - 1; d-- > 0;) {
              at += step[d] * dxStrides[d];
              if (++k[size_t(d)] < lengths[d])
                break;
              at -= lengths[d] * step[d] * dxStrides[d];
              k[size_t(d)] = 0;
            }
          }
        });
  };
  if (acc == dx) {
    // dX is the sum's own bytes: only the rows the slice read change.
    scatterRows(/*add=*/true);
    return llvm::Error::success();
  }
  if (!acc && cols < 16) {
    // Rows of a few elements (a filter's box of taps cut from its kernel:
    // rows of 3 by the million): zeros in one parallel fill, then dY's
    // rows written into place.
    parallelFor(dX.numElements(), 1 << 16, [&](int64_t b, int64_t e) {
      std::fill(dx + b, dx + e, T(0));
    });
    scatterRows(/*add=*/false);
    return llvm::Error::success();
  }
  parallelFor(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)),
              [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> pos(rank - 1);
    for (int64_t d = rank - 1, rest = r0; d-- > 0;) {
      pos[d] = rest % dX.shape[d];
      rest /= dX.shape[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      T *out = dx + r * cols;
      // The dY row this row of dX received, if any (without divisions
      // where the outer dims are not stepped: rows of a few elements, a
      // filter's box of taps, are millions).
      int64_t at = 0;
      bool read = len > 0;
      for (int64_t d = 0; d + 1 < rank && read; ++d) {
        const int64_t diff = pos[d] - first[d];
        if (unitSteps) {
          read = diff >= 0 && diff < lengths[d];
          at += diff * dyStrides[d];
          continue;
        }
        const int64_t k = diff / step[d];
        read = diff % step[d] == 0 && k >= 0 && k < lengths[d];
        at += k * dyStrides[d];
      }
      if (acc) {
        const T *base = acc + r * cols;
        if (base != out)
          std::copy_n(base, cols, out);
        for (int64_t k = 0; read && k < len; ++k)
          out[c0 + k * cstep] = T(out[c0 + k * cstep] + dy[at + k]);
      } else if (!read) {
        std::fill_n(out, cols, T(0));
      } else if (cstep == 1) {
        std::fill_n(out, c0, T(0));
        std::copy_n(dy + at, len, out + c0);
        std::fill(out + c0 + len, out + cols, T(0));
      } else {
        std::fill_n(out, cols, T(0));
        for (int64_t k = 0; k < len; ++k)
          out[c0 + k * cstep] = dy[at + k];
      }
      for (int64_t d = rank - 1; d-- > 0;) {
        if (++pos[d] < dX.shape[d])
          break;
        pos[d] = 0;
      }
    }
  });
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(unaryGradKernel, unaryGrad)
CLEAVE_FLOAT_DISPATCH(sumToKernel, sumTo)
CLEAVE_FLOAT_DISPATCH(softmaxGradKernel, softmaxGrad, /*Log=*/false)
CLEAVE_FLOAT_DISPATCH(logSoftmaxGradKernel, softmaxGrad, /*Log=*/true)
CLEAVE_FLOAT_DISPATCH(softmaxCrossEntropyGradKernel, softmaxCrossEntropyGrad)
CLEAVE_FLOAT_DISPATCH(dropoutGradKernel, dropoutGrad)
CLEAVE_FLOAT_DISPATCH(gatherGradKernel, gatherGrad)
CLEAVE_FLOAT_DISPATCH(gatherElementsGradKernel, gatherElementsGrad)
CLEAVE_FLOAT_DISPATCH(scatterNDGradDataKernel, scatterNDGradData)
CLEAVE_FLOAT_DISPATCH(scatterNDGradUpdatesKernel, scatterNDGradUpdates)
CLEAVE_FLOAT_DISPATCH(sliceGradKernel, sliceGrad)

} // namespace

void registerGradientKernels(KernelTable &t) {
  t.add(ir::OpKind::UnaryGrad, unaryGradKernel, kFloatTypes);
  t.add(ir::OpKind::SumTo, sumToKernel, kFloatTypes);
  t.add(ir::OpKind::SoftmaxGrad, softmaxGradKernel, kFloatTypes);
  t.add(ir::OpKind::LogSoftmaxGrad, logSoftmaxGradKernel, kFloatTypes);
  t.add(ir::OpKind::SoftmaxCrossEntropyLossGrad, softmaxCrossEntropyGradKernel,
        kFloatTypes);
  t.add(ir::OpKind::DropoutGrad, dropoutGradKernel, kFloatTypes);
  t.add(ir::OpKind::GatherGrad, gatherGradKernel, kFloatTypes);
  t.add(ir::OpKind::GatherElementsGrad, gatherElementsGradKernel, kFloatTypes);
  t.add(ir::OpKind::ScatterNDGradData, scatterNDGradDataKernel, kFloatTypes);
  t.add(ir::OpKind::ScatterNDGradUpdates, scatterNDGradUpdatesKernel,
        kFloatTypes);
  t.add(ir::OpKind::SliceGrad, sliceGradKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
