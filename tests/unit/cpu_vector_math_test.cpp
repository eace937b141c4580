// VectorMath.h against libm: exp, erf and erf's gradient over arrays of
// every length up to 20 (whole vectors and the partial tail), values across
// the ranges that matter, and the edges (overflow, underflow, infinities,
// NaN).
#include "runtime/cpu/VectorMath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace unit_cpu_vector_math {

using namespace cleave::runtime::cpu;

namespace {

std::vector<double> samples() {
  std::vector<double> v;
  for (double x = -30; x <= 30; x += 0.173)
    v.push_back(x);
  for (double x : {0.0, -0.0, 1e-300, -1e-30, 1e-8, 0.4999, 0.5, 0.5001, -0.5,
                   3.9, 6.0, -6.0, 700.0, 709.7, -707.0, -707.9})
    v.push_back(x);
  return v;
}

double relErr(double got, double want) {
  if (got == want)
    return 0;
  return std::abs(got - want) / std::abs(want);
}

// exp as VectorMath.h promises it: no subnormal results.
double expFlushed(double x) { return x < -708 ? 0.0 : std::exp(x); }

} // namespace

TEST(VectorMath, ExpMatchesLibmToDoublePrecision) {
  std::vector<double> x = samples();
  for (size_t n = 1; n <= 20; ++n) { // every tail length
    std::vector<double> out(n);
    expShifted(x.data(), int64_t(n), 0.0, 1.0, out.data());
    for (size_t i = 0; i < n; ++i)
      EXPECT_LT(relErr(out[i], std::exp(x[i])), 1e-14) << x[i];
  }
  std::vector<double> out(x.size());
  expShifted(x.data(), int64_t(x.size()), 1.5, 2.0, out.data());
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_LT(relErr(out[i], 2.0 * expFlushed(x[i] - 1.5)), 1e-14) << x[i];
  double sum = sumExpShifted(x.data(), int64_t(x.size()), 3.0), want = 0;
  for (double v : x)
    want += std::exp(v - 3.0);
  EXPECT_LT(relErr(sum, want), 1e-13);
}

TEST(VectorMath, ExpEdges) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> x = {710.0, 1e6, inf, -746.0, -1e6, -inf,
                           std::nan(""), -709.0, 0.0};
  std::vector<double> out(x.size());
  expShifted(x.data(), int64_t(x.size()), 0.0, 1.0, out.data());
  EXPECT_EQ(out[0], inf);
  EXPECT_EQ(out[1], inf);
  EXPECT_EQ(out[2], inf);
  EXPECT_EQ(out[3], 0.0);
  EXPECT_EQ(out[4], 0.0);
  EXPECT_EQ(out[5], 0.0);
  EXPECT_TRUE(std::isnan(out[6]));
  EXPECT_EQ(out[7], 0.0); // subnormal results flush to 0
  EXPECT_EQ(out[8], 1.0);
  // A row with -inf (a masked logit) adds nothing to the sum.
  std::vector<float> row = {0.0f, -std::numeric_limits<float>::infinity(), 0.0f};
  EXPECT_DOUBLE_EQ(sumExpShifted(row.data(), 3, 0.0), 2.0);
}

TEST(VectorMath, ErfWithinAFloatsRounding) {
  std::vector<double> x = samples();
  std::vector<double> out(x.size()), grad(x.size()), dy(x.size(), 0.75);
  erfArray(x.data(), int64_t(x.size()), out.data());
  erfGradArray(dy.data(), x.data(), int64_t(x.size()), grad.data());
  for (size_t i = 0; i < x.size(); ++i) {
    double want = std::erf(x[i]);
    EXPECT_LT(std::abs(out[i] - want), 1e-7 * std::max(1.0, std::abs(want)))
        << x[i];
    if (std::abs(x[i]) < 0.5) { // the series: relative accuracy near zero
      EXPECT_LT(relErr(out[i], want), 1e-13) << x[i];
    }
    EXPECT_LT(relErr(grad[i], 0.75 * 2 / std::sqrt(M_PI) * expFlushed(-x[i] * x[i])),
              1e-13)
        << x[i];
  }
  std::vector<float> xf = {-3.0f, -0.2f, 0.0f, 0.3f, 1.0f, 2.5f, 9.0f};
  std::vector<float> outf(xf.size());
  erfArray(xf.data(), int64_t(xf.size()), outf.data());
  for (size_t i = 0; i < xf.size(); ++i)
    EXPECT_NEAR(outf[i], std::erf(xf[i]), 2e-7) << xf[i];
  double nan = std::nan("");
  double inf = std::numeric_limits<double>::infinity();
  std::vector<double> edge = {nan, inf, -inf}, edgeOut(3);
  erfArray(edge.data(), 3, edgeOut.data());
  EXPECT_TRUE(std::isnan(edgeOut[0]));
  EXPECT_EQ(edgeOut[1], 1.0);
  EXPECT_EQ(edgeOut[2], -1.0);
}

// The f32 activations (eight float lanes) against double references: tanh,
// sigmoid, both GELU forms and their derivatives, within a few float ulps
// of the result's magnitude (relative 1e-6, absolute 1e-7), every tail
// length, the edges; and the f64 versions to about 1e-13.
namespace {

double geluErfRef(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double geluErfDerivRef(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}
double geluTanhRef(double x) {
  double b = std::sqrt(2 / M_PI);
  return 0.5 * x * (1 + std::tanh(b * (x + 0.044715 * x * x * x)));
}
double geluTanhDerivRef(double x) {
  double b = std::sqrt(2 / M_PI), t = std::tanh(b * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * b * (1 + 3 * 0.044715 * x * x);
}
double sigmoidRef(double x) { return 1 / (1 + std::exp(-x)); }

std::vector<float> activationSamples() {
  std::vector<float> v;
  for (double x = -12; x <= 12; x += 0.0371)
    v.push_back(float(x));
  for (float x :
       {0.0f, -0.0f, 1e-30f, -1e-8f, 0.2499f, 0.25f, -0.2501f, 0.35355f,
        0.7071f, 0.70711f, -0.7072f, 9.5f, -30.0f, 30.0f, 100.0f, -100.0f})
    v.push_back(x);
  return v;
}

void expectClose(float got, double want, const char *what, float x) {
  EXPECT_LE(std::abs(double(got) - want), 1e-7 + 1e-6 * std::abs(want))
      << what << " at x = " << x << ": " << got << " against " << want;
}

} // namespace

TEST(VectorMath, FloatActivationsWithinAFewUlps) {
  std::vector<float> x = activationSamples();
  size_t n = x.size();
  std::vector<float> dy(n), out(n);
  for (size_t i = 0; i < n; ++i)
    dy[i] = 0.5f + float(i % 7) * 0.25f;
  auto check = [&](const char *what, auto run, auto ref, bool withDy) {
    for (size_t len : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(15),
                       size_t(17), n}) {
      std::fill(out.begin(), out.end(), -7.0f);
      run(len);
      for (size_t i = 0; i < len; ++i)
        expectClose(out[i], (withDy ? double(dy[i]) : 1.0) * ref(double(x[i])),
                    what, x[i]);
      for (size_t i = len; i < n; ++i)
        ASSERT_EQ(out[i], -7.0f) << what << " wrote past its length";
    }
  };
  check(
      "tanh", [&](size_t m) { tanhArray(x.data(), m, out.data()); },
      [](double v) { return std::tanh(v); }, false);
  check(
      "tanh'",
      [&](size_t m) { tanhGradArray(dy.data(), x.data(), m, out.data()); },
      [](double v) { return 1 - std::tanh(v) * std::tanh(v); }, true);
  check(
      "sigmoid", [&](size_t m) { sigmoidArray(x.data(), m, out.data()); },
      sigmoidRef, false);
  check(
      "sigmoid'",
      [&](size_t m) { sigmoidGradArray(dy.data(), x.data(), m, out.data()); },
      [](double v) { return sigmoidRef(v) * (1 - sigmoidRef(v)); }, true);
  check(
      "gelu", [&](size_t m) { geluArray(x.data(), m, false, out.data()); },
      geluErfRef, false);
  check(
      "gelu'",
      [&](size_t m) {
        geluGradArray(dy.data(), x.data(), m, false, out.data());
      },
      geluErfDerivRef, true);
  check(
      "gelu_tanh", [&](size_t m) { geluArray(x.data(), m, true, out.data()); },
      geluTanhRef, false);
  check(
      "gelu_tanh'",
      [&](size_t m) {
        geluGradArray(dy.data(), x.data(), m, true, out.data());
      },
      geluTanhDerivRef, true);
}

TEST(VectorMath, FloatActivationEdges) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {inf, -inf, std::nanf(""), 1e30f, -1e30f};
  std::vector<float> t(5), s(5), g(5);
  tanhArray(x.data(), 5, t.data());
  sigmoidArray(x.data(), 5, s.data());
  geluArray(x.data(), 5, false, g.data());
  EXPECT_EQ(t[0], 1.0f);
  EXPECT_EQ(t[1], -1.0f);
  EXPECT_TRUE(std::isnan(t[2]));
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 0.0f);
  EXPECT_TRUE(std::isnan(s[2]));
  EXPECT_EQ(g[3], 1e30f);
  EXPECT_EQ(g[4], -0.0f);
  EXPECT_TRUE(std::isnan(g[2]));
}

TEST(VectorMath, DoubleActivations) {
  std::vector<double> x;
  for (double v = -25; v <= 25; v += 0.0913)
    x.push_back(v);
  size_t n = x.size();
  std::vector<double> t(n), s(n), dy(n, 1.0), tg(n);
  tanhArray(x.data(), n, t.data());
  sigmoidArray(x.data(), n, s.data());
  tanhGradArray(dy.data(), x.data(), n, tg.data());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(t[i], std::tanh(x[i]), 1e-13 * std::max(1e-3, std::abs(t[i])));
    EXPECT_NEAR(s[i], sigmoidRef(x[i]), 1e-13 * s[i] + 1e-300);
    double tt = std::tanh(x[i]);
    EXPECT_NEAR(tg[i], 1 - tt * tt, 1e-13);
  }
}

// f32 rows: exp in float lanes within two float ulps, sums in double as
// the double lanes add them, every tail length; softmax's one-pass form
// writes the same exps and returns the same sum.
TEST(VectorMath, FloatExpRows) {
  std::vector<float> x;
  for (double v = -80; v <= 80; v += 0.731)
    x.push_back(float(v));
  for (float v : {0.0f, -0.0f, 88.0f, -87.0f, -100.0f, 1e-20f})
    x.push_back(v);
  for (size_t n : {size_t(1), size_t(5), size_t(8), size_t(13), x.size()}) {
    std::vector<float> out(n), once(n);
    expShifted(x.data(), int64_t(n), 2.0, 0.5, out.data());
    double sum = sumExpShifted(x.data(), int64_t(n), 2.0), want = 0;
    double oneSum = expShiftedSum(x.data(), int64_t(n), 2.0, once.data());
    for (size_t i = 0; i < n; ++i) {
      double e = x[i] - 2.0 < -87.3 ? 0.0 : std::exp(double(x[i]) - 2.0);
      want += e;
      EXPECT_LE(std::abs(out[i] - 0.5 * e), 2.4e-7 * 0.5 * e) << x[i];
      EXPECT_LE(std::abs(once[i] - e), 2.4e-7 * e) << x[i];
    }
    EXPECT_LE(std::abs(sum - want), 2.4e-7 * want);
    EXPECT_EQ(sum, oneSum);
  }
}

// The f32 row exps run 16 lanes at a time where the CPU has AVX-512 and 8
// lanes elsewhere: each element's exp has the same bits whatever its place
// in the row (a lone element goes through the partial tail), and the sum
// adds each element into double lane i % 8 in order, then the lanes' tree.
TEST(VectorMath, FloatExpRowsSameBitsAtEveryWidth) {
  std::vector<float> x;
  for (int i = 0; i < 77; ++i)
    x.push_back(float(std::sin(i * 0.7) * 30 - (i % 5 == 0 ? 60 : 0)));
  for (int64_t n : {16, 31, 32, 48, 77}) {
    std::vector<float> row(static_cast<size_t>(n)), once(row.size());
    expShifted(x.data(), n, 1.5, 1.0, row.data());
    double sum = expShiftedSum(x.data(), n, 1.5, once.data());
    double lanes[8] = {};
    for (int64_t i = 0; i < n; ++i) {
      float alone;
      expShifted(x.data() + i, 1, 1.5, 1.0, &alone);
      EXPECT_EQ(row[i], alone) << "n " << n << ", element " << i;
      EXPECT_EQ(once[i], alone) << "n " << n << ", element " << i;
      lanes[i % 8] += double(alone);
    }
    double want = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                  ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    EXPECT_EQ(sum, want) << n;
    EXPECT_EQ(sumExpShifted(x.data(), n, 1.5), want) << n;
  }
}

TEST(VectorMath, RowMax) {
  EXPECT_EQ(rowMax(static_cast<const float *>(nullptr), 0), -INFINITY);
  std::vector<float> x;
  for (int i = 0; i < 41; ++i)
    x.push_back(float(-i * 0.25));
  for (int64_t n = 1; n <= 41; ++n) {
    x[size_t(n - 1)] = 7.0f + float(n); // the largest, last of the row
    EXPECT_EQ(rowMax(x.data(), n), 7.0f + float(n)) << n;
    x[size_t(n - 1)] = float(-(n - 1) * 0.25);
  }
  std::vector<float> hidden(37, -INFINITY);
  EXPECT_EQ(rowMax(hidden.data(), 37), -INFINITY);
  for (size_t at : {size_t(0), size_t(17), size_t(36)}) {
    std::vector<float> y(37, 1.0f);
    y[at] = NAN;
    EXPECT_TRUE(std::isnan(rowMax(y.data(), 37))) << at;
  }
}

// tanh, sigmoid, GELU and their gradients run 32 elements a turn in 16-lane
// vectors where the CPU has AVX-512: an element's result has the same bits
// at every place in an array (a lone element takes the 8-lane tail).
TEST(VectorMath, FloatActivationsSameBitsAtEveryWidth) {
  std::vector<float> x, dy;
  for (int i = 0; i < 77; ++i) {
    x.push_back(float(std::sin(i * 0.37) * 6));
    dy.push_back(float(std::cos(i * 0.11)));
  }
  using Map = void (*)(const float *, int64_t, float *);
  using Grad = void (*)(const float *, const float *, int64_t, float *);
  const std::pair<const char *, Map> maps[] = {
      {"tanh", [](const float *a, int64_t n, float *o) { tanhArray(a, n, o); }},
      {"sigmoid",
       [](const float *a, int64_t n, float *o) { sigmoidArray(a, n, o); }},
      {"gelu", [](const float *a, int64_t n,
                  float *o) { geluArray(a, n, false, o); }},
      {"gelu tanh", [](const float *a, int64_t n, float *o) {
         geluArray(a, n, true, o);
       }}};
  const std::pair<const char *, Grad> grads[] = {
      {"tanh", [](const float *d, const float *a, int64_t n,
                  float *o) { tanhGradArray(d, a, n, o); }},
      {"sigmoid", [](const float *d, const float *a, int64_t n,
                     float *o) { sigmoidGradArray(d, a, n, o); }},
      {"gelu", [](const float *d, const float *a, int64_t n,
                  float *o) { geluGradArray(d, a, n, false, o); }},
      {"gelu tanh", [](const float *d, const float *a, int64_t n, float *o) {
         geluGradArray(d, a, n, true, o);
       }}};
  std::vector<float> all(x.size());
  for (auto [name, f] : maps) {
    f(x.data(), int64_t(x.size()), all.data());
    for (size_t i = 0; i < x.size(); ++i) {
      float alone;
      f(x.data() + i, 1, &alone);
      EXPECT_EQ(all[i], alone) << name << ", element " << i;
    }
  }
  for (auto [name, f] : grads) {
    f(dy.data(), x.data(), int64_t(x.size()), all.data());
    for (size_t i = 0; i < x.size(); ++i) {
      float alone;
      f(dy.data() + i, x.data() + i, 1, &alone);
      EXPECT_EQ(all[i], alone) << name << " gradient, element " << i;
    }
  }
}

} // namespace unit_cpu_vector_math
