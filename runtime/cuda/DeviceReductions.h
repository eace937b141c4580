// Device code of the reductions (DeviceCode.h): SumTo and ReduceSum/Mean/Max
// (one thread an output), the row ops (softmax, log-softmax, layer norm,
// cross-entropy; a "lanes" of threads a row), column sums, the loss's
// totals, and batch normalization's per-channel statistics and maps.
#pragma once

#include "runtime/cuda/DeviceElements.h"

namespace cleave::runtime::cuda {

enum class ReduceKind : uint8_t { Sum, Mean, Max };

// How many inputs a reduction's thread loads before it adds them (in order).
constexpr int kReduceAhead = 8;

// The inputs r0 <= r < r1 of one output of a reduction (SumTo,
// ReduceSum/Mean/Max), at first + reduced(r), in increasing r: their sum in
// double (as the CPU sums), or their maximum (-inf for none; a NaN wins).
// The loads of kReduceAhead inputs are issued before their sums, which
// stay in order: a GPU thread waits for memory once a group instead of
// once an input, and the bits are the plain loop's.
CLEAVE_HD double reduceRange(ReduceKind kind, const void *in, Elem inElem,
                             int64_t first, const Indexer &reduced, int64_t r0,
                             int64_t r1) {
  constexpr int kAhead = kReduceAhead;
  int64_t r = r0;
  if (kind == ReduceKind::Max) {
    float m = -INFINITY;
    for (; r + kAhead <= r1; r += kAhead) {
      float v[kAhead];
      for (int u = 0; u < kAhead; ++u)
        v[u] = load(in, inElem, first + reduced(r + u));
      for (int u = 0; u < kAhead; ++u)
        m = v[u] > m || v[u] != v[u] ? v[u] : m;
    }
    for (; r < r1; ++r) {
      float v = load(in, inElem, first + reduced(r));
      m = v > m || v != v ? v : m;
    }
    return m;
  }
  double acc = 0.0;
  for (; r + kAhead <= r1; r += kAhead) {
    float v[kAhead];
    for (int u = 0; u < kAhead; ++u)
      v[u] = load(in, inElem, first + reduced(r + u));
    for (int u = 0; u < kAhead; ++u)
      acc += v[u];
  }
  for (; r < r1; ++r)
    acc += load(in, inElem, first + reduced(r));
  return acc;
}

// The output from its sum or maximum over `count` inputs.
CLEAVE_HD void reduceStore(ReduceKind kind, double value, int64_t count,
                           void *out, Elem outElem, int64_t o) {
  store(out, outElem, o,
        float(kind == ReduceKind::Mean ? value / double(count) : value));
}

// One thread per output element: out[at(o)] = sum over the reduced
// coordinates r < count of in[base(o) + reduced(r)]: SumTo and ReduceSum /
// ReduceMean / ReduceMax. Where few outputs reduce many inputs (a bias
// gradient: 768 outputs of 8192 rows) one thread an output leaves most of
// a GPU idle, so the lowering may split the inputs into chunks of `chunk`
// (chunkedReduction): a thread per (output, chunk) writes the chunk's sum
// (or maximum) in double to partial[o * chunks + c], then a thread per
// output adds its chunks in order. The order is fixed by the lowering, so
// the bits do not depend on the launch, and the emulation gives the GPU's.
struct ReduceStep {
  ReduceKind kind = ReduceKind::Sum;
  const void *in = nullptr;
  Elem inElem = Elem::F32;
  void *out = nullptr;
  Elem outElem = Elem::F32;
  int64_t outputs = 0;
  Indexer base;    // output element -> offset of its first input element
  Indexer reduced; // reduced coordinate -> offset from that first element
  int64_t count = 0;
  int64_t chunk = 0;         // inputs a chunk; 0: one thread an output
  double *partial = nullptr; // outputs x chunks, where chunk > 0

  CLEAVE_HD int64_t chunks() const {
    return chunk > 0 ? (count + chunk - 1) / chunk : 1;
  }
};

// An integer output in one thread, as the CPU folds integers: sums wrap
// (modulo 2^64, then the type's width), the mean divides the wrapped sum
// in int64 (0 of nothing), the maximum of nothing is the type's lowest.
// Order does not matter to any of them, so they are never chunked.
CLEAVE_HD void reduceIntElement(const ReduceStep &r, int64_t o) {
  bool wide = r.inElem == Elem::I64;
  int64_t lowest = wide ? INT64_MIN : INT32_MIN;
  uint64_t sum = 0;
  int64_t max = lowest;
  int64_t first = r.base(o);
  for (int64_t k = 0; k < r.count; ++k) {
    int64_t v = loadInt(r.in, r.inElem, first + r.reduced(k));
    sum += uint64_t(v);
    max = v > max ? v : max;
  }
  int64_t v = r.kind == ReduceKind::Max ? max
              : r.kind == ReduceKind::Sum
                  ? int64_t(sum)
                  : (r.count ? int64_t(sum) / r.count : 0);
  if (r.outElem == Elem::I64)
    static_cast<int64_t *>(r.out)[o] = v;
  else
    static_cast<int32_t *>(r.out)[o] = int32_t(uint32_t(uint64_t(v)));
}

// Output o in one thread (chunk 0).
CLEAVE_HD void reduceElement(const ReduceStep &r, int64_t o) {
  if (isInt(r.inElem)) {
    reduceIntElement(r, o);
    return;
  }
  reduceStore(r.kind,
              reduceRange(r.kind, r.in, r.inElem, r.base(o), r.reduced, 0,
                          r.count),
              r.count, r.out, r.outElem, o);
}

// Chunk i / outputs of output i % outputs, into partial[output * chunks +
// chunk]: consecutive threads take consecutive outputs, whose inputs are
// consecutive in a bias gradient (a sum over rows of columns).
CLEAVE_HD void reducePartial(const ReduceStep &r, int64_t i) {
  int64_t n = r.chunks(), o = i % r.outputs, c = i / r.outputs;
  int64_t r0 = c * r.chunk, r1 = r0 + r.chunk < r.count ? r0 + r.chunk : r.count;
  r.partial[o * n + c] =
      reduceRange(r.kind, r.in, r.inElem, r.base(o), r.reduced, r0, r1);
}

// Output o from its chunks, in order.
CLEAVE_HD void reduceChunks(const ReduceStep &r, int64_t o) {
  int64_t n = r.chunks();
  const double *p = r.partial + o * n;
  double v;
  if (r.kind == ReduceKind::Max) {
    float m = -INFINITY;
    for (int64_t c = 0; c < n; ++c) {
      float x = float(p[c]);
      m = x > m || x != x ? x : m;
    }
    v = m;
  } else {
    v = 0.0;
    for (int64_t c = 0; c < n; ++c)
      v += p[c];
  }
  reduceStore(r.kind, v, r.count, r.out, r.outElem, o);
}

// --- row ops ---------------------------------------------------------------
//
// A row ("lane" in the CPU kernels) is `len` elements along one axis: row r
// starts at (r / inner) * len * inner + r % inner and steps by `inner`. The
// row functions take a Lanes: the threads that share the row. Each lane
// handles elements j = lane, lane + count, ...; `sum` and `max` combine the
// lanes' partial results and give every lane the total. On the GPU a Lanes
// is a warp (shuffles); on the host it is one lane, and the functions run
// sequentially.
struct HostLanes {
  CLEAVE_HD int lane() const { return 0; }
  CLEAVE_HD int count() const { return 1; }
  CLEAVE_HD double sum(double x) const { return x; }
  CLEAVE_HD float max(float x) const { return x; }
};

enum class RowOp : uint8_t {
  Softmax,             // y = exp(x - max) / sum
  LogSoftmax,          // y = x - max - log(sum)
  LogSoftmaxGrad,      // x: dY, aux: Y (log-probabilities);
                       // dx = dy - exp(y) * sum(dy)
  SoftmaxGrad,         // x: dY, aux: Y; dx = y * (dy - sum(dy * y))
  LayerNorm,           // x: X, scale, bias; out: Y, mean, invStd (f32)
  LayerNormGradData,   // x: X, aux: dY, scale; out: dX
  LayerNormStats,      // x: X; stats[2r], stats[2r+1] = mean, invStd (f64)
  CrossEntropy,        // x: scores, labels, weights; stats[2r], [2r+1] =
                       // loss and weight of the row (0, 0 when ignored);
                       // out: log-probabilities when asked
  CrossEntropyGrad,    // x: scores, labels, weights, aux: dL; stats[0]: the
                       // divisor; out: dScores
};

struct RowStep {
  RowOp op = RowOp::Softmax;
  int64_t rows = 0, len = 0, inner = 1;
  const void *x = nullptr;
  Elem xElem = Elem::F32;
  const void *aux = nullptr; // dY / Y / dL
  Elem auxElem = Elem::F32;
  void *out = nullptr; // Y / dX / log-probabilities (may be null)
  Elem outElem = Elem::F32;
  // LayerNorm: scale and bias (broadcast to the row: index j % scaleLen).
  const void *scale = nullptr, *bias = nullptr;
  Elem scaleElem = Elem::F32, biasElem = Elem::F32;
  int64_t scaleLen = 1, biasLen = 1;
  float *mean = nullptr, *invStd = nullptr; // LayerNorm's optional outputs
  float epsilon = 0;
  // LayerNorm rows as RMSNormalization's: a mean of 0 and inv = 1 /
  // sqrt(mean(x^2) + epsilon); no mean(g) term in the data gradient.
  bool rms = false;
  // Cross-entropy: labels (one per row), optional class weights,
  // ignore_index (when hasIgnore), and whether dL is one value or per row.
  const void *labels = nullptr;
  Elem labelElem = Elem::I64;
  const void *weights = nullptr;
  Elem weightElem = Elem::F32;
  bool hasIgnore = false;
  int64_t ignoreIndex = 0;
  bool perRowGrad = false;
  double *stats = nullptr; // per-row statistics, or the divisor
};

CLEAVE_HD int64_t rowStart(const RowStep &s, int64_t r) {
  return (r / s.inner) * s.len * s.inner + r % s.inner;
}

template <class L>
CLEAVE_HD float rowMax(const L &l, const void *p, Elem e, int64_t start,
                       int64_t len, int64_t inner) {
  float m = -INFINITY;
  for (int64_t j = l.lane(); j < len; j += l.count()) {
    float v = load(p, e, start + j * inner);
    m = v > m ? v : m;
  }
  return l.max(m);
}

template <class L>
CLEAVE_HD void rowElement(const L &l, const RowStep &s, int64_t r) {
  int64_t start = rowStart(s, r), len = s.len, in = s.inner;
  auto x = [&](int64_t j) { return load(s.x, s.xElem, start + j * in); };
  auto aux = [&](int64_t j) { return load(s.aux, s.auxElem, start + j * in); };
  auto put = [&](int64_t j, double v) {
    store(s.out, s.outElem, start + j * in, float(v));
  };
  switch (s.op) {
  case RowOp::Softmax: {
    float m = rowMax(l, s.x, s.xElem, start, len, in);
    double sum = 0;
    for (int64_t j = l.lane(); j < len; j += l.count())
      sum += exp(double(x(j)) - double(m));
    sum = l.sum(sum);
    double rcp = 1.0 / sum;
    for (int64_t j = l.lane(); j < len; j += l.count())
      put(j, exp(double(x(j)) - double(m)) * rcp);
    return;
  }
  case RowOp::LogSoftmax: {
    float m = rowMax(l, s.x, s.xElem, start, len, in);
    double sum = 0;
    for (int64_t j = l.lane(); j < len; j += l.count())
      sum += exp(double(x(j)) - double(m));
    double shift = double(m) + log(l.sum(sum));
    for (int64_t j = l.lane(); j < len; j += l.count())
      put(j, double(x(j)) - shift);
    return;
  }
  case RowOp::LogSoftmaxGrad: {
    double sum = 0;
    for (int64_t j = l.lane(); j < len; j += l.count())
      sum += double(x(j));
    sum = l.sum(sum);
    for (int64_t j = l.lane(); j < len; j += l.count())
      put(j, double(x(j)) - exp(double(aux(j))) * sum);
    return;
  }
  case RowOp::SoftmaxGrad: {
    double sum = 0;
    for (int64_t j = l.lane(); j < len; j += l.count())
      sum += double(x(j)) * aux(j);
    sum = l.sum(sum);
    for (int64_t j = l.lane(); j < len; j += l.count())
      put(j, double(aux(j)) * (double(x(j)) - sum));
    return;
  }
  case RowOp::LayerNorm:
  case RowOp::LayerNormGradData:
  case RowOp::LayerNormStats: {
    double mean = 0, var = 0;
    if (!s.rms) {
      for (int64_t j = l.lane(); j < len; j += l.count())
        mean += x(j);
      mean = len ? l.sum(mean) / double(len) : 0.0;
    }
    for (int64_t j = l.lane(); j < len; j += l.count()) {
      double d = x(j) - mean;
      var += d * d;
    }
    var = len ? l.sum(var) / double(len) : 0.0;
    double inv = 1.0 / sqrt(var + double(s.epsilon));
    auto scale = [&](int64_t j) {
      return double(load(s.scale, s.scaleElem, j % s.scaleLen));
    };
    if (s.op == RowOp::LayerNormStats) {
      if (l.lane() == 0) {
        s.stats[2 * r] = mean;
        s.stats[2 * r + 1] = inv;
      }
      return;
    }
    if (s.op == RowOp::LayerNorm) {
      for (int64_t j = l.lane(); j < len; j += l.count()) {
        double b = s.bias ? double(load(s.bias, s.biasElem, j % s.biasLen)) : 0.0;
        put(j, ((x(j) - mean) * inv) * scale(j) + b);
      }
      if (l.lane() == 0 && s.mean)
        s.mean[r] = float(mean);
      if (l.lane() == 0 && s.invStd)
        s.invStd[r] = float(inv);
      return;
    }
    double meanG = 0, meanGX = 0; // dY lives in aux
    for (int64_t j = l.lane(); j < len; j += l.count()) {
      double g = double(aux(j)) * scale(j);
      meanG += g;
      meanGX += g * ((x(j) - mean) * inv);
    }
    meanG = len && !s.rms ? l.sum(meanG) / double(len) : 0.0;
    meanGX = len ? l.sum(meanGX) / double(len) : 0.0;
    for (int64_t j = l.lane(); j < len; j += l.count()) {
      double g = double(aux(j)) * scale(j), xh = (x(j) - mean) * inv;
      put(j, inv * ((g - meanG) - xh * meanGX));
    }
    return;
  }
  case RowOp::CrossEntropy:
  case RowOp::CrossEntropyGrad: {
    int64_t label = loadInt(s.labels, s.labelElem, r);
    bool ignored = s.hasIgnore && label == s.ignoreIndex;
    bool valid = !ignored && label >= 0 && label < len;
    double w = !valid ? 0.0
               : s.weights ? double(load(s.weights, s.weightElem, label))
                           : 1.0;
    if (s.op == RowOp::CrossEntropyGrad && !valid) {
      for (int64_t j = l.lane(); j < len; j += l.count())
        put(j, 0.0);
      return;
    }
    float m = rowMax(l, s.x, s.xElem, start, len, in);
    double sum = 0;
    for (int64_t j = l.lane(); j < len; j += l.count())
      sum += exp(double(x(j)) - double(m));
    sum = l.sum(sum);
    if (s.op == RowOp::CrossEntropy) {
      double shift = double(m) + log(sum);
      if (s.out)
        for (int64_t j = l.lane(); j < len; j += l.count())
          put(j, double(x(j)) - shift);
      if (l.lane() == 0) {
        s.stats[2 * r] = valid ? -(double(x(label)) - shift) * w : 0.0;
        s.stats[2 * r + 1] = w;
      }
      return;
    }
    double dl = load(s.aux, s.auxElem, s.perRowGrad ? r : 0);
    double coef = dl * w / s.stats[0];
    for (int64_t j = l.lane(); j < len; j += l.count())
      put(j, (exp(double(x(j)) - double(m)) / sum - (j == label ? 1.0 : 0.0)) *
                 coef);
    return;
  }
  }
}

// --- column sums --------------------------------------------------------------

// LayerNormalizationGradParams, one thread per column j of [rows, len]:
// dScale[j] = sum over rows (increasing) of dY[r, j] * (X[r, j] - mean_r) *
// invStd_r, with the statistics from a LayerNormStats row step. As a
// ReduceStep, the lowering may split the rows into chunks (a GPT-2 layer's
// 768 columns of 8192 rows): a thread per (column, chunk) into partial,
// then a thread per column adds its chunks in order.
struct ColumnStep {
  int64_t rows = 0, len = 0;
  const void *dy = nullptr, *x = nullptr;
  Elem dyElem = Elem::F32, xElem = Elem::F32;
  const double *stats = nullptr;
  void *out = nullptr;
  Elem outElem = Elem::F32;
  int64_t chunk = 0;         // rows a chunk; 0: one thread a column
  double *partial = nullptr; // len x chunks, where chunk > 0

  CLEAVE_HD int64_t chunks() const {
    return chunk > 0 ? (rows + chunk - 1) / chunk : 1;
  }
};

// The column's sum over rows [r0, r1), in double.
CLEAVE_HD double columnRange(const ColumnStep &s, int64_t j, int64_t r0,
                             int64_t r1) {
  // Loads ahead of the sums, as reduceElement.
  constexpr int kAhead = kReduceAhead;
  auto term = [&](int64_t r, float dy, float x) {
    return double(dy) * ((double(x) - s.stats[2 * r]) * s.stats[2 * r + 1]);
  };
  double acc = 0;
  int64_t r = r0;
  for (; r + kAhead <= r1; r += kAhead) {
    float dy[kAhead], x[kAhead];
    for (int u = 0; u < kAhead; ++u) {
      int64_t i = (r + u) * s.len + j;
      dy[u] = load(s.dy, s.dyElem, i);
      x[u] = load(s.x, s.xElem, i);
    }
    for (int u = 0; u < kAhead; ++u)
      acc += term(r + u, dy[u], x[u]);
  }
  for (; r < r1; ++r) {
    int64_t i = r * s.len + j;
    acc += term(r, load(s.dy, s.dyElem, i), load(s.x, s.xElem, i));
  }
  return acc;
}

// Column j in one thread (chunk 0).
CLEAVE_HD void columnElement(const ColumnStep &s, int64_t j) {
  store(s.out, s.outElem, j, float(columnRange(s, j, 0, s.rows)));
}

// Chunk i / len of column i % len, into partial[column * chunks + chunk]:
// consecutive threads take consecutive columns, so their loads are
// consecutive.
CLEAVE_HD void columnPartial(const ColumnStep &s, int64_t i) {
  int64_t n = s.chunks(), j = i % s.len, c = i / s.len;
  int64_t r0 = c * s.chunk, r1 = r0 + s.chunk < s.rows ? r0 + s.chunk : s.rows;
  s.partial[j * n + c] = columnRange(s, j, r0, r1);
}

// Column j from its chunks, in order.
CLEAVE_HD void columnChunks(const ColumnStep &s, int64_t j) {
  int64_t n = s.chunks();
  double acc = 0;
  for (int64_t c = 0; c < n; ++c)
    acc += s.partial[j * n + c];
  store(s.out, s.outElem, j, float(acc));
}

// One thread over all rows of a cross-entropy (the loss rows of a
// CrossEntropy row step, in stats as (loss, weight) pairs):
//   Total:   out = total / weight sum (mean) or total (sum); stats[2 * rows]
//            = the weight sum;
//   PerRow:  out[r] = loss_r (reduction none);
//   Divisor: stats[0] = the weight sum of the rows not ignored (mean) or 1,
//            from the labels and weights alone (the gradient's divisor).
enum class LossKind : uint8_t { Total, PerRow, Divisor };

struct LossStep {
  LossKind kind = LossKind::Total;
  int64_t rows = 0;
  double *stats = nullptr;
  bool mean = true;
  void *out = nullptr;
  Elem outElem = Elem::F32;
  // Divisor: the row step's labels, weights and classes.
  const void *labels = nullptr;
  Elem labelElem = Elem::I64;
  const void *weights = nullptr;
  Elem weightElem = Elem::F32;
  bool hasIgnore = false;
  int64_t ignoreIndex = 0, classes = 0;
};

CLEAVE_HD void lossStep(const LossStep &s) {
  if (s.kind == LossKind::PerRow) {
    for (int64_t r = 0; r < s.rows; ++r)
      store(s.out, s.outElem, r, float(s.stats[2 * r]));
    return;
  }
  if (s.kind == LossKind::Divisor) {
    double weight = 0;
    for (int64_t r = 0; s.mean && r < s.rows; ++r) {
      int64_t label = loadInt(s.labels, s.labelElem, r);
      if ((s.hasIgnore && label == s.ignoreIndex) || label < 0 ||
          label >= s.classes)
        continue;
      weight += s.weights ? double(load(s.weights, s.weightElem, label)) : 1.0;
    }
    s.stats[0] = s.mean ? weight : 1.0;
    return;
  }
  double total = 0, weight = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    total += s.stats[2 * r];
    weight += s.stats[2 * r + 1];
  }
  s.stats[2 * s.rows] = weight;
  store(s.out, s.outElem, 0, float(s.mean ? total / weight : total));
}

// --- batch normalization ---------------------------------------------------------

// BatchNormalization and its gradient parts (runtime/cpu/Normalization.cpp,
// GradientsNormalization.cpp) over X [N, C, spatial...], whose channel c is
// the N blocks of `spatial` elements at (n * C + c) * spatial. A channel
// step computes one channel's statistics, in double, with the Lanes of the
// row ops (a warp a channel on the GPU): the batch mean and population
// variance in training mode (two passes), the given mean and variance
// otherwise. Then, per channel:
//   BatchNorm:     coef[2c], [2c+1] = a, shift with y = x * a + shift, and
//                  the running statistics when asked: running = input *
//                  momentum + batch * (1 - momentum) in training mode
//                  (ONNX's convention, population variance; times
//                  unbias = n / (n - 1) for PyTorch's unbiased one), the
//                  input otherwise;
//   BatchNormGradData: coef[4c..4c+3] = a, q, r, m with dX = a * dY +
//                  (q * (x - m) + r); in inference mode (or with no
//                  elements) q = r = m = 0 and a = scale / sqrt(var +
//                  epsilon) with the given variance;
//   BatchNormGradParams: out[c] = dscale = inv * sum of dY * (x - mean).
// A ChannelMapStep then applies the coefficients element by element.
enum class ChannelOp : uint8_t {
  BatchNorm,
  BatchNormGradData,
  BatchNormGradParams,
};

struct ChannelStep {
  ChannelOp op = ChannelOp::BatchNorm;
  int64_t images = 0, channels = 0, spatial = 0;
  const void *x = nullptr, *dy = nullptr;
  Elem xElem = Elem::F32, dyElem = Elem::F32;
  // Per-channel operands (null where the op has none).
  const void *scale = nullptr, *bias = nullptr, *mean = nullptr,
             *var = nullptr;
  Elem scaleElem = Elem::F32, biasElem = Elem::F32, meanElem = Elem::F32,
       varElem = Elem::F32;
  bool training = false;
  double epsilon = 0, momentum = 0;
  double unbias = 1; // multiplies the batch variance in the running one
  float *coef = nullptr;
  void *runMean = nullptr, *runVar = nullptr; // BatchNorm's optional results
  Elem runMeanElem = Elem::F32, runVarElem = Elem::F32;
  void *out = nullptr; // dscale
  Elem outElem = Elem::F32;
};

template <class L>
CLEAVE_HD void channelElement(const L &l, const ChannelStep &s, int64_t ch) {
  int64_t count = s.images * s.spatial;
  auto at = [&](int64_t j) {
    return (j / s.spatial * s.channels + ch) * s.spatial + j % s.spatial;
  };
  auto x = [&](int64_t j) { return double(load(s.x, s.xElem, at(j))); };
  auto param = [&](const void *p, Elem e) { return double(load(p, e, ch)); };
  bool batch = s.training && count > 0;
  if (s.op == ChannelOp::BatchNormGradData && !batch) {
    if (l.lane() == 0) {
      s.coef[4 * ch] = float(param(s.scale, s.scaleElem) /
                             sqrt(param(s.var, s.varElem) + s.epsilon));
      s.coef[4 * ch + 1] = s.coef[4 * ch + 2] = s.coef[4 * ch + 3] = 0.0f;
    }
    return;
  }
  double mean = 0, var = 0;
  if (batch) {
    for (int64_t j = l.lane(); j < count; j += l.count())
      mean += x(j);
    mean = l.sum(mean) / double(count);
    for (int64_t j = l.lane(); j < count; j += l.count()) {
      double d = x(j) - mean;
      var += d * d;
    }
    var = l.sum(var) / double(count);
  } else if (!s.training) {
    mean = param(s.mean, s.meanElem);
    var = param(s.var, s.varElem);
  }
  if (s.op == ChannelOp::BatchNorm) {
    if (l.lane() != 0)
      return;
    double a = param(s.scale, s.scaleElem) / sqrt(var + s.epsilon);
    s.coef[2 * ch] = float(a);
    s.coef[2 * ch + 1] = float(param(s.bias, s.biasElem) - mean * a);
    if (s.runMean) {
      double m0 = param(s.mean, s.meanElem), v0 = param(s.var, s.varElem);
      store(s.runMean, s.runMeanElem, ch,
            float(s.training ? m0 * s.momentum + mean * (1.0 - s.momentum)
                             : m0));
      store(s.runVar, s.runVarElem, ch,
            float(s.training ? v0 * s.momentum +
                                   var * s.unbias * (1.0 - s.momentum)
                             : v0));
    }
    return;
  }
  double inv = 1.0 / sqrt(var + s.epsilon), dy = 0, dyCentered = 0;
  for (int64_t j = l.lane(); j < count; j += l.count()) {
    double g = load(s.dy, s.dyElem, at(j));
    dy += g;
    dyCentered += g * (x(j) - mean);
  }
  dy = l.sum(dy);
  dyCentered = l.sum(dyCentered);
  if (l.lane() != 0)
    return;
  if (s.op == ChannelOp::BatchNormGradParams) {
    store(s.out, s.outElem, ch, float(dyCentered * inv));
    return;
  }
  double a = param(s.scale, s.scaleElem) * inv;
  s.coef[4 * ch] = float(a);
  s.coef[4 * ch + 1] = float(-a * inv * inv * dyCentered / double(count));
  s.coef[4 * ch + 2] = float(-a * dy / double(count));
  s.coef[4 * ch + 3] = float(mean);
}

// A channel step's coefficients applied to `elements` elements of X [N, C,
// spatial...], one thread each, in f32 as the CPU: y = x * a + shift, or
// (grad) dX = a * dY + (q * (x - m) + r).
struct ChannelMapStep {
  bool grad = false;
  int64_t elements = 0, channels = 0, spatial = 0;
  const void *x = nullptr, *dy = nullptr;
  Elem xElem = Elem::F32, dyElem = Elem::F32;
  const float *coef = nullptr;
  void *out = nullptr;
  Elem outElem = Elem::F32;
};

CLEAVE_HD void channelMapElement(const ChannelMapStep &s, int64_t i) {
  int64_t ch = i / s.spatial % s.channels;
  float x = load(s.x, s.xElem, i);
  if (!s.grad) {
    store(s.out, s.outElem, i, x * s.coef[2 * ch] + s.coef[2 * ch + 1]);
    return;
  }
  const float *k = s.coef + 4 * ch;
  store(s.out, s.outElem, i,
        k[0] * load(s.dy, s.dyElem, i) + (k[1] * (x - k[3]) + k[2]));
}

} // namespace cleave::runtime::cuda
