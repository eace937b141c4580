// CPU reduction kernels: ReduceSum / ReduceMean / ReduceMax over leading,
// trailing, middle and scattered axes, keepdims, negative axes, integer
// types, NaN, empty reductions, and a comparison against a direct loop on
// shapes large enough to run in parallel.
#include "CpuKernelTesting.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace unit_cpu_reduction {

using namespace cleave;
using namespace cleave::testsupport::untyped;

namespace {

Host eval(OpKind op, const Host &in, std::vector<int64_t> outShape,
          ir::AttrMap attrs = {}) {
  Host out = empty(in.dtype, std::move(outShape));
  TensorRef i = in.ref(), o = out.ref();
  llvm::Error e = backend().run(runtime::KernelCall{op, attrs, i, o});
  EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
  return out;
}

ir::AttrMap axes(std::vector<int64_t> a, int64_t keep = 1) {
  return {{"axes", std::move(a)}, {"keepdims", keep}};
}

using F = std::vector<float>;

// [2,3,4] holding 0..23.
Host iota234() {
  F v(24);
  for (int i = 0; i < 24; ++i)
    v[i] = float(i);
  return make(DType::F32, {2, 3, 4}, v);
}

} // namespace

TEST(CpuReduction, AllAxesByDefault) {
  Host x = iota234();
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {1, 1, 1}).values<float>(), F{276});
  EXPECT_EQ(eval(OpKind::ReduceMean, x, {}, {{"keepdims", int64_t(0)}})
                .values<float>(),
            F{11.5f});
  EXPECT_EQ(eval(OpKind::ReduceMax, x, {1, 1, 1}).values<float>(), F{23});
}

TEST(CpuReduction, LastAxis) {
  Host x = iota234();
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {2, 3}, axes({-1}, 0)).values<float>(),
            (F{6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(eval(OpKind::ReduceMax, x, {2, 3, 1}, axes({2})).values<float>(),
            (F{3, 7, 11, 15, 19, 23}));
}

TEST(CpuReduction, LeadingAndMiddleAxes) {
  Host x = iota234();
  // Over axis 0: kept dims are innermost.
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {3, 4}, axes({0}, 0)).values<float>(),
            (F{12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34}));
  // Over axis 1: kept dims on both sides.
  EXPECT_EQ(eval(OpKind::ReduceMean, x, {2, 1, 4}, axes({1}))
                .values<float>(),
            (F{4, 5, 6, 7, 16, 17, 18, 19}));
  // Over axes 0 and 2: the middle dim is kept (per-channel statistics).
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {3}, axes({0, -1}, 0)).values<float>(),
            (F{6 + 54, 22 + 70, 38 + 86}));
  EXPECT_EQ(eval(OpKind::ReduceMax, x, {1, 3, 1}, axes({2, 0}))
                .values<float>(),
            (F{15, 19, 23}));
  // Over axes 0 and 1: the last dim is kept.
  EXPECT_EQ(eval(OpKind::ReduceMax, x, {4}, axes({0, 1}, 0)).values<float>(),
            (F{20, 21, 22, 23}));
}

TEST(CpuReduction, SizeOneDimsAndScalars) {
  Host x = make<float>(DType::F32, {1, 3, 1}, {1, 2, 3});
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {1, 1, 1}, axes({1})).values<float>(),
            F{6});
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {3, 1}, axes({0}, 0)).values<float>(),
            (F{1, 2, 3}));
  Host s = make<float>(DType::F32, {}, {4.5f});
  EXPECT_EQ(eval(OpKind::ReduceMean, s, {}).values<float>(), F{4.5f});
}

TEST(CpuReduction, IntegerTypes) {
  Host x = make<int64_t>(DType::I64, {2, 3}, {1, -2, 3, 4, 5, -9});
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {2}, axes({1}, 0)).values<int64_t>(),
            (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(eval(OpKind::ReduceMax, x, {3}, axes({0}, 0)).values<int64_t>(),
            (std::vector<int64_t>{4, 5, 3}));
  Host y = make<int32_t>(DType::I32, {2, 2}, {1, 2, -3, -4});
  // Integer mean truncates toward zero: 3/2 -> 1, -7/2 -> -3.
  EXPECT_EQ(eval(OpKind::ReduceMean, y, {2, 1}, axes({1})).values<int32_t>(),
            (std::vector<int32_t>{1, -3}));
  Host z = make<int8_t>(DType::I8, {3}, {-100, -100, -120});
  EXPECT_EQ(eval(OpKind::ReduceMax, z, {1}).values<int8_t>(),
            std::vector<int8_t>{-100});
}

TEST(CpuReduction, NanAndEmptyReductions) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = make<float>(DType::F32, {2, 2}, {1, nan, nan, 2});
  F m = eval(OpKind::ReduceMax, x, {2}, axes({1}, 0)).values<float>();
  EXPECT_TRUE(std::isnan(m[0]) && std::isnan(m[1]));

  Host e = make<float>(DType::F32, {0, 3}, {});
  EXPECT_EQ(eval(OpKind::ReduceSum, e, {1, 3}, axes({0})).values<float>(),
            (F{0, 0, 0}));
  F mx = eval(OpKind::ReduceMax, e, {1, 3}, axes({0})).values<float>();
  for (float v : mx)
    EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
  F mean = eval(OpKind::ReduceMean, e, {3}, axes({0}, 0)).values<float>();
  EXPECT_TRUE(std::isnan(mean[0]));
  // Reducing a kept empty dim gives an empty output.
  EXPECT_EQ(eval(OpKind::ReduceSum, e, {0, 1}, axes({1})).numElements(), 0);
}

TEST(CpuReduction, SumAccumulatesF32InDouble) {
  F v(1002, 1.0f);
  v[0] = 1e8f;
  v[1001] = -1e8f;
  Host x = make(DType::F32, {1002}, v);
  EXPECT_EQ(eval(OpKind::ReduceSum, x, {1}).values<float>(), F{1000});
  // f16 inputs too (as f32 in f64).
  std::vector<uint16_t> h = {ir::floatToHalf(0.5f), ir::floatToHalf(1.25f),
                             ir::floatToHalf(-3.0f)};
  Host xh = make(DType::F16, {3}, h);
  EXPECT_EQ(ir::halfToFloat(
                eval(OpKind::ReduceSum, xh, {1}).values<uint16_t>()[0]),
            -1.25f);
}

// Every kind of axis set on a 4-D shape, and large shapes that run in
// parallel, against a direct loop over the input.
TEST(CpuReduction, MatchesDirectLoop) {
  struct Case {
    std::vector<int64_t> shape;
    std::vector<int64_t> axes;
  };
  const Case cases[] = {
      {{5, 6, 7, 8}, {1}},       {{5, 6, 7, 8}, {0, 2}},
      {{5, 6, 7, 8}, {1, 3}},    {{5, 6, 7, 8}, {0, 3}},
      {{5, 6, 7, 8}, {0, 1, 2}}, {{5, 6, 7, 8}, {3}},
      {{257, 300}, {0}},         {{300, 257}, {1}},
      {{3, 70000}, {1}},         {{70000, 3}, {0}},
      {{200001}, {0}},           {{2, 3000, 17}, {0, 2}},
  };
  for (const Case &c : cases) {
    int64_t n = 1, r = c.shape.size();
    for (int64_t d : c.shape)
      n *= d;
    F v(n);
    for (int64_t i = 0; i < n; ++i)
      v[i] = float((i * 7919) % 1009) / 64.0f - 7.0f;
    Host x = make(DType::F32, c.shape, v);
    std::vector<bool> red(r, false);
    for (int64_t a : c.axes)
      red[a] = true;
    std::vector<int64_t> outShape;
    for (int64_t d = 0; d < r; ++d)
      outShape.push_back(red[d] ? 1 : c.shape[d]);
    int64_t outN = 1;
    for (int64_t d : outShape)
      outN *= d;
    std::vector<double> sum(outN, 0.0);
    std::vector<float> mx(outN, -INFINITY);
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, o = 0, scale = 1;
      for (int64_t d = r - 1; d >= 0; --d) {
        int64_t k = rem % c.shape[d];
        rem /= c.shape[d];
        if (!red[d])
          o += k * scale;
        scale *= outShape[d];
      }
      sum[o] += v[i];
      mx[o] = std::max(mx[o], v[i]);
    }
    F gotSum = eval(OpKind::ReduceSum, x, outShape, axes(c.axes))
                   .values<float>();
    F gotMean = eval(OpKind::ReduceMean, x, outShape, axes(c.axes))
                    .values<float>();
    F gotMax = eval(OpKind::ReduceMax, x, outShape, axes(c.axes))
                   .values<float>();
    double count = double(n) / double(outN);
    for (int64_t o = 0; o < outN; ++o) {
      ASSERT_NEAR(gotSum[o], sum[o], 1e-3 + std::abs(sum[o]) * 1e-6)
          << "shape " << r << "-D, output " << o;
      ASSERT_NEAR(gotMean[o], sum[o] / count, 1e-5);
      ASSERT_EQ(gotMax[o], mx[o]);
    }
  }
}

// ArgMax / ArgMin: i64 indices along one axis; ties go to the first index
// (the last with select_last_index); NaN wins, as in PyTorch.
TEST(CpuReduction, ArgMaxArgMin) {
  auto arg = [](OpKind op, const Host &x, std::vector<int64_t> outShape,
                ir::AttrMap attrs) {
    Host out = empty(DType::I64, std::move(outShape));
    TensorRef i = x.ref(), o = out.ref();
    llvm::Error e = backend().run(runtime::KernelCall{op, attrs, i, o});
    EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
    return out.values<int64_t>();
  };
  using I = std::vector<int64_t>;
  float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = make(DType::F32, {2, 4}, F{1, 5, 5, -2, 3, nan, 7, nan});
  ir::AttrMap last{{"axis", int64_t(1)}, {"keepdims", int64_t(0)}};
  EXPECT_EQ(arg(OpKind::ArgMax, x, {2}, last), (I{1, 1}));
  EXPECT_EQ(arg(OpKind::ArgMin, x, {2}, last), (I{3, 1}));
  last.insert_or_assign("select_last_index", int64_t(1));
  EXPECT_EQ(arg(OpKind::ArgMax, x, {2}, last), (I{2, 1}));
  ir::AttrMap first{{"axis", int64_t(0)}};
  EXPECT_EQ(arg(OpKind::ArgMax, x, {1, 4}, first), (I{1, 1, 1, 1}));
  EXPECT_EQ(arg(OpKind::ArgMin, x, {1, 4}, first), (I{0, 1, 0, 1}));
  Host ints = make(DType::I32, {3}, std::vector<int32_t>{4, -9, 4});
  EXPECT_EQ(arg(OpKind::ArgMin, ints, {1}, {}), (I{1}));
}

// TopKIndices: the indices of the k largest (smallest) along one axis, in
// order; the lower index first among equal values; NaN ranks above every
// number (first when largest, last when smallest), as PyTorch's topk.
TEST(CpuReduction, TopKIndices) {
  auto topk = [](const Host &x, std::vector<int64_t> outShape,
                 ir::AttrMap attrs) {
    Host out = empty(DType::I64, std::move(outShape));
    TensorRef i = x.ref(), o = out.ref();
    llvm::Error e = backend().run(
        runtime::KernelCall{OpKind::TopKIndices, attrs, i, o});
    EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
    return out.values<int64_t>();
  };
  using I = std::vector<int64_t>;
  float nan = std::numeric_limits<float>::quiet_NaN();
  Host x = make(DType::F32, {2, 5}, F{1, 5, 5, -2, 3, nan, 7, 0, 7, -1});
  EXPECT_EQ(topk(x, {2, 3}, {{"axis", int64_t(-1)}, {"k", int64_t(3)}}),
            (I{1, 2, 4, 0, 1, 3}));
  EXPECT_EQ(topk(x, {2, 2},
                 {{"axis", int64_t(1)}, {"k", int64_t(2)},
                  {"largest", int64_t(0)}}),
            (I{3, 0, 4, 2}));
  // Along the first axis of [2, 5]: each column's larger row first.
  EXPECT_EQ(topk(x, {1, 5}, {{"axis", int64_t(0)}, {"k", int64_t(1)}}),
            (I{1, 1, 0, 1, 0}));
  Host ints = make(DType::I64, {4}, std::vector<int64_t>{3, 9, 3, -4});
  EXPECT_EQ(topk(ints, {4}, {{"axis", int64_t(0)}, {"k", int64_t(4)}}),
            (I{1, 0, 2, 3}));
}

} // namespace unit_cpu_reduction
