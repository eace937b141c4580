// The message order of rank pairs (runtime/comm/MessageOrder.h): which
// plans a transport that matches messages by order alone (NCCL's
// point-to-point) can carry. Every schedule's plan of the example GPT on 2
// and 4 ranks is checked, and a planted swap of two receives is caught.
#include "runtime/comm/MessageOrder.h"
#include "tools/Compile.h"

#include <gtest/gtest.h>

namespace unit_message_order {

using namespace cleave;

namespace {

llvm::Expected<runtime::Plan> gptPlan(const std::string &schedule,
                                      int ranks) {
  tools::CompileOptions o;
  o.model = std::string(CLEAVE_SOURCE_DIR) + "/examples/gpt/gpt-tiny.onnx";
  o.import.microbatchSize = 2;
  tools::PlanningRequest req;
  req.stages = ranks;
  req.stagesGiven = true;
  req.microbatches = 8;
  req.microbatchesGiven = true;
  req.schedule = schedule;
  req.layerDepth = 2;
  o.planning = req;
  auto r = tools::compile(o);
  if (!r)
    return r.takeError();
  return tools::buildRunnablePlan(*r, o, {});
}

const char *kSchedules[] = {"1f1b",      "1f1b-2bp",         "zb-h1",
                            "zb-h2",     "gpipe-2bp",        "interleaved-1f1b",
                            "zb-v",      "v-half",           "v-min",
                            "dualpipe-v"};

} // namespace

// One channel per stage pair carries every schedule's plan in order; one
// per rank pair only where each rank pair has one stage pair's messages
// each way (one stage per rank, or two ranks).
TEST(MessageOrder, EverySchedulesPlanSendsInTheOrderItReceives) {
  for (int ranks : {2, 4})
    for (const char *s : kSchedules) {
      auto plan = gptPlan(s, ranks);
      ASSERT_TRUE(bool(plan)) << s << ": " << llvm::toString(plan.takeError());
      runtime::RankPairOrder o = runtime::rankPairOrder(*plan);
      size_t messages = 0;
      for (const auto &v : o.sends)
        messages += v.size();
      EXPECT_GT(messages, 0u) << s;
      llvm::Error e =
          runtime::checkMessagesInOrder(*plan, runtime::Channel::StagePair);
      EXPECT_FALSE(bool(e)) << s << " on " << ranks
                            << " ranks: " << llvm::toString(std::move(e));
      llvm::Error byRank = runtime::checkMessagesInOrder(*plan);
      if (plan->stageRank.empty() || ranks == 2)
        EXPECT_FALSE(bool(byRank))
            << s << " on " << ranks << " ranks, by rank pair: "
            << llvm::toString(std::move(byRank));
      else
        llvm::consumeError(std::move(byRank));
    }
}

// By rank pair, a V schedule on 4 ranks interleaves the messages of two
// stage pairs differently at the two ends.
TEST(MessageOrder, VScheduleOnFourRanksNeedsAChannelPerStagePair) {
  auto plan = gptPlan("zb-v", 4);
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  llvm::Error e = runtime::checkMessagesInOrder(*plan);
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("out of the order"),
            std::string::npos);
}

TEST(MessageOrder, TwoReceivesSwappedAreCaught) {
  auto plan = gptPlan("1f1b", 2);
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  // Stage 1's first two actions that receive: swap those actions.
  runtime::StagePlan &s = plan->stages[1];
  std::vector<size_t> receiving;
  for (size_t i = 0; i < s.actions.size() && receiving.size() < 2; ++i)
    if (s.actions[i].kind == runtime::ActionKind::F)
      receiving.push_back(i);
  ASSERT_EQ(receiving.size(), 2u);
  std::swap(s.actions[receiving[0]], s.actions[receiving[1]]);
  llvm::Error e = runtime::checkMessagesInOrder(*plan);
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("rank 0 sends to rank 1 out of "
                                              "the order it receives"),
            std::string::npos);
}

} // namespace unit_message_order
