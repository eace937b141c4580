// Plans with several stages per rank: the placement and rank programs
// survive the plan file, and the checks refuse a program that names another
// rank's stage, leaves actions out, or cannot complete when the rank runs
// its stages one at a time.
#include "TestPlans.h"
#include "TestSupport.h"

#include "runtime/PlanFile.h"

#include <gtest/gtest.h>

namespace unit_rank_programs {

using namespace cleave;

namespace {

runtime::Plan zbvPlan() {
  auto plan = testsupport::compileTrainingPlan("gpt", 2, 4, "zb-v");
  if (!plan) {
    ADD_FAILURE() << llvm::toString(plan.takeError());
    return {};
  }
  return std::move(*plan);
}

std::string errorOf(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : "(success)";
}

TEST(RankPrograms, ZbVPlacesTwoStagesPerRankInAV) {
  runtime::Plan plan = zbvPlan();
  ASSERT_EQ(plan.stages.size(), 4u);
  EXPECT_EQ(plan.stageRank, (std::vector<int>{0, 1, 1, 0}));
  ASSERT_EQ(plan.rankPrograms.size(), 2u);
  EXPECT_EQ(runtime::rankCount(plan), 2);
  EXPECT_EQ(runtime::stagesOfRank(plan, 0), (std::vector<int>{0, 3}));
  // Rank 0 starts with stage 0's forward and ends with stage 0's work:
  // the microbatch's last backward is on stage 0.
  EXPECT_EQ(plan.rankPrograms[0].front(), 0);
  EXPECT_EQ(plan.rankPrograms[0].back(), 0);
  EXPECT_EQ(errorOf(runtime::verifyPlan(plan)), "(success)");
  EXPECT_EQ(errorOf(runtime::verifyRunnable(plan)), "(success)");
}

TEST(RankPrograms, SurviveThePlanFile) {
  runtime::Plan plan = zbvPlan();
  testsupport::TempDir dir;
  std::string path = dir.file("zbv.cplan");
  ASSERT_EQ(errorOf(runtime::writePlanFile(plan, path)), "(success)");
  auto back = runtime::readPlanFile(path);
  ASSERT_TRUE(bool(back)) << llvm::toString(back.takeError());
  EXPECT_EQ(back->stageRank, plan.stageRank);
  EXPECT_EQ(back->rankPrograms, plan.rankPrograms);
}

TEST(RankPrograms, BadProgramsAreRefused) {
  runtime::Plan plan = zbvPlan();
  {
    runtime::Plan p = plan;
    p.rankPrograms[0][0] = 1;
    EXPECT_EQ(errorOf(runtime::verifyPlan(p)),
              "invalid plan: rank 0's program names stage 1, which it does "
              "not run");
  }
  {
    runtime::Plan p = plan;
    p.rankPrograms[1].pop_back();
    EXPECT_NE(errorOf(runtime::verifyPlan(p)).find("rank 1's program runs"),
              std::string::npos);
  }
  {
    runtime::Plan p = plan;
    p.stageRank = {0, 1, 1, 2};
    EXPECT_EQ(errorOf(runtime::verifyPlan(p)),
              "invalid plan: the plan has 2 rank programs for 3 ranks");
  }
  {
    // Rank 0 runs all of stage 3 before stage 0: stage 3's first forward
    // waits for a microbatch stage 0 has not sent yet.
    runtime::Plan p = plan;
    std::vector<int> &prog = p.rankPrograms[0];
    std::stable_partition(prog.begin(), prog.end(),
                          [](int st) { return st == 3; });
    EXPECT_EQ(errorOf(runtime::verifyPlan(p)), "(success)");
    EXPECT_NE(errorOf(runtime::verifyRunnable(p)).find(
                  "the schedule cannot complete"),
              std::string::npos)
        << errorOf(runtime::verifyRunnable(p));
  }
}

} // namespace

} // namespace unit_rank_programs
