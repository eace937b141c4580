// CPU Softmax, LogSoftmax, LayerNormalization, RMSNormalization,
// BatchNormalization, SoftmaxCrossEntropyLoss and Dropout kernels against
// hand-computed values and double references written out in the test,
// including the ONNX corner cases: training-mode statistics, ignore_index,
// weighted means, and the identity forms of Dropout.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace unit_cpu_normalization {

using namespace cleave;
using runtime::TensorRef;
using namespace cleave::testsupport::typed;

namespace {

using Mask = Host<uint8_t>; // bool tensors, one byte per element

// Softmax or LogSoftmax along `axis` in double.
template <typename T>
std::vector<double> referenceSoftmax(const Host<T> &x, int64_t axis, bool log) {
  int64_t outer =
      numElements(llvm::ArrayRef<int64_t>(x.shape).take_front(axis));
  int64_t len = x.shape[axis];
  int64_t inner =
      numElements(llvm::ArrayRef<int64_t>(x.shape).drop_front(axis + 1));
  std::vector<double> y(x.data.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return (o * len + j) * inner + i; };
      double max = -INFINITY, sum = 0;
      for (int64_t j = 0; j < len; ++j)
        max = std::max(max, double(x.data[at(j)]));
      for (int64_t j = 0; j < len; ++j)
        sum += std::exp(x.data[at(j)] - max);
      for (int64_t j = 0; j < len; ++j)
        y[at(j)] = log ? x.data[at(j)] - max - std::log(sum)
                       : std::exp(x.data[at(j)] - max) / sum;
    }
  return y;
}

} // namespace

// --- Softmax, LogSoftmax -------------------------------------------------

TEST(CpuSoftmax, HandComputedAndStableForLargeInputs) {
  Host<float> x({2, 3}, {1, 2, 3, 1000, 1001, 1002}), y({2, 3});
  ASSERT_FALSE(bool(run(ir::OpKind::Softmax, {}, {x.ref()}, {y.ref()})));
  double e = std::exp(1.0), s = 1 + e + e * e;
  expectClose(y.data, {1 / s, e / s, e * e / s, 1 / s, e / s, e * e / s}, 1e-6);
  ASSERT_FALSE(bool(run(ir::OpKind::LogSoftmax, {}, {x.ref()}, {y.ref()})));
  double ls = std::log(s);
  expectClose(y.data, {-ls, 1 - ls, 2 - ls, -ls, 1 - ls, 2 - ls}, 1e-6);
}

TEST(CpuSoftmax, EveryAxisMatchesReference) {
  Ints shape{3, 4, 5};
  for (int64_t axis : {0, 1, 2, -1})
    for (bool log : {false, true}) {
      SCOPED_TRACE("axis " + std::to_string(axis) + (log ? " log" : ""));
      ir::AttrMap attrs{{"axis", axis}};
      auto op = log ? ir::OpKind::LogSoftmax : ir::OpKind::Softmax;
      Host<float> x = randomHost<float>(shape, 1, -5, 5), y(shape);
      ASSERT_FALSE(bool(run(op, attrs, {x.ref()}, {y.ref()})));
      expectClose(y.data, referenceSoftmax(x, axis < 0 ? axis + 3 : axis, log),
                  1e-6);
      Host<double> xd = randomHost<double>(shape, 2, -5, 5), yd(shape);
      ASSERT_FALSE(bool(run(op, attrs, {xd.ref()}, {yd.ref()})));
      expectClose(yd.data,
                  referenceSoftmax(xd, axis < 0 ? axis + 3 : axis, log), 1e-14);
    }
}

// --- LayerNormalization --------------------------------------------------

template <typename T>
void checkLayerNorm(int64_t axis, Ints scaleShape, bool withBias) {
  SCOPED_TRACE("axis " + std::to_string(axis));
  Ints shape{2, 3, 4};
  size_t a = axis < 0 ? axis + 3 : axis;
  Ints norm(shape.begin() + a, shape.end()),
      stat(shape.begin(), shape.begin() + a);
  stat.resize(3, 1);
  Host<T> x = randomHost<T>(shape, 3, -2, 3),
          scale = randomHost<T>(scaleShape, 4),
          bias = randomHost<T>(scaleShape, 5), y(shape);
  Host<float> mean(stat), inv(stat);
  std::vector<TensorRef> ins{x.ref(), scale.ref()};
  if (withBias)
    ins.push_back(bias.ref());
  ir::AttrMap attrs{{"axis", axis}, {"epsilon", 1e-3f}};
  ASSERT_FALSE(bool(run(ir::OpKind::LayerNormalization, attrs, ins,
                        {y.ref(), mean.ref(), inv.ref()})));
  int64_t rows = numElements(stat), size = numElements(norm);
  std::vector<double> want(x.data.size()), wantMean, wantInv;
  for (int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < size; ++i)
      mu += x.data[r * size + i] / double(size);
    for (int64_t i = 0; i < size; ++i)
      var += std::pow(x.data[r * size + i] - mu, 2) / double(size);
    // Float64 data: the decimal epsilon was written as.
    double is = 1 / std::sqrt(
        var + (std::is_same_v<T, double> ? 1e-3 : double(1e-3f)));
    for (int64_t i = 0; i < size; ++i) {
      // Scale and bias broadcast over the trailing dims of the norm shape.
      int64_t si = i % numElements(scaleShape);
      want[r * size + i] = (x.data[r * size + i] - mu) * is * scale.data[si] +
                           (withBias ? double(bias.data[si]) : 0.0);
    }
    wantMean.push_back(mu);
    wantInv.push_back(is);
  }
  double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  expectClose(y.data, want, tol);
  expectClose(mean.data, wantMean, 1e-6);
  expectClose(inv.data, wantInv, 1e-6);
}

TEST(CpuLayerNorm, MatchesReferenceWithStatistics) {
  checkLayerNorm<float>(-1, {4}, true);
  checkLayerNorm<float>(1, {3, 4}, true);
  checkLayerNorm<double>(1, {4}, false); // scale broadcast over axis 1
  checkLayerNorm<double>(0, {3, 4}, true);
}

TEST(CpuLayerNorm, OnlyYRequested) {
  Host<float> x({1, 4}, {1, 2, 3, 4}), s({4}, {1, 1, 1, 1}), y({1, 4});
  ASSERT_FALSE(bool(run(ir::OpKind::LayerNormalization, {{"epsilon", 0.0f}},
                        {x.ref(), s.ref()}, {y.ref()})));
  double is = 1 / std::sqrt(1.25);
  expectClose(y.data, {-1.5 * is, -0.5 * is, 0.5 * is, 1.5 * is}, 1e-6);
}

// --- RMSNormalization ----------------------------------------------------

template <typename T> void checkRMSNorm(int64_t axis, Ints scaleShape) {
  SCOPED_TRACE("axis " + std::to_string(axis));
  Ints shape{2, 3, 4};
  size_t a = axis < 0 ? axis + 3 : axis;
  Ints norm(shape.begin() + a, shape.end());
  Host<T> x = randomHost<T>(shape, 6, -2, 3),
          scale = randomHost<T>(scaleShape, 7), y(shape);
  ir::AttrMap attrs{{"axis", axis}, {"epsilon", 1e-3f}};
  ASSERT_FALSE(bool(run(ir::OpKind::RMSNormalization, attrs,
                        {x.ref(), scale.ref()}, {y.ref()})));
  int64_t size = numElements(norm), rows = int64_t(x.data.size()) / size;
  std::vector<double> want(x.data.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < size; ++i)
      ms += std::pow(double(x.data[r * size + i]), 2) / double(size);
    double is = 1 / std::sqrt(
        ms + (std::is_same_v<T, double> ? 1e-3 : double(1e-3f)));
    for (int64_t i = 0; i < size; ++i) {
      int64_t si = i % numElements(scaleShape); // trailing broadcast
      want[r * size + i] = x.data[r * size + i] * is * scale.data[si];
    }
  }
  expectClose(y.data, want, std::is_same_v<T, float> ? 1e-5 : 1e-12);
}

TEST(CpuRMSNorm, MatchesReference) {
  checkRMSNorm<float>(-1, {4});
  checkRMSNorm<float>(1, {3, 4});
  checkRMSNorm<double>(1, {4}); // scale broadcast over axis 1
  checkRMSNorm<double>(0, {2, 3, 4});
}

TEST(CpuRMSNorm, HandComputed) {
  // Row [1, 2, 3, 4]: mean of squares 7.5; row [0, 0, 0, 0] stays 0.
  Host<float> x({2, 4}, {1, 2, 3, 4, 0, 0, 0, 0}), s({4}, {1, 2, 1, 0.5f}),
      y({2, 4});
  ASSERT_FALSE(bool(run(ir::OpKind::RMSNormalization, {{"epsilon", 0.0f}},
                        {x.ref(), s.ref()}, {y.ref()})));
  double is = 1 / std::sqrt(7.5);
  EXPECT_NEAR(y.data[0], 1 * is, 1e-6);
  EXPECT_NEAR(y.data[1], 4 * is, 1e-6);
  EXPECT_NEAR(y.data[2], 3 * is, 1e-6);
  EXPECT_NEAR(y.data[3], 2 * is, 1e-6);
  ASSERT_FALSE(bool(run(ir::OpKind::RMSNormalization, {{"epsilon", 1.0f}},
                        {x.ref(), s.ref()}, {y.ref()})));
  for (int i = 4; i < 8; ++i)
    EXPECT_EQ(y.data[i], 0.0f);
}

TEST(CpuRMSNorm, SameBitsOnOneAndTwoThreads) {
  Host<double> x = randomHost<double>({64, 300}, 8),
               s = randomHost<double>({300}, 9), y1({64, 300}), y2({64, 300});
  testsupport::cpu(); // created first, so it does not reset the pool below
  ir::AttrMap attrs;
  std::vector<TensorRef> ins{x.ref(), s.ref()}, out1{y1.ref()},
      out2{y2.ref()};
  {
    auto one = runtime::createCpuBackend(1);
    ASSERT_FALSE(bool(
        one->run(runtime::KernelCall{ir::OpKind::RMSNormalization, attrs, ins,
                                     out1})));
  }
  {
    auto two = runtime::createCpuBackend(2);
    ASSERT_FALSE(bool(
        two->run(runtime::KernelCall{ir::OpKind::RMSNormalization, attrs, ins,
                                     out2})));
  }
  EXPECT_EQ(0, std::memcmp(y1.data.data(), y2.data.data(),
                           y1.data.size() * sizeof(double)));
}

// --- BatchNormalization --------------------------------------------------

TEST(CpuBatchNorm, InferenceUsesGivenStatistics) {
  Host<float> x({2, 2, 1, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Host<float> scale({2}, {2, 0.5f}), bias({2}, {1, -1}), mean({2}, {1, 2}),
      var({2}, {4, 0.25f}), y(x.shape);
  ASSERT_FALSE(bool(run(
      ir::OpKind::BatchNormalization, {{"epsilon", 0.0f}},
      {x.ref(), scale.ref(), bias.ref(), mean.ref(), var.ref()}, {y.ref()})));
  // Channel 0: (x - 1) / 2 * 2 + 1; channel 1: (x - 2) / 0.5 * 0.5 - 1.
  expectClose(y.data, {1, 2, 0, 1, 5, 6, 4, 5}, 1e-6);
}

TEST(CpuBatchNorm, TrainingUsesBatchStatisticsAndUpdatesRunningOnes) {
  Ints shape{3, 2, 2, 3};
  Host<double> x = randomHost<double>(shape, 7, -1, 4);
  Host<double> scale({2}, {1.5, -0.5}), bias({2}, {0.25, 2}),
      mean({2}, {0.1, -0.2}), var({2}, {1.2, 0.8}), y(shape), runMean({2}),
      runVar({2});
  ir::AttrMap attrs{
      {"epsilon", 1e-2f}, {"momentum", 0.8f}, {"training_mode", int64_t(1)}};
  ASSERT_FALSE(
      bool(run(ir::OpKind::BatchNormalization, attrs,
               {x.ref(), scale.ref(), bias.ref(), mean.ref(), var.ref()},
               {y.ref(), runMean.ref(), runVar.ref()})));
  std::vector<double> want(x.data.size()), wantMean, wantVar;
  // Float64 data: the decimals the attributes were written as.
  double mom = 0.8, eps = 1e-2;
  for (int64_t c = 0; c < 2; ++c) {
    std::vector<int64_t> at;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t s = 0; s < 6; ++s)
        at.push_back((n * 2 + c) * 6 + s);
    double mu = 0, v = 0;
    for (int64_t i : at)
      mu += x.data[i] / 18;
    for (int64_t i : at)
      v += (x.data[i] - mu) * (x.data[i] - mu) / 18; // population variance
    for (int64_t i : at)
      want[i] =
          (x.data[i] - mu) / std::sqrt(v + eps) * scale.data[c] + bias.data[c];
    wantMean.push_back(mean.data[c] * mom + mu * (1 - mom));
    wantVar.push_back(var.data[c] * mom + v * (1 - mom));
  }
  expectClose(y.data, want, 1e-12);
  expectClose(runMean.data, wantMean, 1e-12);
  expectClose(runVar.data, wantVar, 1e-12);

  // One output: still batch statistics.
  Host<double> y1(shape);
  ASSERT_FALSE(bool(run(
      ir::OpKind::BatchNormalization, attrs,
      {x.ref(), scale.ref(), bias.ref(), mean.ref(), var.ref()}, {y1.ref()})));
  EXPECT_EQ(y1.data, y.data);
}

// ONNX holds epsilon in float32 (1e-5 as 9.99999974737875e-06). Over two
// values a channel (a 1x1 map at batch 2) the output's distance from +-1
// is proportional to epsilon, so its float32 rounding shows at 2.5e-8 and
// training amplifies it (regnet_hf's float64 loss was 2e-2 from PyTorch
// float64's after 3 steps). Float64 data gets the decimal, float32 data the
// float, as PyTorch's kernels of each type use it.
TEST(CpuBatchNorm, EpsilonIsTheWrittenDecimalOnDoubles) {
  EXPECT_EQ(ir::decimalWidened(1e-5f), 1e-5);
  EXPECT_EQ(ir::decimalWidened(0.9f), 0.9);
  EXPECT_EQ(ir::decimalWidened(0.01f), 0.01);
  EXPECT_EQ(ir::decimalWidened(0.0078125f), 0.0078125);
  EXPECT_EQ(ir::decimalWidened(0.0f), 0.0);
  EXPECT_TRUE(std::isinf(ir::decimalWidened(INFINITY)));
  // No short decimal: within half a float ulp of the float.
  float odd = 1.0f / 3.0f;
  EXPECT_EQ(float(ir::decimalWidened(odd)), odd);
  EXPECT_LE(std::abs(ir::decimalWidened(odd) - double(odd)),
            0.5 * (double(std::nextafter(odd, 1.0f)) - double(odd)));

  ir::AttrMap attrs{{"epsilon", 1e-5f}, {"training_mode", int64_t(1)}};
  Host<double> x({2, 1, 1, 1}, {0.3, 0.3 + 2e-3}), scale({1}, {1}),
      bias({1}, {0}), mean({1}, {0}), var({1}, {1}), y({2, 1, 1, 1});
  ASSERT_FALSE(
      bool(run(ir::OpKind::BatchNormalization, attrs,
               {x.ref(), scale.ref(), bias.ref(), mean.ref(), var.ref()},
               {y.ref()})));
  double half = (x.data[1] - x.data[0]) / 2;
  double written = half / std::sqrt(half * half + 1e-5),
         stored = half / std::sqrt(half * half + double(1e-5f));
  EXPECT_GT(std::abs(written - stored), 1e-9); // the case tells them apart
  EXPECT_NEAR(y.data[1], written, 1e-14);
  EXPECT_NEAR(y.data[0], -written, 1e-14);

  Host<float> xf({2, 1, 1, 1}, {0.25f, 0.25f + 0x1p-9f}), scalef({1}, {1}),
      biasf({1}, {0}), meanf({1}, {0}), varf({1}, {1}), yf({2, 1, 1, 1});
  ASSERT_FALSE(
      bool(run(ir::OpKind::BatchNormalization, attrs,
               {xf.ref(), scalef.ref(), biasf.ref(), meanf.ref(), varf.ref()},
               {yf.ref()})));
  double halff = (double(xf.data[1]) - double(xf.data[0])) / 2;
  EXPECT_NEAR(yf.data[1], halff / std::sqrt(halff * halff + double(1e-5f)),
              2e-6);
}

TEST(CpuBatchNorm, ParametersMayBeAnotherFloatType) {
  Host<double> x({1, 1, 2}, {1, 3}), y({1, 1, 2});
  Host<float> scale({1}, {1}), bias({1}, {0}), mean({1}, {2}), var({1}, {1});
  ASSERT_FALSE(bool(run(
      ir::OpKind::BatchNormalization, {{"epsilon", 0.0f}},
      {x.ref(), scale.ref(), bias.ref(), mean.ref(), var.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<double>{-1, 1}));
}

// --- SoftmaxCrossEntropyLoss ---------------------------------------------

namespace {

// Scores [2, 3, 2] (N=2, C=3, one extra dim of 2) and their log-softmax.
Host<float> sceScores() {
  return Host<float>({2, 3, 2}, {1, 0, 2, 0, 3, 0, -1, 2, 0, 1, 1, 0.5f});
}

double logSoftmaxAt(const Host<float> &s, int64_t n, int64_t c, int64_t d) {
  double sum = 0;
  for (int64_t j = 0; j < 3; ++j)
    sum += std::exp(double(s.data[(n * 3 + j) * 2 + d]));
  return s.data[(n * 3 + c) * 2 + d] - std::log(sum);
}

} // namespace

TEST(CpuSoftmaxCrossEntropy, ReductionsWeightsAndLogProb) {
  Host<float> scores = sceScores(), w({3}, {0.5f, 2, 1});
  Host<int64_t> labels({2, 2}, {2, 0, 1, 1});
  std::vector<double> plain, weighted;
  double wsum = 0;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t d = 0; d < 2; ++d) {
      int64_t l = labels.data[n * 2 + d];
      plain.push_back(-logSoftmaxAt(scores, n, l, d));
      weighted.push_back(plain.back() * w.data[l]);
      wsum += w.data[l];
    }
  auto sum = [](const std::vector<double> &v) {
    double s = 0;
    for (double x : v)
      s += x;
    return s;
  };

  Host<float> none({2, 2}), scalar({}), logProb(scores.shape);
  ASSERT_FALSE(
      bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, {{"reduction", "none"}},
               {scores.ref(), labels.ref()}, {none.ref(), logProb.ref()})));
  expectClose(none.data, plain, 1e-6);
  std::vector<double> wantLogProb;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t d = 0; d < 2; ++d)
        wantLogProb.push_back(logSoftmaxAt(scores, n, c, d));
  expectClose(logProb.data, wantLogProb, 1e-6);

  ASSERT_FALSE(bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, {},
                        {scores.ref(), labels.ref()}, {scalar.ref()})));
  expectClose(scalar.data, {sum(plain) / 4}, 1e-6);
  ASSERT_FALSE(
      bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, {{"reduction", "sum"}},
               {scores.ref(), labels.ref(), w.ref()}, {scalar.ref()})));
  expectClose(scalar.data, {sum(weighted)}, 1e-6);
  // Weighted mean divides by the summed weights, not the count.
  ASSERT_FALSE(
      bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, {},
               {scores.ref(), labels.ref(), w.ref()}, {scalar.ref()})));
  expectClose(scalar.data, {sum(weighted) / wsum}, 1e-6);
}

TEST(CpuSoftmaxCrossEntropy, IgnoreIndex) {
  Host<float> scores = sceScores(), w({3}, {0.5f, 2, 1});
  Host<int32_t> labels({2, 2}, {2, -100, 1, -100});
  Host<float> none({2, 2}), mean({});
  ir::AttrMap attrs{{"ignore_index", int64_t(-100)}, {"reduction", "none"}};
  ASSERT_FALSE(bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, attrs,
                        {scores.ref(), labels.ref(), w.ref()}, {none.ref()})));
  double l0 = -logSoftmaxAt(scores, 0, 2, 0) * 1,
         l2 = -logSoftmaxAt(scores, 1, 1, 0) * 2;
  expectClose(none.data, {l0, 0, l2, 0}, 1e-6);
  attrs.insert_or_assign("reduction", "mean");
  ASSERT_FALSE(bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, attrs,
                        {scores.ref(), labels.ref(), w.ref()}, {mean.ref()})));
  expectClose(mean.data, {(l0 + l2) / 3}, 1e-6);
  // Without weights the mean is over the positions not ignored.
  ASSERT_FALSE(bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, attrs,
                        {scores.ref(), labels.ref()}, {mean.ref()})));
  expectClose(mean.data, {(l0 + l2 / 2) / 2}, 1e-6);
  // An ignore_index inside [0, C) is honored too.
  Host<int64_t> inRange({2, 2}, {2, 0, 1, 0});
  ASSERT_FALSE(bool(run(ir::OpKind::SoftmaxCrossEntropyLoss,
                        {{"ignore_index", int64_t(0)}},
                        {scores.ref(), inRange.ref()}, {mean.ref()})));
  expectClose(mean.data, {(l0 + l2 / 2) / 2}, 1e-6);
}

TEST(CpuSoftmaxCrossEntropy, OutOfRangeLabelIsAnError) {
  Host<float> scores = sceScores(), out({});
  // Without ignore_index nothing is ignored, so -100 is out of range.
  Host<int64_t> labels({2, 2}, {2, -100, 1, 0});
  llvm::Error e = run(ir::OpKind::SoftmaxCrossEntropyLoss, {},
                      {scores.ref(), labels.ref()}, {out.ref()});
  ASSERT_TRUE(bool(e));
  EXPECT_EQ(llvm::toString(std::move(e)),
            "SoftmaxCrossEntropyLoss: label -100 at position 1 is out of "
            "range [0, 3)");
  labels.data = {3, 0, 0, 0};
  EXPECT_TRUE(llvm::errorToBool(
      run(ir::OpKind::SoftmaxCrossEntropyLoss, {{"ignore_index", int64_t(-1)}},
          {scores.ref(), labels.ref()}, {out.ref()})));
}

TEST(CpuSoftmaxCrossEntropy, DoubleScoresTwoDimensional) {
  Host<double> scores({2, 2}, {0, 0, 3, 1}), out({});
  Host<int64_t> labels({2}, {1, 0});
  ASSERT_FALSE(
      bool(run(ir::OpKind::SoftmaxCrossEntropyLoss, {{"reduction", "sum"}},
               {scores.ref(), labels.ref()}, {out.ref()})));
  expectClose(out.data, {std::log(2.0) + std::log(1 + std::exp(-2.0))}, 1e-14);
}

// --- Dropout -------------------------------------------------------------

TEST(CpuDropout, InferenceAndZeroRatioAreIdentity) {
  Host<float> x = randomHost<float>({3, 5}, 9), y({3, 5});
  Mask mask({3, 5});
  for (ir::AttrMap attrs :
       {ir::AttrMap{},
        ir::AttrMap{{"ratio", 0.0f}, {"training_mode", int64_t(1)}}}) {
    std::fill(mask.data.begin(), mask.data.end(), 0);
    ASSERT_FALSE(bool(
        run(ir::OpKind::Dropout, attrs, {x.ref()}, {y.ref(), mask.ref()}, 42)));
    EXPECT_EQ(y.data, x.data);
    EXPECT_EQ(mask.data, std::vector<uint8_t>(15, 1));
  }
}

TEST(CpuDropout, TrainingDropsAboutRatioAndScalesTheRest) {
  int64_t n = 100000; // big enough to run on both threads
  Host<double> x = randomHost<double>({n}, 10, 0.5, 1.5), y({n});
  Mask mask({n});
  ir::AttrMap attrs{{"ratio", 0.25f}, {"training_mode", int64_t(1)}};
  ASSERT_FALSE(bool(
      run(ir::OpKind::Dropout, attrs, {x.ref()}, {y.ref(), mask.ref()}, 7)));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    kept += mask.data[i];
    double want = mask.data[i] ? x.data[i] / (1 - double(0.25f)) : 0.0;
    ASSERT_NEAR(y.data[i], want, 1e-12) << "element " << i;
  }
  EXPECT_NEAR(double(kept) / n, 0.75, 0.01);

  // The same seed repeats the mask (also without the mask output); another
  // seed gives another one.
  Host<double> again({n}), other({n});
  ASSERT_FALSE(
      bool(run(ir::OpKind::Dropout, attrs, {x.ref()}, {again.ref()}, 7)));
  EXPECT_EQ(again.data, y.data);
  ASSERT_FALSE(
      bool(run(ir::OpKind::Dropout, attrs, {x.ref()}, {other.ref()}, 8)));
  EXPECT_NE(other.data, y.data);
}

TEST(CpuNormalization, IntegerInputsAreRefused) {
  Host<int64_t> x({2, 2}), y({2, 2});
  llvm::Error e = run(ir::OpKind::Softmax, {}, {x.ref()}, {y.ref()});
  ASSERT_TRUE(bool(e));
  EXPECT_EQ(llvm::toString(std::move(e)),
            "Softmax: the CPU kernel does not handle i64 inputs");
}

} // namespace unit_cpu_normalization
