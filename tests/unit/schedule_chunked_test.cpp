// Schedules with several stages per rank (interleaved 1F1B, looped BFS,
// ZB-V, V-Half, V-Min, DualPipeV): the published bubble and memory at equal costs, the
// placement rules, the simulator's rank clocks and local messages, and the
// CSV notation with several stages in a row.
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/Simulator.h"
#include "passes/schedule/Validator.h"

#include <gtest/gtest.h>

namespace unit_schedule_chunked {

using namespace cleave::passes;
using namespace cleave::passes::schedule;

namespace {

// Each of the P x v stages does 1/v of a rank's unit of work.
PipelineCosts chunkCosts(int P, int v) {
  PipelineCosts c = PipelineCosts::uniform(P * v);
  for (StageCost &s : c.stages)
    s.f = s.b = s.w = 1.0 / v;
  return c;
}

struct Made {
  Schedule schedule;
  SimResult sim;
};

Made make(const std::string &name, int P, int v, int M) {
  PipelineCosts costs = chunkCosts(P, v);
  auto s = makeSchedule(name, P * v, M, costs, HeldCap(), v);
  if (!s) {
    ADD_FAILURE() << name << ": " << llvm::toString(s.takeError());
    return {};
  }
  if (auto e = validateSchedule(*s, costs, HeldCap()))
    ADD_FAILURE() << name << ": " << llvm::toString(std::move(e));
  auto r = simulate(*s, costs);
  if (!r) {
    ADD_FAILURE() << name << ": " << llvm::toString(r.takeError());
    return {};
  }
  return {std::move(*s), std::move(*r)};
}

std::string label(const std::string &name, int P, int v, int M) {
  return name + " P=" + std::to_string(P) + " v=" + std::to_string(v) +
         " M=" + std::to_string(M);
}

int rankPeak(const SimResult &r) {
  int peak = 0;
  for (const RankStats &rk : r.ranks)
    peak = std::max(peak, rk.peakActivationMicrobatches);
  return peak;
}

// P ranks, rank r running stages r and 2P-1-r.
void expectVPlacement(const Schedule &s, int P, const std::string &at) {
  ASSERT_EQ(rankCount(s), P) << at;
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(rankOfStage(s, r), r) << at;
    EXPECT_EQ(rankOfStage(s, 2 * P - 1 - r), r) << at;
  }
}

TEST(ChunkedSchedules, InterleavedMatchesMegatronsBubbleAndMemory) {
  for (int P : {2, 4, 8})
    for (int v : {2, 3, 4})
      for (int M : {P, 2 * P, 4 * P}) {
        Made m = make("interleaved-1f1b", P, v, M);
        std::string at = label("interleaved-1f1b", P, v, M);
        ASSERT_EQ(rankCount(m.schedule), P) << at;
        // Every rank does 3 units per microbatch; the bubble is (P-1)/(vM +
        // P - 1) of the step: the step is 3M (vM + P - 1) / (vM).
        double busy = 3.0 * M;
        EXPECT_NEAR(m.sim.stepTime, busy * (v * M + P - 1) / (v * M), 1e-9) << at;
        EXPECT_NEAR(m.sim.ranks[0].bubble, double(P - 1) / (v * M + P - 1), 1e-9)
            << at;
        // Rank 0 holds its warm-up forwards plus one.
        EXPECT_EQ(m.sim.ranks[0].peakActivationMicrobatches,
                  std::min(2 * (P - 1) + (v - 1) * P + 1, v * M))
            << at;
        // Less bubble than 1F1B's (P-1)/(M+P-1).
        Made base = make("1f1b", P, 1, M);
        EXPECT_LT(m.sim.stepTime, base.sim.stepTime) << at;
      }
}

TEST(ChunkedSchedules, LoopedHoldsEveryMicrobatchOfEveryStage) {
  for (int P : {2, 4})
    for (int v : {2, 4}) {
      int M = 2 * P;
      Made m = make("looped-bfs", P, v, M);
      for (const RankStats &rk : m.sim.ranks)
        EXPECT_EQ(rk.peakActivationMicrobatches, v * M) << label("looped-bfs", P, v, M);
      Made split = make("looped-bfs-2bp", P, v, M);
      EXPECT_LE(split.sim.stepTime, m.sim.stepTime) << label("looped-bfs-2bp", P, v, M);
    }
}

TEST(ChunkedSchedules, ZbVKeepsOneFOneBMemoryWithLessBubbleThanZbH1) {
  for (int P : {2, 4, 8})
    for (int M : {P, 2 * P, 4 * P}) {
      std::string at = label("zb-v", P, 2, M);
      Made v = make("zb-v", P, 2, M);
      expectVPlacement(v.schedule, P, at);
      // 1F1B's peak, P microbatches of a whole rank's share: 2P of a
      // half-size stage.
      EXPECT_LE(rankPeak(v.sim), 2 * std::min(P, M)) << at;
      Made h1 = make("zb-h1", P, 1, M);
      EXPECT_LE(v.sim.stepTime, h1.sim.stepTime) << at;
      // Under cleave's count (a microbatch held until its W) what is left
      // of the bubble is at most (P-1) half-size forwards and backwards.
      EXPECT_LE(v.sim.stepTime, 3.0 * M + (P - 1) * 1.0 + 1e-9) << at;
      Made half = make("v-half", P, 2, M);
      EXPECT_LE(rankPeak(half.sim), std::min(P + 2, 2 * M)) << label("v-half", P, 2, M);
      Made base = make("1f1b", P, 1, M);
      if (P > 2) {
        EXPECT_LT(half.sim.stepTime, base.sim.stepTime) << label("v-half", P, 2, M);
      }
    }
}

// V-Min at equal costs: the published (P+4)/3 microbatches of a rank's
// share on the fullest rank (about 1/3 of 1F1B's P, less than V-Half's),
// no idle time in the steady state (the step grows by 3 units per
// microbatch) and under 2P - 1 units of idle time in all, where 1F1B idles
// 3(P-1) and the published V-Min's bubble is about 2P/(3M) of the step's
// work (2P units).
TEST(ChunkedSchedules, VMinHoldsAThirdOfOneFOneBsActivations) {
  for (int P : {2, 3, 4, 5, 6, 8})
    for (int M : {P, 2 * P, 4 * P}) {
      std::string at = label("v-min", P, 2, M);
      Made v = make("v-min", P, 2, M);
      expectVPlacement(v.schedule, P, at);
      EXPECT_EQ(rankPeak(v.sim), 2 * ((P + 4) / 3)) << at;
      Made base = make("1f1b", P, 1, M);
      int oneFOneB = 0;
      for (const StageStats &st : base.sim.stages)
        oneFOneB = std::max(oneFOneB, st.peakActivationMicrobatches);
      EXPECT_EQ(oneFOneB, P) << at;
      if (P >= 3) {
        EXPECT_LT(rankPeak(v.sim), rankPeak(make("v-half", P, 2, M).sim)) << at;
      }
      EXPECT_LE(v.sim.stepTime, 3.0 * M + 2 * P - 1 + 1e-9) << at;
      EXPECT_LT(v.sim.stepTime, base.sim.stepTime) << at;
      EXPECT_EQ(v.sim.makespan, v.sim.stepTime) << at;
      if (M > P) {
        Made fewer = make("v-min", P, 2, M - 1);
        EXPECT_DOUBLE_EQ(v.sim.stepTime - fewer.sim.stepTime, 3.0) << at;
      }
    }
}

// The order is fixed at equal costs; other costs change when actions run
// but not what is held, and the schedule stays valid.
TEST(ChunkedSchedules, VMinKeepsItsMemoryUnderOtherCosts) {
  PipelineCosts costs = chunkCosts(4, 2);
  for (StageCost &c : costs.stages)
    c.b *= 2, c.w *= 0.5;
  costs.stages[3].f *= 3;
  auto s = makeSchedule("v-min", 8, 8, costs, HeldCap(), 2);
  ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
  EXPECT_FALSE(bool(validateSchedule(*s, costs, HeldCap(size_t(8), 3))));
  auto r = simulate(*s, costs);
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  EXPECT_EQ(rankPeak(*r), 4);
}

// DualPipeV at equal costs (each half-size stage F = B = W = 1/2, F&B
// run as F then the full backward, 3/2): the published bubble
// (PP/2 - 1)(F&B + B - 3W) = (P-1)/2 and PP + 1 = 2P + 1 half-size
// microbatches held on every rank; M forwards and backwards per chunk in
// its eight phases; never slower than zb-v, faster from P = 8.
TEST(ChunkedSchedules, DualPipeVMatchesItsPublishedBubbleAndMemory) {
  for (int P : {2, 4, 8})
    for (int M : {2 * P, 3 * P, 4 * P}) {
      std::string at = label("dualpipe-v", P, 2, M);
      Made d = make("dualpipe-v", P, 2, M);
      expectVPlacement(d.schedule, P, at);
      EXPECT_NEAR(d.sim.stepTime, 3.0 * M + 0.5 * (P - 1), 1e-9) << at;
      for (const RankStats &rk : d.sim.ranks)
        EXPECT_EQ(rk.peakActivationMicrobatches, 2 * P + 1) << at;
      // Phase 1 on rank 0: 2(P-1) forwards of stage 0 before anything else.
      auto programs = rankPrograms(d.schedule);
      int leading = 0;
      for (const RankAction &a : programs[0]) {
        const Action &act = d.schedule.actions[a.stage][a.index];
        if (isComm(act.kind))
          continue;
        if (act.kind != ActionKind::F || a.stage != 0)
          break;
        ++leading;
      }
      EXPECT_EQ(leading, 2 * (P - 1) + 1) << at; // phase 2 starts with F 0
      Made v = make("zb-v", P, 2, M);
      EXPECT_LE(d.sim.stepTime, v.sim.stepTime + 1e-9) << at;
      if (P == 8) {
        EXPECT_LT(d.sim.stepTime, v.sim.stepTime) << at;
      }
    }
  PipelineCosts costs = chunkCosts(4, 2);
  auto few = makeSchedule("dualpipe-v", 8, 6, costs, HeldCap(), 2);
  EXPECT_EQ(llvm::toString(few.takeError()),
            "schedule 'dualpipe-v' needs at least twice as many microbatches "
            "as ranks (8), not 6");
}

TEST(ChunkedSchedules, LocalMessagesTakeNoTime) {
  // Slow links: the V's turn (stages P-1 and P on the last rank) and the
  // loss's turn back are local, so zb-v crosses fewer links than 1f1b.
  PipelineCosts costs = chunkCosts(2, 2);
  costs.linkLatency = 10;
  auto s = makeSchedule("zb-v", 4, 4, costs, HeldCap(), 2);
  ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
  auto r = simulate(*s, costs);
  ASSERT_TRUE(bool(r));
  const auto &list = s->actions[1];
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i].kind == ActionKind::SendF) { // stage 1 -> 2, both on rank 1
      EXPECT_DOUBLE_EQ(r->spans[1][i].end, r->spans[1][i].start);
    }
}

TEST(ChunkedSchedules, RejectsBadRequests) {
  PipelineCosts c4 = chunkCosts(2, 2);
  auto odd = makeSchedule("zb-v", 4, 4, c4, HeldCap(), 4);
  EXPECT_EQ(llvm::toString(odd.takeError()),
            "schedule 'zb-v' runs 2 stages per rank in a V, not 4");
  auto one = makeSchedule("1f1b", 4, 4, c4, HeldCap(), 2);
  EXPECT_EQ(llvm::toString(one.takeError()),
            "schedule '1f1b' runs one stage per rank; --chunks 2 needs one of "
            "interleaved-1f1b, interleaved-1f1b-2bp, looped-bfs, "
            "looped-bfs-2bp, zb-v, v-half, v-min, dualpipe-v");
  auto mb = makeSchedule("interleaved-1f1b", 4, 3, c4, HeldCap(), 2);
  EXPECT_EQ(llvm::toString(mb.takeError()),
            "schedule 'interleaved-1f1b' needs the microbatches (3) to be a "
            "multiple of the ranks (2)");
  PipelineCosts c6 = chunkCosts(3, 2);
  auto split = makeSchedule("looped-bfs", 6, 4, c6, HeldCap(), 4);
  EXPECT_EQ(llvm::toString(split.takeError()),
            "6 stages do not split into 4 per rank");
}

TEST(ChunkedSchedules, ValidatorChecksThePlacement) {
  PipelineCosts costs = chunkCosts(2, 2);
  auto s = makeSchedule("interleaved-1f1b", 4, 4, costs, HeldCap(), 2);
  ASSERT_TRUE(bool(s));
  Schedule moved = *s;
  moved.order[0][0] = 1; // stage 1 runs on rank 1
  EXPECT_EQ(llvm::toString(validateSchedule(moved, costs, HeldCap())),
            "rank 0's program names stage 1, which rank 1 runs");
  Schedule empty = *s;
  empty.rankOf = {0, 2, 0, 2};
  empty.order.push_back({});
  EXPECT_EQ(llvm::toString(validateSchedule(empty, costs, HeldCap())),
            "rank 1 runs no stage");
  Schedule lateStep = *s;
  // Rank 0's program: put its first STEP before its last action.
  auto &prog = lateStep.order[0];
  std::vector<size_t> count(4, 0);
  size_t stepAt = 0;
  for (size_t k = 0; k < prog.size(); ++k) {
    int st = prog[k];
    if (lateStep.actions[st][count[st]++].kind == ActionKind::Step) {
      stepAt = k;
      break;
    }
  }
  // The last action of stage prog[stepAt] is its STEP; move every entry of
  // the other stage after it.
  int stepped = prog[stepAt];
  std::stable_partition(prog.begin(), prog.end(),
                        [&](int st) { return st == stepped; });
  EXPECT_NE(llvm::toString(validateSchedule(lateStep, costs, HeldCap()))
                .find("a rank's STEPs come after all its other actions"),
            std::string::npos);
}

TEST(ChunkedSchedules, CsvRoundTripKeepsThePlacement) {
  for (const std::string &name : chunkedScheduleNames()) {
    PipelineCosts costs = chunkCosts(4, 2);
    auto s = makeSchedule(name, 8, 8, costs, HeldCap(), 2);
    ASSERT_TRUE(bool(s)) << name;
    auto back = scheduleFromCsv(scheduleToCsv(*s), "x.csv", s->name);
    ASSERT_TRUE(bool(back)) << llvm::toString(back.takeError());
    EXPECT_EQ(*back, *s) << name;
    // PyTorch's compute-only form gets the same messages inserted.
    auto compute = scheduleFromCsv(scheduleToCsv(*s, true), "x.csv", s->name);
    ASSERT_TRUE(bool(compute)) << llvm::toString(compute.takeError());
    EXPECT_EQ(*compute, *s) << name;
  }
  // Row 0 holds stages 0 and 3 of a 2-rank V.
  auto v = scheduleFromCsv("0F0,3F0,3I0,3W0,0I0,0W0\n1F0,2F0,2I0,1I0,2W0,1W0\n",
                           "v.csv");
  ASSERT_TRUE(bool(v)) << llvm::toString(v.takeError());
  EXPECT_EQ(v->stages, 4);
  EXPECT_EQ(rankCount(*v), 2);
  EXPECT_EQ(rankOfStage(*v, 3), 0);
  EXPECT_FALSE(bool(validateSchedule(*v, PipelineCosts::uniform(4), HeldCap())));
}

} // namespace

namespace {

TEST(ChunkedSchedules, AutoIsTheFastestOfTheChunkedOnes) {
  for (int P : {2, 4})
    for (int M : {P, 2 * P}) {
      Made best = make("auto", P, 2, M);
      ASSERT_EQ(rankCount(best.schedule), P);
      for (const std::string &name : chunkedScheduleNames()) {
        if (name == "dualpipe-v" && M < 2 * P)
          continue; // not a candidate (M >= 2P)
        EXPECT_LE(best.sim.stepTime, make(name, P, 2, M).sim.stepTime)
            << label(name, P, 2, M);
      }
    }
}

} // namespace

} // namespace unit_schedule_chunked
