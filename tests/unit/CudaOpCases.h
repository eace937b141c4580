// The op cases the CUDA backend is checked on against the CPU backend,
// shared by the host test of its lowering (cuda_lowering_test.cpp, on the
// emulated backend) and the GPU test (cuda_backend_test.cpp, on a device).
// Each case runs one kernel call on both backends, each through its own
// memory and copies, and compares every output: data movement bit for bit,
// arithmetic within the case's tolerance.
#ifndef CLEAVE_TESTS_UNIT_CUDAOPCASES_H
#define CLEAVE_TESTS_UNIT_CUDAOPCASES_H

#include "CpuKernelTesting.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace cleave::cudatest {

using runtime::KernelCall;
using runtime::TensorRef;
using ir::DType;
using ir::OpKind;
using Ints = std::vector<int64_t>;

// Ties: values in {-1, 0, 1}, so pooling windows hold equal maxima.
// Wide: uniform in [-5, 5] (past HardSigmoid's and HardSwish's kinks);
// Halves: multiples of 0.5 in [-4, 4] (Round's ties); Special: NaN, +-inf
// and finite values mixed; Signed: integers in [-3, 3] (indices counting
// from either end of a dim of 4 or more; integers are otherwise in [0, 3]);
// Unit: uniform in [-0.9, 0.9] (asin's, acos's and atanh's domain);
// AboveOne: uniform in [1.1, 3] (acosh's).
enum class Fill {
  Uniform, Positive, Small, Bool, Ties, Wide, Halves, Special, Signed, Unit,
  AboveOne
};

struct Arg {
  DType dtype;
  Ints shape;
  Fill fill = Fill::Uniform;
};

struct Case {
  std::string name;
  OpKind op;
  ir::AttrMap attrs;
  std::vector<Arg> ins;
  std::vector<Arg> outs;
  double tol = 0; // 0: bit for bit
};

struct Buffer {
  DType dtype;
  Ints shape;
  std::vector<uint8_t> bytes;
  TensorRef ref() {
    return {dtype, shape, bytes.data()};
  }
  double at(int64_t i) const {
    switch (dtype) {
    case DType::F32: return reinterpret_cast<const float *>(bytes.data())[i];
    case DType::BF16:
      return ir::bf16ToFloat(reinterpret_cast<const uint16_t *>(bytes.data())[i]);
    case DType::I64: return double(reinterpret_cast<const int64_t *>(bytes.data())[i]);
    case DType::I32: return double(reinterpret_cast<const int32_t *>(bytes.data())[i]);
    default: return double(bytes[i]);
    }
  }
};

inline int64_t count(const Ints &s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

inline Buffer make(const Arg &a, std::mt19937 &rng) {
  Buffer b{a.dtype, a.shape, {}};
  int64_t n = count(a.shape);
  b.bytes.assign(size_t(n) * ir::dtypeSize(a.dtype) + 8, 0xcd);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f), pos(0.1f, 3.0f),
      wide(-5.0f, 5.0f), unit(-0.9f, 0.9f), aboveOne(1.1f, 3.0f);
  std::uniform_int_distribution<int> small(0, 3), halves(-8, 8),
      signedInt(-3, 3);
  const float special[] = {NAN, INFINITY, -INFINITY, 1.5f, -0.0f, 0.0f, -2.5f};
  for (int64_t i = 0; i < n; ++i) {
    float f = a.fill == Fill::Positive ? pos(rng)
              : a.fill == Fill::Ties   ? float(small(rng) % 3) - 1
              : a.fill == Fill::Wide   ? wide(rng)
              : a.fill == Fill::Unit   ? unit(rng)
              : a.fill == Fill::AboveOne ? aboveOne(rng)
              : a.fill == Fill::Halves ? float(halves(rng)) * 0.5f
              : a.fill == Fill::Special ? special[i % 7]
                                        : uni(rng);
    switch (a.dtype) {
    case DType::F32: reinterpret_cast<float *>(b.bytes.data())[i] = f; break;
    case DType::BF16:
      reinterpret_cast<uint16_t *>(b.bytes.data())[i] = ir::floatToBf16(f);
      break;
    case DType::I64:
      reinterpret_cast<int64_t *>(b.bytes.data())[i] =
          a.fill == Fill::Signed ? signedInt(rng) : small(rng);
      break;
    case DType::I32:
      reinterpret_cast<int32_t *>(b.bytes.data())[i] =
          a.fill == Fill::Signed ? signedInt(rng) : small(rng);
      break;
    case DType::Bool: b.bytes[i] = small(rng) & 1; break;
    default: break;
    }
  }
  return b;
}

// Runs `c` on the CPU backend and on `other` (through its own memory and
// copies, so a GPU backend works the same way) and compares the outputs.
inline void check(const Case &c, runtime::Backend &other) {
  SCOPED_TRACE(c.name);
  std::mt19937 rng(7);
  std::vector<Buffer> ins;
  for (const Arg &a : c.ins)
    ins.push_back(make(a, rng));
  auto runOn = [&](runtime::Backend &backend) {
    std::vector<Buffer> outs;
    for (const Arg &a : c.outs)
      outs.push_back(make(a, rng)); // garbage a kernel must overwrite
    std::vector<void *> memory;
    auto place = [&](Buffer &b) {
      void *p = backend.allocate(b.bytes.size());
      backend.copyToDevice(p, b.bytes.data(), b.bytes.size());
      memory.push_back(p);
      return TensorRef{b.dtype, b.shape, p};
    };
    std::vector<TensorRef> in, out;
    for (Buffer &b : ins)
      in.push_back(place(b));
    for (Buffer &b : outs)
      out.push_back(place(b));
    KernelCall call{c.op, c.attrs, in, out, 0};
    llvm::Error e = backend.run(call);
    EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
    for (size_t k = 0; k < outs.size(); ++k)
      backend.copyToHost(outs[k].bytes.data(), out[k].data,
                         outs[k].bytes.size());
    for (void *p : memory)
      backend.release(p);
    return outs;
  };
  std::vector<Buffer> want = runOn(testsupport::cpu());
  std::vector<Buffer> got = runOn(other);
  ASSERT_EQ(want.size(), got.size());
  for (size_t k = 0; k < want.size(); ++k) {
    int64_t n = count(want[k].shape);
    size_t bytes = size_t(n) * ir::dtypeSize(want[k].dtype);
    if (c.tol == 0) {
      EXPECT_TRUE(std::equal(want[k].bytes.begin(), want[k].bytes.begin() + bytes,
                             got[k].bytes.begin()))
          << "output " << k << " differs";
      continue;
    }
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      double w = want[k].at(i), g = got[k].at(i);
      if (!(std::abs(w - g) <= c.tol * (1 + std::abs(w)))) {
        ADD_FAILURE() << "output " << k << " element " << i << ": cpu " << w
                      << ", cuda lowering " << g;
        ++bad;
      }
    }
  }
}

inline Arg f32(Ints s, Fill f = Fill::Uniform) { return {DType::F32, std::move(s), f}; }
inline Arg bf16(Ints s) { return {DType::BF16, std::move(s)}; }
inline Arg i64(Ints s) { return {DType::I64, std::move(s), Fill::Small}; }
inline Arg boolean(Ints s) { return {DType::Bool, std::move(s), Fill::Bool}; }

inline ir::AttrMap gemmAttrs(int64_t ta, int64_t tb, float alpha = 1, float beta = 1) {
  return {{"transA", ta}, {"transB", tb}, {"alpha", alpha}, {"beta", beta}};
}


inline std::vector<Case> elementwiseCases() {
  std::vector<Case> cases = {
      {"relu", OpKind::Relu, {}, {f32({3, 5})}, {f32({3, 5})}},
      {"neg bf16", OpKind::Neg, {}, {bf16({7})}, {bf16({7})}},
      {"exp", OpKind::Exp, {}, {f32({3, 5})}, {f32({3, 5})}, 1e-6},
      {"tanh", OpKind::Tanh, {}, {f32({3, 5})}, {f32({3, 5})}, 1e-6},
      {"erf", OpKind::Erf, {}, {f32({3, 5})}, {f32({3, 5})}, 1e-6},
      {"sigmoid", OpKind::Sigmoid, {}, {f32({3, 5})}, {f32({3, 5})}, 1e-6},
      {"log", OpKind::Log, {}, {f32({9}, Fill::Positive)}, {f32({9})}, 1e-6},
      {"sqrt", OpKind::Sqrt, {}, {f32({9}, Fill::Positive)}, {f32({9})}},
      {"add broadcast", OpKind::Add, {}, {f32({2, 3, 4}), f32({4})},
       {f32({2, 3, 4})}},
      {"sub both broadcast", OpKind::Sub, {}, {f32({2, 1, 4}), f32({3, 1})},
       {f32({2, 3, 4})}},
      {"mul bf16", OpKind::Mul, {}, {bf16({4, 6}), bf16({4, 6})},
       {bf16({4, 6})}},
      {"div scalar", OpKind::Div, {}, {f32({3, 4}), f32({}, Fill::Positive)},
       {f32({3, 4})}},
      {"add bf16 scalar", OpKind::Add, {}, {bf16({5}), bf16({1})}, {bf16({5})}},
      {"equal i64", OpKind::Equal, {}, {i64({2, 6}), i64({6})},
       {boolean({2, 6})}},
      {"equal f32", OpKind::Equal, {}, {f32({4}), f32({4})}, {boolean({4})}},
      {"where", OpKind::Where, {}, {boolean({2, 3}), f32({2, 3}), f32({3})},
       {f32({2, 3})}},
      {"cast f32 bf16", OpKind::Cast, {{"to", std::string("bf16")}},
       {f32({17})}, {bf16({17})}},
      {"cast bf16 f32", OpKind::Cast, {{"to", std::string("f32")}},
       {bf16({17})}, {f32({17})}},
      // Long enough for the GPU's four-at-a-time cast and a partial tail.
      {"cast f32 bf16 long", OpKind::Cast, {{"to", std::string("bf16")}},
       {f32({3, 1027})}, {bf16({3, 1027})}},
      {"cast bf16 f32 long", OpKind::Cast, {{"to", std::string("f32")}},
       {bf16({1027, 3})}, {f32({1027, 3})}},
      {"cast i64 f32", OpKind::Cast, {{"to", std::string("f32")}}, {i64({6})},
       {f32({6})}},
      {"cast bool f32", OpKind::Cast, {{"to", std::string("f32")}},
       {boolean({6})}, {f32({6})}},
      {"cast f32 i64", OpKind::Cast, {{"to", std::string("i64")}},
       {f32({6})}, {i64({6})}},
  };
  for (const char *fn : {"relu", "sigmoid", "tanh", "erf", "exp", "abs"})
    cases.push_back({std::string("unary grad ") + fn, OpKind::UnaryGrad,
                     {{"fn", std::string(fn)}}, {f32({4, 5}), f32({4, 5})},
                     {f32({4, 5})}, 1e-5});
  for (const char *fn : {"log", "sqrt", "reciprocal"})
    cases.push_back({std::string("unary grad ") + fn, OpKind::UnaryGrad,
                     {{"fn", std::string(fn)}},
                     {f32({4, 5}), f32({4, 5}, Fill::Positive)}, {f32({4, 5})},
                     1e-6});
  // The ops lowered after the first set: trigonometry, rounding, sign,
  // the float predicates, the hard activations, the inclusive comparisons.
  auto wide = [](Ints s) { return f32(std::move(s), Fill::Wide); };
  for (auto [name, op] : {std::pair{"sin", OpKind::Sin}, {"cos", OpKind::Cos}})
    cases.push_back({name, op, {}, {wide({4, 5})}, {f32({4, 5})}, 1e-6});
  cases.push_back({"floor", OpKind::Floor, {}, {wide({4, 5})}, {f32({4, 5})}});
  cases.push_back({"ceil", OpKind::Ceil, {}, {wide({4, 5})}, {f32({4, 5})}});
  cases.push_back({"round halves to even", OpKind::Round, {},
                   {f32({4, 5}, Fill::Halves)}, {f32({4, 5})}});
  cases.push_back({"sign with nan and zeros", OpKind::Sign, {},
                   {f32({3, 7}, Fill::Special)}, {f32({3, 7})}});
  cases.push_back({"sign i64", OpKind::Sign, {}, {i64({6})}, {i64({6})}});
  cases.push_back({"isnan", OpKind::IsNaN, {}, {f32({3, 7}, Fill::Special)},
                   {boolean({3, 7})}});
  cases.push_back({"isinf both", OpKind::IsInf,
                   {{"detect_negative", int64_t(1)},
                    {"detect_positive", int64_t(1)}},
                   {f32({3, 7}, Fill::Special)}, {boolean({3, 7})}});
  cases.push_back({"isinf positive only", OpKind::IsInf,
                   {{"detect_negative", int64_t(0)},
                    {"detect_positive", int64_t(1)}},
                   {f32({3, 7}, Fill::Special)}, {boolean({3, 7})}});
  cases.push_back({"hard sigmoid pytorch", OpKind::HardSigmoid,
                   {{"alpha", 1.0f / 6.0f}, {"beta", 0.5f}}, {wide({4, 5})},
                   {f32({4, 5})}});
  cases.push_back({"hard sigmoid onnx default", OpKind::HardSigmoid,
                   {{"alpha", 0.2f}, {"beta", 0.5f}}, {wide({4, 5})},
                   {f32({4, 5})}});
  cases.push_back({"hard swish", OpKind::HardSwish, {}, {wide({4, 5})},
                   {f32({4, 5})}});
  cases.push_back({"silu", OpKind::Silu, {}, {wide({4, 5})}, {f32({4, 5})},
                   1e-6});
  cases.push_back({"greater or equal", OpKind::GreaterOrEqual, {},
                   {f32({3, 4}, Fill::Ties), f32({4}, Fill::Ties)},
                   {boolean({3, 4})}});
  cases.push_back({"less or equal i64", OpKind::LessOrEqual, {},
                   {i64({3, 4}), i64({4})}, {boolean({3, 4})}});
  // The rest of the trigonometric and hyperbolic functions, and their
  // gradients, inside their domains.
  auto domain = [&](OpKind op) {
    Fill f = op == OpKind::Asin || op == OpKind::Acos || op == OpKind::Atanh
                 ? Fill::Unit
             : op == OpKind::Acosh ? Fill::AboveOne
                                   : Fill::Uniform;
    return f32({4, 5}, f);
  };
  for (auto [name, op] :
       {std::pair{"tan", OpKind::Tan}, {"asin", OpKind::Asin},
        {"acos", OpKind::Acos}, {"atan", OpKind::Atan}, {"sinh", OpKind::Sinh},
        {"cosh", OpKind::Cosh}, {"asinh", OpKind::Asinh},
        {"acosh", OpKind::Acosh}, {"atanh", OpKind::Atanh}}) {
    cases.push_back({name, op, {}, {domain(op)}, {f32({4, 5})}, 1e-6});
    cases.push_back({std::string("unary grad ") + name, OpKind::UnaryGrad,
                     {{"fn", std::string(name)}}, {f32({4, 5}), domain(op)},
                     {f32({4, 5})}, 1e-6});
  }
  for (const char *fn : {"sin", "cos", "hard_swish", "silu"})
    cases.push_back({std::string("unary grad ") + fn, OpKind::UnaryGrad,
                     {{"fn", std::string(fn)}}, {f32({4, 5}), wide({4, 5})},
                     {f32({4, 5})}, 1e-6});
  for (float alpha : {1.0f / 6.0f, 0.2f})
    cases.push_back({"unary grad hard_sigmoid", OpKind::UnaryGrad,
                     {{"fn", std::string("hard_sigmoid")},
                      {"alpha", alpha},
                      {"beta", 0.5f}},
                     {f32({4, 5}), wide({4, 5})}, {f32({4, 5})}});
  cases.push_back({"unary grad clip", OpKind::UnaryGrad,
                   {{"fn", std::string("clip")},
                    {"min", -0.5f},
                    {"max", 0.7f}},
                   {f32({4, 5}), f32({4, 5})},
                   {f32({4, 5})}});
  return cases;
}

inline std::vector<Case> dataMovementCases() {
  Ints s = {2, 3, 4, 5};
  std::vector<Case> cases = {
      {"reshape", OpKind::Reshape, {{"shape", Ints{6, 20}}}, {f32(s)},
       {f32({6, 20})}},
      {"transpose", OpKind::Transpose, {{"perm", Ints{0, 2, 1, 3}}}, {f32(s)},
       {f32({2, 4, 3, 5})}},
      {"transpose bf16 reversed", OpKind::Transpose, {{"perm", Ints{3, 2, 1, 0}}},
       {bf16(s)}, {bf16({5, 4, 3, 2})}},
      {"slice", OpKind::Slice,
       {{"starts", Ints{1, -1}},
        {"ends", Ints{3, -5}},
        {"axes", Ints{1, 3}},
        {"steps", Ints{1, -2}}},
       {f32(s)},
       {f32({2, 2, 4, 2})}},
      {"slice grad", OpKind::SliceGrad,
       {{"starts", Ints{1, 0}},
        {"ends", Ints{3, 5}},
        {"axes", Ints{1, 3}},
        {"steps", Ints{1, 2}},
        {"shape", s}},
       {f32({2, 2, 4, 3})},
       {f32(s)}},
      {"slice grad into a sum", OpKind::SliceGrad,
       {{"starts", Ints{1, 0}},
        {"ends", Ints{3, 5}},
        {"axes", Ints{1, 3}},
        {"steps", Ints{1, 2}},
        {"shape", s}},
       {f32({2, 2, 4, 3}), f32(s)},
       {f32(s)}},
      {"concat", OpKind::Concat, {{"axis", int64_t(1)}},
       {f32({2, 3, 4}), f32({2, 1, 4}), f32({2, 2, 4})},
       {f32({2, 6, 4})}},
      {"split", OpKind::Split, {{"axis", int64_t(-1)}, {"split", Ints{2, 3}}},
       {i64({3, 5})},
       {i64({3, 2}), i64({3, 3})}},
      {"expand", OpKind::Expand, {{"shape", Ints{2, 3, 4}}}, {f32({3, 1})},
       {f32({2, 3, 4})}},
  };
  return cases;
}

inline std::vector<Case> reductionCases() {
  std::vector<Case> cases = {
      {"rows", OpKind::SumTo, {{"shape", Ints{4}}}, {f32({2, 3, 4})},
       {f32({4})}, 1e-6},
      {"middle", OpKind::SumTo, {{"shape", Ints{3, 1}}}, {f32({2, 3, 4})},
       {f32({3, 1})}, 1e-6},
      {"bias bf16", OpKind::SumTo, {{"shape", Ints{16}}}, {bf16({8, 16})},
       {bf16({16})}},
      {"all", OpKind::SumTo, {{"shape", Ints{}}}, {f32({5, 7})}, {f32({})},
       1e-6},
      {"reduce sum", OpKind::ReduceSum,
       {{"axes", Ints{0, 2}}, {"keepdims", int64_t(1)}}, {f32({2, 3, 4})},
       {f32({1, 3, 1})}, 1e-6},
      {"reduce mean all", OpKind::ReduceMean,
       {{"axes", Ints{}}, {"keepdims", int64_t(0)}}, {f32({2, 3, 4})},
       {f32({})}, 1e-6},
      {"reduce max", OpKind::ReduceMax,
       {{"axes", Ints{-1}}, {"keepdims", int64_t(0)}}, {f32({2, 3, 4})},
       {f32({2, 3})}},
      // Few outputs of many inputs: in chunks (a partial last one), then
      // the chunks in order (ReduceStep); a maximum is exact either way.
      {"bias chunked", OpKind::SumTo, {{"shape", Ints{24}}},
       {f32({3, 700, 24})}, {f32({24})}, 1e-6},
      {"bias bf16 chunked", OpKind::SumTo, {{"shape", Ints{16}}},
       {bf16({1030, 16})}, {bf16({16})}, 8e-3},
      {"reduce max chunked", OpKind::ReduceMax,
       {{"axes", Ints{0}}, {"keepdims", int64_t(0)}}, {f32({1500, 3})},
       {f32({3})}},
      {"reduce mean all chunked", OpKind::ReduceMean,
       {{"axes", Ints{}}, {"keepdims", int64_t(0)}}, {f32({40, 30})},
       {f32({})}, 1e-6},
      // A Tile's gradient: rank 10, merged into groups that fit, and the
      // reshape to it.
      {"reshape to rank 10", OpKind::Reshape,
       {{"shape", Ints{1, 2, 1, 16, 1, 1, 8, 1, 1, 8}}}, {f32({2, 16, 64})},
       {f32({1, 2, 1, 16, 1, 1, 8, 1, 1, 8})}},
      {"reduce sum rank 10", OpKind::ReduceSum,
       {{"axes", Ints{0, 3, 9}}, {"keepdims", int64_t(1)}},
       {f32({2, 2, 1, 4, 1, 1, 3, 1, 1, 2})},
       {f32({1, 2, 1, 1, 1, 1, 3, 1, 1, 1})}, 1e-6},
  };
  return cases;
}

inline std::vector<Case> productCases() {
  std::vector<Case> cases;
  struct Shapes {
    Ints a, b, y;
  };
  for (Shapes sh : {Shapes{{2, 3, 4, 5}, {5, 6}, {2, 3, 4, 6}},
                    Shapes{{2, 3, 4, 5}, {2, 3, 5, 6}, {2, 3, 4, 6}},
                    Shapes{{4, 5}, {3, 5, 6}, {3, 4, 6}},
                    Shapes{{3, 4, 5}, {1, 5, 6}, {3, 4, 6}},
                    Shapes{{2, 1, 4, 5}, {1, 3, 5, 6}, {2, 3, 4, 6}}}) {
    std::string s = ir::shapeStr(sh.a) + " x " + ir::shapeStr(sh.b);
    cases.push_back({"matmul " + s, OpKind::MatMul, {}, {f32(sh.a), f32(sh.b)},
                     {f32(sh.y)}, 1e-5});
    cases.push_back({"grad A " + s, OpKind::MatMulGradA, {{"shape", sh.a}},
                     {f32(sh.y), f32(sh.b)}, {f32(sh.a)}, 1e-5});
    cases.push_back({"grad B " + s, OpKind::MatMulGradB, {{"shape", sh.b}},
                     {f32(sh.a), f32(sh.y)}, {f32(sh.b)}, 1e-5});
  }
  cases.push_back({"matmul bf16", OpKind::MatMul, {}, {bf16({4, 8}), bf16({8, 16})},
                   {bf16({4, 16})}, 8e-3});
  cases.push_back({"grad B bf16", OpKind::MatMulGradB, {{"shape", Ints{8, 16}}},
                   {bf16({2, 4, 8}), bf16({2, 4, 16})}, {bf16({8, 16})}, 8e-3});
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      std::string t = " transA " + std::to_string(ta) + " transB " +
                      std::to_string(tb);
      Ints a = ta ? Ints{5, 3} : Ints{3, 5}, b = tb ? Ints{4, 5} : Ints{5, 4};
      cases.push_back({"gemm" + t, OpKind::Gemm, gemmAttrs(ta, tb, 0.5f, 2.0f),
                       {f32(a), f32(b), f32({4})}, {f32({3, 4})}, 1e-5});
      // beta 1 and a bias over the columns: cuBLASLt's bias epilogue on a
      // GPU (CudaBackend.cpp), a copy under the GEMM elsewhere.
      cases.push_back({"gemm bias epilogue" + t, OpKind::Gemm,
                       gemmAttrs(ta, tb, 0.5f, 1.0f),
                       {f32(a), f32(b), f32({1, 4})}, {f32({3, 4})}, 1e-5});
      cases.push_back({"gemm grad A" + t, OpKind::GemmGradA,
                       {{"transA", ta}, {"transB", tb}, {"alpha", 0.5f},
                        {"shape", a}},
                       {f32({3, 4}), f32(b)}, {f32(a)}, 1e-5});
      cases.push_back({"gemm grad B" + t, OpKind::GemmGradB,
                       {{"transA", ta}, {"transB", tb}, {"alpha", 0.5f},
                        {"shape", b}},
                       {f32(a), f32({3, 4})}, {f32(b)}, 1e-5});
    }
  cases.push_back({"gemm bias column", OpKind::Gemm, gemmAttrs(0, 1),
                   {f32({3, 5}), f32({4, 5}), f32({3, 1})}, {f32({3, 4})}, 1e-5});
  cases.push_back({"gemm no bias", OpKind::Gemm, gemmAttrs(0, 0),
                   {f32({3, 5}), f32({5, 4})}, {f32({3, 4})}, 1e-5});
  cases.push_back({"gemm bf16", OpKind::Gemm, gemmAttrs(0, 1),
                   {bf16({3, 8}), bf16({4, 8}), bf16({4})}, {bf16({3, 4})}, 8e-3});
  // Fused attention: causal, a mask broadcast over the heads, 4 query heads
  // over 2 kv heads. The CUDA backend's per-row functions against the
  // CPU's blocked kernels (other sums' orders: a tolerance). The gradient
  // reads random O and L: the formula, not a consistent backward.
  ir::AttrMap attn = {{"scale", 0.35f}, {"causal", int64_t(1)}};
  cases.push_back({"fused attention", OpKind::FusedAttention, attn,
                   {f32({2, 4, 20, 8}), f32({2, 2, 20, 8}), f32({2, 2, 20, 8}),
                    f32({2, 1, 20, 20})},
                   {f32({2, 4, 20, 8}), f32({2, 4, 20})}, 1e-5});
  cases.push_back({"fused attention grad", OpKind::FusedAttentionGrad, attn,
                   {f32({2, 4, 20, 8}), f32({2, 4, 20, 8}), f32({2, 2, 20, 8}),
                    f32({2, 2, 20, 8}), f32({2, 4, 20, 8}),
                    f32({2, 4, 20}, Fill::Wide), f32({2, 1, 20, 20})},
                   {f32({2, 4, 20, 8}), f32({2, 2, 20, 8}), f32({2, 2, 20, 8})},
                   1e-4});
  // Not causal, no mask, one head per kv head, in bf16 (the same float
  // arithmetic on widened operands; the results rounded to bf16 once).
  ir::AttrMap plain = {{"scale", 0.35f}};
  cases.push_back({"fused attention bf16", OpKind::FusedAttention, plain,
                   {bf16({1, 2, 70, 16}), bf16({1, 2, 70, 16}),
                    bf16({1, 2, 70, 16})},
                   {bf16({1, 2, 70, 16}), f32({1, 2, 70})}, 8e-3});
  cases.push_back({"fused attention grad bf16", OpKind::FusedAttentionGrad,
                   plain,
                   {bf16({1, 2, 70, 16}), bf16({1, 2, 70, 16}),
                    bf16({1, 2, 70, 16}), bf16({1, 2, 70, 16}),
                    bf16({1, 2, 70, 16}), f32({1, 2, 70}, Fill::Wide)},
                   {bf16({1, 2, 70, 16}), bf16({1, 2, 70, 16}),
                    bf16({1, 2, 70, 16})},
                   8e-3});
  // The head sizes the GPU's kernels fix at compile time (64 here), over
  // more than two tiles of keys, with a boolean mask (a random one: each
  // block step reads the mask's tile) and without. A small scale keeps the
  // scores of 64-wide products of uniform [-2, 2] values near 1 (with the
  // random L, larger ones make P = exp(S - L) huge and its sums cancel).
  ir::AttrMap d64 = {{"scale", 0.02f}};
  ir::AttrMap d64causal = {{"scale", 0.02f}, {"causal", int64_t(1)}};
  cases.push_back({"fused attention d64 mask", OpKind::FusedAttention, d64,
                   {f32({1, 2, 130, 64}), f32({1, 2, 130, 64}),
                    f32({1, 2, 130, 64}), boolean({1, 1, 130, 130})},
                   {f32({1, 2, 130, 64}), f32({1, 2, 130})}, 1e-5});
  cases.push_back({"fused attention grad d64 mask", OpKind::FusedAttentionGrad,
                   d64,
                   {f32({1, 2, 130, 64}), f32({1, 2, 130, 64}),
                    f32({1, 2, 130, 64}), f32({1, 2, 130, 64}),
                    f32({1, 2, 130, 64}), f32({1, 2, 130}, Fill::Wide),
                    boolean({1, 1, 130, 130})},
                   {f32({1, 2, 130, 64}), f32({1, 2, 130, 64}),
                    f32({1, 2, 130, 64})},
                   1e-4});
  cases.push_back({"fused attention d64 causal", OpKind::FusedAttention, d64causal,
                   {bf16({2, 4, 100, 64}), bf16({2, 2, 100, 64}),
                    bf16({2, 2, 100, 64})},
                   {bf16({2, 4, 100, 64}), f32({2, 4, 100})}, 8e-3});
  cases.push_back({"fused attention grad d64 causal",
                   OpKind::FusedAttentionGrad, d64causal,
                   {bf16({2, 4, 100, 64}), bf16({2, 4, 100, 64}),
                    bf16({2, 2, 100, 64}), bf16({2, 2, 100, 64}),
                    bf16({2, 4, 100, 64}), f32({2, 4, 100}, Fill::Wide)},
                   {bf16({2, 4, 100, 64}), bf16({2, 2, 100, 64}),
                    bf16({2, 2, 100, 64})},
                   8e-3});
  return cases;
}

inline std::vector<Case> rowCases() {
  ir::AttrMap axis1 = {{"axis", int64_t(1)}};
  ir::AttrMap ln = {{"axis", int64_t(-1)}, {"epsilon", 1e-5f}};
  ir::AttrMap ln2 = {{"axis", int64_t(1)}, {"epsilon", 1e-5f}};
  auto sce = [](const char *red, bool ignore) {
    ir::AttrMap a = {{"reduction", std::string(red)}};
    if (ignore)
      a.insert_or_assign("ignore_index", ir::Attribute(int64_t(2)));
    return a;
  };
  std::vector<Case> cases = {
      {"softmax last", OpKind::Softmax, {{"axis", int64_t(-1)}},
       {f32({3, 4, 7})}, {f32({3, 4, 7})}, 1e-6},
      {"softmax inner", OpKind::Softmax, axis1, {f32({3, 4, 7})},
       {f32({3, 4, 7})}, 1e-6},
      {"softmax bf16", OpKind::Softmax, {{"axis", int64_t(-1)}},
       {bf16({4, 9})}, {bf16({4, 9})}, 8e-3},
      {"softmax grad", OpKind::SoftmaxGrad, axis1,
       {f32({3, 4, 7}), f32({3, 4, 7}, Fill::Positive)}, {f32({3, 4, 7})},
       1e-5},
      {"layer norm", OpKind::LayerNormalization, ln,
       {f32({2, 3, 8}), f32({8}), f32({8})},
       {f32({2, 3, 8}), f32({2, 3, 1}), f32({2, 3, 1})}, 1e-5},
      {"layer norm two dims", OpKind::LayerNormalization, ln2,
       {f32({2, 3, 8}), f32({3, 8})}, {f32({2, 3, 8})}, 1e-5},
      {"layer norm grad data", OpKind::LayerNormalizationGradData, ln,
       {f32({2, 3, 8}), f32({2, 3, 8}), f32({8})}, {f32({2, 3, 8})}, 1e-5},
      {"layer norm grad params", OpKind::LayerNormalizationGradParams, ln,
       {f32({2, 3, 8}), f32({2, 3, 8})}, {f32({8})}, 1e-5},
      // Many rows of few columns: the rows in chunks (a partial last one),
      // then each column's chunks in order (ColumnStep).
      {"layer norm grad params chunked", OpKind::LayerNormalizationGradParams,
       ln, {f32({3, 350, 8}), f32({3, 350, 8})}, {f32({8})}, 1e-5},
      {"rms norm grad params bf16 chunked",
       OpKind::RMSNormalizationGradParams, ln,
       {bf16({1030, 16}), bf16({1030, 16})}, {bf16({16})}, 8e-3},
      {"rms norm", OpKind::RMSNormalization, ln, {f32({2, 3, 8}), f32({8})},
       {f32({2, 3, 8})}, 1e-5},
      {"rms norm two dims", OpKind::RMSNormalization, ln2,
       {f32({2, 3, 8}), f32({3, 8})}, {f32({2, 3, 8})}, 1e-5},
      {"rms norm bf16", OpKind::RMSNormalization, ln,
       {bf16({4, 16}), bf16({16})}, {bf16({4, 16})}, 8e-3},
      {"rms norm grad data", OpKind::RMSNormalizationGradData, ln,
       {f32({2, 3, 8}), f32({2, 3, 8}), f32({8})}, {f32({2, 3, 8})}, 1e-5},
      {"rms norm grad params", OpKind::RMSNormalizationGradParams, ln,
       {f32({2, 3, 8}), f32({2, 3, 8})}, {f32({8})}, 1e-5},
      {"cross-entropy mean", OpKind::SoftmaxCrossEntropyLoss, sce("mean", false),
       {f32({6, 5}), i64({6})}, {f32({})}, 1e-6},
      {"cross-entropy ignore", OpKind::SoftmaxCrossEntropyLoss, sce("mean", true),
       {f32({6, 5}), i64({6})}, {f32({}), f32({6, 5})}, 1e-6},
      {"cross-entropy sum spatial", OpKind::SoftmaxCrossEntropyLoss,
       sce("sum", false), {f32({2, 5, 3}), i64({2, 3})}, {f32({})}, 1e-6},
      {"cross-entropy none weighted", OpKind::SoftmaxCrossEntropyLoss,
       sce("none", false), {f32({6, 5}), i64({6}), f32({5}, Fill::Positive)},
       {f32({6})}, 1e-6},
      {"cross-entropy grad mean", OpKind::SoftmaxCrossEntropyLossGrad,
       sce("mean", true), {f32({}), f32({6, 5}), i64({6})}, {f32({6, 5})},
       1e-6},
      {"cross-entropy grad none spatial", OpKind::SoftmaxCrossEntropyLossGrad,
       sce("none", false), {f32({2, 3}), f32({2, 5, 3}), i64({2, 3})},
       {f32({2, 5, 3})}, 1e-6},
      {"gather rows", OpKind::Gather, {{"axis", int64_t(0)}},
       {f32({5, 3}), i64({2, 4})}, {f32({2, 4, 3})}},
      {"gather middle axis", OpKind::Gather, {{"axis", int64_t(1)}},
       {bf16({2, 5, 3}), i64({4})}, {bf16({2, 4, 3})}},
      {"gather grad", OpKind::GatherGrad,
       {{"axis", int64_t(0)}, {"shape", Ints{5, 3}}},
       {f32({2, 4, 3}), i64({2, 4})}, {f32({5, 3})}},
      {"gather grad into a sum", OpKind::GatherGrad,
       {{"axis", int64_t(0)}, {"shape", Ints{5, 3}}},
       {f32({2, 4, 3}), i64({2, 4}), f32({5, 3})}, {f32({5, 3})}},
      {"sgd", OpKind::SGD, {{"grad_scale", 0.25f}, {"weight_decay", 0.01f}},
       {f32({7}), f32({7}), f32({}, Fill::Positive)}, {f32({7})}, 1e-7},
      {"sgd nesterov", OpKind::SGD,
       {{"momentum", 0.9f}, {"nesterov", int64_t(1)}},
       {f32({7}), f32({7}), f32({}, Fill::Positive), f32({7})},
       {f32({7}), f32({7})}, 1e-7},
      {"adamw", OpKind::AdamW, {},
       {f32({7}), f32({7}), f32({}, Fill::Positive), f32({}, Fill::Positive),
        f32({7}), f32({7}, Fill::Positive)},
       {f32({7}), f32({7}), f32({7})}, 1e-6},
  };
  return cases;
}

inline ir::AttrMap convAttrs(Ints pads, Ints strides, Ints dilations,
                             int64_t group, Ints shape = {}) {
  ir::AttrMap a = {{"pads", pads},
                   {"strides", strides},
                   {"dilations", dilations},
                   {"group", group}};
  if (!shape.empty())
    a.insert_or_assign("shape", ir::Attribute(shape));
  return a;
}

inline ir::AttrMap poolAttrs(Ints kernel, Ints pads, Ints strides,
                             int64_t ceil, Ints dilations = {},
                             int64_t includePad = -1, Ints shape = {}) {
  ir::AttrMap a = {{"kernel_shape", kernel},
                   {"pads", pads},
                   {"strides", strides},
                   {"ceil_mode", ceil}};
  if (!dilations.empty())
    a.insert_or_assign("dilations", ir::Attribute(dilations));
  if (includePad >= 0)
    a.insert_or_assign("count_include_pad", ir::Attribute(includePad));
  if (!shape.empty())
    a.insert_or_assign("shape", ir::Attribute(shape));
  return a;
}

// Conv and its gradient parts (im2col, GEMMs per group, col2im), pools and
// their gradients (window gathers), GlobalAveragePool and BatchNorm with
// its gradient parts (channel statistics, then a map).
inline std::vector<Case> convPoolNormCases() {
  std::vector<Case> cases;
  struct Conv {
    std::string name;
    Ints x, w, y, pads, strides, dilations;
    int64_t group;
  };
  for (const Conv &c : {
           Conv{"padded", {2, 3, 5, 5}, {4, 3, 3, 3}, {2, 4, 5, 5},
                {1, 1, 1, 1}, {1, 1}, {1, 1}, 1},
           Conv{"stride 2 uneven pads", {2, 3, 7, 6}, {4, 3, 3, 2},
                {2, 4, 4, 3}, {1, 0, 1, 1}, {2, 2}, {1, 1}, 1},
           Conv{"dilation 2", {1, 2, 7, 7}, {3, 2, 3, 3}, {1, 3, 7, 7},
                {2, 2, 2, 2}, {1, 1}, {2, 2}, 1},
           Conv{"group 2", {2, 4, 5, 5}, {6, 2, 3, 3}, {2, 6, 5, 5},
                {1, 1, 1, 1}, {1, 1}, {1, 1}, 2},
           Conv{"1-D stride 2", {2, 3, 9}, {4, 3, 3}, {2, 4, 5}, {1, 1}, {2},
                {1}, 1},
           // The CNN's shape: 8 channels take the CPU's tap-by-tap paths.
           Conv{"8 channels", {2, 8, 6, 6}, {8, 8, 3, 3}, {2, 8, 6, 6},
                {1, 1, 1, 1}, {1, 1}, {1, 1}, 1},
       }) {
    ir::AttrMap attrs = convAttrs(c.pads, c.strides, c.dilations, c.group);
    cases.push_back({"conv " + c.name, OpKind::Conv, attrs,
                     {f32(c.x), f32(c.w)}, {f32(c.y)}, 1e-5});
    cases.push_back({"conv bias " + c.name, OpKind::Conv, attrs,
                     {f32(c.x), f32(c.w), f32({c.w[0]})}, {f32(c.y)}, 1e-5});
    cases.push_back({"conv grad data " + c.name, OpKind::ConvGradData,
                     convAttrs(c.pads, c.strides, c.dilations, c.group, c.x),
                     {f32(c.y), f32(c.w)}, {f32(c.x)}, 1e-5});
    cases.push_back({"conv grad filter " + c.name, OpKind::ConvGradFilter,
                     convAttrs(c.pads, c.strides, c.dilations, c.group, c.w),
                     {f32(c.x), f32(c.y)}, {f32(c.w)}, 1e-5});
  }
  ir::AttrMap same = convAttrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1);
  cases.push_back({"conv bf16", OpKind::Conv, same,
                   {bf16({2, 3, 5, 5}), bf16({4, 3, 3, 3}), bf16({4})},
                   {bf16({2, 4, 5, 5})}, 8e-3});
  cases.push_back({"conv grad data bf16", OpKind::ConvGradData,
                   convAttrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1, {2, 3, 5, 5}),
                   {bf16({2, 4, 5, 5}), bf16({4, 3, 3, 3})},
                   {bf16({2, 3, 5, 5})}, 8e-3});
  cases.push_back({"conv grad filter bf16", OpKind::ConvGradFilter,
                   convAttrs({1, 1, 1, 1}, {1, 1}, {1, 1}, 1, {4, 3, 3, 3}),
                   {bf16({2, 3, 5, 5}), bf16({2, 4, 5, 5})},
                   {bf16({4, 3, 3, 3})}, 8e-3});

  struct Pool {
    std::string name;
    Ints x, y, kernel, pads, strides;
    int64_t ceil;
    Ints dilations;
  };
  for (const Pool &p : {
           Pool{"padded stride 2", {2, 3, 7, 7}, {2, 3, 4, 4}, {3, 3},
                {1, 1, 1, 1}, {2, 2}, 0, {1, 1}},
           Pool{"ceil mode end pad", {1, 2, 7, 7}, {1, 2, 4, 4}, {3, 3},
                {0, 0, 1, 1}, {2, 2}, 1, {1, 1}},
           Pool{"2x2 stride 2", {2, 3, 6, 6}, {2, 3, 3, 3}, {2, 2},
                {0, 0, 0, 0}, {2, 2}, 0, {1, 1}},
       }) {
    for (Fill fill : {Fill::Uniform, Fill::Ties}) {
      std::string name = p.name + (fill == Fill::Ties ? " ties" : "");
      cases.push_back({"max pool " + name, OpKind::MaxPool,
                       poolAttrs(p.kernel, p.pads, p.strides, p.ceil,
                                 p.dilations),
                       {{DType::F32, p.x, fill}}, {f32(p.y)}});
      cases.push_back({"max pool grad " + name, OpKind::MaxPoolGrad,
                       poolAttrs(p.kernel, p.pads, p.strides, p.ceil,
                                 p.dilations),
                       {f32(p.y), {DType::F32, p.x, fill}}, {f32(p.x)},
                       1e-6});
    }
    for (int64_t includePad : {0, 1}) {
      std::string name =
          p.name + (includePad ? " count_include_pad" : " count inside");
      cases.push_back({"average pool " + name, OpKind::AveragePool,
                       poolAttrs(p.kernel, p.pads, p.strides, p.ceil, {},
                                 includePad),
                       {f32(p.x)}, {f32(p.y)}, 1e-6});
      cases.push_back({"average pool grad " + name, OpKind::AveragePoolGrad,
                       poolAttrs(p.kernel, p.pads, p.strides, p.ceil, {},
                                 includePad, p.x),
                       {f32(p.y)}, {f32(p.x)}, 1e-6});
    }
  }
  cases.push_back({"max pool dilation 2 indices", OpKind::MaxPool,
                   poolAttrs({2, 2}, {0, 0, 0, 0}, {1, 1}, 0, {2, 2}),
                   {f32({1, 2, 7, 7})},
                   {f32({1, 2, 5, 5}), {DType::I64, {1, 2, 5, 5}}}});
  cases.push_back({"max pool grad dilation 2", OpKind::MaxPoolGrad,
                   poolAttrs({2, 2}, {0, 0, 0, 0}, {1, 1}, 0, {2, 2}),
                   {f32({1, 2, 5, 5}), f32({1, 2, 7, 7})},
                   {f32({1, 2, 7, 7})}, 1e-6});
  cases.push_back({"max pool 1-D", OpKind::MaxPool,
                   poolAttrs({3}, {1, 1}, {2}, 0, {1}), {f32({2, 3, 9})},
                   {f32({2, 3, 5})}});
  cases.push_back({"global average pool", OpKind::GlobalAveragePool, {},
                   {f32({2, 3, 4, 5})}, {f32({2, 3, 1, 1})}, 1e-6});

  auto bn = [](int64_t training) {
    return ir::AttrMap{{"epsilon", 1e-5f},
                       {"momentum", 0.9f},
                       {"training_mode", training}};
  };
  auto bnGrad = [](int64_t training) {
    return ir::AttrMap{{"epsilon", 1e-5f}, {"training_mode", training}};
  };
  for (Ints x : {Ints{2, 3, 4, 5}, Ints{6, 4}}) {
    Ints c = {x[1]};
    std::string s = " " + ir::shapeStr(x);
    Arg var = f32(c, Fill::Positive);
    cases.push_back({"batch norm training" + s, OpKind::BatchNormalization,
                     bn(1), {f32(x), f32(c), f32(c), f32(c), var},
                     {f32(x), f32(c), f32(c)}, 1e-5});
    cases.push_back({"batch norm inference" + s, OpKind::BatchNormalization,
                     bn(0), {f32(x), f32(c), f32(c), f32(c), var}, {f32(x)},
                     1e-5});
    for (int64_t training : {1, 0}) {
      std::string mode = training ? " training" : " inference";
      cases.push_back({"batch norm grad data" + mode + s,
                       OpKind::BatchNormalizationGradData, bnGrad(training),
                       {f32(x), f32(x), f32(c), f32(c), var}, {f32(x)}, 1e-5});
      cases.push_back({"batch norm grad params" + mode + s,
                       OpKind::BatchNormalizationGradParams, bnGrad(training),
                       {f32(x), f32(x), f32(c), var}, {f32(c)}, 1e-5});
    }
  }
  return cases;
}

// The rest of the CPU backend's ops: Clip, LeakyRelu, variadic Max and
// Min, the logical ops, Dropout (the same counter-based draw, so bit for
// bit) and its gradient, LogSoftmax and its gradient, Pad in every mode,
// integer arithmetic, and the combined gradient ops (as their two parts).
inline std::vector<Case> remainingCases() {
  Arg i32{DType::I32, {4, 5}, Fill::Small};
  ir::AttrMap drop = {{"ratio", 0.3f}, {"training_mode", int64_t(1)}};
  ir::AttrMap noDrop = {{"ratio", 0.3f}, {"training_mode", int64_t(0)}};
  auto pad = [](const char *mode, Ints pads, float value = 0) {
    return ir::AttrMap{{"mode", std::string(mode)}, {"pads", pads},
                       {"value", value}};
  };
  ir::AttrMap conv = {{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{1, 1}},
                      {"dilations", Ints{1, 1}}, {"group", int64_t(1)}};
  ir::AttrMap ln = {{"axis", int64_t(-1)}, {"epsilon", 1e-5f}};
  ir::AttrMap bn = {{"epsilon", 1e-5f}, {"training_mode", int64_t(1)}};
  return {
      {"clip", OpKind::Clip, {{"min", -0.5f}, {"max", 0.75f}}, {f32({4, 5})},
       {f32({4, 5})}},
      {"clip i64", OpKind::Clip, {{"min", 1.0f}, {"max", 2.0f}}, {i64({7})},
       {i64({7})}},
      {"leaky relu", OpKind::LeakyRelu, {{"alpha", 0.1f}}, {f32({9})},
       {f32({9})}},
      {"max of three", OpKind::Max, {},
       {f32({2, 3}), f32({3}), f32({2, 1})}, {f32({2, 3})}},
      {"min bf16", OpKind::Min, {}, {bf16({4}), bf16({4})}, {bf16({4})}},
      {"max of one", OpKind::Max, {}, {f32({5})}, {f32({5})}},
      {"not", OpKind::Not, {}, {boolean({6})}, {boolean({6})}},
      {"and", OpKind::And, {}, {boolean({2, 3}), boolean({3})},
       {boolean({2, 3})}},
      {"or", OpKind::Or, {}, {boolean({6}), boolean({6})}, {boolean({6})}},
      {"xor", OpKind::Xor, {}, {boolean({2, 3}), boolean({3})},
       {boolean({2, 3})}},
      // bitwise on integers (ONNX's BitwiseAnd, ...)
      {"and i64 broadcast", OpKind::And, {}, {i64({2, 3}), i64({3})},
       {i64({2, 3})}},
      {"or i32", OpKind::Or, {}, {i32, i32}, {i32}},
      {"xor i64", OpKind::Xor, {}, {i64({6}), i64({6})}, {i64({6})}},
      {"not i32", OpKind::Not, {}, {i32}, {i32}},
      {"add i32", OpKind::Add, {}, {i32, i32}, {i32}},
      {"mul i64 broadcast", OpKind::Mul, {}, {i64({2, 3}), i64({3})},
       {i64({2, 3})}},
      {"neg i64", OpKind::Neg, {}, {i64({5})}, {i64({5})}},
      {"relu i32", OpKind::Relu, {}, {i32}, {i32}},
      {"less i64", OpKind::Less, {}, {i64({6}), i64({6})}, {boolean({6})}},
      {"dropout", OpKind::Dropout, drop, {f32({64})},
       {f32({64}), boolean({64})}},
      {"dropout inference", OpKind::Dropout, noDrop, {f32({8})},
       {f32({8}), boolean({8})}},
      {"dropout grad", OpKind::DropoutGrad, {{"ratio", 0.3f}},
       {f32({8}), boolean({8})}, {f32({8})}},
      {"log softmax", OpKind::LogSoftmax, {{"axis", int64_t(1)}},
       {f32({3, 5, 2})}, {f32({3, 5, 2})}, 1e-6},
      {"log softmax grad", OpKind::LogSoftmaxGrad, {{"axis", int64_t(-1)}},
       {f32({3, 5}), f32({3, 5})}, {f32({3, 5})}, 1e-5},
      {"pad constant", OpKind::Pad, pad("constant", {1, 0, 0, 2}, 1.5f),
       {f32({2, 3})}, {f32({3, 5})}},
      {"pad edge bf16", OpKind::Pad, pad("edge", {0, 2, 1, 3}), {bf16({2, 3})},
       {bf16({3, 8})}},
      {"pad reflect wide", OpKind::Pad, pad("reflect", {0, 5, 0, 4}),
       {f32({2, 3})}, {f32({2, 12})}},
      {"pad i64", OpKind::Pad, pad("constant", {1, 1}, 7.0f), {i64({3})},
       {i64({5})}},
      {"matmul grad", OpKind::MatMulGrad, {},
       {f32({2, 4, 6}), f32({2, 4, 5}), f32({5, 6})},
       {f32({2, 4, 5}), f32({5, 6})}, 1e-5},
      {"gemm grad", OpKind::GemmGrad,
       {{"transA", int64_t(0)}, {"transB", int64_t(1)}, {"alpha", 1.0f}},
       {f32({3, 4}), f32({3, 5}), f32({4, 5})}, {f32({3, 5}), f32({4, 5})},
       1e-5},
      {"conv grad", OpKind::ConvGrad, conv,
       {f32({2, 4, 5, 5}), f32({2, 3, 5, 5}), f32({4, 3, 3, 3})},
       {f32({2, 3, 5, 5}), f32({4, 3, 3, 3})}, 1e-5},
      {"layer norm grad", OpKind::LayerNormalizationGrad, ln,
       {f32({3, 8}), f32({3, 8}), f32({8})}, {f32({3, 8}), f32({8})}, 1e-5},
      {"rms norm grad", OpKind::RMSNormalizationGrad, ln,
       {f32({3, 8}), f32({3, 8}), f32({8})}, {f32({3, 8}), f32({8})}, 1e-5},
      {"batch norm grad", OpKind::BatchNormalizationGrad, bn,
       {f32({2, 3, 4}), f32({2, 3, 4}), f32({3}), f32({3}),
        f32({3}, Fill::Positive)},
       {f32({2, 3, 4}), f32({3})}, 1e-5},
  };
}

// The index ops (DeviceIndex.h) and Tile and Mod: CumSum (both
// directions, exclusive, floats and wrapping integers), ArgMax/ArgMin and
// TopK over ties and NaN, Trilu, GatherElements and ScatterElements with
// repeated and negative indices (the last write wins; reductions in index
// order) and their gradients, ScatterND at every tuple width with repeated
// tuples and its gradients, Tile, float Mod, integer reductions (sums
// wrap, means truncate). All bit for bit.
inline std::vector<Case> indexCases() {
  Arg i32{DType::I32, {3, 5, 2}, Fill::Signed};
  Arg ties{DType::F32, {3, 6, 2}, Fill::Ties};
  Arg tiesBf16{DType::BF16, {4, 7}, Fill::Ties};
  Arg idx{DType::I64, {3, 4, 2}, Fill::Signed};
  Arg idx32{DType::I32, {3, 4, 2}, Fill::Signed};
  auto cum = [](int64_t axis, int64_t excl, int64_t rev) {
    return ir::AttrMap{{"axis", axis}, {"exclusive", excl}, {"reverse", rev}};
  };
  auto arg = [](int64_t axis, int64_t last) {
    return ir::AttrMap{{"axis", axis}, {"keepdims", int64_t(1)},
                       {"select_last_index", last}};
  };
  auto topk = [](int64_t axis, int64_t k, int64_t largest) {
    return ir::AttrMap{{"axis", axis}, {"k", k}, {"largest", largest}};
  };
  auto scatter = [](int64_t axis, const char *red) {
    return ir::AttrMap{{"axis", axis}, {"reduction", std::string(red)}};
  };
  auto nd = [](const char *red) {
    return ir::AttrMap{{"reduction", std::string(red)}};
  };
  Arg pos{DType::I64, {5, 2}, Fill::Small}; // tuples into [4, 4, 3]
  return {
      {"cumsum", OpKind::CumSum, cum(1, 0, 0), {f32({3, 5, 2})},
       {f32({3, 5, 2})}},
      {"cumsum exclusive reverse", OpKind::CumSum, cum(-1, 1, 1),
       {f32({3, 5, 4})}, {f32({3, 5, 4})}},
      {"cumsum bf16", OpKind::CumSum, cum(0, 0, 1), {bf16({6, 3})},
       {bf16({6, 3})}},
      {"cumsum i64", OpKind::CumSum, cum(1, 1, 0), {i64({2, 9})},
       {i64({2, 9})}},
      {"cumsum i32", OpKind::CumSum, cum(2, 0, 0), {i32}, {i32}},
      {"argmax ties", OpKind::ArgMax, arg(1, 0), {ties}, {i64({3, 1, 2})}},
      {"argmin last of ties", OpKind::ArgMin, arg(1, 1), {ties},
       {i64({3, 1, 2})}},
      {"argmax nan", OpKind::ArgMax, arg(-1, 0), {f32({3, 7}, Fill::Special)},
       {i64({3, 1})}},
      {"argmin nan last", OpKind::ArgMin, arg(0, 1),
       {f32({7, 2}, Fill::Special)}, {i64({1, 2})}},
      {"argmax i64", OpKind::ArgMax, arg(0, 0), {i64({5, 3})}, {i64({1, 3})}},
      {"argmin bf16", OpKind::ArgMin, arg(1, 0), {tiesBf16}, {i64({4, 1})}},
      {"topk ties", OpKind::TopKIndices, topk(-1, 4, 1), {tiesBf16},
       {i64({4, 4})}},
      {"topk smallest middle axis", OpKind::TopKIndices, topk(1, 3, 0),
       {ties}, {i64({3, 3, 2})}},
      {"topk nan", OpKind::TopKIndices, topk(1, 7, 1),
       {f32({2, 7}, Fill::Special)}, {i64({2, 7})}},
      {"topk nan smallest", OpKind::TopKIndices, topk(1, 5, 0),
       {f32({2, 7}, Fill::Special)}, {i64({2, 5})}},
      {"topk i32", OpKind::TopKIndices, topk(0, 2, 1), {i32},
       {i64({2, 5, 2})}},
      {"topk none", OpKind::TopKIndices, topk(0, 0, 1), {f32({4, 3})},
       {i64({0, 3})}},
      {"trilu upper", OpKind::Trilu, {{"k", int64_t(1)}, {"upper", int64_t(1)}},
       {f32({2, 4, 5})}, {f32({2, 4, 5})}},
      {"trilu lower i64", OpKind::Trilu,
       {{"k", int64_t(-1)}, {"upper", int64_t(0)}}, {i64({5, 3})},
       {i64({5, 3})}},
      {"trilu bool", OpKind::Trilu, {{"k", int64_t(0)}, {"upper", int64_t(0)}},
       {boolean({3, 3})}, {boolean({3, 3})}},
      {"gather elements", OpKind::GatherElements, {{"axis", int64_t(1)}},
       {f32({3, 5, 2}), idx}, {f32({3, 4, 2})}},
      {"gather elements smaller indices", OpKind::GatherElements,
       {{"axis", int64_t(0)}}, {i64({5, 4}), Arg{DType::I32, {6, 3}, Fill::Signed}},
       {i64({6, 3})}},
      {"gather elements bool", OpKind::GatherElements, {{"axis", int64_t(-1)}},
       {boolean({2, 6}), Arg{DType::I64, {2, 3}, Fill::Signed}},
       {boolean({2, 3})}},
      {"gather elements grad", OpKind::GatherElementsGrad,
       {{"axis", int64_t(1)}, {"shape", Ints{3, 5, 2}}},
       {f32({3, 4, 2}), idx}, {f32({3, 5, 2})}},
      {"gather elements grad smaller", OpKind::GatherElementsGrad,
       {{"axis", int64_t(0)}, {"shape", Ints{5, 4}}},
       {bf16({6, 3}), Arg{DType::I64, {6, 3}, Fill::Signed}}, {bf16({5, 4})}},
      {"scatter elements", OpKind::ScatterElements, scatter(1, "none"),
       {f32({3, 5, 2}), idx, f32({3, 4, 2})}, {f32({3, 5, 2})}},
      {"scatter elements add", OpKind::ScatterElements, scatter(1, "add"),
       {f32({3, 5, 2}), idx32, f32({3, 4, 2})}, {f32({3, 5, 2})}},
      {"scatter elements max i64", OpKind::ScatterElements, scatter(-2, "max"),
       {i64({3, 5, 2}), idx, i64({3, 4, 2})}, {i64({3, 5, 2})}},
      {"scatter elements mul i32", OpKind::ScatterElements, scatter(1, "mul"),
       {i32, idx, Arg{DType::I32, {3, 4, 2}, Fill::Signed}}, {i32}},
      {"scatter elements min", OpKind::ScatterElements, scatter(0, "min"),
       {f32({5, 4}), Arg{DType::I64, {6, 3}, Fill::Signed}, f32({6, 3})},
       {f32({5, 4})}},
      {"scatter elements bool", OpKind::ScatterElements, scatter(1, "none"),
       {boolean({3, 5, 2}), idx, boolean({3, 4, 2})}, {boolean({3, 5, 2})}},
      {"scatter elements bf16", OpKind::ScatterElements, scatter(1, "none"),
       {bf16({3, 5, 2}), idx, bf16({3, 4, 2})}, {bf16({3, 5, 2})}},
      {"scatter elements grad data", OpKind::ScatterElementsGradData,
       {{"axis", int64_t(1)}}, {f32({3, 5, 2}), idx}, {f32({3, 5, 2})}},
      {"scatter elements grad updates", OpKind::ScatterElementsGradUpdates,
       {{"axis", int64_t(1)}}, {f32({3, 5, 2}), idx}, {f32({3, 4, 2})}},
      {"scatter elements grad updates bf16", OpKind::ScatterElementsGradUpdates,
       {{"axis", int64_t(0)}}, {bf16({5, 4}), Arg{DType::I64, {6, 3}, Fill::Signed}},
       {bf16({6, 3})}},
      {"scatter nd", OpKind::ScatterND, nd("none"),
       {f32({4, 4, 3}), pos, f32({5, 3})}, {f32({4, 4, 3})}},
      {"scatter nd add", OpKind::ScatterND, nd("add"),
       {f32({4, 4, 3}), pos, f32({5, 3})}, {f32({4, 4, 3})}},
      {"scatter nd rows", OpKind::ScatterND, nd("none"),
       {bf16({4, 4, 3}), Arg{DType::I64, {6, 1}, Fill::Signed},
        bf16({6, 4, 3})},
       {bf16({4, 4, 3})}},
      {"scatter nd elements", OpKind::ScatterND, nd("mul"),
       {i64({4, 4, 4}), Arg{DType::I32, {2, 3, 3}, Fill::Small},
        i64({2, 3})},
       {i64({4, 4, 4})}},
      {"scatter nd max", OpKind::ScatterND, nd("max"),
       {f32({4, 4, 3}), pos, f32({5, 3})}, {f32({4, 4, 3})}},
      {"scatter nd bool", OpKind::ScatterND, nd("none"),
       {boolean({4, 4, 3}), pos, boolean({5, 3})}, {boolean({4, 4, 3})}},
      {"scatter nd grad data", OpKind::ScatterNDGradData, {},
       {f32({4, 4, 3}), pos}, {f32({4, 4, 3})}},
      {"scatter nd grad updates", OpKind::ScatterNDGradUpdates,
       {{"shape", Ints{5, 3}}}, {f32({4, 4, 3}), pos}, {f32({5, 3})}},
      {"scatter nd grad updates rows", OpKind::ScatterNDGradUpdates,
       {{"shape", Ints{6, 4, 3}}},
       {bf16({4, 4, 3}), Arg{DType::I64, {6, 1}, Fill::Signed}},
       {bf16({6, 4, 3})}},
      {"tile", OpKind::Tile, {{"repeats", Ints{2, 1}}}, {f32({2, 3})},
       {f32({4, 3})}},
      {"tile every dim", OpKind::Tile, {{"repeats", Ints{2, 3, 2}}},
       {i64({2, 3, 2})}, {i64({4, 9, 4})}},
      {"tile bool", OpKind::Tile, {{"repeats", Ints{1, 1, 3}}},
       {boolean({2, 1, 2})}, {boolean({2, 1, 6})}},
      {"reduce sum i64", OpKind::ReduceSum,
       {{"axes", Ints{1}}, {"keepdims", int64_t(0)}},
       {Arg{DType::I64, {3, 5, 2}, Fill::Signed}}, {i64({3, 2})}},
      {"reduce sum i64 to one", OpKind::ReduceSum,
       {{"axes", Ints{}}, {"keepdims", int64_t(0)}},
       {Arg{DType::I64, {70, 300}, Fill::Signed}}, {i64({})}},
      {"reduce max i32", OpKind::ReduceMax,
       {{"axes", Ints{0, 2}}, {"keepdims", int64_t(1)}}, {i32},
       {Arg{DType::I32, {1, 5, 1}}}},
      {"reduce mean i64", OpKind::ReduceMean,
       {{"axes", Ints{-1}}, {"keepdims", int64_t(1)}},
       {Arg{DType::I64, {4, 7}, Fill::Signed}}, {i64({4, 1})}},
      {"reduce sum i32 none", OpKind::ReduceSum,
       {{"axes", Ints{1}}, {"keepdims", int64_t(0)}},
       {Arg{DType::I32, {3, 0}}}, {Arg{DType::I32, {3}}}},
      // The DFT's twiddles are libm's on the host, the device's on a GPU
      // (not correctly rounded there): a tolerance, which the host meets
      // bit for bit.
      {"dft", OpKind::DFT,
       {{"axis", int64_t(1)}, {"inverse", int64_t(0)}, {"normalized", int64_t(0)}},
       {f32({2, 7, 3, 2})}, {f32({2, 7, 3, 2})}, 1e-6},
      {"dft inverse bf16", OpKind::DFT,
       {{"axis", int64_t(-2)}, {"inverse", int64_t(1)}, {"normalized", int64_t(1)}},
       {bf16({3, 12, 2})}, {bf16({3, 12, 2})}, 8e-3},
      {"mod", OpKind::Mod, {{"fmod", int64_t(1)}},
       {f32({4, 5}, Fill::Wide), f32({5}, Fill::Positive)}, {f32({4, 5})}},
      {"mod bf16", OpKind::Mod, {{"fmod", int64_t(1)}},
       {bf16({6}), bf16({6})}, {bf16({6})}},
  };
}

// Resize and ResizeGrad: nearest in every rounding (any type, by bytes),
// linear in every coordinate transform, up and down, with and without
// scales, over 1, 2 and 3 dims, cubic up and down over 1 and 2; the
// gradients of the same geometries.
inline std::vector<Case> resizeCases() {
  struct Geometry {
    std::string name, mode, coord, round;
    Ints in, out;
    std::vector<float> scales; // empty: none
    DType dtype = DType::F32;
  };
  const std::vector<Geometry> geometries = {
      {"nearest up", "nearest", "half_pixel", "round_prefer_floor",
       {1, 2, 3, 4}, {1, 2, 6, 8}},
      {"nearest asymmetric floor i64", "nearest", "asymmetric", "floor",
       {2, 3, 3}, {2, 6, 9}, {1, 2, 3}, DType::I64},
      {"nearest down bool", "nearest", "half_pixel", "round_prefer_ceil",
       {1, 1, 5, 7}, {1, 1, 2, 3}, {}, DType::Bool},
      {"nearest ceil tf", "nearest", "tf_half_pixel_for_nn", "ceil",
       {2, 5, 4}, {2, 7, 3}},
      {"linear pytorch half pixel", "linear", "pytorch_half_pixel",
       "round_prefer_floor", {1, 2, 4, 5}, {1, 2, 8, 10}, {1, 1, 2, 2}},
      {"linear align corners", "linear", "align_corners", "round_prefer_floor",
       {2, 3, 4, 4}, {2, 3, 7, 9}},
      {"linear down bf16", "linear", "half_pixel", "round_prefer_floor",
       {1, 2, 6, 6}, {1, 2, 4, 3}, {}, DType::BF16},
      {"trilinear asymmetric", "linear", "asymmetric", "round_prefer_floor",
       {1, 1, 3, 4, 5}, {1, 1, 6, 8, 10}},
      {"linear to one", "linear", "pytorch_half_pixel", "round_prefer_floor",
       {2, 3, 5}, {2, 3, 1}},
      {"linear middle dim", "linear", "half_pixel", "round_prefer_floor",
       {2, 3, 4}, {2, 7, 4}},
      {"cubic up", "cubic", "half_pixel", "round_prefer_floor",
       {1, 2, 4, 5}, {1, 2, 6, 10}, {1, 1, 1.5f, 2}},
      {"cubic align corners", "cubic", "align_corners", "round_prefer_floor",
       {2, 2, 5, 4}, {2, 2, 9, 3}},
      {"cubic one dim", "cubic", "pytorch_half_pixel", "round_prefer_floor",
       {2, 6, 3}, {2, 11, 3}},
  };
  std::vector<Case> cases;
  for (const Geometry &g : geometries) {
    ir::AttrMap a = {{"mode", g.mode},
                     {"coordinate_transformation_mode", g.coord},
                     {"nearest_mode", g.round}};
    if (!g.scales.empty())
      a.insert({"scales", ir::Attribute(g.scales)});
    ir::AttrMap fwd = a;
    fwd.insert({"sizes", ir::Attribute(g.out)});
    Fill fill = g.dtype == DType::Bool ? Fill::Bool
                : g.dtype == DType::I64 ? Fill::Small
                                        : Fill::Uniform;
    cases.push_back({"resize " + g.name, OpKind::Resize, fwd,
                     {Arg{g.dtype, g.in, fill}}, {Arg{g.dtype, g.out, fill}}});
    if (g.dtype == DType::Bool || g.dtype == DType::I64)
      continue;
    ir::AttrMap back = a;
    back.insert({"shape", ir::Attribute(g.in)});
    cases.push_back({"resize grad " + g.name, OpKind::ResizeGrad, back,
                     {Arg{g.dtype, g.out}}, {Arg{g.dtype, g.in}}});
  }
  return cases;
}

// GridSample and its two gradients: every mode, padding and corner rule,
// grids in [-2, 2] (half the points outside), at exact halves (nearest's
// ties and linear's corner seams) and at NaN and infinities.
inline std::vector<Case> gridSampleCases() {
  struct Geometry {
    std::string mode, padding;
    int64_t align;
    Fill gridFill;
  };
  const std::vector<Geometry> geometries = {
      {"linear", "zeros", 0, Fill::Uniform},
      {"linear", "border", 1, Fill::Uniform},
      {"linear", "reflection", 0, Fill::Wide},
      {"linear", "reflection", 1, Fill::Wide},
      {"linear", "zeros", 1, Fill::Halves},
      {"linear", "border", 0, Fill::Special},
      {"nearest", "zeros", 0, Fill::Halves},
      {"nearest", "reflection", 1, Fill::Uniform},
      {"nearest", "border", 0, Fill::Special},
  };
  const Ints x = {2, 3, 5, 4}, grid = {2, 6, 7, 2}, y = {2, 3, 6, 7};
  std::vector<Case> cases;
  for (const Geometry &g : geometries) {
    std::string name = g.mode + " " + g.padding +
                       (g.align ? " align_corners" : "") +
                       (g.gridFill == Fill::Halves    ? " halves"
                        : g.gridFill == Fill::Special ? " special"
                                                      : "");
    ir::AttrMap a = {{"mode", g.mode},
                     {"padding_mode", g.padding},
                     {"align_corners", g.align}};
    cases.push_back({"grid sample " + name, OpKind::GridSample, a,
                     {f32(x), f32(grid, g.gridFill)}, {f32(y)}});
    ir::AttrMap data = a;
    data.insert({"shape", ir::Attribute(x)});
    cases.push_back({"grid sample grad data " + name,
                     OpKind::GridSampleGradData, data,
                     {f32(y), f32(grid, g.gridFill)}, {f32(x)}});
    cases.push_back({"grid sample grad grid " + name,
                     OpKind::GridSampleGradGrid, a,
                     {f32(y), f32(x), f32(grid, g.gridFill)}, {f32(grid)}});
  }
  return cases;
}

} // namespace cleave::cudatest

#endif
