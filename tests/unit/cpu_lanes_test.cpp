// The order of the CPU kernels' double sums, pinned bit for bit
// (runtime/cpu/CpuKernels.h): LayerNormalization's row statistics and
// gradient sums in sumLanes16's order (sixteen running sums, element i in
// lane i % 16, the lanes added in a fixed tree, then the tail of n % 16 in
// sequence) and ReduceSum's rows in eight lanes. Each build (AVX-512's
// Double8, the pairs of four lanes elsewhere, the baseline) must give
// exactly these bits, so that no CPU changes a result; each kernel is run
// here against a scalar reference written in that order.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

namespace unit_cpu_lanes {

using namespace cleave;
using namespace cleave::testsupport::typed;
using ir::AttrMap;
using ir::OpKind;

namespace {

// sum over i < n of term(i) in `lanes` running sums (lane i % lanes) over
// the first multiple of `lanes` terms, the lanes added pairwise in a tree
// of eights ((0+1)+(2+3))+((4+5)+(6+7)) after the two halves of sixteen are
// added lane by lane, then the rest in sequence.
double laneOrderSum(int64_t n, int lanes,
                    const std::function<double(int64_t)> &term) {
  double acc[16] = {};
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (int l = 0; l < lanes; ++l)
      acc[l] += term(i + l);
  double v[8];
  for (int l = 0; l < 8; ++l)
    v[l] = lanes == 16 ? acc[l] + acc[l + 8] : acc[l];
  double tail = 0;
  for (; i < n; ++i)
    tail += term(i);
  return (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))) +
         tail;
}

bool sameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expectSameBits(const std::vector<float> &got,
                    const std::vector<float> &want, const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (!sameBits(got[i], want[i])) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i]
                    << ", the reference order gives " << want[i];
      return;
    }
}

struct RowStats {
  double mean, inv;
};

RowStats statsOf(const float *x, int64_t n, double eps) {
  double mean = laneOrderSum(n, 16, [&](int64_t i) { return double(x[i]); }) /
                double(n);
  double sq = laneOrderSum(n, 16, [&](int64_t i) {
    double d = double(x[i]) - mean;
    return d * d;
  });
  return {mean, 1.0 / std::sqrt(sq / double(n) + eps)};
}

// Row sizes with and without a tail, below one vector, and a transformer's;
// three rows of each.
const int64_t kSizes[] = {5, 16, 77, 256};
constexpr int64_t kRows = 3;
constexpr float kEps = 1e-5f;
const AttrMap kNormAttrs{{"axis", int64_t(-1)}, {"epsilon", kEps}};

TEST(CpuLanes, LayerNormForwardFollowsTheLaneOrder) {
  for (int64_t size : kSizes) {
    SCOPED_TRACE("row size " + std::to_string(size));
    Host<float> X = randomHost<float>({kRows, size}, 7, -2, 3),
                scale = randomHost<float>({size}, 8),
                bias = randomHost<float>({size}, 9);
    Host<float> Y({kRows, size}), mean({kRows, 1}), inv({kRows, 1});
    ASSERT_FALSE(bool(run(OpKind::LayerNormalization, kNormAttrs,
                          {X.ref(), scale.ref(), bias.ref()},
                          {Y.ref(), mean.ref(), inv.ref()})));
    std::vector<float> wantY, wantMean, wantInv;
    for (int64_t r = 0; r < kRows; ++r) {
      const float *x = X.data.data() + r * size;
      RowStats s = statsOf(x, size, kEps);
      wantMean.push_back(float(s.mean));
      wantInv.push_back(float(s.inv));
      for (int64_t i = 0; i < size; ++i)
        wantY.push_back(float((double(x[i]) - s.mean) * s.inv *
                                  double(scale.data[i]) +
                              double(bias.data[i])));
    }
    expectSameBits(Y.data, wantY, "Y");
    expectSameBits(mean.data, wantMean, "Mean");
    expectSameBits(inv.data, wantInv, "InvStdDev");
  }
}

TEST(CpuLanes, LayerNormGradientFollowsTheLaneOrder) {
  for (int64_t size : kSizes) {
    SCOPED_TRACE("row size " + std::to_string(size));
    Host<float> X = randomHost<float>({kRows, size}, 11, -2, 3),
                dY = randomHost<float>({kRows, size}, 12),
                scale = randomHost<float>({size}, 13);
    Host<float> dX({kRows, size});
    ASSERT_FALSE(bool(run(OpKind::LayerNormalizationGradData, kNormAttrs,
                          {dY.ref(), X.ref(), scale.ref()}, {dX.ref()})));
    std::vector<float> want;
    for (int64_t r = 0; r < kRows; ++r) {
      const float *x = X.data.data() + r * size, *dy = dY.data.data() + r * size;
      RowStats s = statsOf(x, size, kEps);
      auto g = [&](int64_t i) { return double(dy[i]) * double(scale.data[i]); };
      auto xh = [&](int64_t i) { return (double(x[i]) - s.mean) * s.inv; };
      double meanG = laneOrderSum(size, 16, g) / double(size);
      double meanGX =
          laneOrderSum(size, 16, [&](int64_t i) { return g(i) * xh(i); }) /
          double(size);
      for (int64_t i = 0; i < size; ++i)
        want.push_back(float(s.inv * (g(i) - meanG - xh(i) * meanGX)));
    }
    expectSameBits(dX.data, want, "dX");
  }
}

TEST(CpuLanes, ReduceSumRowsFollowTheLaneOrder) {
  for (int64_t size : kSizes) {
    SCOPED_TRACE("row size " + std::to_string(size));
    Host<float> X = randomHost<float>({kRows, size}, 21, -2, 3);
    Host<float> Y({kRows, 1});
    AttrMap attrs{{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t(1)}};
    ASSERT_FALSE(bool(run(OpKind::ReduceSum, attrs, {X.ref()}, {Y.ref()})));
    std::vector<float> want;
    for (int64_t r = 0; r < kRows; ++r) {
      const float *x = X.data.data() + r * size;
      want.push_back(float(
          laneOrderSum(size, 8, [&](int64_t i) { return double(x[i]); })));
    }
    expectSameBits(Y.data, want, "ReduceSum");
  }
}

} // namespace

} // namespace unit_cpu_lanes
