// The arithmetic of the CUDA backend's own kernels, in one header that both
// nvcc (CudaKernels.cu, where each function runs in a GPU thread) and the
// host C++ compiler (tests/unit/cuda_device_code_test.cpp, where a loop
// runs the same functions over every index) compile. So the index math and
// the formulas are tested against the CPU backend on any machine, GPU or
// not; what only a GPU can test is the launch around them.
//
// Three shapes of kernel cover the ops:
//   - a strided map (`mapElement`): element i of the output, at an offset an
//     Indexer gives, is an op of up to three operands read through their own
//     Indexers. Broadcasting is a zero stride, Transpose permuted strides,
//     Slice a base offset and scaled strides, Concat and Split one map per
//     piece; elementwise math, Cast, Where and UnaryGrad are the op.
//   - a row op (`rowElement`, `channelElement`): one row of a reduction
//     (or one BatchNorm channel), written against a `Lanes` that splits the
//     row among the lanes of a warp on the GPU (sums and maxima by shuffles)
//     and is one lane on the host.
//   - a window op (`im2colElement`, `poolElement`): one element of a conv's
//     column matrix or of a pool, walking its window; the gradients gather,
//     one thread per input element, instead of scattering, so they need no
//     atomics and sum in a fixed order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CLEAVE_HD __host__ __device__ inline
#else
#define CLEAVE_HD inline
#endif

namespace cleave::runtime::cuda {

constexpr int kMaxRank = 8;

// Element types the kernels read and write.
enum class Elem : uint8_t { F32, BF16, I64, I32, Bool };

CLEAVE_HD int elemSize(Elem e) {
  switch (e) {
  case Elem::F32: return 4;
  case Elem::BF16: return 2;
  case Elem::I64: return 8;
  case Elem::I32: return 4;
  case Elem::Bool: return 1;
  }
  return 1;
}

// bf16 <-> f32 exactly as ir/DType.cpp: widening is exact; narrowing
// rounds to nearest even and keeps NaN a (quiet) NaN.
CLEAVE_HD float bf16ToFloat(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
CLEAVE_HD uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Where element i (row-major over `dims`) of an operand lives: base +
// sum of coordinate * stride. Strides are in elements; a broadcast
// dimension has stride 0.
struct Indexer {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  int64_t base = 0;

  CLEAVE_HD int64_t operator()(int64_t i) const {
    int64_t off = base;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = i % dims[d];
      i /= dims[d];
      off += c * strides[d];
    }
    return off;
  }
};

struct Operand {
  const void *data = nullptr;
  Elem elem = Elem::F32;
  Indexer at;
};

CLEAVE_HD float load(const void *p, Elem e, int64_t off) {
  switch (e) {
  case Elem::F32: return static_cast<const float *>(p)[off];
  case Elem::BF16: return bf16ToFloat(static_cast<const uint16_t *>(p)[off]);
  case Elem::I64: return float(static_cast<const int64_t *>(p)[off]);
  case Elem::I32: return float(static_cast<const int32_t *>(p)[off]);
  case Elem::Bool: return static_cast<const uint8_t *>(p)[off] ? 1.0f : 0.0f;
  }
  return 0.0f;
}
CLEAVE_HD int64_t loadInt(const void *p, Elem e, int64_t off) {
  switch (e) {
  case Elem::I64: return static_cast<const int64_t *>(p)[off];
  case Elem::I32: return static_cast<const int32_t *>(p)[off];
  case Elem::Bool: return static_cast<const uint8_t *>(p)[off];
  default: return int64_t(load(p, e, off));
  }
}
CLEAVE_HD void store(void *p, Elem e, int64_t off, float v) {
  switch (e) {
  case Elem::F32: static_cast<float *>(p)[off] = v; return;
  case Elem::BF16: static_cast<uint16_t *>(p)[off] = floatToBf16(v); return;
  case Elem::I64: static_cast<int64_t *>(p)[off] = int64_t(v); return;
  case Elem::I32: static_cast<int32_t *>(p)[off] = int32_t(v); return;
  case Elem::Bool: static_cast<uint8_t *>(p)[off] = v != 0.0f; return;
  }
}
CLEAVE_HD bool isInt(Elem e) {
  return e == Elem::I64 || e == Elem::I32 || e == Elem::Bool;
}

// The ops of the strided map. Copy moves raw elements (any type, bit for
// bit); Cast converts between types; the rest compute in f32.
enum class MapOp : uint8_t {
  Copy,
  Cast,
  Zero, // writes 0 (the part of a SliceGrad no slice covers)
  Fill, // writes p0
  // one operand
  Relu, Neg, Abs, Exp, Log, Sqrt, Tanh, Erf, Sigmoid, Reciprocal,
  Scale,     // a * p0
  Clip,      // min(max(a, p0), p1), NaN stays NaN
  LeakyRelu, // a < 0 ? a * p0 : a
  Not,       // !a (bool)
  Dropout,   // a * p0 where the draw for element i keeps it (key, ratio)
  DropoutMask, // the same draw, as a bool
  // two operands
  Add, Sub, Mul, Div, Pow, Equal, Less, Greater,
  Max, Min, // NaN wins, as numpy.maximum / minimum
  And, Or,  // bool
  DropoutGrad, // b (the mask) ? a * p0 : 0
  // UnaryGrad: operand 0 the output gradient dy, operand 1 the forward
  // input x (runtime/cpu/Gradients.cpp); a mask selects dy or 0, so an
  // infinite dy where the mask is off gives 0
  AbsGrad, ClipGrad, ErfGrad, ExpGrad, LeakyReluGrad, LogGrad,
  ReciprocalGrad, ReluGrad, SigmoidGrad, SqrtGrad, TanhGrad,
  // three operands
  Where, // operand 0 the condition
};

CLEAVE_HD float sigmoid(float x) {
  return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

// p0, p1: the op's parameters (Clip's min and max, LeakyRelu's alpha).
CLEAVE_HD float applyMap(MapOp op, float a, float b, float c, float p0,
                         float p1) {
  switch (op) {
  case MapOp::Copy:
  case MapOp::Cast: return a;
  case MapOp::Zero: return 0.0f;
  case MapOp::Fill: return p0;
  case MapOp::Relu: return a < 0.0f ? 0.0f : a;
  case MapOp::Neg: return -a;
  case MapOp::Abs: return fabsf(a);
  case MapOp::Exp: return expf(a);
  case MapOp::Log: return logf(a);
  case MapOp::Sqrt: return sqrtf(a);
  case MapOp::Tanh: return tanhf(a);
  case MapOp::Erf: return erff(a);
  case MapOp::Sigmoid: return sigmoid(a);
  case MapOp::Reciprocal: return 1.0f / a;
  case MapOp::Scale: return a * p0;
  case MapOp::Clip: {
    float y = a < p0 ? p0 : a;
    return y > p1 ? p1 : y;
  }
  case MapOp::LeakyRelu: return a < 0.0f ? a * p0 : a;
  case MapOp::Not: return a != 0.0f ? 0.0f : 1.0f;
  case MapOp::Max: return a > b || a != a ? a : b;
  case MapOp::Min: return a < b || a != a ? a : b;
  case MapOp::And: return a != 0.0f && b != 0.0f ? 1.0f : 0.0f;
  case MapOp::Or: return a != 0.0f || b != 0.0f ? 1.0f : 0.0f;
  case MapOp::DropoutGrad: return b != 0.0f ? a * p0 : 0.0f;
  case MapOp::Dropout:
  case MapOp::DropoutMask: return a; // mapElement draws
  case MapOp::Add: return a + b;
  case MapOp::Sub: return a - b;
  case MapOp::Mul: return a * b;
  case MapOp::Div: return a / b;
  case MapOp::Pow: return powf(a, b);
  case MapOp::Equal: return a == b ? 1.0f : 0.0f;
  case MapOp::Less: return a < b ? 1.0f : 0.0f;
  case MapOp::Greater: return a > b ? 1.0f : 0.0f;
  case MapOp::AbsGrad: return b > 0.0f ? a : b < 0.0f ? -a : 0.0f;
  case MapOp::ClipGrad: return b >= p0 && b <= p1 ? a : 0.0f;
  case MapOp::ErfGrad: return a * (1.1283791670955126f * expf(-b * b));
  case MapOp::ExpGrad: return a * expf(b);
  case MapOp::LeakyReluGrad: return b > 0.0f ? a : a * p0;
  case MapOp::LogGrad: return a / b;
  case MapOp::ReciprocalGrad: return -a / (b * b);
  case MapOp::ReluGrad: return b > 0.0f ? a : 0.0f;
  case MapOp::SigmoidGrad: {
    float s = 1.0f / (1.0f + expf(-b));
    return a * s * (1.0f - s);
  }
  case MapOp::SqrtGrad: return a / (2.0f * sqrtf(b));
  case MapOp::TanhGrad: {
    float t = tanhf(b);
    return a * (1.0f - t * t);
  }
  case MapOp::Where: return a != 0.0f ? b : c;
  }
  return a;
}

CLEAVE_HD int mapOperands(MapOp op) {
  if (op == MapOp::Zero || op == MapOp::Fill)
    return 0;
  if (op <= MapOp::DropoutMask)
    return 1;
  if (op == MapOp::Where)
    return 3;
  return 2;
}

// One strided map: `n` elements; the output's element i is at out.at(i).
struct MapArgs {
  MapOp op = MapOp::Copy;
  int64_t n = 0;
  Operand in[3];
  void *out = nullptr;
  Elem outElem = Elem::F32;
  Indexer outAt;
  float p0 = 0, p1 = 0; // applyMap's parameters
  // Dropout: the call's key (splitmix64 of its seed) and the drop ratio.
  uint64_t key = 0;
  double ratio = 0;
};

// Dropout's counter-based draw (runtime/cpu/Normalization.cpp): element i
// is kept when a hash of the call's key and i, as a double in [0, 1), is at
// least the ratio; the same on every backend and thread count.
CLEAVE_HD uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
CLEAVE_HD bool dropoutKeeps(uint64_t key, double ratio, int64_t i) {
  double u = double(splitmix64(key ^ uint64_t(i)) >> 11) * 0x1.0p-53;
  return u >= ratio;
}

// Integer arithmetic, where the output is an integer type: in int64,
// wrapping as the CPU's two's complement does (through uint64).
CLEAVE_HD bool intMap(MapOp op) {
  return op == MapOp::Relu || op == MapOp::Neg || op == MapOp::Abs ||
         op == MapOp::Clip || op == MapOp::Add || op == MapOp::Sub ||
         op == MapOp::Mul || op == MapOp::Max || op == MapOp::Min;
}
CLEAVE_HD int64_t applyIntMap(MapOp op, int64_t a, int64_t b, int64_t lo,
                              int64_t hi) {
  switch (op) {
  case MapOp::Relu: return a < 0 ? 0 : a;
  case MapOp::Neg: return int64_t(uint64_t(0) - uint64_t(a));
  case MapOp::Abs: return a < 0 ? int64_t(uint64_t(0) - uint64_t(a)) : a;
  case MapOp::Clip: {
    int64_t y = a < lo ? lo : a;
    return y > hi ? hi : y;
  }
  case MapOp::Add: return int64_t(uint64_t(a) + uint64_t(b));
  case MapOp::Sub: return int64_t(uint64_t(a) - uint64_t(b));
  case MapOp::Mul: return int64_t(uint64_t(a) * uint64_t(b));
  case MapOp::Max: return a > b ? a : b;
  case MapOp::Min: return a < b ? a : b;
  default: return a;
  }
}

// Copies one element of `size` bytes, bit for bit.
CLEAVE_HD void mapCopyElement(const void *src, int64_t s, void *dst, int64_t o,
                              int size) {
  switch (size) {
  case 1: static_cast<uint8_t *>(dst)[o] = static_cast<const uint8_t *>(src)[s]; return;
  case 2: static_cast<uint16_t *>(dst)[o] = static_cast<const uint16_t *>(src)[s]; return;
  case 4: static_cast<uint32_t *>(dst)[o] = static_cast<const uint32_t *>(src)[s]; return;
  default: static_cast<uint64_t *>(dst)[o] = static_cast<const uint64_t *>(src)[s]; return;
  }
}

CLEAVE_HD void mapElement(const MapArgs &a, int64_t i) {
  int64_t o = a.outAt(i);
  if (a.op == MapOp::Copy) {
    mapCopyElement(a.in[0].data, a.in[0].at(i), a.out, o, elemSize(a.outElem));
    return;
  }
  if (a.op == MapOp::Dropout || a.op == MapOp::DropoutMask) {
    bool keep = dropoutKeeps(a.key, a.ratio, i);
    float x = a.op == MapOp::Dropout
                  ? load(a.in[0].data, a.in[0].elem, a.in[0].at(i)) * a.p0
                  : 1.0f;
    store(a.out, a.outElem, o, keep ? x : 0.0f);
    return;
  }
  if (isInt(a.outElem) && a.outElem != Elem::Bool && intMap(a.op)) {
    int k = mapOperands(a.op);
    int64_t x = loadInt(a.in[0].data, a.in[0].elem, a.in[0].at(i));
    int64_t y = k > 1 ? loadInt(a.in[1].data, a.in[1].elem, a.in[1].at(i)) : 0;
    int64_t v = applyIntMap(a.op, x, y, int64_t(a.p0), int64_t(a.p1));
    if (a.outElem == Elem::I64)
      static_cast<int64_t *>(a.out)[o] = v;
    else
      static_cast<int32_t *>(a.out)[o] = int32_t(v);
    return;
  }
  if ((a.op == MapOp::Less || a.op == MapOp::Greater) && isInt(a.in[0].elem)) {
    int64_t x = loadInt(a.in[0].data, a.in[0].elem, a.in[0].at(i)),
            y = loadInt(a.in[1].data, a.in[1].elem, a.in[1].at(i));
    store(a.out, a.outElem, o,
          (a.op == MapOp::Less ? x < y : x > y) ? 1.0f : 0.0f);
    return;
  }
  if (a.op == MapOp::Equal && isInt(a.in[0].elem)) {
    bool eq = loadInt(a.in[0].data, a.in[0].elem, a.in[0].at(i)) ==
              loadInt(a.in[1].data, a.in[1].elem, a.in[1].at(i));
    store(a.out, a.outElem, o, eq ? 1.0f : 0.0f);
    return;
  }
  if (a.op == MapOp::Cast && isInt(a.in[0].elem) && isInt(a.outElem)) {
    int64_t v = loadInt(a.in[0].data, a.in[0].elem, a.in[0].at(i));
    switch (a.outElem) {
    case Elem::I64: static_cast<int64_t *>(a.out)[o] = v; return;
    case Elem::I32: static_cast<int32_t *>(a.out)[o] = int32_t(v); return;
    default: static_cast<uint8_t *>(a.out)[o] = v != 0; return;
    }
  }
  int k = mapOperands(a.op);
  float x = k > 0 ? load(a.in[0].data, a.in[0].elem, a.in[0].at(i)) : 0.0f;
  float y = k > 1 ? load(a.in[1].data, a.in[1].elem, a.in[1].at(i)) : 0.0f;
  float z = k > 2 ? load(a.in[2].data, a.in[2].elem, a.in[2].at(i)) : 0.0f;
  store(a.out, a.outElem, o, applyMap(a.op, x, y, z, a.p0, a.p1));
}

enum class ReduceKind : uint8_t { Sum, Mean, Max };

// One output of a reduction (SumTo, ReduceSum/Mean/Max): the `count`
// inputs at first + reduced(r), in increasing r, summed in double (as the
// CPU does) or their maximum (-inf for none).
CLEAVE_HD void reduceElement(ReduceKind kind, const void *in, Elem inElem,
                             int64_t first, const Indexer &reduced,
                             int64_t count, void *out, Elem outElem,
                             int64_t o) {
  if (kind == ReduceKind::Max) {
    float m = -INFINITY;
    for (int64_t r = 0; r < count; ++r) {
      float v = load(in, inElem, first + reduced(r));
      m = v > m || v != v ? v : m;
    }
    store(out, outElem, o, m);
    return;
  }
  double acc = 0.0;
  for (int64_t r = 0; r < count; ++r)
    acc += load(in, inElem, first + reduced(r));
  store(out, outElem, o,
        float(kind == ReduceKind::Mean ? acc / double(count) : acc));
}

// One thread per output element: out[at(o)] = sum over the reduced
// coordinates r < count of in[base(o) + reduced(r)] (reduceElement):
// SumTo and ReduceSum / ReduceMean / ReduceMax.
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
};

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
    for (int64_t j = l.lane(); j < len; j += l.count())
      mean += x(j);
    mean = len ? l.sum(mean) / double(len) : 0.0;
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
    meanG = len ? l.sum(meanG) / double(len) : 0.0;
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
// invStd_r, with the statistics from a LayerNormStats row step.
struct ColumnStep {
  int64_t rows = 0, len = 0;
  const void *dy = nullptr, *x = nullptr;
  Elem dyElem = Elem::F32, xElem = Elem::F32;
  const double *stats = nullptr;
  void *out = nullptr;
  Elem outElem = Elem::F32;
};

CLEAVE_HD void columnElement(const ColumnStep &s, int64_t j) {
  double acc = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    int64_t i = r * s.len + j;
    acc += double(load(s.dy, s.dyElem, i)) *
           ((double(load(s.x, s.xElem, i)) - s.stats[2 * r]) * s.stats[2 * r + 1]);
  }
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

// --- gather and its gradient ------------------------------------------------------

// Gather along an axis: out[(o * n + k) * inner + i] = data[(o * dim +
// idx[k]) * inner + i], a negative index counting from the end. An index
// out of range reads nothing and writes 0 (cleave-run checks index inputs
// against the plan before they reach a kernel).
struct GatherStep {
  const void *data = nullptr;
  Elem elem = Elem::F32;
  const void *idx = nullptr;
  Elem idxElem = Elem::I64;
  void *out = nullptr;
  int64_t outer = 1, n = 0, dim = 0, inner = 1;
  bool grad = false; // GatherGrad: out is dX, data is dY
};

CLEAVE_HD int64_t gatherIndex(const GatherStep &s, int64_t k) {
  int64_t v = loadInt(s.idx, s.idxElem, k);
  return v < 0 ? v + s.dim : v;
}

// Gather: element i of the output.
CLEAVE_HD void gatherElement(const GatherStep &s, int64_t i) {
  int64_t in = i % s.inner, k = (i / s.inner) % s.n, o = i / (s.inner * s.n);
  int64_t v = gatherIndex(s, k);
  if (v < 0 || v >= s.dim) {
    store(s.out, s.elem, i, 0.0f);
    return;
  }
  mapCopyElement(s.data, (o * s.dim + v) * s.inner + in, s.out, i,
                 elemSize(s.elem));
}

// GatherGrad: column c = (o, i) of dX, which is zero before: adds dY[o, k,
// i] into dX[o, idx[k], i] for k in increasing order, in f32, as the CPU.
CLEAVE_HD void gatherGradColumn(const GatherStep &s, int64_t c) {
  int64_t in = c % s.inner, o = c / s.inner;
  for (int64_t k = 0; k < s.n; ++k) {
    int64_t v = gatherIndex(s, k);
    if (v < 0 || v >= s.dim)
      continue;
    int64_t dst = (o * s.dim + v) * s.inner + in;
    float acc = load(s.out, s.elem, dst) +
                load(s.data, s.elem, (o * s.n + k) * s.inner + in);
    store(s.out, s.elem, dst, acc);
  }
}

// --- convolution and pooling windows -----------------------------------------

constexpr int kMaxSpatial = kMaxRank - 2;

// The windows of a conv or pool over `rank` spatial dims (NCHW-style
// layouts, one plane per (image, channel)), as runtime/cpu/ConvGeometry.h:
// output position o's window starts at o * stride - padBegin per dim, and
// its tap k reads input coordinate start + k * dilation. Positions and taps
// are flat, row-major over the spatial dims.
struct Window {
  int rank = 0;
  int64_t in[kMaxSpatial] = {}, out[kMaxSpatial] = {},
          kernel[kMaxSpatial] = {};
  int64_t strides[kMaxSpatial] = {}, padBegin[kMaxSpatial] = {},
          padEnd[kMaxSpatial] = {}, dilations[kMaxSpatial] = {};
  int64_t inSize = 1, outSize = 1, kernelSize = 1;
};

// The input position tap t of output position o reads, or -1 where it
// lands in the padding.
CLEAVE_HD int64_t windowInput(const Window &w, int64_t o, int64_t t) {
  int64_t q = 0, step = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    int64_t od = o % w.out[d], kd = t % w.kernel[d];
    o /= w.out[d];
    t /= w.kernel[d];
    int64_t i = od * w.strides[d] + kd * w.dilations[d] - w.padBegin[d];
    if (i < 0 || i >= w.in[d])
      return -1;
    q += i * step;
    step *= w.in[d];
  }
  return q;
}

// The output position whose tap t reads input position q, or -1 for none
// (each tap of each window reads one input, so there is at most one).
// Taps in decreasing order give those outputs in increasing order.
CLEAVE_HD int64_t windowOutput(const Window &w, int64_t q, int64_t t) {
  int64_t o = 0, step = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    int64_t qd = q % w.in[d], kd = t % w.kernel[d];
    q /= w.in[d];
    t /= w.kernel[d];
    int64_t at = qd + w.padBegin[d] - kd * w.dilations[d];
    if (at < 0 || at % w.strides[d] != 0 || at / w.strides[d] >= w.out[d])
      return -1;
    o += at / w.strides[d] * step;
    step *= w.out[d];
  }
  return o;
}

// im2col and its adjoint, col2im. Image n's column matrix holds, at
// n * imageStride + row * rowStride + o with row = c * kernelSize + t, the
// input of channel c that tap t of output position o reads, 0 in the
// padding: conv's right-hand operand (group g's rows are its channels').
//   im2col:  one thread per column entry (n, row, o), copied bit for bit
//            from `in` (the images) to `out` (the columns);
//   col2im:  one thread per image element (n, c, q) of `out`, which is
//            the sum of the column entries read from q, in f32 and in
//            increasing tap order as the CPU's col2im adds them: a gather,
//            so deterministic without atomics.
struct Im2colStep {
  bool adjoint = false; // col2im
  Window w;
  int64_t images = 0, channels = 0;
  int64_t imageStride = 0, rowStride = 0; // of the column matrices
  const void *in = nullptr;
  Elem inElem = Elem::F32;
  void *out = nullptr;
  Elem outElem = Elem::F32;
};

CLEAVE_HD int64_t im2colCount(const Im2colStep &s) {
  int64_t perImage = s.adjoint ? s.w.inSize : s.w.kernelSize * s.w.outSize;
  return s.images * s.channels * perImage;
}

CLEAVE_HD void im2colElement(const Im2colStep &s, int64_t i) {
  const Window &w = s.w;
  int64_t rows = s.channels * w.kernelSize;
  if (!s.adjoint) {
    int64_t o = i % w.outSize, row = i / w.outSize % rows,
            n = i / (w.outSize * rows);
    int64_t q = windowInput(w, o, row % w.kernelSize);
    int64_t dst = n * s.imageStride + row * s.rowStride + o;
    if (q < 0)
      store(s.out, s.outElem, dst, 0.0f);
    else
      mapCopyElement(s.in, (n * s.channels + row / w.kernelSize) * w.inSize + q,
                     s.out, dst, elemSize(s.outElem));
    return;
  }
  int64_t q = i % w.inSize, c = i / w.inSize % s.channels,
          n = i / (w.inSize * s.channels);
  float acc = 0.0f;
  for (int64_t t = 0; t < w.kernelSize; ++t) {
    int64_t o = windowOutput(w, q, t);
    if (o >= 0)
      acc += load(s.in, s.inElem,
                  n * s.imageStride + (c * w.kernelSize + t) * s.rowStride + o);
  }
  store(s.out, s.outElem, i, acc);
}

// Pooling, runtime/cpu/ConvPool.cpp and GradientsConvPool.cpp:
//   Max:         y = the window's first maximum (-inf for a window wholly
//                in the padding); `indices`, when asked, its flat index
//                over the whole input (ONNX's), -1 for none;
//   Average:     y = the sum of the taps inside the input (in double) over
//                the window's divisor (windowDivisor);
//   MaxGrad:     dX[q] = the sum of dY over the windows whose first maximum
//                is q (X is the forward input);
//   AverageGrad: dX[q] = the sum of dY / count over the windows that read q.
// The forward kinds take one thread per output element, the gradients one
// per input element, which gathers its windows' shares in increasing output
// order, in f32, the order the CPU adds them: no scatter, no atomics.
enum class PoolKind : uint8_t { Max, Average, MaxGrad, AverageGrad };

struct PoolStep {
  PoolKind kind = PoolKind::Max;
  Window w;
  int64_t planes = 0; // images * channels
  const void *x = nullptr; // X (Max, Average, MaxGrad)
  Elem xElem = Elem::F32;
  const void *dy = nullptr; // dY (the gradients)
  Elem dyElem = Elem::F32;
  void *out = nullptr; // Y or dX
  Elem outElem = Elem::F32;
  int64_t *indices = nullptr; // MaxPool's optional second result
  bool includePad = false;    // AveragePool's count_include_pad
};

CLEAVE_HD int64_t poolCount(const PoolStep &s) {
  bool grad = s.kind == PoolKind::MaxGrad || s.kind == PoolKind::AverageGrad;
  return s.planes * (grad ? s.w.inSize : s.w.outSize);
}

// The first maximum of output o's window over `plane`, as an input
// position, or -1 when no tap lands inside the input. A NaN first tap
// stays (nothing compares greater), as on the CPU.
CLEAVE_HD int64_t windowArgmax(const PoolStep &s, int64_t plane, int64_t o) {
  int64_t at = -1;
  float best = -INFINITY;
  for (int64_t t = 0; t < s.w.kernelSize; ++t) {
    int64_t q = windowInput(s.w, o, t);
    if (q < 0)
      continue;
    float v = load(s.x, s.xElem, plane * s.w.inSize + q);
    if (at < 0 || v > best) {
      best = v;
      at = q;
    }
  }
  return at;
}

// AveragePool's divisor for output o: its taps inside the input, or with
// count_include_pad those inside the padded input (the cells a ceil_mode
// window reaches past the end padding never count).
CLEAVE_HD int64_t windowDivisor(const PoolStep &s, int64_t o) {
  const Window &w = s.w;
  int64_t count = 0;
  if (!s.includePad) {
    for (int64_t t = 0; t < w.kernelSize; ++t)
      count += windowInput(w, o, t) >= 0 ? 1 : 0;
    return count;
  }
  count = 1;
  for (int d = w.rank - 1; d >= 0; --d) {
    int64_t start = o % w.out[d] * w.strides[d]; // from the padding's start
    o /= w.out[d];
    int64_t room = w.in[d] + w.padBegin[d] + w.padEnd[d] - start;
    count *= room <= 0 ? 0 : room < w.kernel[d] ? room : w.kernel[d];
  }
  return count;
}

CLEAVE_HD void poolElement(const PoolStep &s, int64_t i) {
  const Window &w = s.w;
  if (s.kind == PoolKind::Max || s.kind == PoolKind::Average) {
    int64_t o = i % w.outSize, plane = i / w.outSize;
    if (s.kind == PoolKind::Max) {
      int64_t at = windowArgmax(s, plane, o);
      store(s.out, s.outElem, i,
            at < 0 ? -INFINITY : load(s.x, s.xElem, plane * w.inSize + at));
      if (s.indices)
        s.indices[i] = at < 0 ? -1 : plane * w.inSize + at;
      return;
    }
    double sum = 0;
    for (int64_t t = 0; t < w.kernelSize; ++t) {
      int64_t q = windowInput(w, o, t);
      if (q >= 0)
        sum += load(s.x, s.xElem, plane * w.inSize + q);
    }
    int64_t count = windowDivisor(s, o);
    store(s.out, s.outElem, i, count ? float(sum / double(count)) : 0.0f);
    return;
  }
  int64_t q = i % w.inSize, plane = i / w.inSize;
  float acc = 0.0f;
  for (int64_t t = w.kernelSize - 1; t >= 0; --t) {
    int64_t o = windowOutput(w, q, t);
    if (o < 0)
      continue;
    float g = load(s.dy, s.dyElem, plane * w.outSize + o);
    if (s.kind == PoolKind::MaxGrad) {
      if (windowArgmax(s, plane, o) == q)
        acc += g;
      continue;
    }
    int64_t count = windowDivisor(s, o);
    if (count)
      acc += float(double(g) / double(count));
  }
  store(s.out, s.outElem, i, acc);
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
//                  (ONNX's convention, population variance), the input
//                  otherwise;
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
            float(s.training ? v0 * s.momentum + var * (1.0 - s.momentum)
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

// --- padding ---------------------------------------------------------------------

// Pad, runtime/cpu/DataMovement.cpp: output coordinate o of dim d reads
// input coordinate o - padBegin[d] when inside; outside, constant mode
// writes `value` (the raw bits of the element), edge clamps, reflect
// mirrors without repeating the edge (periodic with 2 (n - 1)).
enum class PadMode : uint8_t { Constant, Edge, Reflect };

struct PadStep {
  PadMode mode = PadMode::Constant;
  int rank = 0;
  int64_t in[kMaxRank] = {}, out[kMaxRank] = {}, padBegin[kMaxRank] = {};
  const void *src = nullptr;
  void *dst = nullptr;
  int size = 4; // element bytes
  uint64_t value = 0;
  int64_t n = 0; // output elements
};

CLEAVE_HD void padElement(const PadStep &s, int64_t i) {
  int64_t rest = i, q = 0, step = 1;
  bool inside = true;
  for (int d = s.rank - 1; d >= 0; --d) {
    int64_t o = rest % s.out[d], n = s.in[d];
    rest /= s.out[d];
    int64_t c = o - s.padBegin[d];
    if (c < 0 || c >= n) {
      if (s.mode == PadMode::Constant) {
        inside = false;
      } else if (s.mode == PadMode::Edge || n == 1) {
        c = c < 0 ? 0 : n - 1;
      } else {
        int64_t period = 2 * (n - 1), m = ((c % period) + period) % period;
        c = m < n ? m : period - m;
      }
    }
    q += c * step;
    step *= n;
  }
  if (inside) {
    mapCopyElement(s.src, q, s.dst, i, s.size);
    return;
  }
  switch (s.size) {
  case 1: static_cast<uint8_t *>(s.dst)[i] = uint8_t(s.value); return;
  case 2: static_cast<uint16_t *>(s.dst)[i] = uint16_t(s.value); return;
  case 4: static_cast<uint32_t *>(s.dst)[i] = uint32_t(s.value); return;
  default: static_cast<uint64_t *>(s.dst)[i] = s.value; return;
  }
}

// --- optimizers ------------------------------------------------------------------

// SGD and AdamW, element by element, in double (runtime/cpu/Optimizers.cpp).
// lr and step are one-element tensors read in the kernel, so a changed
// learning rate needs no new launch parameters.
struct OptimizerStep {
  bool adamw = false;
  int64_t n = 0;
  const void *param = nullptr, *grad = nullptr, *lr = nullptr,
             *step = nullptr;
  Elem elem = Elem::F32, lrElem = Elem::F32, stepElem = Elem::F32;
  const void *m = nullptr, *v = nullptr; // SGD: m is the velocity (or null)
  void *paramOut = nullptr, *mOut = nullptr, *vOut = nullptr;
  Elem mElem = Elem::F32, vElem = Elem::F32;
  double gradScale = 1, momentum = 0, weightDecay = 0, beta1 = 0.9,
         beta2 = 0.999, epsilon = 1e-8;
  bool nesterov = false;
};

CLEAVE_HD void optimizerElement(const OptimizerStep &s, int64_t i) {
  double lr = load(s.lr, s.lrElem, 0);
  double g = double(load(s.grad, s.elem, i)) * s.gradScale;
  double p = load(s.param, s.elem, i);
  if (!s.adamw) {
    g += s.weightDecay * p;
    if (s.m) {
      double vNew = s.momentum * double(load(s.m, s.mElem, i)) + g;
      store(s.mOut, s.mElem, i, float(vNew));
      g = s.nesterov ? g + s.momentum * vNew : vNew;
    }
    store(s.paramOut, s.elem, i, float(p - lr * g));
    return;
  }
  double t = double(load(s.step, s.stepElem, 0)) + 1.0;
  double stepSize = lr / (1.0 - pow(s.beta1, t));
  double c2 = sqrt(1.0 - pow(s.beta2, t));
  p = p * (1.0 - lr * s.weightDecay);
  double mNew = s.beta1 * double(load(s.m, s.mElem, i)) + (1.0 - s.beta1) * g;
  double vNew =
      s.beta2 * double(load(s.v, s.vElem, i)) + (1.0 - s.beta2) * g * g;
  double denom = sqrt(vNew) / c2 + s.epsilon;
  store(s.paramOut, s.elem, i, float(p - stepSize * mNew / denom));
  store(s.mOut, s.mElem, i, float(mNew));
  store(s.vOut, s.vElem, i, float(vNew));
}

} // namespace cleave::runtime::cuda
