// Softmax, normalization, loss and dropout kernels for the CPU backend.
//
// These ops reduce along one axis and then rescale, so every kernel works on
// "lanes": the values along the reduced axis for one position of the other
// axes. Sums, means and variances are accumulated in double whatever the
// element type, which keeps f32 results within an ulp or two of a double
// reference. Parameter tensors (scale, bias, running statistics, class
// weights) may be a different float type than X in ONNX, so they are read
// into doubles first. Semantics follow ONNX opset 13 and later (the importer
// translates older Softmax forms).
#include "runtime/cpu/CpuKernels.h"
#include "runtime/cpu/VectorMath.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

namespace cleave::runtime::cpu {
namespace {

// --- Softmax, LogSoftmax --------------------------------------------------

template <typename T, bool Log> llvm::Error softmax(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t axis = normalizedAxis(call, X.rank());
  int64_t len = X.shape[axis],
          inner = elementCount(X.shape.drop_front(axis + 1));
  int64_t lanes = elementCount(X.shape.take_front(axis)) * inner;
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  parallelFor(lanes, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, len)),
              [&](int64_t l0, int64_t l1) {
                for (int64_t l = l0; l < l1; ++l) {
                  int64_t base = (l / inner) * len * inner + l % inner;
                  const T *xl = x + base;
                  T *yl = y + base;
                  T max = -std::numeric_limits<T>::infinity();
                  for (int64_t j = 0; j < len; ++j)
                    max = std::max(max, xl[j * inner]);
                  if (inner == 1) { // a contiguous row: exp in vector lanes
                    if constexpr (!Log && std::is_same_v<T, float>) {
                      // One pass of exps into y, then y scaled.
                      double sum = expShiftedSum(xl, len, double(max), yl);
                      float scale = float(1.0 / sum);
                      for (int64_t j = 0; j < len; ++j)
                        yl[j] *= scale;
                      continue;
                    }
                    double sum = sumExpShifted(xl, len, double(max));
                    if constexpr (Log) {
                      double shift = double(max) + std::log(sum);
                      for (int64_t j = 0; j < len; ++j)
                        yl[j] = T(double(xl[j]) - shift);
                    } else {
                      expShifted(xl, len, double(max), 1.0 / sum, yl);
                    }
                    continue;
                  }
                  double sum = 0;
                  for (int64_t j = 0; j < len; ++j) {
                    T e = std::exp(xl[j * inner] - max);
                    sum += e;
                    if constexpr (!Log)
                      yl[j * inner] = e;
                  }
                  if constexpr (Log) {
                    double shift = double(max) + std::log(sum);
                    for (int64_t j = 0; j < len; ++j)
                      yl[j * inner] = T(double(xl[j * inner]) - shift);
                  } else {
                    double scale = 1.0 / sum;
                    for (int64_t j = 0; j < len; ++j)
                      yl[j * inner] = T(yl[j * inner] * scale);
                  }
                }
              });
  return llvm::Error::success();
}

// --- LayerNormalization ---------------------------------------------------

// Row i's y = (x - mean) * inv * scale + bias (RMS: x * inv * scale, with
// mean 0 and bias null), in double, eight elements a vector where T is
// float (the per-element expression's operations in its order, so the
// tail's bits are the vector's).
template <typename T, bool Wide>
[[gnu::always_inline]] inline void normalizeRow(const T *xr, T *yr,
                                                int64_t size, double mean,
                                                double inv, const double *scale,
                                                const double *bias) {
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>)
    for (; i + 8 <= size; i += 8) {
      auto v = (loadDouble8W<Wide>(xr + i) - mean) * inv *
               loadDouble8W<Wide>(scale + i);
      if (bias)
        v += loadDouble8W<Wide>(bias + i);
      storeLanes8(yr + i, v);
    }
  for (; i < size; ++i) {
    double v = (xr[i] - mean) * inv * scale[i];
    yr[i] = T(bias ? v + bias[i] : v);
  }
}

// Rows [r0, r1) of the LayerNormalization forward; built for AVX-512
// (Wide) and as CLEAVE_VECTOR_CLONES for the others (CpuKernels.h,
// CLEAVE_WIDE_TARGET).
template <typename T, bool Wide>
[[gnu::always_inline]] inline void
layerNormRowsLanes(const T *x, T *y, int64_t r0, int64_t r1, int64_t size,
                   double eps, const double *scale, const double *bias,
                   float *meanOut, float *invOut) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *xr = x + r * size;
    auto [mean, inv] = layerNormRowStats<T, Wide>(xr, size, eps);
    normalizeRow<T, Wide>(xr, y + r * size, size, mean, inv, scale, bias);
    if (meanOut)
      meanOut[r] = float(mean);
    if (invOut)
      invOut[r] = float(inv);
  }
}
CLEAVE_WIDE_BUILDS(layerNormRows, (typename T), (T),
                   (const T *x, T *y, int64_t r0, int64_t r1, int64_t size,
                    double eps, const double *scale, const double *bias,
                    float *meanOut, float *invOut),
                   (x, y, r0, r1, size, eps, scale, bias, meanOut, invOut))
template <typename T>
void layerNormRows(const T *x, T *y, int64_t r0, int64_t r1, int64_t size,
                   double eps, const double *scale, const double *bias,
                   float *meanOut, float *invOut) {
  if (cpuHasAvx512F())
    layerNormRowsWide(x, y, r0, r1, size, eps, scale, bias, meanOut, invOut);
  else
    layerNormRowsNarrow(x, y, r0, r1, size, eps, scale, bias, meanOut, invOut);
}

template <typename T> llvm::Error layerNorm(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t axis = normalizedAxis(call, X.rank());
  llvm::ArrayRef<int64_t> normShape = X.shape.drop_front(axis);
  int64_t rows = elementCount(X.shape.take_front(axis)),
          size = elementCount(normShape);
  auto scaleOr = broadcastDoubles(call, call.inputs[1], normShape);
  if (!scaleOr)
    return scaleOr.takeError();
  auto biasOr = call.inputs.size() == 3
                    ? broadcastDoubles(call, call.inputs[2], normShape)
                    : std::vector<double>(size, 0.0);
  if (!biasOr)
    return biasOr.takeError();
  const std::vector<double> &scale = *scaleOr, &bias = *biasOr;
  double eps = call.getFloatFor<T>("epsilon");
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  // Mean and InvStdDev are always f32, shaped [rows..., 1, ...].
  float *meanOut =
      call.outputs.size() > 1 ? call.outputs[1].as<float>() : nullptr;
  float *invOut =
      call.outputs.size() > 2 ? call.outputs[2].as<float>() : nullptr;
  parallelFor(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, size)),
              [&](int64_t r0, int64_t r1) {
                layerNormRows(x, y, r0, r1, size, eps, scale.data(),
                              bias.data(), meanOut, invOut);
              });
  return llvm::Error::success();
}

// --- RMSNormalization -----------------------------------------------------

// Rows [r0, r1) of y = x * inv * scale (built as layerNormRows).
template <typename T, bool Wide>
[[gnu::always_inline]] inline void rmsNormRowsLanes(const T *x, T *y,
                                                    int64_t r0, int64_t r1,
                                                    int64_t size, double eps,
                                                    const double *scale) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *xr = x + r * size;
    // x - 0.0 is exact: the bits of double(x) * inv * scale.
    normalizeRow<T, Wide>(xr, y + r * size, size, 0.0,
                          rmsRowInv<T, Wide>(xr, size, eps), scale, nullptr);
  }
}
CLEAVE_WIDE_BUILDS(rmsNormRows, (typename T), (T),
                   (const T *x, T *y, int64_t r0, int64_t r1, int64_t size,
                    double eps, const double *scale),
                   (x, y, r0, r1, size, eps, scale))

template <typename T>
void rmsNormRows(const T *x, T *y, int64_t r0, int64_t r1, int64_t size,
                 double eps, const double *scale) {
  if (cpuHasAvx512F())
    rmsNormRowsWide(x, y, r0, r1, size, eps, scale);
  else
    rmsNormRowsNarrow(x, y, r0, r1, size, eps, scale);
}

// y = x * inv * scale, inv = 1 / sqrt(mean(x^2) + epsilon) over the row
// (the normalized dims), summed in double in index order; the gradient
// kernels recompute inv with rmsRowInv (GradientsNormalization.cpp) the
// same way.
template <typename T> llvm::Error rmsNorm(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t axis = normalizedAxis(call, X.rank());
  llvm::ArrayRef<int64_t> normShape = X.shape.drop_front(axis);
  int64_t rows = elementCount(X.shape.take_front(axis)),
          size = elementCount(normShape);
  auto scaleOr = broadcastDoubles(call, call.inputs[1], normShape);
  if (!scaleOr)
    return scaleOr.takeError();
  const std::vector<double> &scale = *scaleOr;
  double eps = call.getFloatFor<T>("epsilon");
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  parallelFor(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, size)),
              [&](int64_t r0, int64_t r1) {
                rmsNormRows(x, y, r0, r1, size, eps, scale.data());
              });
  return llvm::Error::success();
}

// --- BatchNormalization ---------------------------------------------------

// Inference normalizes with the given statistics. Training (training_mode=1)
// normalizes with the batch's mean and population variance and, with three
// outputs, returns running = input * momentum + batch * (1 - momentum) for
// both, as ONNX specifies (population variance there too), or with the
// unbiased variance in running_var when unbiased_running_var is set (what
// PyTorch's train() does; the importer sets it for PyTorch's exports).

// The mean and the sum of squared deviations of p[0..n) in one pass, in
// double: sums of d = p[i] - K and d^2 about the row's first value K, then
// M2 = sum d^2 - (sum d)^2 / n. K is one of the row's values, so the
// shifted sums stay near the deviations themselves and the subtraction
// loses little (in double, nothing a float result sees). Eight lanes per
// sum (one running sum is one long dependency chain).
struct RowMoments {
  double mean = 0, m2 = 0;
};
template <typename T, bool Wide>
[[gnu::always_inline]] inline RowMoments rowMoments(const T *p, int64_t n) {
  if (n == 0)
    return {};
  double k = double(p[0]);
  DoubleLanes<Wide> s = {}, sq = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    auto d = loadDouble8W<Wide>(p + i) - k;
    s += d;
    sq += d * d;
  }
  double sTail = 0, sqTail = 0;
  for (; i < n; ++i) {
    double d = double(p[i]) - k;
    sTail += d;
    sqTail += d * d;
  }
  double sum = laneSum(s) + sTail, squares = laneSum(sq) + sqTail;
  return {k + sum / double(n), std::max(0.0, squares - sum * sum / double(n))};
}

// rowMoments of rows [r0, r1), built as layerNormRows.
template <typename T, bool Wide>
[[gnu::always_inline]] inline void
rowMomentsLanes(const T *x, int64_t r0, int64_t r1, int64_t spatial,
                double *rowMean, double *rowM2) {
  for (int64_t r = r0; r < r1; ++r) {
    RowMoments mo = rowMoments<T, Wide>(x + r * spatial, spatial);
    rowMean[r] = mo.mean;
    rowM2[r] = mo.m2;
  }
}
CLEAVE_WIDE_BUILDS(rowMoments, (typename T), (T),
                   (const T *x, int64_t r0, int64_t r1, int64_t spatial,
                    double *rowMean, double *rowM2),
                   (x, r0, r1, spatial, rowMean, rowM2))

// Batch mean and population variance per channel of x [n, c, spatial].
// Every (image, channel) row gets its own mean and squared deviations about
// it (rowMoments, one pass), and the rows
// of a channel are then combined exactly (Chan et al.: M2 = sum of the rows'
// M2 + spatial * sum of (row mean - mean)^2). Working row by row splits the
// batch over threads by image, as the ops around BatchNorm do, so each
// thread reads what it wrote.
template <typename T>
void batchMoments(const T *x, int64_t n, int64_t c, int64_t spatial,
                  std::vector<double> &mean, std::vector<double> &var) {
  std::vector<double> rowMean(n * c), rowM2(n * c);
  const bool wide = cpuHasAvx512F();
  parallelFor(n * c, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, spatial)),
              [&](int64_t r0, int64_t r1) {
                if (wide)
                  rowMomentsWide(x, r0, r1, spatial, rowMean.data(),
                                 rowM2.data());
                else
                  rowMomentsNarrow(x, r0, r1, spatial, rowMean.data(),
                                   rowM2.data());
              });
  for (int64_t ch = 0; ch < c; ++ch) {
    double mu = 0, m2 = 0;
    for (int64_t i = 0; i < n; ++i)
      mu += rowMean[i * c + ch];
    mu = n ? mu / double(n) : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      double d = rowMean[i * c + ch] - mu;
      m2 += rowM2[i * c + ch] + double(spatial) * d * d;
    }
    mean[ch] = mu;
    var[ch] = n > 0 && spatial > 0 ? m2 / double(n * spatial) : 0.0;
  }
}

// Rows [r0, r1) of y = x * a + shift, a and shift the row's channel's; in
// T, built for the CPU's vector width (a lambda's loop is the baseline's
// SSE2).
template <typename T>
CLEAVE_VECTOR_CLONES void batchNormApplyRows(const T *x, T *y, int64_t r0,
                                             int64_t r1, int64_t c,
                                             int64_t spatial, const T *a,
                                             const T *shift) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *p = x + r * spatial;
    T *q = y + r * spatial;
    T ar = a[r % c], br = shift[r % c];
    for (int64_t s = 0; s < spatial; ++s)
      q[s] = p[s] * ar + br;
  }
}

template <typename T> llvm::Error batchNorm(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t n = X.shape[0], c = X.shape[1],
          spatial = elementCount(X.shape.drop_front(2));
  std::vector<double> scale = readDoubles(call.inputs[1]),
                      bias = readDoubles(call.inputs[2]),
                      mean = readDoubles(call.inputs[3]),
                      var = readDoubles(call.inputs[4]);
  bool training = call.getInt("training_mode");
  double eps = call.getFloatFor<T>("epsilon"),
         momentum = call.getFloatFor<T>("momentum");
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();

  std::vector<double> mu = mean, sigma2 = var;
  if (training)
    batchMoments(x, n, c, spatial, mu, sigma2);
  // y = x * a + shift per channel: one multiply-add per element, in T (in
  // double it would convert every element there and back).
  std::vector<T> a(c), shift(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = scale[ch] / std::sqrt(sigma2[ch] + eps);
    a[ch] = T(s);
    shift[ch] = T(bias[ch] - mu[ch] * s);
  }
  parallelFor(n * c,
              std::max<int64_t>(1, 16384 / std::max<int64_t>(1, spatial)),
              [&](int64_t r0, int64_t r1) {
                batchNormApplyRows(x, y, r0, r1, c, spatial, a.data(),
                                   shift.data());
              });
  // n / (n - 1) over the n values a channel's statistics saw.
  int64_t count = n * spatial;
  double unbias = call.getInt("unbiased_running_var") && count > 1
                      ? double(count) / double(count - 1)
                      : 1.0;
  if (call.outputs.size() == 3)
    for (int64_t ch = 0; ch < c; ++ch) {
      double runMean =
          training ? mean[ch] * momentum + mu[ch] * (1.0 - momentum) : mean[ch];
      double runVar = training
                          ? var[ch] * momentum +
                                sigma2[ch] * unbias * (1.0 - momentum)
                          : var[ch];
      storeDouble(call.outputs[1], ch, runMean);
      storeDouble(call.outputs[2], ch, runVar);
    }
  return llvm::Error::success();
}

// --- SoftmaxCrossEntropyLoss ----------------------------------------------

// scores [N, C, d...], labels [N, d...]. Per position: loss = -weight[label]
// * log_softmax(scores)[label], 0 where label == ignore_index. "mean"
// divides the sum by the summed weights of the positions not ignored (their
// count without weights); with every position ignored that is 0/0 = NaN,
// as in ONNX's reference and PyTorch.
template <typename T> llvm::Error softmaxCrossEntropy(const KernelCall &call) {
  const TensorRef &S = call.inputs[0], &L = call.inputs[1];
  int64_t n = S.shape[0], classes = S.shape[1];
  int64_t inner = elementCount(S.shape.drop_front(2)), lanes = n * inner;
  std::vector<int64_t> labels(lanes);
  dispatchType(L.dtype, [&](auto v) {
    using Label = decltype(v);
    const Label *p = L.as<Label>();
    for (int64_t i = 0; i < lanes; ++i)
      labels[i] = int64_t(p[i]);
  });
  std::optional<int64_t> ignore;
  if (call.hasAttr("ignore_index"))
    ignore = call.getInt("ignore_index");
  for (int64_t i = 0; i < lanes; ++i)
    if ((!ignore || labels[i] != *ignore) &&
        (labels[i] < 0 || labels[i] >= classes))
      return kernelError(call,
                         "label {0} at position {1} is out of range "
                         "[0, {2})",
                         labels[i], i, classes);
  std::vector<double> weights = call.inputs.size() == 3
                                    ? readDoubles(call.inputs[2])
                                    : std::vector<double>(classes, 1.0);

  const T *s = S.as<T>();
  T *logProb = call.outputs.size() > 1 ? call.outputs[1].as<T>() : nullptr;
  std::vector<double> loss(lanes, 0.0);
  parallelFor(lanes, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, classes)),
              [&](int64_t l0, int64_t l1) {
                for (int64_t l = l0; l < l1; ++l) {
                  bool ignored = ignore && labels[l] == *ignore;
                  if (ignored && !logProb)
                    continue;
                  int64_t base = (l / inner) * classes * inner + l % inner;
                  const T *sl = s + base;
                  double max = -std::numeric_limits<double>::infinity();
                  if (inner == 1) // exact; NaN where one is (the loss is
                    max = rowMax(sl, classes); // NaN either way)
                  else
                    for (int64_t j = 0; j < classes; ++j)
                      max = std::max(max, double(sl[j * inner]));
                  double sum = 0;
                  if (inner == 1) // contiguous classes: exp in vector lanes
                    sum = sumExpShifted(sl, classes, max);
                  else
                    for (int64_t j = 0; j < classes; ++j)
                      sum += std::exp(double(sl[j * inner]) - max);
                  double shift = max + std::log(sum);
                  if (logProb)
                    for (int64_t j = 0; j < classes; ++j)
                      logProb[base + j * inner] =
                          T(double(sl[j * inner]) - shift);
                  if (!ignored)
                    loss[l] = -(double(sl[labels[l] * inner]) - shift) *
                              weights[labels[l]];
                }
              });

  T *out = call.outputs[0].as<T>();
  const std::string &reduction = call.getString("reduction");
  if (reduction == "none") {
    for (int64_t i = 0; i < lanes; ++i)
      out[i] = T(loss[i]);
    return llvm::Error::success();
  }
  double total = 0, weightSum = 0;
  for (int64_t i = 0; i < lanes; ++i) {
    total += loss[i];
    if (!ignore || labels[i] != *ignore)
      weightSum += weights[labels[i]];
  }
  out[0] = T(reduction == "sum" ? total : total / weightSum);
  return llvm::Error::success();
}

// --- Dropout --------------------------------------------------------------

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Training mode keeps each element with probability 1 - ratio and scales the
// kept ones by 1 / (1 - ratio). The draw for element i is a hash of the
// call's seed and i alone (counter-based), so the mask is the same whatever
// the thread count and can be recomputed from the seed.
template <typename T> llvm::Error dropout(const KernelCall &call) {
  const TensorRef &X = call.inputs[0];
  int64_t size = X.numElements();
  const T *x = X.as<T>();
  T *y = call.outputs[0].as<T>();
  bool *mask = call.outputs.size() > 1 ? call.outputs[1].as<bool>() : nullptr;
  double ratio = call.getFloat("ratio");
  if (!call.getInt("training_mode") || ratio == 0.0) {
    std::copy(x, x + size, y);
    if (mask)
      std::fill(mask, mask + size, true);
    return llvm::Error::success();
  }
  uint64_t key = splitmix64(call.seed);
  T scale = T(1.0 / (1.0 - ratio));
  parallelFor(size, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      double u = double(splitmix64(key ^ uint64_t(i)) >> 11) * 0x1.0p-53;
      bool keep = u >= ratio;
      y[i] = keep ? T(x[i] * scale) : T(0);
      if (mask)
        mask[i] = keep;
    }
  });
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(softmaxKernel, softmax, /*Log=*/false)
CLEAVE_FLOAT_DISPATCH(logSoftmaxKernel, softmax, /*Log=*/true)
CLEAVE_FLOAT_DISPATCH(layerNormKernel, layerNorm)
CLEAVE_FLOAT_DISPATCH(rmsNormKernel, rmsNorm)
CLEAVE_FLOAT_DISPATCH(batchNormKernel, batchNorm)
CLEAVE_FLOAT_DISPATCH(softmaxCrossEntropyKernel, softmaxCrossEntropy)
CLEAVE_FLOAT_DISPATCH(dropoutKernel, dropout)

} // namespace

// Shared with the LayerNormalization gradients (CpuKernels.h).
llvm::Expected<std::vector<double>>
broadcastDoubles(const KernelCall &call, const TensorRef &t,
                 llvm::ArrayRef<int64_t> shape) {
  size_t r = shape.size();
  if (t.rank() > r)
    return kernelError(call, "{0} does not broadcast to {1}",
                       ir::shapeStr(t.shape), ir::shapeStr(shape));
  size_t lead = r - t.rank();
  for (size_t d = lead; d < r; ++d)
    if (t.shape[d - lead] != 1 && t.shape[d - lead] != shape[d])
      return kernelError(call, "{0} does not broadcast to {1}",
                         ir::shapeStr(t.shape), ir::shapeStr(shape));
  std::vector<int64_t> srcStrides = stridesOf(t.shape);
  std::vector<double> out(elementCount(shape));
  for (int64_t i = 0; i < int64_t(out.size()); ++i) {
    int64_t rest = i, off = 0;
    for (size_t d = r; d-- > lead;) {
      int64_t c = rest % shape[d];
      rest /= shape[d];
      if (t.shape[d - lead] != 1)
        off += c * srcStrides[d - lead];
    }
    out[i] = loadDouble(t, off);
  }
  return out;
}

void registerNormalizationKernels(KernelTable &t) {
  t.add(ir::OpKind::Softmax, softmaxKernel, kFloatTypes);
  t.add(ir::OpKind::LogSoftmax, logSoftmaxKernel, kFloatTypes);
  t.add(ir::OpKind::LayerNormalization, layerNormKernel, kFloatTypes);
  t.add(ir::OpKind::RMSNormalization, rmsNormKernel, kFloatTypes);
  t.add(ir::OpKind::BatchNormalization, batchNormKernel, kFloatTypes);
  t.add(ir::OpKind::SoftmaxCrossEntropyLoss, softmaxCrossEntropyKernel,
        kFloatTypes);
  t.add(ir::OpKind::Dropout, dropoutKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
