// VectorMath.h against libm: exp, erf and erf's gradient over arrays of
// every length up to 20 (whole vectors and the partial tail), values across
// the ranges that matter, and the edges (overflow, underflow, infinities,
// NaN).
#include "runtime/cpu/VectorMath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

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
