// CPU elementwise kernels on small hand-computed cases: unary math, Clip,
// Cast between every kind of type, broadcasting binary ops (scalar, row,
// column and general N-D shapes, including runs split across threads),
// integer wrap-around and division by zero, Pow with mixed types, variadic
// Max/Min, comparisons, logic and Where.
#include "CpuKernelTesting.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace unit_cpu_elementwise {

using namespace cleave;
using namespace cleave::testsupport::untyped;

namespace {

Host f32(std::vector<int64_t> s, std::vector<float> v) {
  return make(DType::F32, std::move(s), std::move(v));
}
Host i64(std::vector<int64_t> s, std::vector<int64_t> v) {
  return make(DType::I64, std::move(s), std::move(v));
}
Host i32(std::vector<int64_t> s, std::vector<int32_t> v) {
  return make(DType::I32, std::move(s), std::move(v));
}
Host boolean(std::vector<int64_t> s, std::vector<uint8_t> v) {
  return make(DType::Bool, std::move(s), std::move(v));
}
Host f16(std::vector<int64_t> s, std::vector<float> v) {
  std::vector<uint16_t> h;
  for (float x : v)
    h.push_back(ir::floatToHalf(x));
  return make(DType::F16, std::move(s), h);
}
std::vector<float> halfValues(const Host &h) {
  std::vector<float> out;
  for (uint16_t x : h.values<uint16_t>())
    out.push_back(ir::halfToFloat(x));
  return out;
}

llvm::Error run(OpKind op, std::vector<const Host *> ins, Host &out,
                ir::AttrMap attrs = {}) {
  std::vector<TensorRef> in;
  for (const Host *h : ins)
    in.push_back(h->ref());
  TensorRef o = out.ref();
  return backend().run(runtime::KernelCall{op, attrs, in, o});
}

// Runs and expects success.
Host eval(OpKind op, std::vector<const Host *> ins, DType dt,
          std::vector<int64_t> shape, ir::AttrMap attrs = {}) {
  Host out = empty(dt, std::move(shape));
  llvm::Error e = run(op, ins, out, std::move(attrs));
  EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
  return out;
}

std::string errorOf(OpKind op, std::vector<const Host *> ins, Host &out,
                    ir::AttrMap attrs = {}) {
  llvm::Error e = run(op, ins, out, std::move(attrs));
  return e ? llvm::toString(std::move(e)) : "";
}

using F = std::vector<float>;

} // namespace

TEST(CpuElementwise, UnaryFloatMath) {
  Host x = f32({4}, {-2.0f, -0.5f, 0.0f, 3.0f});
  EXPECT_EQ(eval(OpKind::Abs, {&x}, DType::F32, {4}).values<float>(),
            (F{2, 0.5f, 0, 3}));
  EXPECT_EQ(eval(OpKind::Neg, {&x}, DType::F32, {4}).values<float>(),
            (F{2, 0.5f, -0.0f, -3}));
  EXPECT_EQ(eval(OpKind::Relu, {&x}, DType::F32, {4}).values<float>(),
            (F{0, 0, 0, 3}));
  EXPECT_EQ(eval(OpKind::LeakyRelu, {&x}, DType::F32, {4},
                 {{"alpha", 0.5f}})
                .values<float>(),
            (F{-1, -0.25f, 0, 3}));
  EXPECT_EQ(eval(OpKind::LeakyRelu, {&x}, DType::F32, {4}).values<float>(),
            (F{-0.02f, -0.005f, 0, 3}));
  EXPECT_EQ(eval(OpKind::Identity, {&x}, DType::F32, {4}).values<float>(),
            x.values<float>());

  Host p = f32({3}, {0.25f, 1.0f, 4.0f});
  EXPECT_EQ(eval(OpKind::Sqrt, {&p}, DType::F32, {3}).values<float>(),
            (F{0.5f, 1, 2}));
  EXPECT_EQ(eval(OpKind::Reciprocal, {&p}, DType::F32, {3}).values<float>(),
            (F{4, 1, 0.25f}));
  auto logs = eval(OpKind::Log, {&p}, DType::F32, {3}).values<float>();
  auto exps = eval(OpKind::Exp, {&p}, DType::F32, {3}).values<float>();
  auto tanhs = eval(OpKind::Tanh, {&p}, DType::F32, {3}).values<float>();
  auto erfs = eval(OpKind::Erf, {&p}, DType::F32, {3}).values<float>();
  F in = p.values<float>();
  for (int i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(logs[i], std::log(in[i]));
    EXPECT_FLOAT_EQ(exps[i], std::exp(in[i]));
    EXPECT_FLOAT_EQ(tanhs[i], std::tanh(in[i]));
    EXPECT_FLOAT_EQ(erfs[i], std::erf(in[i]));
  }
}

TEST(CpuElementwise, SigmoidIsStableAtBothEnds) {
  Host x = f32({5}, {-1000.0f, -2.0f, 0.0f, 2.0f, 1000.0f});
  F y = eval(OpKind::Sigmoid, {&x}, DType::F32, {5}).values<float>();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_FLOAT_EQ(y[1], 1.0f / (1.0f + std::exp(2.0f)));
  EXPECT_EQ(y[2], 0.5f);
  EXPECT_FLOAT_EQ(y[3], 1.0f / (1.0f + std::exp(-2.0f)));
  EXPECT_EQ(y[4], 1.0f);
}

TEST(CpuElementwise, IntegerUnaryWraps) {
  const int32_t lo = std::numeric_limits<int32_t>::min();
  Host x = i32({4}, {lo, -3, 0, 7});
  EXPECT_EQ(eval(OpKind::Abs, {&x}, DType::I32, {4}).values<int32_t>(),
            (std::vector<int32_t>{lo, 3, 0, 7}));
  EXPECT_EQ(eval(OpKind::Neg, {&x}, DType::I32, {4}).values<int32_t>(),
            (std::vector<int32_t>{lo, 3, 0, -7}));
  EXPECT_EQ(eval(OpKind::Relu, {&x}, DType::I32, {4}).values<int32_t>(),
            (std::vector<int32_t>{0, 0, 0, 7}));
}

TEST(CpuElementwise, NotAndOr) {
  Host a = boolean({4}, {0, 0, 1, 1}), b = boolean({4}, {0, 1, 0, 1});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(eval(OpKind::Not, {&a}, DType::Bool, {4}).values<uint8_t>(),
            (B{1, 1, 0, 0}));
  EXPECT_EQ(eval(OpKind::And, {&a, &b}, DType::Bool, {4}).values<uint8_t>(),
            (B{0, 0, 0, 1}));
  EXPECT_EQ(eval(OpKind::Or, {&a, &b}, DType::Bool, {4}).values<uint8_t>(),
            (B{0, 1, 1, 1}));
  Host col = boolean({2, 1}, {0, 1}), row = boolean({2}, {1, 0});
  EXPECT_EQ(
      eval(OpKind::Or, {&col, &row}, DType::Bool, {2, 2}).values<uint8_t>(),
      (B{1, 0, 1, 1}));
}

// Not, And, Or, Xor on integers are bitwise (ONNX's BitwiseNot, ...), in
// the operands' width; Xor on bool is logical.
TEST(CpuElementwise, BitwiseOnIntegersAndXorOnBool) {
  const int32_t lo = std::numeric_limits<int32_t>::min();
  Host a = i32({2, 3}, {lo, -1, 0, 5, -6, 0x0F0F}),
       b = i32({3}, {-1, 0x00FF, 12});
  using I = std::vector<int32_t>;
  EXPECT_EQ(eval(OpKind::And, {&a, &b}, DType::I32, {2, 3}).values<int32_t>(),
            (I{lo, 0x00FF, 0, 5, 0x00FA, 12 & 0x0F0F}));
  EXPECT_EQ(eval(OpKind::Or, {&a, &b}, DType::I32, {2, 3}).values<int32_t>(),
            (I{-1, -1, 12, -1, -6 | 0x00FF, 0x0F0F | 12}));
  EXPECT_EQ(eval(OpKind::Xor, {&a, &b}, DType::I32, {2, 3}).values<int32_t>(),
            (I{int32_t(~lo), int32_t(-1 ^ 0x00FF), 12, ~5, -6 ^ 0x00FF,
               0x0F0F ^ 12}));
  EXPECT_EQ(eval(OpKind::Not, {&a}, DType::I32, {2, 3}).values<int32_t>(),
            (I{std::numeric_limits<int32_t>::max(), 0, -1, -6, 5, ~0x0F0F}));
  Host c = i64({2}, {int64_t(1) << 40 | 7, -2}), d = i64({2}, {5, 3});
  EXPECT_EQ(eval(OpKind::And, {&c, &d}, DType::I64, {2}).values<int64_t>(),
            (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(eval(OpKind::Not, {&c}, DType::I64, {2}).values<int64_t>(),
            (std::vector<int64_t>{~(int64_t(1) << 40 | 7), 1}));
  Host p = boolean({4}, {0, 0, 1, 1}), q = boolean({4}, {0, 1, 0, 1});
  EXPECT_EQ(eval(OpKind::Xor, {&p, &q}, DType::Bool, {4}).values<uint8_t>(),
            (std::vector<uint8_t>{0, 1, 1, 0}));
}

TEST(CpuElementwise, Clip) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = f32({5}, {-5.0f, -1.0f, 0.5f, 9.0f, nan});
  F y = eval(OpKind::Clip, {&x}, DType::F32, {5},
             {{"min", -2.0f}, {"max", 1.0f}})
            .values<float>();
  EXPECT_EQ(F(y.begin(), y.begin() + 4), (F{-2, -1, 0.5f, 1}));
  EXPECT_TRUE(std::isnan(y[4]));
  // Defaults: no bound at all.
  F same = eval(OpKind::Clip, {&x}, DType::F32, {5}).values<float>();
  EXPECT_EQ(F(same.begin(), same.begin() + 4), (F{-5, -1, 0.5f, 9}));
  // Only max; and min > max makes everything max.
  F hiOnly = eval(OpKind::Clip, {&x}, DType::F32, {5}, {{"max", 0.0f}})
                 .values<float>();
  EXPECT_EQ(F(hiOnly.begin(), hiOnly.begin() + 4), (F{-5, -1, 0, 0}));
  F crossed = eval(OpKind::Clip, {&x}, DType::F32, {5},
                   {{"min", 3.0f}, {"max", 1.0f}})
                  .values<float>();
  EXPECT_EQ(F(crossed.begin(), crossed.begin() + 4), (F{1, 1, 1, 1}));

  Host n = i64({4}, {-100, -1, 5, std::numeric_limits<int64_t>::max()});
  EXPECT_EQ(eval(OpKind::Clip, {&n}, DType::I64, {4},
                 {{"min", -3.0f}, {"max", 4.0f}})
                .values<int64_t>(),
            (std::vector<int64_t>{-3, -1, 4, 4}));
  EXPECT_EQ(eval(OpKind::Clip, {&n}, DType::I64, {4}).values<int64_t>(),
            n.values<int64_t>());
}

TEST(CpuElementwise, CastFloatToIntTruncatesTowardZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = f32({6}, {-2.7f, -0.5f, 2.7f, 3e10f, -3e10f, nan});
  EXPECT_EQ(eval(OpKind::Cast, {&x}, DType::I32, {6}, {{"to", "i32"}})
                .values<int32_t>(),
            (std::vector<int32_t>{-2, 0, 2, std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min(), 0}));
  EXPECT_EQ(eval(OpKind::Cast, {&x}, DType::I64, {6}, {{"to", "i64"}})
                .values<int64_t>(),
            (std::vector<int64_t>{-2, 0, 2, 30000001024, -30000001024, 0}));
  EXPECT_EQ(eval(OpKind::Cast, {&x}, DType::Bool, {6}, {{"to", "bool"}})
                .values<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 1, 1, 1, 1}));
}

TEST(CpuElementwise, CastBetweenOtherTypes) {
  Host b = boolean({3}, {1, 0, 1});
  EXPECT_EQ(eval(OpKind::Cast, {&b}, DType::F32, {3}, {{"to", "f32"}})
                .values<float>(),
            (F{1, 0, 1}));
  Host n = i64({3}, {300, -129, 5});
  EXPECT_EQ(eval(OpKind::Cast, {&n}, DType::I8, {3}, {{"to", "i8"}})
                .values<int8_t>(),
            (std::vector<int8_t>{44, 127, 5})); // wraps modulo 256
  EXPECT_EQ(eval(OpKind::Cast, {&n}, DType::Bool, {3}, {{"to", "bool"}})
                .values<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 1}));
  Host h = eval(OpKind::Cast, {&n}, DType::F16, {3}, {{"to", "f16"}});
  EXPECT_EQ(halfValues(h), (F{300, -129, 5}));
  // f16 -> f64 -> bf16 -> f32.
  Host d = eval(OpKind::Cast, {&h}, DType::F64, {3}, {{"to", "f64"}});
  EXPECT_EQ(d.values<double>(), (std::vector<double>{300, -129, 5}));
  Host bf = eval(OpKind::Cast, {&d}, DType::BF16, {3}, {{"to", "bf16"}});
  EXPECT_EQ(eval(OpKind::Cast, {&bf}, DType::F32, {3}, {{"to", "f32"}})
                .values<float>(),
            (F{300, -129, 5}));
  Host x = f32({2}, {1.5f, -2.25f});
  EXPECT_EQ(eval(OpKind::Cast, {&x}, DType::F32, {2}, {{"to", "f32"}})
                .values<float>(),
            (F{1.5f, -2.25f}));
  EXPECT_EQ(eval(OpKind::Cast, {&x}, DType::F64, {2}, {{"to", "f64"}})
                .values<double>(),
            (std::vector<double>{1.5, -2.25}));
}

TEST(CpuElementwise, AddBroadcastsScalarsRowsAndColumns) {
  Host a = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  Host same = f32({2, 3}, {10, 20, 30, 40, 50, 60});
  EXPECT_EQ(eval(OpKind::Add, {&a, &same}, DType::F32, {2, 3})
                .values<float>(),
            (F{11, 22, 33, 44, 55, 66}));
  Host row = f32({3}, {10, 20, 30});
  EXPECT_EQ(eval(OpKind::Add, {&a, &row}, DType::F32, {2, 3}).values<float>(),
            (F{11, 22, 33, 14, 25, 36}));
  Host col = f32({2, 1}, {100, 200});
  EXPECT_EQ(eval(OpKind::Add, {&col, &a}, DType::F32, {2, 3}).values<float>(),
            (F{101, 102, 103, 204, 205, 206}));
  Host scalar = f32({}, {0.5f});
  EXPECT_EQ(
      eval(OpKind::Add, {&scalar, &a}, DType::F32, {2, 3}).values<float>(),
      (F{1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f}));
  // Outer product shape: [2,1] + [1,3].
  Host r13 = f32({1, 3}, {1, 2, 3});
  EXPECT_EQ(eval(OpKind::Add, {&col, &r13}, DType::F32, {2, 3})
                .values<float>(),
            (F{101, 102, 103, 201, 202, 203}));
}

TEST(CpuElementwise, SubMulDivBroadcastAcrossRanks) {
  // [2,1,3] op [2,1] -> [2,2,3]
  Host a = f32({2, 1, 3}, {1, 2, 3, 4, 5, 6});
  Host b = f32({2, 1}, {1, 2});
  EXPECT_EQ(eval(OpKind::Sub, {&a, &b}, DType::F32, {2, 2, 3})
                .values<float>(),
            (F{0, 1, 2, -1, 0, 1, 3, 4, 5, 2, 3, 4}));
  EXPECT_EQ(eval(OpKind::Mul, {&a, &b}, DType::F32, {2, 2, 3})
                .values<float>(),
            (F{1, 2, 3, 2, 4, 6, 4, 5, 6, 8, 10, 12}));
  EXPECT_EQ(eval(OpKind::Div, {&a, &b}, DType::F32, {2, 2, 3})
                .values<float>(),
            (F{1, 2, 3, 0.5f, 1, 1.5f, 4, 5, 6, 2, 2.5f, 3}));
  Host zero = f32({}, {0.0f});
  F inf = eval(OpKind::Div, {&b, &zero}, DType::F32, {2, 1}).values<float>();
  EXPECT_TRUE(std::isinf(inf[0]) && std::isinf(inf[1]));
}

TEST(CpuElementwise, IntegerArithmetic) {
  Host a = i64({4}, {7, -7, 7, -7}), b = i64({4}, {2, 2, -2, -2});
  EXPECT_EQ(eval(OpKind::Div, {&a, &b}, DType::I64, {4}).values<int64_t>(),
            (std::vector<int64_t>{3, -3, -3, 3}));
  EXPECT_EQ(eval(OpKind::Mul, {&a, &b}, DType::I64, {4}).values<int64_t>(),
            (std::vector<int64_t>{14, -14, -14, 14}));
  EXPECT_EQ(eval(OpKind::Sub, {&a, &b}, DType::I64, {4}).values<int64_t>(),
            (std::vector<int64_t>{5, -9, 9, -5}));
  // Overflow wraps; lowest / -1 wraps instead of trapping.
  Host big = make<int8_t>(DType::I8, {2}, {127, -128});
  Host one = make<int8_t>(DType::I8, {}, {1});
  Host minusOne = make<int8_t>(DType::I8, {}, {-1});
  EXPECT_EQ(eval(OpKind::Add, {&big, &one}, DType::I8, {2}).values<int8_t>(),
            (std::vector<int8_t>{-128, -127}));
  Host lo = i32({1}, {std::numeric_limits<int32_t>::min()});
  Host m1 = i32({1}, {-1});
  EXPECT_EQ(eval(OpKind::Div, {&lo, &m1}, DType::I32, {1}).values<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
  EXPECT_EQ(
      eval(OpKind::Div, {&big, &minusOne}, DType::I8, {2}).values<int8_t>(),
      (std::vector<int8_t>{-127, -128}));
}

TEST(CpuElementwise, IntegerDivisionByZeroIsAnError) {
  Host a = i32({3}, {1, 2, 3}), b = i32({3}, {1, 0, 1});
  Host out = empty(DType::I32, {3});
  std::string msg = errorOf(OpKind::Div, {&a, &b}, out);
  EXPECT_NE(msg.find("Div"), std::string::npos) << msg;
  EXPECT_NE(msg.find("division by zero"), std::string::npos) << msg;
}

TEST(CpuElementwise, PowWithMixedExponentTypes) {
  Host base = f32({2, 2}, {1, 2, 3, 4});
  Host e = f32({2}, {2, 0.5f});
  F mixed = eval(OpKind::Pow, {&base, &e}, DType::F32, {2, 2}).values<float>();
  F expect = {1, std::sqrt(2.0f), 9, 2};
  for (int i = 0; i < 4; ++i)
    EXPECT_FLOAT_EQ(mixed[i], expect[i]);
  Host two = f32({}, {2});
  EXPECT_EQ(eval(OpKind::Pow, {&base, &two}, DType::F32, {2, 2})
                .values<float>(),
            (F{1, 4, 9, 16}));
  // x^1 (the gradient of x^2 raises to 2 - 1) is x itself, every value,
  // in f32 and in an i64 exponent's widened double.
  const float inf = std::numeric_limits<float>::infinity();
  Host odd = f32({6}, {-0.0f, 1e-40f, -3.5f, inf, -inf, 1.17549435e-38f});
  Host one = f32({}, {1});
  EXPECT_EQ(eval(OpKind::Pow, {&odd, &one}, DType::F32, {6}).values<float>(),
            odd.values<float>());
  Host oneI = i64({}, {1});
  EXPECT_EQ(eval(OpKind::Pow, {&odd, &oneI}, DType::F32, {6}).values<float>(),
            odd.values<float>());
  Host nanBase = f32({1}, {std::nanf("")});
  EXPECT_TRUE(std::isnan(
      eval(OpKind::Pow, {&nanBase, &one}, DType::F32, {1}).values<float>()[0]));
  Host three = i64({}, {3});
  EXPECT_EQ(eval(OpKind::Pow, {&base, &three}, DType::F32, {2, 2})
                .values<float>(),
            (F{1, 8, 27, 64}));
  Host ib = i64({5}, {3, 2, -1, -1, 5});
  Host ie = i64({5}, {4, -1, -3, 2, 0});
  EXPECT_EQ(eval(OpKind::Pow, {&ib, &ie}, DType::I64, {5}).values<int64_t>(),
            (std::vector<int64_t>{81, 0, -1, 1, 1}));
  Host half = f32({}, {0.5f});
  Host sq = i32({3}, {4, 10, 9});
  EXPECT_EQ(eval(OpKind::Pow, {&sq, &half}, DType::I32, {3})
                .values<int32_t>(),
            (std::vector<int32_t>{2, 3, 3}));
}

TEST(CpuElementwise, VariadicMaxMin) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Host a = f32({2, 2}, {1, 5, 3, 0});
  Host b = f32({2}, {2, 2});
  Host c = f32({2, 1}, {0, 4});
  EXPECT_EQ(eval(OpKind::Max, {&a}, DType::F32, {2, 2}).values<float>(),
            a.values<float>());
  EXPECT_EQ(eval(OpKind::Max, {&b, &a, &c}, DType::F32, {2, 2})
                .values<float>(),
            (F{2, 5, 4, 4}));
  EXPECT_EQ(eval(OpKind::Min, {&a, &b, &c}, DType::F32, {2, 2})
                .values<float>(),
            (F{0, 0, 2, 0}));
  // Broadcasting can happen in the first pair only.
  EXPECT_EQ(eval(OpKind::Min, {&b, &c}, DType::F32, {2, 2}).values<float>(),
            (F{0, 0, 2, 2}));
  Host n = f32({2}, {nan, 1});
  Host m = f32({2}, {1, nan});
  F mx = eval(OpKind::Max, {&n, &m}, DType::F32, {2}).values<float>();
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
  Host ia = i32({3}, {-1, 5, 2}), ib = i32({1}, {3});
  EXPECT_EQ(
      eval(OpKind::Max, {&ia, &ib}, DType::I32, {3}).values<int32_t>(),
      (std::vector<int32_t>{3, 5, 3}));
}

TEST(CpuElementwise, Comparisons) {
  using B = std::vector<uint8_t>;
  Host a = f32({2, 2}, {1, 2, 3, 4});
  Host b = f32({2}, {2, 3});
  EXPECT_EQ(eval(OpKind::Equal, {&a, &b}, DType::Bool, {2, 2})
                .values<uint8_t>(),
            (B{0, 0, 0, 0}));
  EXPECT_EQ(eval(OpKind::Greater, {&a, &b}, DType::Bool, {2, 2})
                .values<uint8_t>(),
            (B{0, 0, 1, 1}));
  EXPECT_EQ(eval(OpKind::Less, {&a, &b}, DType::Bool, {2, 2})
                .values<uint8_t>(),
            (B{1, 1, 0, 0}));
  Host ia = i64({3}, {1, 2, 3}), ib = i64({}, {2});
  EXPECT_EQ(
      eval(OpKind::Equal, {&ia, &ib}, DType::Bool, {3}).values<uint8_t>(),
      (B{0, 1, 0}));
  Host ba = boolean({2}, {1, 0}), bb = boolean({2}, {1, 1});
  EXPECT_EQ(
      eval(OpKind::Equal, {&ba, &bb}, DType::Bool, {2}).values<uint8_t>(),
      (B{1, 0}));
  // f16 compares values: +0 == -0.
  Host ha = f16({2}, {0.0f, 1.5f}), hb = f16({2}, {-0.0f, 1.5f});
  EXPECT_EQ(
      eval(OpKind::Equal, {&ha, &hb}, DType::Bool, {2}).values<uint8_t>(),
      (B{1, 1}));
}

TEST(CpuElementwise, WhereBroadcastsAllThreeInputs) {
  Host cond = boolean({2, 1}, {1, 0});
  Host x = f32({1, 3}, {1, 2, 3});
  Host y = f32({}, {-1});
  EXPECT_EQ(eval(OpKind::Where, {&cond, &x, &y}, DType::F32, {2, 3})
                .values<float>(),
            (F{1, 2, 3, -1, -1, -1}));
  Host c2 = boolean({3}, {0, 1, 0});
  Host xi = i64({2, 3}, {1, 2, 3, 4, 5, 6});
  Host yi = i64({2, 1}, {-7, -8});
  EXPECT_EQ(eval(OpKind::Where, {&c2, &xi, &yi}, DType::I64, {2, 3})
                .values<int64_t>(),
            (std::vector<int64_t>{-7, 2, -7, -8, 5, -8}));
  Host xh = f16({3}, {1, 2, 3}), yh = f16({3}, {4, 5, 6});
  EXPECT_EQ(halfValues(eval(OpKind::Where, {&c2, &xh, &yh}, DType::F16, {3})),
            (F{4, 2, 6}));
}

TEST(CpuElementwise, HalfPrecisionComputesInF32) {
  Host a = f16({3}, {1.5f, 2.25f, -4.0f});
  Host b = f16({}, {0.25f});
  EXPECT_EQ(halfValues(eval(OpKind::Add, {&a, &b}, DType::F16, {3})),
            (F{1.75f, 2.5f, -3.75f}));
  EXPECT_EQ(halfValues(eval(OpKind::Relu, {&a}, DType::F16, {3})),
            (F{1.5f, 2.25f, 0}));
}

// Large enough that the flat range splits across threads in the middle of a
// row; checked against a direct index computation.
TEST(CpuElementwise, LargeBroadcastMatchesReference) {
  const int64_t rows = 63, cols = 301;
  std::vector<float> av(rows * cols), rv(cols), cv(rows);
  for (int64_t i = 0; i < rows * cols; ++i)
    av[i] = float(i % 1000) * 0.5f;
  for (int64_t j = 0; j < cols; ++j)
    rv[j] = float(j);
  for (int64_t i = 0; i < rows; ++i)
    cv[i] = float(i) * 1000.0f;
  Host a = f32({rows, cols}, av), r = f32({cols}, rv), c = f32({rows, 1}, cv);
  F sum = eval(OpKind::Add, {&a, &r}, DType::F32, {rows, cols})
              .values<float>();
  F diff = eval(OpKind::Sub, {&c, &a}, DType::F32, {rows, cols})
               .values<float>();
  F outer = eval(OpKind::Mul, {&c, &r}, DType::F32, {rows, cols})
                .values<float>();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      int64_t k = i * cols + j;
      ASSERT_EQ(sum[k], av[k] + rv[j]) << i << "," << j;
      ASSERT_EQ(diff[k], cv[i] - av[k]) << i << "," << j;
      ASSERT_EQ(outer[k], cv[i] * rv[j]) << i << "," << j;
    }

  // General N-D: [4,1,50,3] + [7,1,3] -> [4,7,50,3] (more than one grain).
  std::vector<float> xv(4 * 50 * 3), yv(7 * 3);
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = float(i);
  for (size_t i = 0; i < yv.size(); ++i)
    yv[i] = float(i) * 10000.0f;
  Host x = f32({4, 1, 50, 3}, xv), y = f32({7, 1, 3}, yv);
  F z = eval(OpKind::Add, {&x, &y}, DType::F32, {4, 7, 50, 3})
            .values<float>();
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t m = 0; m < 7; ++m)
      for (int64_t h = 0; h < 50; ++h)
        for (int64_t w = 0; w < 3; ++w)
          ASSERT_EQ(z[((n * 7 + m) * 50 + h) * 3 + w],
                    xv[(n * 50 + h) * 3 + w] + yv[m * 3 + w]);
}

TEST(CpuElementwise, UnsupportedTypeIsAnErrorNotACrash) {
  EXPECT_TRUE(backend().supports(OpKind::Exp, DType::F32));
  EXPECT_TRUE(backend().supports(OpKind::Add, DType::I8));
  EXPECT_FALSE(backend().supports(OpKind::Exp, DType::I32));
  EXPECT_FALSE(backend().supports(OpKind::Add, DType::Bool));
  Host x = i32({2}, {1, 2});
  Host out = empty(DType::I32, {2});
  std::string msg = errorOf(OpKind::Exp, {&x}, out);
  EXPECT_NE(msg.find("Exp"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i32"), std::string::npos) << msg;
}

// --- Sin, Cos, Gelu, IsNaN, IsInf, LessOrEqual, GreaterOrEqual, Mod, Trilu

TEST(CpuElementwise, SinCos) {
  Host x = f32({4}, {0.0f, 0.5f, 1.5707964f, -2.0f});
  auto s = eval(OpKind::Sin, {&x}, DType::F32, {4}).values<float>();
  auto c = eval(OpKind::Cos, {&x}, DType::F32, {4}).values<float>();
  EXPECT_EQ(s[0], 0.0f);
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_FLOAT_EQ(s[2], 1.0f);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(s[i], std::sin(x.values<float>()[i]));
    EXPECT_FLOAT_EQ(c[i], std::cos(x.values<float>()[i]));
  }
}

// Gelu-20's values at -1, 0, 1, 2 (erf form: x * Phi(x); tanh form: the
// values PyTorch's gelu(approximate="tanh") gives).
TEST(CpuElementwise, GeluBothForms) {
  Host x = make(DType::F64, {4}, std::vector<double>{-1, 0, 1, 2});
  auto erfForm = eval(OpKind::Gelu, {&x}, DType::F64, {4}).values<double>();
  EXPECT_NEAR(erfForm[0], -0.15865525393145707, 1e-15);
  EXPECT_EQ(erfForm[1], 0.0);
  EXPECT_NEAR(erfForm[2], 0.8413447460685429, 1e-15);
  EXPECT_NEAR(erfForm[3], 1.9544997361036416, 1e-15);
  auto tanhForm = eval(OpKind::Gelu, {&x}, DType::F64, {4},
                       {{"approximate", std::string("tanh")}})
                      .values<double>();
  EXPECT_NEAR(tanhForm[0], -0.15880800939172324, 1e-12);
  EXPECT_EQ(tanhForm[1], 0.0);
  EXPECT_NEAR(tanhForm[2], 0.8411919906082768, 1e-12);
  EXPECT_NEAR(tanhForm[3], 1.9545976940871754, 1e-12);
  Host out = empty(DType::F64, {4});
  EXPECT_NE(errorOf(OpKind::Gelu, {&x}, out,
                    {{"approximate", std::string("fast")}}),
            "");
}

TEST(CpuElementwise, IsNaNAndIsInf) {
  float inf = std::numeric_limits<float>::infinity();
  float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = f32({5}, {nan, 1.0f, inf, -inf, 0.0f});
  EXPECT_EQ(eval(OpKind::IsNaN, {&x}, DType::Bool, {5}).values<uint8_t>(),
            (std::vector<uint8_t>{1, 0, 0, 0, 0}));
  EXPECT_EQ(eval(OpKind::IsInf, {&x}, DType::Bool, {5}).values<uint8_t>(),
            (std::vector<uint8_t>{0, 0, 1, 1, 0}));
  EXPECT_EQ(eval(OpKind::IsInf, {&x}, DType::Bool, {5},
                 {{"detect_negative", int64_t(0)}})
                .values<uint8_t>(),
            (std::vector<uint8_t>{0, 0, 1, 0, 0}));
  EXPECT_EQ(eval(OpKind::IsInf, {&x}, DType::Bool, {5},
                 {{"detect_positive", int64_t(0)}})
                .values<uint8_t>(),
            (std::vector<uint8_t>{0, 0, 0, 1, 0}));
  auto t = ir::inferResultTypes(OpKind::IsNaN,
                                {ir::TensorType(DType::I64, {2})}, {}, 1);
  ASSERT_FALSE(bool(t)); // float operands only
  llvm::consumeError(t.takeError());
}

TEST(CpuElementwise, LessOrEqualGreaterOrEqualBroadcast) {
  Host a = f32({3}, {1, 2, 3}), two = f32({}, {2});
  EXPECT_EQ(eval(OpKind::LessOrEqual, {&a, &two}, DType::Bool, {3})
                .values<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(eval(OpKind::GreaterOrEqual, {&a, &two}, DType::Bool, {3})
                .values<uint8_t>(),
            (std::vector<uint8_t>{0, 1, 1}));
  Host ia = i64({2, 1}, {1, 5}), ib = i64({2}, {1, 5});
  EXPECT_EQ(eval(OpKind::LessOrEqual, {&ia, &ib}, DType::Bool, {2, 2})
                .values<uint8_t>(),
            (std::vector<uint8_t>{1, 1, 0, 1}));
}

TEST(CpuElementwise, ModFollowsTheDivisorOrTheDividend) {
  Host a = i64({4}, {-7, 7, -7, 7}), b = i64({4}, {3, -3, -3, 3});
  EXPECT_EQ(eval(OpKind::Mod, {&a, &b}, DType::I64, {4}).values<int64_t>(),
            (std::vector<int64_t>{2, -2, -1, 1})); // Python's %
  EXPECT_EQ(eval(OpKind::Mod, {&a, &b}, DType::I64, {4}, {{"fmod", int64_t(1)}})
                .values<int64_t>(),
            (std::vector<int64_t>{-1, 1, -1, 1})); // C's %
  Host i = i32({2}, {5, -5}), three = i32({}, {3});
  EXPECT_EQ(eval(OpKind::Mod, {&i, &three}, DType::I32, {2}).values<int32_t>(),
            (std::vector<int32_t>{2, 1}));
  Host x = f32({2}, {-7.5f, 7.5f}), y = f32({2}, {2.0f, -2.0f});
  EXPECT_EQ(eval(OpKind::Mod, {&x, &y}, DType::F32, {2}, {{"fmod", int64_t(1)}})
                .values<float>(),
            (F{-1.5f, 1.5f}));
  Host zero = i64({}, {0}), out = empty(DType::I64, {4});
  EXPECT_NE(errorOf(OpKind::Mod, {&a, &zero}, out).find("by zero"),
            std::string::npos);
  auto t = ir::inferResultTypes(OpKind::Mod,
                                {ir::TensorType(DType::F32, {2}),
                                 ir::TensorType(DType::F32, {2})},
                                {}, 1);
  ASSERT_FALSE(bool(t)); // floats need fmod = 1
  EXPECT_NE(llvm::toString(t.takeError()).find("fmod"), std::string::npos);
}

TEST(CpuElementwise, TriluKeepsATriangleOfEachMatrix) {
  Host x = f32({2, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9,
                           -1, -2, -3, -4, -5, -6, -7, -8, -9});
  auto run3 = [&](int64_t upper, int64_t k) {
    return eval(OpKind::Trilu, {&x}, DType::F32, {2, 3, 3},
                {{"upper", upper}, {"k", k}})
        .values<float>();
  };
  EXPECT_EQ(run3(1, 0), (F{1, 2, 3, 0, 5, 6, 0, 0, 9,
                           -1, -2, -3, 0, -5, -6, 0, 0, -9}));
  EXPECT_EQ(run3(0, 0), (F{1, 0, 0, 4, 5, 0, 7, 8, 9,
                           -1, 0, 0, -4, -5, 0, -7, -8, -9}));
  auto up1 = run3(1, 1), lowM1 = run3(0, -1);
  EXPECT_EQ(F(up1.begin(), up1.begin() + 9), (F{0, 2, 3, 0, 0, 6, 0, 0, 0}));
  EXPECT_EQ(F(lowM1.begin(), lowM1.begin() + 9),
            (F{0, 0, 0, 4, 0, 0, 7, 8, 0}));
  Host r = i64({2, 3}, {1, 2, 3, 4, 5, 6}); // not square, integers
  EXPECT_EQ(eval(OpKind::Trilu, {&r}, DType::I64, {2, 3}, {{"k", int64_t(-1)}})
                .values<int64_t>(),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(eval(OpKind::Trilu, {&r}, DType::I64, {2, 3},
                 {{"upper", int64_t(0)}, {"k", int64_t(1)}})
                .values<int64_t>(),
            (std::vector<int64_t>{1, 2, 0, 4, 5, 6}));
}

namespace {

// Floor, Ceil and Round (halves to even) on floats; Sign on floats and
// integers.
TEST(CpuElementwise, FloorCeilRoundSign) {
  Host x = f32({7}, {-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 2.7f});
  EXPECT_EQ(eval(OpKind::Floor, {&x}, DType::F32, {7}).values<float>(),
            (std::vector<float>{-3, -2, -1, 0, 1, 2, 2}));
  EXPECT_EQ(eval(OpKind::Ceil, {&x}, DType::F32, {7}).values<float>(),
            (std::vector<float>{-2, -1, -0.0f, 1, 2, 3, 3}));
  EXPECT_EQ(eval(OpKind::Round, {&x}, DType::F32, {7}).values<float>(),
            (std::vector<float>{-2, -2, -0.0f, 0, 2, 2, 3}));
  Host s = f32({4}, {-2.5f, 0.0f, 3.0f, std::nanf("")});
  auto sign = eval(OpKind::Sign, {&s}, DType::F32, {4}).values<float>();
  EXPECT_EQ(sign[0], -1.0f);
  EXPECT_EQ(sign[1], 0.0f);
  EXPECT_EQ(sign[2], 1.0f);
  EXPECT_TRUE(std::isnan(sign[3]));
  Host i = i32({3}, {-7, 0, 9});
  EXPECT_EQ(eval(OpKind::Sign, {&i}, DType::I32, {3}).values<int32_t>(),
            (std::vector<int32_t>{-1, 0, 1}));
}

// HardSigmoid with ONNX's example constants (alpha 0.5, beta 0.6) and with
// PyTorch's (1/6, 1/2: PyTorch's formula, min(max(x + 3, 0), 6) / 6);
// HardSwish as PyTorch computes it.
TEST(CpuElementwise, HardSigmoidAndHardSwish) {
  Host x = f32({3}, {-1, 0, 1});
  EXPECT_EQ(eval(OpKind::HardSigmoid, {&x}, DType::F32, {3},
                 {{"alpha", 0.5f}, {"beta", 0.6f}})
                .values<float>(),
            (std::vector<float>{0.5f * -1.0f + 0.6f, 0.6f, 1.0f}));
  std::vector<float> v{-4, -3, -1.5f, 0, 0.7f, 3, 5};
  Host y = f32({7}, v);
  auto hs = eval(OpKind::HardSigmoid, {&y}, DType::F32, {7},
                 {{"alpha", 1.0f / 6.0f}, {"beta", 0.5f}})
                .values<float>();
  auto hw = eval(OpKind::HardSwish, {&y}, DType::F32, {7}).values<float>();
  for (size_t k = 0; k < v.size(); ++k) {
    float clamped = std::min(std::max(v[k] + 3.0f, 0.0f), 6.0f);
    EXPECT_EQ(hs[k], clamped / 6.0f) << v[k];
    EXPECT_EQ(hw[k], v[k] * clamped / 6.0f) << v[k];
  }
}

} // namespace

namespace {

// Silu (made by recognize-silu from Mul(x, Sigmoid(x))) gives the bits of
// the Sigmoid then the Mul it replaces, at every length (the 16-, 8-lane
// and partial tails) and in the tails of the range (exp's edges, NaN).
TEST(CpuElementwise, SiluIsTheBitsOfSigmoidThenMul) {
  for (int64_t n : {1, 7, 8, 15, 16, 33, 64, 100}) {
    std::vector<float> xs(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      xs[size_t(i)] = float(-40.0 + 80.0 * double(i * 37 % n) / double(n)) +
                     0.013f * float(i);
    if (n > 3) {
      xs[0] = 90.0f;
      xs[1] = -90.0f;
      xs[2] = std::nanf("");
    }
    Host x = f32({n}, xs);
    auto s = eval(OpKind::Sigmoid, {&x}, DType::F32, {n}).values<float>();
    Host sig = f32({n}, s);
    auto product = eval(OpKind::Mul, {&x, &sig}, DType::F32, {n}).values<float>();
    auto silu = eval(OpKind::Silu, {&x}, DType::F32, {n}).values<float>();
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(product[size_t(i)]))
        EXPECT_TRUE(std::isnan(silu[size_t(i)])) << i;
      else
        EXPECT_EQ(silu[size_t(i)], product[size_t(i)]) << "n " << n << " x " << xs[size_t(i)];
    }
  }
}

} // namespace

} // namespace unit_cpu_elementwise
