// The compile driver (tools/Compile.h): what cleavec runs, called as a
// library. A planned compile gives one graph per stage and a plan that
// passes cleave-run's checks; planning an inference model is a usage error;
// recomputation chosen under a cap reaches the plan.
#include "tools/Compile.h"

#include <gtest/gtest.h>

namespace unit_compile_driver {

using namespace cleave;

namespace {

tools::CompileOptions gptTiny(int stages) {
  tools::CompileOptions o;
  o.model = std::string(CLEAVE_SOURCE_DIR) + "/examples/gpt/gpt-tiny.onnx";
  o.import.microbatchSize = 2;
  tools::PlanningRequest req;
  req.stages = stages;
  req.stagesGiven = true;
  req.microbatches = 4;
  req.microbatchesGiven = true;
  req.schedule = "zb-h1";
  o.planning = req;
  return o;
}

} // namespace

TEST(CompileDriver, PlansAndBuildsARunnablePlan) {
  tools::CompileOptions o = gptTiny(2);
  auto r = tools::compile(o);
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  EXPECT_TRUE(r->training);
  ASSERT_TRUE(r->plan);
  EXPECT_EQ(r->plan->stageGraphs.size(), 2u);
  EXPECT_EQ(r->plan->schedule.name, "zb-h1");
  EXPECT_FALSE(r->modelTensors.empty());
  auto plan = tools::buildRunnablePlan(*r, o, {});
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  EXPECT_EQ(plan->stages.size(), 2u);
  EXPECT_GT(plan->predictedStepTime, 0.0);
}

TEST(CompileDriver, PlanningAnInferenceModelIsAUsageError) {
  tools::CompileOptions o = gptTiny(2);
  o.inference = true;
  auto r = tools::compile(o);
  ASSERT_FALSE(bool(r));
  EXPECT_TRUE(r.errorIsA<tools::UsageError>());
  std::string why = llvm::toString(r.takeError());
  EXPECT_NE(why.find("needs a training graph"), std::string::npos) << why;
}

TEST(CompileDriver, NoPlanningWithoutARequest) {
  tools::CompileOptions o = gptTiny(2);
  o.planning.reset();
  auto r = tools::compile(o);
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  EXPECT_TRUE(r->training);
  EXPECT_FALSE(r->plan);
  for (const auto &op : r->graph->ops())
    EXPECT_EQ(op->stage(), -1);
}

TEST(CompileDriver, RecomputationReachesThePlan) {
  tools::CompileOptions o = gptTiny(2);
  o.planning->recompute = "full";
  auto r = tools::compile(o);
  ASSERT_TRUE(bool(r)) << llvm::toString(r.takeError());
  int clones = 0;
  for (const auto &stage : r->plan->stageGraphs)
    for (const auto &op : stage->ops())
      clones += op->attrs().count(ir::kRecomputeOfAttr);
  EXPECT_GT(clones, 0);
  EXPECT_NE(r->plan->text.find("recompute: full on every layer"),
            std::string::npos);
  auto plan = tools::buildRunnablePlan(*r, o, {});
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
}

} // namespace unit_compile_driver
