// Gradient kernels of LayerNormalization, RMSNormalization and
// BatchNormalization for the CPU backend: the ...GradData part (dX), the
// ...GradParams part (dscale) and the combined op, kept whole by
// split-backward, whose kernel computes what the parts share once (a row's
// statistics, a channel's sums); its results are the split form's bits.
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

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

namespace cleave::runtime::cpu {
namespace {

using Stats = RowStats;

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

// The forward kernels' row statistics (CpuKernels.h): LayerNormalization's
// (Centered), or RMSNormalization's in LayerNormalization's form, a mean of
// 0 (x - 0.0 is exact, so x̂ = (x - mean) * inv has the bits of x * inv).
template <typename T, bool Centered, bool Wide>
[[gnu::always_inline]] inline Stats statsOf(const T *x, int64_t size,
                                            double eps) {
  if constexpr (Centered)
    return layerNormRowStats<T, Wide>(x, size, eps);
  else
    return Stats{0.0, rmsRowInv<T, Wide>(x, size, eps)};
}

// LayerNormalizationGradData and RMSNormalizationGradData(dY, X, scale) ->
// dX = inv * (g - mean(g) - x̂ * mean(g * x̂)), g = dY * scale; RMS
// (Centered false) has no mean(g) term (g - 0.0 is exact, so the bits are
// those of the formula without it).
// One row of dX from the row's statistics `s`; with AddParams, also
// acc[j] += dY * x̂ in the same loop (normalizedColumnSums' terms and
// order). mean(g) and mean(g * x̂) are summed in one pass, each in
// sumLanes16's order. normGradDataRows does rows [r0, r1), built for
// AVX-512 (Wide) and as CLEAVE_VECTOR_CLONES for the others (CpuKernels.h,
// CLEAVE_WIDE_TARGET), eight doubles a vector.
template <typename T, bool Centered, bool Wide, bool AddParams = false>
[[gnu::always_inline]] inline void
normGradDataRow(const T *xr, const T *dyr, const double *scale, T *dxr,
                int64_t size, const Stats s, double *acc = nullptr) {
  double sumG = 0.0, sumGX;
  auto gxLanes = [&](int64_t i) {
    return loadDouble8W<Wide>(dyr + i) * loadDouble8W<Wide>(scale + i) *
           ((loadDouble8W<Wide>(xr + i) - s.mean) * s.inv);
  };
  auto gxOne = [&](int64_t i) {
    return dyr[i] * scale[i] * ((xr[i] - s.mean) * s.inv);
  };
  if constexpr (Centered) {
    std::tie(sumG, sumGX) = sumLanes16Pair(
        size,
        [&](int64_t i) {
          return std::pair{loadDouble8W<Wide>(dyr + i) *
                               loadDouble8W<Wide>(scale + i),
                           gxLanes(i)};
        },
        [&](int64_t i) { return std::pair{dyr[i] * scale[i], gxOne(i)}; });
  } else {
    sumGX = sumLanes16(size, gxLanes, gxOne);
  }
  double meanG = sumG / double(size), meanGX = sumGX / double(size);
  int64_t i = 0;
  if constexpr (std::is_same_v<T, float>)
    for (; i + 8 <= size; i += 8) {
      auto dy = loadDouble8W<Wide>(dyr + i);
      auto g = dy * loadDouble8W<Wide>(scale + i);
      auto xh = (loadDouble8W<Wide>(xr + i) - s.mean) * s.inv;
      storeLanes8(dxr + i, s.inv * (g - meanG - xh * meanGX));
      if constexpr (AddParams)
        storeLanes8(acc + i, loadDouble8W<Wide>(acc + i) + dy * xh);
    }
  for (; i < size; ++i) {
    double g = dyr[i] * scale[i];
    double xh = (xr[i] - s.mean) * s.inv;
    dxr[i] = T(s.inv * (g - meanG - xh * meanGX));
    if constexpr (AddParams)
      acc[i] += dyr[i] * xh;
  }
}
template <typename T, bool Centered, bool Wide>
[[gnu::always_inline]] inline void
normGradDataRowsLanes(const T *x, const T *dy, const double *scale, T *dx,
                      int64_t r0, int64_t r1, int64_t size, double eps) {
  for (int64_t r = r0; r < r1; ++r)
    normGradDataRow<T, Centered, Wide>(
        x + r * size, dy + r * size, scale, dx + r * size, size,
        statsOf<T, Centered, Wide>(x + r * size, size, eps));
}
CLEAVE_WIDE_BUILDS(normGradDataRows, (typename T, bool Centered),
                   (T, Centered),
                   (const T *x, const T *dy, const double *scale, T *dx,
                    int64_t r0, int64_t r1, int64_t size, double eps),
                   (x, dy, scale, dx, r0, r1, size, eps))

template <typename T, bool Centered>
llvm::Error normGradData(const KernelCall &call) {
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
  double eps = call.getFloatFor<T>("epsilon");
  const T *x = X.as<T>(), *dy = dY.as<T>();
  T *dx = dX.as<T>();
  const bool wide = cpuHasAvx512F();
  parallelFor(dims->rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, size)),
              [&](int64_t r0, int64_t r1) {
                if (wide)
                  normGradDataRowsWide<T, Centered>(x, dy, scale->data(), dx,
                                                    r0, r1, size, eps);
                else
                  normGradDataRowsNarrow<T, Centered>(x, dy, scale->data(), dx,
                                                      r0, r1, size, eps);
              });
  return llvm::Error::success();
}

template <typename T> llvm::Error layerNormGradData(const KernelCall &call) {
  return normGradData<T, true>(call);
}

// LayerNormalizationGradParams and RMSNormalizationGradParams(dY, X) ->
// dscale, dscale[j] = sum over rows of dY * x̂ with x̂ = (x - mean) * inv
// (RMS: mean 0): over many rows, pieces of rows in one pass each, added in
// order; over few, row statistics first, then threads take columns and add
// the rows in order. Either way the order depends on the shape alone.
// The statistics of rows [r0, r1), and acc[j - j0] += the sum over rows of
// dY * x̂ for columns [j0, j1), rows in order; both built as
// normGradDataRows.
template <typename T, bool Centered, bool Wide>
[[gnu::always_inline]] inline void rowStatsOfLanes(const T *x, Stats *stats,
                                                   int64_t r0, int64_t r1,
                                                   int64_t size, double eps) {
  for (int64_t r = r0; r < r1; ++r)
    stats[r] = statsOf<T, Centered, Wide>(x + r * size, size, eps);
}
template <typename T, bool Wide>
[[gnu::always_inline]] inline void
normalizedColumnSumsLanes(const T *x, const T *dy, const Stats *stats,
                          int64_t rows, int64_t size, int64_t j0, int64_t j1,
                          double *acc) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *xr = x + r * size, *dyr = dy + r * size;
    const double mean = stats[r].mean, inv = stats[r].inv;
    int64_t j = j0;
    if constexpr (std::is_same_v<T, float>)
      for (; j + 8 <= j1; j += 8) {
        storeLanes8(acc + (j - j0),
                    loadDouble8W<Wide>(acc + (j - j0)) +
                        loadDouble8W<Wide>(dyr + j) *
                            ((loadDouble8W<Wide>(xr + j) - mean) * inv));
      }
    for (; j < j1; ++j)
      acc[j - j0] += dyr[j] * ((xr[j] - mean) * inv);
  }
}
// acc[j] += dY * x̂ over rows [r0, r1), each row's statistics computed
// just before its sums, while the row is in cache (one pass over X where
// rowStatsOf then normalizedColumnSums make two).
template <typename T, bool Centered, bool Wide>
[[gnu::always_inline]] inline void
normalizedPieceSumsLanes(const T *x, const T *dy, int64_t r0, int64_t r1,
                         int64_t size, double eps, double *acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *xr = x + r * size, *dyr = dy + r * size;
    const Stats st = statsOf<T, Centered, Wide>(xr, size, eps);
    normalizedColumnSumsLanes<T, Wide>(xr, dyr, &st, 1, size, 0, size, acc);
  }
}
CLEAVE_WIDE_BUILDS(normalizedPieceSums, (typename T, bool Centered),
                   (T, Centered),
                   (const T *x, const T *dy, int64_t r0, int64_t r1,
                    int64_t size, double eps, double *acc),
                   (x, dy, r0, r1, size, eps, acc))
// The combined op's piece: rows [r0, r1) of dX and acc[j] += dY * x̂ over
// them, rows in order, each row's statistics computed once for both while
// the row is in cache (the bits of normGradDataRows and
// normalizedPieceSums, which compute them once each).
template <typename T, bool Centered, bool Wide>
[[gnu::always_inline]] inline void
normGradPieceLanes(const T *x, const T *dy, const double *scale, T *dx,
                   int64_t r0, int64_t r1, int64_t size, double eps,
                   double *acc) {
  for (int64_t r = r0; r < r1; ++r) {
    const T *xr = x + r * size, *dyr = dy + r * size;
    normGradDataRow<T, Centered, Wide, /*AddParams=*/true>(
        xr, dyr, scale, dx + r * size, size,
        statsOf<T, Centered, Wide>(xr, size, eps), acc);
  }
}
CLEAVE_WIDE_BUILDS(normGradPiece, (typename T, bool Centered), (T, Centered),
                   (const T *x, const T *dy, const double *scale, T *dx,
                    int64_t r0, int64_t r1, int64_t size, double eps,
                    double *acc),
                   (x, dy, scale, dx, r0, r1, size, eps, acc))
CLEAVE_WIDE_BUILDS(rowStatsOf, (typename T, bool Centered), (T, Centered),
                   (const T *x, Stats *stats, int64_t r0, int64_t r1,
                    int64_t size, double eps),
                   (x, stats, r0, r1, size, eps))
CLEAVE_WIDE_BUILDS(normalizedColumnSums, (typename T), (T),
                   (const T *x, const T *dy, const Stats *stats, int64_t rows,
                    int64_t size, int64_t j0, int64_t j1, double *acc),
                   (x, dy, stats, rows, size, j0, j1, acc))

// Many rows (a transformer's tokens): pieces of 64 rows or more (cut by
// the shape alone) each sum their rows in order into partials, in one pass
// over X and dY, and the pieces are added in order (the statistics of all
// rows first, then threads over columns, read X twice and split the rows'
// long reduction by columns): ViT's LayerNorms (1040 x 256), the W part of
// each gradient (this and the bias's SumTo) 260 to 130 us in the step
// (`cleave-run --profile`, 2 threads). At most 512 pieces, so the partials
// stay under 4 KB a column. Null below 4 pieces of 64 rows.
struct Pieces {
  int64_t rows, count; // rows a piece (the last may have fewer), pieces
  int64_t begin(int64_t p) const { return p * rows; }
  int64_t end(int64_t p, int64_t total) const {
    return std::min(total, begin(p) + rows);
  }
};
std::optional<Pieces> piecesOf(int64_t rows) {
  constexpr int64_t kPieceRows = 64, kMaxPieces = 512;
  if (rows < 4 * kPieceRows)
    return std::nullopt;
  const int64_t pieceRows =
      std::max(kPieceRows, (rows + kMaxPieces - 1) / kMaxPieces);
  return Pieces{pieceRows, (rows + pieceRows - 1) / pieceRows};
}

// ds[j] = the column sums of the pieces' partials: sumPiece(r0, r1, acc)
// adds rows [r0, r1) into the piece's partials `acc` (zeroed), the pieces
// run over the threads, then are added in piece order.
template <typename T, typename SumPiece>
void sumByPieces(const Pieces &pieces, int64_t rows, int64_t size, T *ds,
                 SumPiece sumPiece) {
  std::vector<double> partial(size_t(pieces.count * size), 0.0);
  parallelFor(pieces.count, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      sumPiece(pieces.begin(p), pieces.end(p, rows),
               partial.data() + p * size);
  });
  parallelFor(size, 256, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < pieces.count; ++p)
        sum += partial[size_t(p * size + j)];
      ds[j] = T(sum);
    }
  });
}

llvm::Error checkDScale(const KernelCall &call, const TensorRef &dScale,
                        const TensorRef &X, int64_t size) {
  if (dScale.numElements() != size)
    return kernelError(call, "dscale {0} does not match the normalized shape "
                             "of X {1}",
                       ir::shapeStr(dScale.shape), ir::shapeStr(X.shape));
  return llvm::Error::success();
}

template <typename T, bool Centered>
llvm::Error normGradParamsInto(const KernelCall &call, const TensorRef &dY,
                               const TensorRef &X, const TensorRef &dScale) {
  auto dims = layerNormDims(call, dY, X);
  if (!dims)
    return dims.takeError();
  int64_t rows = dims->rows, size = dims->size;
  if (auto e = checkDScale(call, dScale, X, size))
    return e;
  double eps = call.getFloatFor<T>("epsilon");
  const T *x = X.as<T>(), *dy = dY.as<T>();
  const bool wide = cpuHasAvx512F();
  T *ds = dScale.as<T>();
  if (auto pieces = piecesOf(rows)) {
    sumByPieces(*pieces, rows, size, ds,
                [&](int64_t r0, int64_t r1, double *acc) {
                  if (wide)
                    normalizedPieceSumsWide<T, Centered>(x, dy, r0, r1, size,
                                                         eps, acc);
                  else
                    normalizedPieceSumsNarrow<T, Centered>(x, dy, r0, r1, size,
                                                           eps, acc);
                });
    return llvm::Error::success();
  }
  std::vector<Stats> stats(rows);
  parallelFor(rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, size)),
              [&](int64_t r0, int64_t r1) {
                if (wide)
                  rowStatsOfWide<T, Centered>(x, stats.data(), r0, r1, size,
                                              eps);
                else
                  rowStatsOfNarrow<T, Centered>(x, stats.data(), r0, r1, size,
                                                eps);
              });
  parallelFor(size, std::max<int64_t>(16, 8192 / std::max<int64_t>(1, rows)),
              [&](int64_t j0, int64_t j1) {
                std::vector<double> acc(j1 - j0, 0.0);
                if (wide)
                  normalizedColumnSumsWide(x, dy, stats.data(), rows, size, j0,
                                           j1, acc.data());
                else
                  normalizedColumnSumsNarrow(x, dy, stats.data(), rows, size,
                                             j0, j1, acc.data());
                for (int64_t j = j0; j < j1; ++j)
                  ds[j] = T(acc[j - j0]);
              });
  return llvm::Error::success();
}

template <typename T, bool Centered>
llvm::Error normGradParams(const KernelCall &call) {
  return normGradParamsInto<T, Centered>(call, call.inputs[0], call.inputs[1],
                                         call.outputs[0]);
}

// LayerNormalizationGrad and RMSNormalizationGrad(dY, X, scale) -> dX,
// dscale, kept whole by split-backward: over many rows, one pass of pieces
// computes each row's statistics once for dX and for the piece's dscale
// partials (the parts compute them once each, in two passes over X and
// dY); over few rows, the two part kernels. The parts' bits either way.
template <typename T, bool Centered>
llvm::Error normGrad(const KernelCall &call) {
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1],
                  &scaleRef = call.inputs[2], &dX = call.outputs[0],
                  &dScale = call.outputs[1];
  auto dims = layerNormDims(call, dY, X);
  if (!dims)
    return dims.takeError();
  const int64_t rows = dims->rows, size = dims->size;
  auto pieces = piecesOf(rows);
  if (!pieces) {
    if (auto e = normGradData<T, Centered>(call))
      return e;
    return normGradParamsInto<T, Centered>(call, dY, X, dScale);
  }
  if (auto e = checkDScale(call, dScale, X, size))
    return e;
  auto scale =
      broadcastDoubles(call, scaleRef, X.shape.drop_front(dims->axis));
  if (!scale)
    return scale.takeError();
  double eps = call.getFloatFor<T>("epsilon");
  const T *x = X.as<T>(), *dy = dY.as<T>();
  T *dx = dX.as<T>();
  const bool wide = cpuHasAvx512F();
  sumByPieces(*pieces, rows, size, dScale.as<T>(),
              [&](int64_t r0, int64_t r1, double *acc) {
                if (wide)
                  normGradPieceWide<T, Centered>(x, dy, scale->data(), dx, r0,
                                                 r1, size, eps, acc);
                else
                  normGradPieceNarrow<T, Centered>(x, dy, scale->data(), dx,
                                                   r0, r1, size, eps, acc);
              });
  return llvm::Error::success();
}

template <typename T> llvm::Error layerNormGradParams(const KernelCall &call) {
  return normGradParams<T, true>(call);
}
template <typename T> llvm::Error layerNormGrad(const KernelCall &call) {
  return normGrad<T, true>(call);
}

// --- RMSNormalization -------------------------------------------------------

// With inv = 1 / sqrt(mean(x^2) + epsilon), x̂ = x * inv and y = x̂ * scale:
//   dX     = inv * (g - x̂ * mean(g * x̂)),  g = dY * scale
//   dscale = sum over rows of dY * x̂
// inv is recomputed with rmsRowInv, the forward kernel's formula.

// RMSNormalizationGradData(dY, X, scale) -> dX.
template <typename T> llvm::Error rmsNormGradData(const KernelCall &call) {
  return normGradData<T, false>(call);
}

// RMSNormalizationGradParams(dY, X) -> dscale: the LayerNormalization
// kernel with a row mean of 0 (x - 0.0 is exact, so the bits are those of
// dY * (x * inv)).
template <typename T> llvm::Error rmsNormGradParams(const KernelCall &call) {
  return normGradParams<T, false>(call);
}
template <typename T> llvm::Error rmsNormGrad(const KernelCall &call) {
  return normGrad<T, false>(call);
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

// The sums a BatchNorm gradient needs over one (image, channel) row of
// `spatial` values: the row's mean and squared deviations about it, the
// sum of dY and of dY * (x - row mean). One pass, in double, as the forward
// kernel's rowMoments: sums of d = x - K (K the row's first value), d^2, dY
// and dY * d, then M2 = sum d^2 - (sum d)^2 / n and sum dY * (x - mean) =
// sum dY * d - (mean - K) * sum dY. Eight double lanes each (DoubleLanes).
struct RowSums {
  double mean = 0, m2 = 0, dy = 0, dyCentered = 0;
};

template <typename T, bool Wide>
[[gnu::always_inline]] inline RowSums gradientRowSums(const T *x, const T *dy,
                                                      int64_t n) {
  if (n == 0)
    return {};
  double k = double(x[0]);
  DoubleLanes<Wide> s = {}, sq = {}, g = {}, gd = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    auto d = loadDouble8W<Wide>(x + i) - k;
    auto v = loadDouble8W<Wide>(dy + i);
    s += d;
    sq += d * d;
    g += v;
    gd += v * d;
  }
  double sT = 0, sqT = 0, gT = 0, gdT = 0;
  for (; i < n; ++i) {
    double d = double(x[i]) - k, v = double(dy[i]);
    sT += d;
    sqT += d * d;
    gT += v;
    gdT += v * d;
  }
  double sum = laneSum(s) + sT, shift = sum / double(n);
  RowSums out;
  out.mean = k + shift;
  out.m2 = std::max(0.0, laneSum(sq) + sqT - sum * shift);
  out.dy = laneSum(g) + gT;
  out.dyCentered = laneSum(gd) + gdT - shift * out.dy;
  return out;
}

// gradientRowSums of rows [r0, r1), built as normGradDataRows.
template <typename T, bool Wide>
[[gnu::always_inline]] inline void gradientRowSumsLanes(const T *x,
                                                        const T *dy, int64_t r0,
                                                        int64_t r1,
                                                        int64_t spatial,
                                                        RowSums *rows) {
  for (int64_t r = r0; r < r1; ++r)
    rows[r] = gradientRowSums<T, Wide>(x + r * spatial, dy + r * spatial,
                                       spatial);
}
CLEAVE_WIDE_BUILDS(gradientRowSums, (typename T), (T),
                   (const T *x, const T *dy, int64_t r0, int64_t r1,
                    int64_t spatial, RowSums *rows),
                   (x, dy, r0, r1, spatial, rows))

// Per channel: the statistics x̂ uses (the batch's in training mode, the
// given running ones otherwise) and the sums of dY and dY * (x - mean).
struct ChannelSums {
  double mean = 0, inv = 0, dy = 0, dyCentered = 0;
};

// Every (image, channel) row's sums, rows split over threads by image as
// in the forward kernel, then each channel's rows combined exactly in
// image order (Chan et al. for the squared deviations; dY * (x - mean) =
// the row's dY * (x - row mean) + (row mean - mean) * the row's dY).
template <typename T>
std::vector<ChannelSums>
channelSums(const T *x, const T *dy, const BatchNormDims &d, bool training,
            const std::vector<double> &runMean,
            const std::vector<double> &runVar, double eps) {
  std::vector<RowSums> rows(d.n * d.c);
  const bool wide = cpuHasAvx512F();
  parallelFor(d.n * d.c,
              std::max<int64_t>(1, 8192 / std::max<int64_t>(1, d.spatial)),
              [&](int64_t r0, int64_t r1) {
                if (wide)
                  gradientRowSumsWide(x, dy, r0, r1, d.spatial, rows.data());
                else
                  gradientRowSumsNarrow(x, dy, r0, r1, d.spatial, rows.data());
              });
  std::vector<ChannelSums> out(d.c);
  double count = double(d.n * d.spatial);
  for (int64_t ch = 0; ch < d.c; ++ch) {
    ChannelSums &cs = out[ch];
    double var = runVar[ch];
    cs.mean = runMean[ch];
    if (training && count) {
      double mu = 0, m2 = 0;
      for (int64_t i = 0; i < d.n; ++i)
        mu += rows[i * d.c + ch].mean;
      mu /= double(d.n);
      for (int64_t i = 0; i < d.n; ++i) {
        double dm = rows[i * d.c + ch].mean - mu;
        m2 += rows[i * d.c + ch].m2 + double(d.spatial) * dm * dm;
      }
      cs.mean = mu;
      var = m2 / count;
    } else if (training) {
      cs.mean = var = 0;
    }
    cs.inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < d.n; ++i) {
      const RowSums &r = rows[i * d.c + ch];
      cs.dy += r.dy;
      cs.dyCentered += r.dyCentered + (r.mean - cs.mean) * r.dy;
    }
  }
  return out;
}

// BatchNormalizationGradData(dY, X, scale, mean, var) -> dX.
// Rows [r0, r1) of dX = a * dY + (q * (x - m) + r), the row's channel's
// coefficients; in T, built for the CPU's vector width (a lambda's loop is
// the baseline's SSE2).
template <typename T>
CLEAVE_VECTOR_CLONES void batchNormGradRows(const T *x, const T *dy, T *dx,
                                            int64_t r0, int64_t r1, int64_t c,
                                            int64_t spatial, const T *a,
                                            const T *q, const T *r,
                                            const T *m) {
  for (int64_t row = r0; row < r1; ++row) {
    int64_t ch = row % c;
    const T *xs = x + row * spatial, *gs = dy + row * spatial;
    T *out = dx + row * spatial;
    T ar = a[ch], qr = q[ch], rr = r[ch], mr = m[ch];
    for (int64_t k = 0; k < spatial; ++k)
      out[k] = ar * gs[k] + (qr * (xs[k] - mr) + rr);
  }
}

// dX = a * (dY - mean(dY) - x̂ * mean(dY * x̂)) with a = scale * inv, as
// dX = a * dY + q * (x - mean) + r per channel, one pass in T. Training
// mode with a batch flows through the batch statistics (the two means, from
// `sums`); otherwise they are constants and dX = a * dY.
template <typename T>
void batchNormInputGradient(const BatchNormDims &d, const T *x, const T *dy,
                            T *dx, const std::vector<double> &scale,
                            const std::vector<double> &runVar,
                            const std::vector<ChannelSums> *sums,
                            double count, double eps) {
  std::vector<T> a(d.c), q(d.c), r(d.c), m(d.c);
  if (sums) {
    for (int64_t ch = 0; ch < d.c; ++ch) {
      const ChannelSums &cs = (*sums)[ch];
      double ach = scale[ch] * cs.inv;
      a[ch] = T(ach);
      q[ch] = T(-ach * cs.inv * cs.inv * cs.dyCentered / count);
      r[ch] = T(-ach * cs.dy / count);
      m[ch] = T(cs.mean);
    }
  } else {
    for (int64_t ch = 0; ch < d.c; ++ch)
      a[ch] = T(scale[ch] / std::sqrt(runVar[ch] + eps));
  }
  parallelFor(d.n * d.c,
              std::max<int64_t>(1, 16384 / std::max<int64_t>(1, d.spatial)),
              [&](int64_t r0, int64_t r1) {
                batchNormGradRows(x, dy, dx, r0, r1, d.c, d.spatial,
                                  a.data(), q.data(), r.data(), m.data());
              });
}

// BatchNormalizationGradParams(dY, X, mean, var) -> dscale = sum of dY * x̂
// = inv * sum of dY * (x - mean).
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
  double eps = call.getFloatFor<T>("epsilon");
  std::vector<ChannelSums> sums = channelSums(
      X.as<T>(), dY.as<T>(), *d, training, runMean, runVar, eps);
  for (int64_t ch = 0; ch < d->c; ++ch)
    storeDouble(dScale, ch, sums[ch].dyCentered * sums[ch].inv);
  return llvm::Error::success();
}

// BatchNormalizationGradData(dY, X, scale, mean, var) -> dX, and the
// combined BatchNormalizationGrad(...) -> dX, dscale: both from one pass
// of channel sums (split-backward keeps the combined op whole, Ops.def),
// the bits of the two parts' kernels (the same sums, the same formulas).
// dX reads the sums in training mode with a batch; dscale in either mode,
// with the running statistics in inference mode (GradParams' sums).
template <typename T>
llvm::Error batchNormGradDataAndScale(const KernelCall &call) {
  const bool combined = call.outputs.size() == 2;
  const TensorRef &dY = call.inputs[0], &X = call.inputs[1],
                  &scaleRef = call.inputs[2], &meanRef = call.inputs[3],
                  &varRef = call.inputs[4], &dX = call.outputs[0];
  auto d = combined ? batchNormDims(call, dY, X,
                                    {&scaleRef, &meanRef, &varRef,
                                     &call.outputs[1]})
                    : batchNormDims(call, dY, X, {&scaleRef, &meanRef, &varRef});
  if (!d)
    return d.takeError();
  std::vector<double> scale = readDoubles(scaleRef),
                      runMean = readDoubles(meanRef),
                      runVar = readDoubles(varRef);
  bool training = call.getInt("training_mode");
  double eps = call.getFloatFor<T>("epsilon");
  double count = double(d->n * d->spatial);
  const T *x = X.as<T>(), *dy = dY.as<T>();
  std::optional<std::vector<ChannelSums>> sums;
  if (combined || (training && count))
    sums = channelSums(x, dy, *d, training, runMean, runVar, eps);
  batchNormInputGradient(*d, x, dy, dX.as<T>(), scale, runVar,
                         training && count ? &*sums : nullptr, count, eps);
  if (combined)
    for (int64_t ch = 0; ch < d->c; ++ch)
      storeDouble(call.outputs[1], ch, (*sums)[ch].dyCentered * (*sums)[ch].inv);
  return llvm::Error::success();
}

CLEAVE_FLOAT_DISPATCH(layerNormGradDataKernel, layerNormGradData)
CLEAVE_FLOAT_DISPATCH(layerNormGradParamsKernel, layerNormGradParams)
CLEAVE_FLOAT_DISPATCH(rmsNormGradDataKernel, rmsNormGradData)
CLEAVE_FLOAT_DISPATCH(rmsNormGradParamsKernel, rmsNormGradParams)
CLEAVE_FLOAT_DISPATCH(layerNormGradKernel, layerNormGrad)
CLEAVE_FLOAT_DISPATCH(rmsNormGradKernel, rmsNormGrad)
CLEAVE_FLOAT_DISPATCH(batchNormGradDataKernel, batchNormGradDataAndScale)
CLEAVE_FLOAT_DISPATCH(batchNormGradParamsKernel, batchNormGradParams)
CLEAVE_FLOAT_DISPATCH(batchNormGradKernel, batchNormGradDataAndScale)

} // namespace

void registerNormalizationGradientKernels(KernelTable &t) {
  using ir::OpKind;
  // The parts of LayerNormalizationGrad(dY, X, scale) -> dX, dscale and of
  // BatchNormalizationGrad(dY, X, scale, mean, var) -> dX, dscale, and the
  // combined ops, which split-backward keeps whole (one pass for both).
  t.add(OpKind::LayerNormalizationGradData, layerNormGradDataKernel,
        kFloatTypes);
  t.add(OpKind::LayerNormalizationGradParams, layerNormGradParamsKernel,
        kFloatTypes);
  t.add(OpKind::RMSNormalizationGradData, rmsNormGradDataKernel, kFloatTypes);
  t.add(OpKind::RMSNormalizationGradParams, rmsNormGradParamsKernel,
        kFloatTypes);
  t.add(OpKind::LayerNormalizationGrad, layerNormGradKernel, kFloatTypes);
  t.add(OpKind::RMSNormalizationGrad, rmsNormGradKernel, kFloatTypes);
  t.add(OpKind::BatchNormalizationGradData, batchNormGradDataKernel,
        kFloatTypes);
  t.add(OpKind::BatchNormalizationGradParams, batchNormGradParamsKernel,
        kFloatTypes);
  t.add(OpKind::BatchNormalizationGrad, batchNormGradKernel, kFloatTypes);
}

} // namespace cleave::runtime::cpu
