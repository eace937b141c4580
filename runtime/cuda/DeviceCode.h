// The arithmetic of the CUDA backend's own kernels, in one header that both
// nvcc (CudaKernels.cu, where each function runs in a GPU thread) and the
// host C++ compiler (tests/unit/cuda_device_code_test.cpp, where a loop
// runs the same functions over every index) compile. So the index math and
// the formulas are tested against the CPU backend on any machine, GPU or
// not; what only a GPU can test is the launch around them.
//
// Two shapes of kernel cover the ops:
//   - a strided map (`mapElement`): element i of the output, at an offset an
//     Indexer gives, is an op of up to three operands read through their own
//     Indexers. Broadcasting is a zero stride, Transpose permuted strides,
//     Slice a base offset and scaled strides, Concat and Split one map per
//     piece; elementwise math, Cast, Where and UnaryGrad are the op.
//   - a row op (`softmaxRow`, `layerNormRow`, ...): one row of a reduction,
//     written against a `Lanes` that splits the row among the lanes of a
//     warp on the GPU (sums and maxima by shuffles) and is one lane on the
//     host.
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
  // one operand
  Relu, Neg, Abs, Exp, Log, Sqrt, Tanh, Erf, Sigmoid, Reciprocal,
  Scale, // a * p0
  // two operands
  Add, Sub, Mul, Div, Pow, Equal, Less, Greater,
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
  if (op == MapOp::Zero)
    return 0;
  if (op <= MapOp::Scale)
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
};

CLEAVE_HD void mapElement(const MapArgs &a, int64_t i) {
  int64_t o = a.outAt(i);
  if (a.op == MapOp::Copy) {
    int64_t s = a.in[0].at(i);
    switch (elemSize(a.outElem)) {
    case 1: static_cast<uint8_t *>(a.out)[o] = static_cast<const uint8_t *>(a.in[0].data)[s]; return;
    case 2: static_cast<uint16_t *>(a.out)[o] = static_cast<const uint16_t *>(a.in[0].data)[s]; return;
    case 4: static_cast<uint32_t *>(a.out)[o] = static_cast<const uint32_t *>(a.in[0].data)[s]; return;
    default: static_cast<uint64_t *>(a.out)[o] = static_cast<const uint64_t *>(a.in[0].data)[s]; return;
    }
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

// One output of a reduction (SumTo): the sum, in f32 and in increasing
// order, of the `count` inputs at first + reduced(r).
CLEAVE_HD void reduceElement(const void *in, Elem inElem, int64_t first,
                             const Indexer &reduced, int64_t count, void *out,
                             Elem outElem, int64_t o) {
  float acc = 0.0f;
  for (int64_t r = 0; r < count; ++r)
    acc += load(in, inElem, first + reduced(r));
  store(out, outElem, o, acc);
}

} // namespace cleave::runtime::cuda
