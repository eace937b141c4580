// The learning-rate schedule (runtime/LrSchedule.h) against PyTorch's and
// HF transformers' schedulers: tests/models/lr_schedule/lr_table.txt holds
// the lr of every step of warm-up + cosine (with and without a floor),
// warm-up + linear, warm-up + constant (HF), and CosineAnnealingLR /
// LinearLR to a floor (torch), written by make_table.py beside it.
#include "runtime/LrSchedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

namespace unit_lr_schedule {

using namespace cleave;
using runtime::LrSchedule;

TEST(LrSchedule, MatchesTorchAndHfSchedulers) {
  std::ifstream in(std::string(CLEAVE_SOURCE_DIR) +
                   "/tests/models/lr_schedule/lr_table.txt");
  ASSERT_TRUE(in.good());
  std::string line;
  int rows = 0;
  double worst = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    std::istringstream fields(line);
    std::string decay;
    double peak, floor, want;
    int64_t warm, total, step;
    fields >> decay >> peak >> warm >> floor >> total >> step >> want;
    ASSERT_FALSE(fields.fail()) << line;
    auto s = LrSchedule::parse(decay + " " + std::to_string(peak) + " " +
                               std::to_string(warm) + " " +
                               std::to_string(floor) + " " +
                               std::to_string(total));
    ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
    s->peak = peak; // exactly the table's (to_string rounds)
    s->minLr = floor;
    double got = s->at(step);
    double err = std::abs(got - want) / std::max(std::abs(want), 1e-300);
    if (want == 0)
      err = std::abs(got);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-12) << line << ": got " << got;
    EXPECT_EQ(s->lrAt(step), float(got));
    ++rows;
  }
  EXPECT_GT(rows, 300);
  std::printf("largest relative difference from torch/HF: %.3g over %d "
              "steps\n",
              worst, rows);
}

TEST(LrSchedule, HandDerivedPointsAndRoundTrip) {
  LrSchedule s;
  s.peak = 1.0;
  s.warmupSteps = 4;
  s.decay = LrSchedule::Decay::Cosine;
  s.minLr = 0.1;
  s.decaySteps = 8;
  EXPECT_EQ(s.at(0), 0.0);
  EXPECT_EQ(s.at(2), 0.5);
  EXPECT_EQ(s.at(4), 1.0);
  EXPECT_NEAR(s.at(6), 0.55, 1e-15); // half way: the mean of peak and floor
  EXPECT_NEAR(s.at(8), 0.1, 1e-15);
  EXPECT_NEAR(s.at(100), 0.1, 1e-15); // past the end: the floor
  s.decay = LrSchedule::Decay::Linear;
  EXPECT_NEAR(s.at(5), 0.775, 1e-15);
  s.decay = LrSchedule::Decay::None;
  EXPECT_EQ(s.at(7), 1.0);
  auto back = LrSchedule::parse(s.str());
  ASSERT_TRUE(bool(back));
  EXPECT_TRUE(*back == s);
  for (const char *bad : {"", "cosine 1 2 3", "square 1 2 3 4",
                          "cosine -1 2 0 4", "cosine 1 x 0 4",
                          "linear 1 2 0 -4"}) {
    auto r = LrSchedule::parse(bad);
    EXPECT_FALSE(bool(r)) << bad;
    if (!r)
      llvm::consumeError(r.takeError());
  }
}

} // namespace unit_lr_schedule
