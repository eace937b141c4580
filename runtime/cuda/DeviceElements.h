// The device code's base (DeviceCode.h): element types and their loads and
// stores (bf16 rounded as ir/DType.cpp rounds it), indexers over strided
// shapes, and the strided map: element i of the output is an op of up to
// three operands, each read through its own indexer.
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

  // The same offsets as the plain loop (c = i % dims[d], i /= dims[d]),
  // without its divisions where they are not needed: an index below the
  // dimension is its own coordinate, and one that fits 32 bits is divided
  // in 32 bits (a GPU divides 64-bit integers in software, and a thread
  // that walks a bias gradient's rows spent its time there).
  CLEAVE_HD int64_t operator()(int64_t i) const {
    int64_t off = base;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c;
      if (i < dims[d]) {
        c = i;
        i = 0;
      } else if (((uint64_t(i) | uint64_t(dims[d])) >> 32) == 0) {
        uint32_t u = uint32_t(i), n = uint32_t(dims[d]);
        c = int64_t(u % n);
        i = int64_t(u / n);
      } else {
        c = i % dims[d];
        i /= dims[d];
      }
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
  Relu, Neg, Abs, Exp, Log, Sqrt, Tanh, Erf, Sigmoid, Silu, Reciprocal,
  Scale,     // a * p0
  Clip,      // min(max(a, p0), p1), NaN stays NaN
  LeakyRelu, // a < 0 ? a * p0 : a
  Gelu,      // x Phi(x): p0 0 the erf form, 1 the tanh approximation
  Not,       // !a (bool), ~a (integers, intMap)
  Sin, Cos, Floor, Ceil,
  Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh,
  Round,     // halves to even (rintf in the default rounding mode)
  Sign,      // -1, 0 or 1; NaN stays NaN
  IsNaN,
  IsInf,     // p0: count -inf, p1: count +inf
  HardSigmoid,      // max(0, min(1, p0 a + p1))
  HardSigmoidTorch, // PyTorch's constants: min(max(a + 3, 0), 6) / 6
  HardSwish,        // a min(max(a + 3, 0), 6) / 6
  Dropout,   // a * p0 where the draw for element i keeps it (key, ratio)
  DropoutMask, // the same draw, as a bool
  // two operands
  Add, Sub, Mul, Div, Pow,
  Mod, // fmod (C's remainder: the dividend's sign)
  Equal, Less, Greater, GreaterOrEqual,
  LessOrEqual,
  Max, Min, // NaN wins, as numpy.maximum / minimum
  And, Or, Xor, // bool: logical; integers: bitwise (intMap)
  DropoutGrad, // b (the mask) ? a * p0 : 0
  // UnaryGrad: operand 0 the output gradient dy, operand 1 the forward
  // input x (runtime/cpu/Gradients.cpp); a mask selects dy or 0, so an
  // infinite dy where the mask is off gives 0
  AbsGrad, ClipGrad, ErfGrad, ExpGrad, LeakyReluGrad, LogGrad,
  ReciprocalGrad, ReluGrad, SigmoidGrad, SiluGrad, SqrtGrad, TanhGrad,
  GeluGrad, // p0 as Gelu's
  SinGrad, CosGrad,
  TanGrad, AsinGrad, AcosGrad, AtanGrad, SinhGrad, CoshGrad, AsinhGrad,
  AcoshGrad, AtanhGrad,
  HardSigmoidGrad,      // p0 alpha, p1 beta
  HardSigmoidTorchGrad, // p0 alpha; PyTorch's test on x (-3 < x < 3)
  HardSwishGrad,
  // three operands
  Where, // operand 0 the condition
};

CLEAVE_HD float sigmoid(float x) {
  return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

// GELU and its derivative (PyTorch's formulas, as the CPU kernels).
CLEAVE_HD float geluTanhInner(float x) {
  return 0.7978845608028654f * (x + 0.044715f * x * x * x);
}
CLEAVE_HD float gelu(float x, bool tanhForm) {
  if (tanhForm)
    return 0.5f * x * (1.0f + tanhf(geluTanhInner(x)));
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}
CLEAVE_HD float geluDerivative(float x, bool tanhForm) {
  if (tanhForm) {
    float t = tanhf(geluTanhInner(x));
    float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
  }
  float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
  return cdf + x * 0.3989422804014327f * expf(-0.5f * x * x);
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
  case MapOp::Silu: return a * sigmoid(a);
  case MapOp::Reciprocal: return 1.0f / a;
  case MapOp::Scale: return a * p0;
  case MapOp::Clip: {
    float y = a < p0 ? p0 : a;
    return y > p1 ? p1 : y;
  }
  case MapOp::LeakyRelu: return a < 0.0f ? a * p0 : a;
  case MapOp::Gelu: return gelu(a, p0 != 0.0f);
  case MapOp::Not: return a != 0.0f ? 0.0f : 1.0f;
  case MapOp::Sin: return sinf(a);
  case MapOp::Tan: return tanf(a);
  case MapOp::Asin: return asinf(a);
  case MapOp::Acos: return acosf(a);
  case MapOp::Atan: return atanf(a);
  case MapOp::Sinh: return sinhf(a);
  case MapOp::Cosh: return coshf(a);
  case MapOp::Asinh: return asinhf(a);
  case MapOp::Acosh: return acoshf(a);
  case MapOp::Atanh: return atanhf(a);
  case MapOp::Cos: return cosf(a);
  case MapOp::Floor: return floorf(a);
  case MapOp::Ceil: return ceilf(a);
  case MapOp::Round: return rintf(a);
  case MapOp::Sign:
    return a != a ? a : float(int(a > 0.0f) - int(a < 0.0f));
  case MapOp::IsNaN: return a != a ? 1.0f : 0.0f;
  case MapOp::IsInf:
    return (a == INFINITY && p1 != 0.0f) || (a == -INFINITY && p0 != 0.0f)
               ? 1.0f
               : 0.0f;
  case MapOp::HardSigmoid: {
    float v = p0 * a + p1;
    return fmaxf(0.0f, fminf(1.0f, v));
  }
  case MapOp::HardSigmoidTorch:
    return fminf(fmaxf(a + 3.0f, 0.0f), 6.0f) / 6.0f;
  case MapOp::HardSwish:
    return a * fminf(fmaxf(a + 3.0f, 0.0f), 6.0f) / 6.0f;
  case MapOp::Max: return a > b || a != a ? a : b;
  case MapOp::Min: return a < b || a != a ? a : b;
  case MapOp::And: return a != 0.0f && b != 0.0f ? 1.0f : 0.0f;
  case MapOp::Or: return a != 0.0f || b != 0.0f ? 1.0f : 0.0f;
  case MapOp::Xor: return (a != 0.0f) != (b != 0.0f) ? 1.0f : 0.0f;
  case MapOp::DropoutGrad: return b != 0.0f ? a * p0 : 0.0f;
  case MapOp::Dropout:
  case MapOp::DropoutMask: return a; // mapElement draws
  case MapOp::Add: return a + b;
  case MapOp::Sub: return a - b;
  case MapOp::Mul: return a * b;
  case MapOp::Div: return a / b;
  case MapOp::Pow: return powf(a, b);
  case MapOp::Mod: return fmodf(a, b);
  case MapOp::Equal: return a == b ? 1.0f : 0.0f;
  case MapOp::Less: return a < b ? 1.0f : 0.0f;
  case MapOp::Greater: return a > b ? 1.0f : 0.0f;
  case MapOp::GreaterOrEqual: return a >= b ? 1.0f : 0.0f;
  case MapOp::LessOrEqual: return a <= b ? 1.0f : 0.0f;
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
  case MapOp::SiluGrad: { // PyTorch's silu_backward
    float s = sigmoid(b);
    return a * s * (1.0f + b * (1.0f - s));
  }
  case MapOp::SqrtGrad: return a / (2.0f * sqrtf(b));
  case MapOp::TanhGrad: {
    float t = tanhf(b);
    return a * (1.0f - t * t);
  }
  case MapOp::GeluGrad: return a * geluDerivative(b, p0 != 0.0f);
  case MapOp::SinGrad: return a * cosf(b);
  case MapOp::CosGrad: return -a * sinf(b);
  case MapOp::TanGrad: {
    float t = tanf(b);
    return a * (1.0f + t * t);
  }
  case MapOp::AsinGrad: return a / sqrtf(1.0f - b * b);
  case MapOp::AcosGrad: return -a / sqrtf(1.0f - b * b);
  case MapOp::AtanGrad: return a / (1.0f + b * b);
  case MapOp::SinhGrad: return a * coshf(b);
  case MapOp::CoshGrad: return a * sinhf(b);
  case MapOp::AsinhGrad: return a / sqrtf(b * b + 1.0f);
  case MapOp::AcoshGrad: return a / (sqrtf(b - 1.0f) * sqrtf(b + 1.0f));
  case MapOp::AtanhGrad: return a / (1.0f - b * b);
  case MapOp::HardSigmoidGrad: {
    float v = p0 * b + p1;
    return v > 0.0f && v < 1.0f ? a * p0 : 0.0f;
  }
  case MapOp::HardSigmoidTorchGrad:
    return b > -3.0f && b < 3.0f ? a * p0 : 0.0f;
  case MapOp::HardSwishGrad:
    return b <= -3.0f ? 0.0f : b < 3.0f ? a * (b / 3.0f + 0.5f) : a;
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
         op == MapOp::Mul || op == MapOp::Max || op == MapOp::Min ||
         op == MapOp::Not || op == MapOp::And || op == MapOp::Or ||
         op == MapOp::Xor;
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
  case MapOp::Not: return ~a;
  case MapOp::And: return a & b;
  case MapOp::Or: return a | b;
  case MapOp::Xor: return a ^ b;
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

} // namespace cleave::runtime::cuda
