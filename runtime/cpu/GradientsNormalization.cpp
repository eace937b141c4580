// Gradient kernels of LayerNormalization and BatchNormalization for the CPU
// backend: the ...GradData part (dX), the ...GradParams part (dscale) and
// the combined op, which runs the two part kernels (addSplitGradient) so its
// results are the split form's bits.
//
// With x̂ = (x - mean) * inv, inv = 1 / sqrt(var + epsilon) and
// y = x̂ * scale + bias, over the n values one statistic covers:
//   dX     = inv * (g - mean(g) - x̂ * mean(g * x̂)),  g = dY * scale
//   dscale = sum(dY * x̂)
// (BatchNorm in inference mode normalizes with the given running
// statistics, which are constants: dX = dY * scale * inv.) The statistics
// are recomputed from X the way the forward kernels compute them. Sums are
// in double, in a fixed order per output element; threads split rows,
// columns or channels, never a sum.
#include "runtime/cpu/CpuKernels.h"

#include <cmath>

namespace cleave::runtime::cpu {
namespace {

struct Stats {
  double mean, inv;
};

// The sum of f(i) for i in [0, n), in double, with four independent
// accumulators so the additions pipeline (one running sum is a long
// dependency chain); the order is fixed, so the bits are too.
template <typename F> double sum4(int64_t n, F &&f) {
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k)
      s[k] += f(i + k);
  for (; i < n; ++i)
    s[0] += f(i);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// --- LayerNormalization -----------------------------------------------------

// The normalized block [axis:] of X and the rows before it.
struct LayerNormDims {
  int64_t axis, rows, size;
};

llvm::Expected<LayerNormDims> layerNormDims(const KernelCall &call,
                                            const TensorRef &dY,
                                            const TensorRef &X) {
  if (dY.shape != X.shape)
    return kernelError(call, "gradient {0} and X {1} differ",
                       ir::shapeStr(dY.shape), ir::shapeStr(X.shape));
  int64_t rank = X.rank(), axis = call.getInt("axis");
  if (axis < -rank || axis >= rank)
    return kernelError(call, "axis {0} is out of range for X {1}", axis,
                       ir::shapeStr(X.shape));
  if (axis < 0)
    axis += rank;
  return LayerNormDims{axis, elementCount(X.shape.take_front(axis)),
                       elementCount(X.shape.drop_front(axis))};
}

// Mean and 1/sqrt(biased variance + epsilon) of one row (the formulas of
// the LayerNormalization kernel).
template <typename T> Stats rowStats(const T *x, int64_t size, double eps) {
  double sum = sum4(size, [&](int64_t i) { return double(x[i]); });
  double mean = size ? sum / double(size) : 0.0;
  double sq = sum4(size, [&](int64_t i) {
    double d = x[i] - mean;
    return d * d;
  });
  return {mean, 1.0 / std::sqrt((size ? sq / size : 0.0) + eps)};
}

// LayerNormalizationGradData(dY, X, scale) -> dX.
template <typename T> llvm::Error layerNormGradData(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1],
                  &scaleRef = call.inputs[2], &dX = call.outputs[0];
  auto dims = layerNormDims(call, dY, X);
  if (!dims)
    return dims.takeError();
  auto scale =
      broadcastDoubles(call, scaleRef, X.shape.drop_front(dims->axis));
  if (!scale)
    return scale.takeError();
  int64_t size = dims->size;
  double eps = call.getFloat("epsilon");
  const T *x = X.as<T>(), *dy = dY.as<T>();
  T *dx = dX.as<T>();
  parallelFor(dims->rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, size)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r) {
                  const T *xr = x + r * size, *dyr = dy + r * size;
                  Stats s = rowStats(xr, size, eps);
                  double sumG = sum4(size, [&](int64_t i) {
                    return dyr[i] * (*scale)[i];
                  });
                  double sumGX = sum4(size, [&](int64_t i) {
                    return dyr[i] * (*scale)[i] * ((xr[i] - s.mean) * s.inv);
                  });
                  double meanG = sumG / double(size),
                         meanGX = sumGX / double(size);
                  for (int64_t i = 0; i < size; ++i) {
                    double g = dyr[i] * (*scale)[i];
                    double xh = (xr[i] - s.mean) * s.inv;
                    dx[r * size + i] = T(s.inv * (g - meanG - xh * meanGX));
                  }
                }
              });
  return llvm::Error::success();
}

// LayerNormalizationGradParams(dY, X) -> dscale, dscale[j] = sum over rows
// of dY * x̂: row statistics first, then threads take columns and add the
// rows in order.
template <typename T> llvm::Error layerNormGradParams(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1],
                  &dScale = call.outputs[0];
  auto dims = layerNormDims(call, dY, X);
  if (!dims)
    return dims.takeError();
  int64_t rows = dims->rows, size = dims->size;
  if (dScale.numElements() != size)
    return kernelError(call, "dscale {0} does not match the normalized shape "
                             "of X {1}",
                       ir::shapeStr(dScale.shape), ir::shapeStr(X.shape));
  double eps = call.getFloat("epsilon");
  const T *x = X.as<T>(), *dy = dY.as<T>();
  std::vector<Stats> stats(rows);
  parallelFor(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, size)),
              [&](int64_t r0, int64_t r1) {
                for (int64_t r = r0; r < r1; ++r)
                  stats[r] = rowStats(x + r * size, size, eps);
              });
  T *ds = dScale.as<T>();
  parallelFor(size, std::max<int64_t>(16, 8192 / std::max<int64_t>(1, rows)),
              [&](int64_t j0, int64_t j1) {
                std::vector<double> acc(j1 - j0, 0.0);
                for (int64_t r = 0; r < rows; ++r) {
                  const T *xr = x + r * size, *dyr = dy + r * size;
                  for (int64_t j = j0; j < j1; ++j)
                    acc[j - j0] +=
                        dyr[j] * ((xr[j] - stats[r].mean) * stats[r].inv);
                }
                for (int64_t j = j0; j < j1; ++j)
                  ds[j] = T(acc[j - j0]);
              });
  return llvm::Error::success();
}

// --- BatchNormalization -----------------------------------------------------

// X [N, C, spatial...]: channel c's values are the N blocks of `spatial`
// elements at (n * C + c) * spatial.
struct BatchNormDims {
  int64_t n, c, spatial;
};

llvm::Expected<BatchNormDims>
batchNormDims(const KernelCall &call, const TensorRef &dY, const TensorRef &X,
              std::initializer_list<const TensorRef *> perChannel) {
  if (dY.shape != X.shape || X.rank() < 2)
    return kernelError(call, "gradient {0} and X {1} differ or X has rank < 2",
                       ir::shapeStr(dY.shape), ir::shapeStr(X.shape));
  BatchNormDims d{X.shape[0], X.shape[1], elementCount(X.shape.drop_front(2))};
  for (const TensorRef *t : perChannel)
    if (t->numElements() != d.c)
      return kernelError(call, "per-channel operand {0} does not have {1} "
                               "elements",
                         ir::shapeStr(t->shape), d.c);
  return d;
}

// The sum of f(offset) over the offsets of channel ch's values, image by
// image.
template <typename F>
double channelSum(const BatchNormDims &d, int64_t ch, F &&f) {
  double sum = 0;
  for (int64_t i = 0; i < d.n; ++i) {
    int64_t base = (i * d.c + ch) * d.spatial;
    sum += sum4(d.spatial, [&](int64_t k) { return f(base + k); });
  }
  return sum;
}

// The sums over channel ch of dY, dY * (x - mean) and, in training mode,
// (x - mean)^2, in one pass (four lanes each, images in order).
struct CenteredSums {
  double dy = 0, dyCentered = 0, squares = 0;
};
template <typename T>
CenteredSums centeredSums(const T *dy, const T *x, const BatchNormDims &d,
                          int64_t ch, double mean, bool squares) {
  CenteredSums out;
  for (int64_t i = 0; i < d.n; ++i) {
    const T *xs = x + (i * d.c + ch) * d.spatial;
    const T *gs = dy + (i * d.c + ch) * d.spatial;
    double g[4] = {0, 0, 0, 0}, gc[4] = {0, 0, 0, 0}, sq[4] = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= d.spatial; k += 4)
      for (int l = 0; l < 4; ++l) {
        double c = double(xs[k + l]) - mean, v = double(gs[k + l]);
        g[l] += v;
        gc[l] += v * c;
        sq[l] += c * c;
      }
    for (; k < d.spatial; ++k) {
      double c = double(xs[k]) - mean, v = double(gs[k]);
      g[0] += v;
      gc[0] += v * c;
      sq[0] += c * c;
    }
    out.dy += (g[0] + g[1]) + (g[2] + g[3]);
    out.dyCentered += (gc[0] + gc[1]) + (gc[2] + gc[3]);
    if (squares)
      out.squares += (sq[0] + sq[1]) + (sq[2] + sq[3]);
  }
  return out;
}

// The batch mean of channel ch.
template <typename T>
double channelMean(const T *x, const BatchNormDims &d, int64_t ch) {
  double count = double(d.n * d.spatial);
  return count ? channelSum(d, ch, [&](int64_t o) { return double(x[o]); }) /
                     count
               : 0.0;
}

// Runs f(channel) for every channel, channels spread over threads.
template <typename F> void forEachChannel(const BatchNormDims &d, F &&f) {
  int64_t perChannel = std::max<int64_t>(1, d.n * d.spatial);
  parallelFor(d.c, std::max<int64_t>(1, 8192 / perChannel),
              [&](int64_t c0, int64_t c1) {
                for (int64_t ch = c0; ch < c1; ++ch)
                  f(ch);
              });
}

// BatchNormalizationGradData(dY, X, scale, mean, var) -> dX.
template <typename T> llvm::Error batchNormGradData(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1],
                  &scaleRef = call.inputs[2], &meanRef = call.inputs[3],
                  &varRef = call.inputs[4], &dX = call.outputs[0];
  auto d = batchNormDims(call, dY, X, {&scaleRef, &meanRef, &varRef});
  if (!d)
    return d.takeError();
  std::vector<double> scale = readDoubles(scaleRef),
                      runMean = readDoubles(meanRef),
                      runVar = readDoubles(varRef);
  bool training = call.getInt("training_mode");
  double eps = call.getFloat("epsilon");
  double count = double(d->n * d->spatial);
  const T *x = X.as<T>(), *dy = dY.as<T>();
  T *dx = dX.as<T>();
  forEachChannel(*d, [&](int64_t ch) {
    // Training mode also flows through the batch statistics: the mean, then
    // one pass for the variance and the two sums of dY.
    Stats s{runMean[ch], 1.0 / std::sqrt(runVar[ch] + eps)};
    double meanDY = 0, meanDYX = 0;
    if (training && count) {
      s.mean = channelMean(x, *d, ch);
      CenteredSums sums = centeredSums(dy, x, *d, ch, s.mean, true);
      s.inv = 1.0 / std::sqrt(sums.squares / count + eps);
      meanDY = sums.dy / count;
      meanDYX = sums.dyCentered * s.inv / count;
    }
    double a = scale[ch] * s.inv;
    for (int64_t i = 0; i < d->n; ++i) {
      int64_t base = (i * d->c + ch) * d->spatial;
      for (int64_t k = 0; k < d->spatial; ++k) {
        double xh = (x[base + k] - s.mean) * s.inv;
        dx[base + k] = T(a * (dy[base + k] - meanDY - xh * meanDYX));
      }
    }
  });
  return llvm::Error::success();
}

// BatchNormalizationGradParams(dY, X, mean, var) -> dscale.
template <typename T> llvm::Error batchNormGradParams(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1],
                  &meanRef = call.inputs[2], &varRef = call.inputs[3],
                  &dScale = call.outputs[0];
  auto d = batchNormDims(call, dY, X, {&meanRef, &varRef, &dScale});
  if (!d)
    return d.takeError();
  std::vector<double> runMean = readDoubles(meanRef),
                      runVar = readDoubles(varRef);
  bool training = call.getInt("training_mode");
  double eps = call.getFloat("epsilon");
  const T *x = X.as<T>(), *dy = dY.as<T>();
  double count = double(d->n * d->spatial);
  forEachChannel(*d, [&](int64_t ch) {
    // dscale = sum of dY * x̂ = inv * sum of dY * (x - mean): the mean, then
    // one pass for the variance and that sum.
    double mean = training && count ? channelMean(x, *d, ch) : runMean[ch];
    CenteredSums sums = centeredSums(dy, x, *d, ch, mean, training);
    double var = training ? (count ? sums.squares / count : 0.0) : runVar[ch];
    storeDouble(dScale, ch, sums.dyCentered / std::sqrt(var + eps));
  });
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(layerNormGradDataKernel, layerNormGradData)
CLEAVE_FLOAT_DISPATCH(layerNormGradParamsKernel, layerNormGradParams)
CLEAVE_FLOAT_DISPATCH(batchNormGradDataKernel, batchNormGradData)
CLEAVE_FLOAT_DISPATCH(batchNormGradParamsKernel, batchNormGradParams)

} // namespace

void registerNormalizationGradientKernels(KernelTable &t) {
  using ir::OpKind;
  // LayerNormalizationGrad(dY, X, scale) -> dX, dscale.
  addSplitGradient(
      t, OpKind::LayerNormalizationGrad,
      {OpKind::LayerNormalizationGradData, layerNormGradDataKernel, {0, 1, 2}},
      {OpKind::LayerNormalizationGradParams, layerNormGradParamsKernel, {0, 1}},
      kFloatTypes);
  // BatchNormalizationGrad(dY, X, scale, mean, var) -> dX, dscale.
  addSplitGradient(t, OpKind::BatchNormalizationGrad,
                   {OpKind::BatchNormalizationGradData, batchNormGradDataKernel,
                    {0, 1, 2, 3, 4}},
                   {OpKind::BatchNormalizationGradParams,
                    batchNormGradParamsKernel, {0, 1, 3, 4}},
                   kFloatTypes);
}

} // namespace cleave::runtime::cpu
