// The schedule generators against the published formulas (uniform costs,
// P in {2, 4, 8}, M in {P, 2P, 4P}), `auto` against every other schedule,
// and non-uniform costs.
#include "passes/schedule/Generators.h"
#include "passes/schedule/Simulator.h"
#include "passes/schedule/Validator.h"

#include <gtest/gtest.h>

namespace unit_schedule_generators {

using namespace cleave::passes;
using namespace cleave::passes::schedule;

namespace {

struct Shape {
  int P, M;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int P : {2, 4, 8})
    for (int M : {P, 2 * P, 4 * P})
      out.push_back({P, M});
  return out;
}

std::string label(const std::string &name, Shape sh) {
  return name + " P=" + std::to_string(sh.P) + " M=" + std::to_string(sh.M);
}

// Makes, validates and simulates; fails the test on any error.
SimResult run(const std::string &name, int P, int M, const PipelineCosts &costs,
              std::optional<int> cap = {}) {
  auto s = makeSchedule(name, P, M, costs, cap);
  if (!s) {
    ADD_FAILURE() << llvm::toString(s.takeError());
    return {};
  }
  if (auto e = validateSchedule(*s, costs, cap))
    ADD_FAILURE() << name << ": " << llvm::toString(std::move(e));
  auto r = simulate(*s, costs);
  if (!r) {
    ADD_FAILURE() << llvm::toString(r.takeError());
    return {};
  }
  return *r;
}

int maxPeak(const SimResult &r) {
  int peak = 0;
  for (const StageStats &st : r.stages)
    peak = std::max(peak, st.peakActivationMicrobatches);
  return peak;
}

// Unit costs, with a BW's input gradient sent when its B part ends (as
// cleave's runtime does).
PipelineCosts early(int P) {
  PipelineCosts c = PipelineCosts::uniform(P);
  c.bwSendsAfterB = true;
  return c;
}

double maxBubble(const SimResult &r) {
  double b = 0;
  for (const StageStats &st : r.stages)
    b = std::max(b, st.bubble);
  return b;
}

} // namespace

// The textbook figures, for a backward that sends its input gradient when
// it ends: the bubble is (P-1)(F+B+W).
TEST(ScheduleGenerators, GPipeAnd1F1BBubbleIsExact) {
  for (Shape sh : shapes())
    for (const char *name : {"gpipe", "1f1b"}) {
      SimResult r = run(name, sh.P, sh.M, PipelineCosts::uniform(sh.P));
      double expected = double(sh.P - 1) / (sh.M + sh.P - 1);
      EXPECT_DOUBLE_EQ(r.stepTime, 3.0 * (sh.M + sh.P - 1)) << label(name, sh);
      for (const StageStats &st : r.stages)
        EXPECT_DOUBLE_EQ(st.bubble, expected) << label(name, sh);
    }
}

// cleave's runtime sends a BW's input gradient when its B part ends, so
// the W parts leave the critical path of the backward: the bubble of 1F1B
// and GPipe is (P-1)(F+B), step 3M + 2(P-1) at unit costs.
TEST(ScheduleGenerators, EarlySendTakesWOffTheCriticalPath) {
  for (Shape sh : shapes())
    for (const char *name : {"gpipe", "1f1b"}) {
      SimResult r = run(name, sh.P, sh.M, early(sh.P));
      EXPECT_DOUBLE_EQ(r.stepTime, 3.0 * sh.M + 2.0 * (sh.P - 1))
          << label(name, sh);
      for (const StageStats &st : r.stages)
        EXPECT_DOUBLE_EQ(st.bubble, 2.0 * (sh.P - 1) / r.stepTime)
            << label(name, sh);
    }
}

TEST(ScheduleGenerators, OneFOneBHoldsPMinusSMicrobatches) {
  for (Shape sh : shapes()) {
    SimResult r = run("1f1b", sh.P, sh.M, PipelineCosts::uniform(sh.P));
    for (int s = 0; s < sh.P; ++s)
      EXPECT_EQ(r.stages[s].peakActivationMicrobatches,
                std::min(sh.P - s, sh.M))
          << label("1f1b", sh) << " stage " << s;
  }
}

TEST(ScheduleGenerators, GPipeHoldsEveryMicrobatch) {
  SimResult r = run("gpipe", 4, 8, PipelineCosts::uniform(4));
  for (const StageStats &st : r.stages)
    EXPECT_EQ(st.peakActivationMicrobatches, 8);
}

// The zero-bubble paper: ZB-H1 idles (P-1)(F+B-W) per stage, a third of
// 1F1B's at equal costs, at 1F1B's peak memory (its first stage's P).
TEST(ScheduleGenerators, ZeroBubbleH1MeetsThePaperBound) {
  for (Shape sh : shapes()) {
    SimResult zb = run("zb-h1", sh.P, sh.M, PipelineCosts::uniform(sh.P));
    SimResult base = run("1f1b", sh.P, sh.M, PipelineCosts::uniform(sh.P));
    double bound = double(sh.P - 1) / (3 * sh.M + sh.P - 1);
    for (const StageStats &st : zb.stages)
      EXPECT_LE(st.bubble, bound + 1e-12) << label("zb-h1", sh);
    EXPECT_EQ(maxPeak(zb), maxPeak(base)) << label("zb-h1", sh);
  }
}

TEST(ScheduleGenerators, ZeroBubbleH2IsAlmostBubbleFree) {
  for (Shape sh : shapes()) {
    SimResult r = run("zb-h2", sh.P, sh.M, PipelineCosts::uniform(sh.P));
    if (sh.M >= 2 * sh.P) {
      EXPECT_LT(maxBubble(r), 0.05) << label("zb-h2", sh);
    }
    EXPECT_LE(maxPeak(r), 2 * sh.P - 1) << label("zb-h2", sh);
  }
}

// 2BP alone (B in place of BW, W deferred) beats the textbook base
// schedule, at the cost of memory: microbatches are held until their W.
// Against cleave's runtime, whose BW already sends after its B part,
// GPipe-2BP gains nothing at unit costs; 1F1B-2BP still gains in 1F1B's
// steady state, where a deferred W no longer delays the next F.
TEST(ScheduleGenerators, TwoBPIsFasterThanItsBaseAndHoldsMore) {
  for (Shape sh : shapes())
    for (auto [split, base] : {std::pair{"gpipe-2bp", "gpipe"},
                               std::pair{"1f1b-2bp", "1f1b"}}) {
      SimResult a = run(split, sh.P, sh.M, PipelineCosts::uniform(sh.P));
      SimResult b = run(base, sh.P, sh.M, PipelineCosts::uniform(sh.P));
      EXPECT_LT(a.stepTime, b.stepTime) << label(split, sh);
      EXPECT_GE(maxPeak(a), maxPeak(b)) << label(split, sh);
      SimResult earlyBase = run(base, sh.P, sh.M, early(sh.P));
      SimResult earlySplit = run(split, sh.P, sh.M, early(sh.P));
      if (std::string(base) == "gpipe")
        EXPECT_DOUBLE_EQ(earlySplit.stepTime, earlyBase.stepTime)
            << label(split, sh);
      else
        EXPECT_LT(earlySplit.stepTime, earlyBase.stepTime) << label(split, sh);
    }
}

TEST(ScheduleGenerators, AutoIsTheFastestWithinTheCap) {
  for (Shape sh : shapes()) {
    PipelineCosts costs = PipelineCosts::uniform(sh.P);
    SimResult best = run("auto", sh.P, sh.M, costs);
    for (const std::string &name : scheduleNames())
      if (name != "auto") {
        EXPECT_LE(best.stepTime, run(name, sh.P, sh.M, costs).stepTime)
            << label(name, sh);
      }
    for (int cap : {sh.P, sh.P + 1, 2 * sh.P}) {
      SimResult capped = run("auto", sh.P, sh.M, costs, cap);
      EXPECT_LE(maxPeak(capped), cap) << label("auto", sh);
      for (const std::string &name : scheduleNames()) {
        if (name == "auto")
          continue;
        SimResult other = run(name, sh.P, sh.M, costs);
        if (maxPeak(other) <= cap) {
          EXPECT_LE(capped.stepTime, other.stepTime) << label(name, sh);
        }
      }
    }
  }
}

TEST(ScheduleGenerators, AutoFailsWhenNothingFits) {
  auto s = makeSchedule("auto", 4, 8, PipelineCosts::uniform(4), 2);
  ASSERT_FALSE(bool(s));
  EXPECT_EQ(llvm::toString(s.takeError()),
            "no schedule fits a memory cap of 2 microbatches per stage; the "
            "least any needs is 4 (1f1b)");
}

TEST(ScheduleGenerators, NonUniformCostsValidateAndSimulate) {
  PipelineCosts costs = PipelineCosts::uniform(4);
  for (int s = 0; s < 4; ++s)
    costs.stages[s] = StageCost{1.0 + 0.25 * s, 2.0, 1.0}; // W = 0.5 B
  costs.linkLatency = 0.1;
  for (const std::string &name : scheduleNames()) {
    SimResult r = run(name, 4, 8, costs);
    EXPECT_GT(r.stepTime, 0) << name;
    for (const StageStats &st : r.stages) {
      EXPECT_GE(st.bubble, 0) << name;
      EXPECT_LT(st.bubble, 1) << name;
    }
  }
  SimResult base = run("1f1b", 4, 8, costs);
  EXPECT_LT(run("zb-h1", 4, 8, costs).stepTime, base.stepTime);
  EXPECT_LT(run("zb-h2", 4, 8, costs).stepTime, base.stepTime);
}

TEST(ScheduleGenerators, RejectsBadRequests) {
  auto unknown = makeSchedule("pipedream", 2, 2, PipelineCosts::uniform(2));
  EXPECT_EQ(llvm::toString(unknown.takeError()),
            "unknown schedule 'pipedream' (known: gpipe, 1f1b, gpipe-2bp, "
            "1f1b-2bp, zb-h1, zb-h2, auto, interleaved-1f1b, "
            "interleaved-1f1b-2bp, looped-bfs, looped-bfs-2bp, zb-v, v-half, "
            "v-min, dualpipe-v, csv:FILE)");
  auto mismatch = makeSchedule("1f1b", 4, 2, PipelineCosts::uniform(2));
  EXPECT_EQ(llvm::toString(mismatch.takeError()),
            "the costs are for 2 stages, the schedule has 4");
  PipelineCosts zero = PipelineCosts::uniform(2);
  zero.stages[1].f = 0;
  auto z = makeSchedule("zb-h1", 2, 2, zero);
  EXPECT_EQ(llvm::toString(z.takeError()),
            "stage 1: F and B must take positive time and W no negative time");
}

TEST(ScheduleGenerators, SingleStageAndSingleMicrobatch) {
  for (const std::string &name : scheduleNames()) {
    SimResult one = run(name, 1, 4, PipelineCosts::uniform(1));
    EXPECT_DOUBLE_EQ(one.stepTime, 12) << name;
    SimResult mb = run(name, 4, 1, PipelineCosts::uniform(4));
    EXPECT_LE(mb.stepTime, 3.0 * 4) << name;
  }
}

} // namespace unit_schedule_generators
