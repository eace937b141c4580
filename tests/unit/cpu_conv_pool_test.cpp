// CPU Conv, MaxPool, AveragePool and GlobalAveragePool kernels: small
// hand-computed cases, and random cases against direct N-d window loops in
// double (groups, strides, dilations, asymmetric pads, ceil_mode). Output
// shapes come from the IR's own type rules.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"
#include "runtime/cpu/ConvGeometry.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

namespace unit_cpu_conv_pool {

using namespace cleave;
using runtime::TensorRef;
using namespace cleave::testsupport::typed;

namespace {

// Result shape `i` of an op, by the IR's type rule.
Ints resultShape(ir::OpKind op, const std::vector<Ints> &inputs,
                 const ir::AttrMap &attrs, unsigned results = 1,
                 unsigned i = 0) {
  std::vector<ir::TensorType> types;
  for (const Ints &s : inputs)
    types.emplace_back(ir::DType::F32, ir::Shape(s.begin(), s.end()));
  auto out = ir::inferResultTypes(op, types, attrs, results);
  if (!out) {
    ADD_FAILURE() << llvm::toString(out.takeError());
    return {};
  }
  return Ints((*out)[i].shape.begin(), (*out)[i].shape.end());
}

// Splits a flat index over `shape` into coordinates.
Ints coords(int64_t flat, const Ints &shape) {
  Ints c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}

int64_t flatIndex(const Ints &c, const Ints &shape) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    f = f * shape[d] + c[d];
  return f;
}

ir::AttrMap convAttrs(Ints strides, Ints pads, Ints dilations,
                      int64_t group = 1) {
  return {{"strides", strides},
          {"pads", pads},
          {"dilations", dilations},
          {"group", group}};
}

// Direct convolution in double: every output sums its window.
template <typename T>
std::vector<double> referenceConv(const Host<T> &x, const Host<T> &w,
                                  const Host<T> *bias, const Ints &yShape,
                                  const ir::AttrMap &attrs) {
  size_t sp = x.shape.size() - 2;
  const Ints &st = attrs.at("strides").getInts(),
             &pd = attrs.at("pads").getInts(),
             &dl = attrs.at("dilations").getInts();
  int64_t group = attrs.at("group").getInt();
  int64_t m = w.shape[0], cg = w.shape[1], mg = m / group;
  Ints inSp(x.shape.begin() + 2, x.shape.end()),
      kSp(w.shape.begin() + 2, w.shape.end()),
      outSp(yShape.begin() + 2, yShape.end());
  std::vector<double> y(numElements(yShape));
  for (int64_t n = 0; n < yShape[0]; ++n)
    for (int64_t oc = 0; oc < m; ++oc)
      for (int64_t o = 0; o < numElements(outSp); ++o) {
        Ints outC = coords(o, outSp);
        double acc = bias ? bias->data[oc] : 0.0;
        for (int64_t ic = 0; ic < cg; ++ic)
          for (int64_t t = 0; t < numElements(kSp); ++t) {
            Ints kc = coords(t, kSp), inC(sp);
            bool inside = true;
            for (size_t d = 0; d < sp; ++d) {
              inC[d] = outC[d] * st[d] - pd[d] + kc[d] * dl[d];
              inside = inside && inC[d] >= 0 && inC[d] < inSp[d];
            }
            if (!inside)
              continue;
            int64_t chan = (oc / mg) * cg + ic;
            acc += double(x.data[(n * x.shape[1] + chan) * numElements(inSp) +
                                 flatIndex(inC, inSp)]) *
                   double(w.data[(oc * cg + ic) * numElements(kSp) + t]);
          }
        y[(n * m + oc) * numElements(outSp) + o] = acc;
      }
  return y;
}

template <typename T>
void checkConv(Ints xs, Ints ws, bool bias, const ir::AttrMap &attrs,
               unsigned seed) {
  SCOPED_TRACE("X " + ir::shapeStr(xs) + " W " + ir::shapeStr(ws));
  Host<T> x = randomHost<T>(xs, seed), w = randomHost<T>(ws, seed + 1);
  Host<T> b = randomHost<T>({ws[0]}, seed + 2);
  std::vector<Ints> inShapes{xs, ws};
  std::vector<TensorRef> ins{x.ref(), w.ref()};
  if (bias) {
    inShapes.push_back(b.shape);
    ins.push_back(b.ref());
  }
  Host<T> y(resultShape(ir::OpKind::Conv, inShapes, attrs));
  ASSERT_FALSE(bool(run(ir::OpKind::Conv, attrs, ins, {y.ref()})));
  double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  expectClose(y.data, referenceConv(x, w, bias ? &b : nullptr, y.shape, attrs),
              tol);
}

ir::AttrMap poolAttrs(Ints kernel, Ints strides, Ints pads, int64_t ceil,
                      Ints dilations = {}) {
  ir::AttrMap a{{"kernel_shape", kernel},
                {"strides", strides},
                {"pads", pads},
                {"ceil_mode", ceil}};
  if (!dilations.empty())
    a.emplace("dilations", dilations);
  return a;
}

struct PoolReference {
  std::vector<double> values;
  Ints indices;
};

// Direct pooling in double. Average: the divisor counts the taps inside the
// input, or with count_include_pad those inside the padded input.
template <typename T>
PoolReference referencePool(bool isMax, const Host<T> &x, const Ints &yShape,
                            const ir::AttrMap &attrs, bool includePad) {
  size_t sp = x.shape.size() - 2;
  const Ints &ks = attrs.at("kernel_shape").getInts(),
             &st = attrs.at("strides").getInts(),
             &pd = attrs.at("pads").getInts();
  Ints dl =
      attrs.count("dilations") ? attrs.at("dilations").getInts() : Ints(sp, 1);
  Ints inSp(x.shape.begin() + 2, x.shape.end()),
      outSp(yShape.begin() + 2, yShape.end());
  int64_t planes = yShape[0] * yShape[1];
  PoolReference r;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t o = 0; o < numElements(outSp); ++o) {
      Ints oc = coords(o, outSp);
      double best = -std::numeric_limits<double>::infinity(), sum = 0;
      int64_t at = -1, inside = 0, padded = 0;
      for (int64_t t = 0; t < numElements(ks); ++t) {
        Ints kc = coords(t, ks), ic(sp);
        bool in = true, inPad = true;
        for (size_t d = 0; d < sp; ++d) {
          ic[d] = oc[d] * st[d] - pd[d] + kc[d] * dl[d];
          in = in && ic[d] >= 0 && ic[d] < inSp[d];
          inPad = inPad && ic[d] >= -pd[d] && ic[d] < inSp[d] + pd[sp + d];
        }
        padded += inPad;
        if (!in)
          continue;
        int64_t flat = p * numElements(inSp) + flatIndex(ic, inSp);
        double v = x.data[flat];
        ++inside;
        sum += v;
        if (at < 0 || v > best || std::isnan(v)) { // PyTorch's rule
          best = v;
          at = flat;
        }
      }
      if (isMax) {
        r.values.push_back(best);
        r.indices.push_back(at);
      } else {
        r.values.push_back(sum / double(includePad ? padded : inside));
      }
    }
  return r;
}

} // namespace

// --- Conv ----------------------------------------------------------------

// insideRange (the taps of a window, the columns an im2col row reads) is
// the brute-force count of i in [0, count) with 0 <= start + i * step <
// limit, for unit steps (their branch has no division) and others.
TEST(CpuConvGeometry, InsideRangeMatchesBruteForce) {
  for (int64_t step = 1; step <= 3; ++step)
    for (int64_t start = -7; start <= 9; ++start)
      for (int64_t count = 0; count <= 5; ++count)
        for (int64_t limit = 0; limit <= 6; ++limit) {
          int64_t lo = count, hi = 0;
          for (int64_t i = 0; i < count; ++i)
            if (start + i * step >= 0 && start + i * step < limit) {
              lo = std::min(lo, i);
              hi = i + 1;
            }
          auto [gotLo, gotHi] =
              runtime::cpu::insideRange(start, step, count, limit);
          if (hi == 0) { // empty: any lo == hi will do
            EXPECT_EQ(gotLo, gotHi) << start << " " << step << " " << count;
            continue;
          }
          EXPECT_EQ(gotLo, lo) << start << " " << step << " " << count << " " << limit;
          EXPECT_EQ(gotHi, hi) << start << " " << step << " " << count << " " << limit;
        }
}

TEST(CpuConv, HandComputed) {
  // 3x3 input 1..9, 2x2 kernel of ones: sums of each 2x2 block, plus bias.
  Host<float> x({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Host<float> w({1, 1, 2, 2}, {1, 1, 1, 1}), b({1}, {0.5f}), y({1, 1, 2, 2});
  ASSERT_FALSE(
      bool(run(ir::OpKind::Conv, convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}),
               {x.ref(), w.ref(), b.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f}));
}

TEST(CpuConv, GroupsStridesDilationsPadsMatchReference) {
  auto attrs = convAttrs({2, 1}, {1, 0, 2, 1}, {2, 1}, 2);
  checkConv<float>({2, 4, 9, 8}, {6, 2, 3, 2}, true, attrs, 1);
  checkConv<double>({2, 4, 9, 8}, {6, 2, 3, 2}, false, attrs, 2);
  checkConv<float>({3, 6, 7, 7}, {6, 1, 3, 3}, true,
                   convAttrs({1, 1}, {1, 1, 1, 1}, {1, 1}, 6), 3); // depthwise
  checkConv<double>({2, 3, 8, 7}, {3, 1, 3, 2}, true,
                    convAttrs({1, 1}, {2, 0, 1, 1}, {2, 1}, 3), 6);
  checkConv<float>({2, 4, 9, 8}, {4, 1, 5, 5}, true,
                   convAttrs({2, 2}, {2, 2, 2, 2}, {1, 1}, 4), 7);
}

TEST(CpuConv, PointwiseFastPath) {
  checkConv<float>({2, 8, 5, 6}, {4, 4, 1, 1}, true,
                   convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}, 2), 4);
  // Strided 1x1 still goes through im2col.
  checkConv<double>({2, 8, 5, 6}, {4, 8, 1, 1}, false,
                    convAttrs({2, 2}, {0, 0, 0, 0}, {1, 1}), 5);
}

TEST(CpuConv, OneAndThreeSpatialDims) {
  checkConv<float>({2, 3, 11}, {4, 3, 3}, true, convAttrs({2}, {1, 2}, {2}), 6);
  checkConv<float>({1, 2, 5, 6, 4}, {3, 2, 2, 3, 2}, true,
                   convAttrs({1, 2, 1}, {1, 0, 1, 0, 1, 1}, {2, 1, 1}), 7);
}

TEST(CpuConv, LargeConvUsesThreadedGemm) {
  // 32 x 400 x 144 multiply-adds per image: one task per image.
  checkConv<float>({2, 16, 20, 20}, {32, 16, 3, 3}, true,
                   convAttrs({1, 1}, {1, 1, 1, 1}, {1, 1}), 8);
}

TEST(CpuConv, ShiftedTapsMatchReference) {
  // 2-D, stride 1, at least 8 channels per group: one GEMM per kernel tap
  // over a zero-padded copy of the input.
  checkConv<float>({3, 8, 12, 10}, {5, 8, 3, 3}, true,
                   convAttrs({1, 1}, {1, 1, 1, 1}, {1, 1}), 9);
  // A 2x3 kernel, asymmetric pads, dilations, groups, no bias.
  checkConv<double>({2, 16, 9, 11}, {6, 8, 2, 3}, false,
                    convAttrs({1, 1}, {0, 2, 1, 1}, {2, 2}, 2), 10);
  // Enough work per image for two blocks of output rows (19 and 18).
  checkConv<float>({1, 8, 37, 30}, {32, 8, 3, 3}, true,
                   convAttrs({1, 1}, {1, 1, 1, 1}, {1, 1}), 11);
}

TEST(CpuConv, Im2colInBlocksOfOutputRows) {
  // Two blocks of output rows per image (23 and 22), strided.
  checkConv<float>({2, 6, 90, 80}, {32, 6, 3, 3}, true,
                   convAttrs({2, 2}, {1, 1, 1, 1}, {1, 1}), 12);
  // 3-D: two blocks of 35 (depth, row) positions, the second starting in
  // the middle of a depth plane.
  checkConv<float>({1, 4, 5, 14, 20}, {16, 4, 3, 3, 3}, false,
                   convAttrs({1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1}), 13);
}

TEST(CpuConv, IntegerInputIsRefused) {
  Host<int64_t> x({1, 1, 3, 3}), w({1, 1, 1, 1}), y({1, 1, 3, 3});
  llvm::Error e = run(ir::OpKind::Conv, convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}),
                      {x.ref(), w.ref()}, {y.ref()});
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("Conv"), std::string::npos);
}

// --- MaxPool -------------------------------------------------------------

TEST(CpuMaxPool, HandComputedWithFlatIndices) {
  // Two planes (N=1, C=2); indices are flattened over N, C, H, W.
  Host<float> x({1, 2, 2, 4}, {1, 5, 2, 0, 3, 4, 8, 7, //
                               9, 1, 1, 1, 1, 1, 1, 6});
  Host<float> y({1, 2, 1, 2});
  Host<int64_t> idx({1, 2, 1, 2});
  ASSERT_FALSE(bool(run(ir::OpKind::MaxPool,
                        poolAttrs({2, 2}, {2, 2}, {0, 0, 0, 0}, 0, {1, 1}),
                        {x.ref()}, {y.ref(), idx.ref()})));
  EXPECT_EQ(y.data, (std::vector<float>{5, 8, 9, 6}));
  EXPECT_EQ(idx.data, (Ints{1, 6, 8, 15}));
}

// PyTorch's max pooling lets a NaN take the window from any value (the
// last NaN of the window wins), so a NaN in the input reaches the output
// (and the loss) instead of vanishing behind a larger neighbour; ties go
// to the first maximum. 2-D (its own loop) and 1-D (the general one).
TEST(CpuMaxPool, NaNPropagatesAsInPyTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Host<float> x({1, 1, 2, 4}, {1, nan, 2, 7, //
                               9, 3, nan, nan});
  Host<float> y({1, 1, 1, 2});
  Host<int64_t> idx({1, 1, 1, 2});
  ASSERT_FALSE(bool(run(ir::OpKind::MaxPool,
                        poolAttrs({2, 2}, {2, 2}, {0, 0, 0, 0}, 0, {1, 1}),
                        {x.ref()}, {y.ref(), idx.ref()})));
  EXPECT_TRUE(std::isnan(y.data[0]) && std::isnan(y.data[1]));
  EXPECT_EQ(idx.data, (Ints{1, 7}));
  Host<float> line({1, 1, 6}, {4, nan, 1, 5, 5, 2});
  Host<float> y1({1, 1, 2});
  Host<int64_t> idx1({1, 1, 2});
  ASSERT_FALSE(bool(run(ir::OpKind::MaxPool, poolAttrs({3}, {3}, {0, 0}, 0, {1}),
                        {line.ref()}, {y1.ref(), idx1.ref()})));
  EXPECT_TRUE(std::isnan(y1.data[0]));
  EXPECT_EQ(y1.data[1], 5.0f);
  EXPECT_EQ(idx1.data, (Ints{1, 3}));
}

TEST(CpuMaxPool, PadsDilationsCeilModeMatchReference) {
  struct Case {
    Ints x;
    ir::AttrMap attrs;
  };
  std::vector<Case> cases = {
      {{2, 3, 7, 8}, poolAttrs({3, 3}, {2, 2}, {1, 1, 1, 1}, 0, {1, 1})},
      {{2, 3, 7, 8}, poolAttrs({3, 2}, {2, 3}, {1, 0, 0, 1}, 1, {1, 1})},
      {{1, 2, 9, 9}, poolAttrs({2, 3}, {1, 2}, {0, 1, 1, 1}, 1, {2, 2})},
      {{2, 2, 10}, poolAttrs({3}, {2}, {1, 1}, 1, {1})},
      {{1, 2, 4, 5, 6},
       poolAttrs({2, 2, 3}, {2, 1, 2}, {0, 1, 1, 1, 0, 1}, 0, {1, 2, 1})},
  };
  unsigned seed = 30;
  for (Case &c : cases) {
    SCOPED_TRACE("X " + ir::shapeStr(c.x));
    Host<float> x = randomHost<float>(c.x, seed++);
    Host<float> y(resultShape(ir::OpKind::MaxPool, {c.x}, c.attrs, 2));
    Host<int64_t> idx(y.shape);
    ASSERT_FALSE(bool(
        run(ir::OpKind::MaxPool, c.attrs, {x.ref()}, {y.ref(), idx.ref()})));
    PoolReference r = referencePool(true, x, y.shape, c.attrs, false);
    expectClose(y.data, r.values, 0);
    EXPECT_EQ(idx.data, r.indices);
    // Without the Indices output the values are the same.
    Host<float> y1(y.shape);
    ASSERT_FALSE(
        bool(run(ir::OpKind::MaxPool, c.attrs, {x.ref()}, {y1.ref()})));
    EXPECT_EQ(y1.data, y.data);
  }
}

// --- AveragePool ---------------------------------------------------------

TEST(CpuAveragePool, CountIncludePad) {
  Host<double> x({1, 1, 3, 3}, std::vector<double>(9, 1.0)), y({1, 1, 3, 3});
  ir::AttrMap attrs = poolAttrs({3, 3}, {1, 1}, {1, 1, 1, 1}, 0);
  ASSERT_FALSE(bool(run(ir::OpKind::AveragePool, attrs, {x.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, std::vector<double>(9, 1.0));
  attrs.insert_or_assign("count_include_pad", int64_t(1));
  ASSERT_FALSE(bool(run(ir::OpKind::AveragePool, attrs, {x.ref()}, {y.ref()})));
  expectClose(
      y.data,
      {4 / 9., 6 / 9., 4 / 9., 6 / 9., 1, 6 / 9., 4 / 9., 6 / 9., 4 / 9.},
      1e-15);
}

TEST(CpuAveragePool, CeilModeWindowPastTheEndCountsOnlyPaddedInput) {
  // in 5, kernel 2, stride 2, ceil: the third window is [4, 6) and only
  // position 4 exists; count_include_pad does not count position 5.
  Host<float> x({1, 1, 5}, {1, 2, 3, 4, 10}), y({1, 1, 3});
  for (int64_t include : {0, 1}) {
    ir::AttrMap attrs = poolAttrs({2}, {2}, {0, 0}, 1);
    attrs.insert_or_assign("count_include_pad", include);
    ASSERT_FALSE(
        bool(run(ir::OpKind::AveragePool, attrs, {x.ref()}, {y.ref()})));
    EXPECT_EQ(y.data, (std::vector<float>{1.5f, 3.5f, 10.0f}));
  }
}

TEST(CpuAveragePool, CeilModeWindowLongerThanTheInputAveragesTheInput) {
  // EfficientNet's pooler, AvgPool2d(k, ceil_mode=True) over a map smaller
  // than k: one window, divided by the cells inside the (padded) input.
  Host<float> x({1, 2, 2, 2}, {1, 2, 3, 4, -1, 0, 2, 7}), y({1, 2, 1, 1});
  for (int64_t include : {0, 1}) {
    ir::AttrMap attrs = poolAttrs({5, 5}, {5, 5}, {0, 0, 0, 0}, 1);
    attrs.insert_or_assign("count_include_pad", include);
    ASSERT_FALSE(
        bool(run(ir::OpKind::AveragePool, attrs, {x.ref()}, {y.ref()})));
    EXPECT_EQ(y.data, (std::vector<float>{2.5f, 2.0f}));
  }
}

TEST(CpuAveragePool, MatchesReference) {
  struct Case {
    Ints x;
    ir::AttrMap attrs;
  };
  std::vector<Case> cases = {
      {{2, 3, 7, 8}, poolAttrs({3, 3}, {2, 2}, {1, 1, 1, 1}, 0)},
      {{2, 3, 7, 8}, poolAttrs({3, 2}, {2, 3}, {1, 0, 2, 1}, 1)},
      {{2, 2, 10}, poolAttrs({4}, {3}, {2, 1}, 1)},
      {{1, 2, 4, 5, 6}, poolAttrs({2, 2, 3}, {2, 1, 2}, {0, 1, 1, 1, 0, 1}, 1)},
  };
  unsigned seed = 40;
  for (Case &c : cases)
    for (int64_t include : {0, 1}) {
      SCOPED_TRACE("X " + ir::shapeStr(c.x) + " count_include_pad " +
                   std::to_string(include));
      c.attrs.insert_or_assign("count_include_pad", include);
      Host<float> x = randomHost<float>(c.x, seed++);
      Host<float> y(resultShape(ir::OpKind::AveragePool, {c.x}, c.attrs));
      ASSERT_FALSE(
          bool(run(ir::OpKind::AveragePool, c.attrs, {x.ref()}, {y.ref()})));
      expectClose(y.data,
                  referencePool(false, x, y.shape, c.attrs, include).values,
                  1e-6);
    }
}

// --- GlobalAveragePool ---------------------------------------------------

TEST(CpuGlobalAveragePool, MeanOfEachPlane) {
  Host<float> x({2, 2, 2, 2},
                {1, 2, 3, 4, 0, 0, 0, 8, -1, -1, -1, -1, 5, 6, 7, 8});
  Host<float> y({2, 2, 1, 1});
  ASSERT_FALSE(
      bool(run(ir::OpKind::GlobalAveragePool, {}, {x.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<float>{2.5f, 2.0f, -1.0f, 6.5f}));
  Host<double> xd({1, 3, 2, 3, 1}), yd({1, 3, 1, 1, 1});
  for (size_t i = 0; i < xd.data.size(); ++i)
    xd.data[i] = double(i);
  ASSERT_FALSE(
      bool(run(ir::OpKind::GlobalAveragePool, {}, {xd.ref()}, {yd.ref()})));
  EXPECT_EQ(yd.data, (std::vector<double>{2.5, 8.5, 14.5}));
}

} // namespace unit_cpu_conv_pool
