// The validator on hand-made schedules (written in PyTorch's CSV notation,
// which ScheduleCsv reads): each broken rule gives its one-line message.
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/Validator.h"

#include <gtest/gtest.h>

#include <climits>

namespace unit_schedule_validator {

using namespace cleave::passes;
using namespace cleave::passes::schedule;

namespace {

// The validator's message for the schedule in `csv` ("" if it is valid).
std::string problem(const std::string &csv, std::optional<int> cap = {}) {
  auto s = scheduleFromCsv(csv, "test.csv");
  if (!s)
    return "parse: " + llvm::toString(s.takeError());
  llvm::Error e = validateSchedule(*s, PipelineCosts::uniform(s->stages), cap);
  return e ? llvm::toString(std::move(e)) : "";
}

} // namespace

TEST(ScheduleValidator, AcceptsPyTorchNotation) {
  // Compute only (messages are inserted), B = full backward, I/W = 2BP,
  // empty cells are idle slots.
  EXPECT_EQ(problem("0F0,0F1,,0B0,0B1\n1F0,1B0,1F1,1B1\n"), "");
  EXPECT_EQ(problem("0F0,0F1,0I0,0I1,0W0,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n"), "");
  // With messages spelled out.
  EXPECT_EQ(problem("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
            "");
}

TEST(ScheduleValidator, WeightGradientBeforeInputGradient) {
  EXPECT_EQ(problem("0F0,0F1,0W0,0I0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n"),
            "stage 0, action 4 (W0): W of microbatch 0 before its B");
}

TEST(ScheduleValidator, BackwardBeforeForward) {
  EXPECT_EQ(problem("0I0,0F0,0W0\n"),
            "stage 0, action 0 (B0): B of microbatch 0 before its F");
}

TEST(ScheduleValidator, MissingAndRepeatedWork) {
  EXPECT_EQ(problem("0F0,0I0\n"), "stage 0: microbatch 0 has no W");
  EXPECT_EQ(problem("0F0,0F1,0B0\n"), "stage 0: microbatch 1 has no B");
  EXPECT_EQ(problem("0F0,0B0,0W0\n"),
            "stage 0, action 2 (W0): W of microbatch 0 again (each "
            "microbatch has one F, then one B and one W or one BW)");
}

TEST(ScheduleValidator, MissingRecv) {
  EXPECT_EQ(problem("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1B0,1SEND_B0\n"),
            "stage 1, action 0 (F0): F of microbatch 0 has no RECV_F from "
            "stage 0 before it");
  EXPECT_EQ(problem("0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
            "stage 0, action 2 (BW0): BW of microbatch 0 has no RECV_B from "
            "stage 1 before it");
}

TEST(ScheduleValidator, RepeatedMessage) {
  EXPECT_EQ(problem("0F0,0SEND_F0,0SEND_F0,0RECV_B0,0B0\n"
                    "1RECV_F0,1F0,1B0,1SEND_B0\n"),
            "stage 0, action 2 (SEND_F0): SEND_F0 appears twice");
}

TEST(ScheduleValidator, MessageToNoStage) {
  EXPECT_EQ(problem("0F0,0SEND_F0,0B0\n"),
            "stage 0, action 1 (SEND_F0): SEND_F on the last stage has no "
            "stage to talk to");
}

TEST(ScheduleValidator, DeadlockCycle) {
  // Stage 0 waits for a gradient before it has sent the activations that
  // stage 1 waits for.
  EXPECT_EQ(problem("0RECV_B0,0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"),
            "deadlock under blocking point-to-point: stage 0, action 0 "
            "(RECV_B0) waits for stage 1; stage 1, action 0 (RECV_F0) waits "
            "for stage 0");
}

TEST(ScheduleValidator, RecvAfterItsUseIsRejectedBeforeSimulating) {
  EXPECT_EQ(problem("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n"),
            "stage 1, action 0 (F0): F of microbatch 0 has no RECV_F from "
            "stage 0 before it");
}

TEST(ScheduleValidator, MemoryCap) {
  auto s = makeSchedule("1f1b", 4, 8, PipelineCosts::uniform(4));
  ASSERT_TRUE(bool(s));
  EXPECT_FALSE(bool(validateSchedule(*s, PipelineCosts::uniform(4), 4)));
  llvm::Error e = validateSchedule(*s, PipelineCosts::uniform(4), 3);
  EXPECT_EQ(llvm::toString(std::move(e)),
            "stage 0, action 6 (F3): 4 microbatches of activations held, "
            "above the memory cap of 3");
}

// A cap per stage: 1F1B's stage s holds P - s microbatches, so 4, 3, 2, 1
// fits exactly; one less on stage 2 does not, whatever the other stages
// may hold.
TEST(ScheduleValidator, MemoryCapPerStage) {
  auto s = makeSchedule("1f1b", 4, 8, PipelineCosts::uniform(4));
  ASSERT_TRUE(bool(s));
  PipelineCosts c = PipelineCosts::uniform(4);
  EXPECT_FALSE(bool(validateSchedule(*s, c, HeldCap{4, 3, 2, 1})));
  EXPECT_EQ(llvm::toString(validateSchedule(*s, c, HeldCap{99, 99, 1, 99})),
            "stage 2, action 4 (F1): 2 microbatches of activations held, "
            "above the memory cap of 1");
  // What a byte cap leaves each stage: (cap - static) / activation.
  c.stages[0].activationBytes = 10;
  c.stages[0].staticBytes = 5;
  c.stages[1].activationBytes = 0;
  EXPECT_EQ(heldCapFor(c, 45)[0], 4);
  EXPECT_EQ(heldCapFor(c, 45)[1], INT_MAX);
  EXPECT_EQ(heldCapFor(c, 4)[0], 0);
}

TEST(ScheduleValidator, StepMustBeLast) {
  Schedule s{"hand", 1, 1,
             {{compute(ActionKind::F, 0), Action{ActionKind::Step, -1, -1},
               compute(ActionKind::BW, 0)}}};
  EXPECT_EQ(llvm::toString(validateSchedule(s, PipelineCosts::uniform(1))),
            "stage 0, action 1 (STEP): STEP must be the stage's last action");
}

TEST(ScheduleValidator, EveryGeneratedScheduleIsValid) {
  for (int P : {1, 2, 3, 4, 8})
    for (int M : {1, 2, 5, 16})
      for (const std::string &name : scheduleNames()) {
        auto s = makeSchedule(name, P, M, PipelineCosts::uniform(P));
        ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
        EXPECT_FALSE(bool(validateSchedule(*s, PipelineCosts::uniform(P))))
            << name << " P=" << P << " M=" << M;
      }
}

} // namespace unit_schedule_validator
