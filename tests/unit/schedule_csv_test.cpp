// PyTorch torch.distributed.pipelining CSV notation: export -> import gives
// the same schedule, both with and without messages; parse errors are one
// line with the place.
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"

#include <gtest/gtest.h>

namespace unit_schedule_csv {

using namespace cleave::passes;
using namespace cleave::passes::schedule;

TEST(ScheduleCsv, RoundTripEverySchedule) {
  for (const std::string &name : scheduleNames())
    for (bool computeOnly : {false, true}) {
      auto s = makeSchedule(name, 4, 8, PipelineCosts::uniform(4));
      ASSERT_TRUE(bool(s));
      auto back = scheduleFromCsv(scheduleToCsv(*s, computeOnly), "rt.csv",
                                  s->name);
      ASSERT_TRUE(bool(back)) << llvm::toString(back.takeError());
      EXPECT_EQ(*back, *s) << name << (computeOnly ? " compute only" : "");
    }
}

TEST(ScheduleCsv, WritesPyTorchNotation) {
  auto s = makeSchedule("1f1b-2bp", 2, 2, PipelineCosts::uniform(2));
  ASSERT_TRUE(bool(s));
  EXPECT_EQ(scheduleToCsv(*s, /*computeOnly=*/true),
            "0F0,0F1,0I0,0W0,0I1,0W1\n"
            "1F0,1I0,1F1,1I1,1W0,1W1\n");
  auto g = makeSchedule("gpipe", 2, 1, PipelineCosts::uniform(2));
  ASSERT_TRUE(bool(g));
  EXPECT_EQ(scheduleToCsv(*g),
            "0F0,0SEND_F0,0RECV_B0,0B0\n"
            "1RECV_F0,1F0,1B0,1SEND_B0\n");
}

TEST(ScheduleCsv, ReadsKindsAndPeers) {
  auto s = scheduleFromCsv("0F0,0SEND_F0,0RECV_B0,0I0,0W0\r\n"
                           "1RECV_F0, 1F0 ,1B0,1SEND_B0\r\n\n",
                           "x.csv");
  ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
  EXPECT_EQ(s->stages, 2);
  EXPECT_EQ(s->microbatches, 1);
  std::vector<Action> stage0 = {compute(ActionKind::F, 0),
                                Action{ActionKind::SendF, 0, 1},
                                Action{ActionKind::RecvB, 0, 1},
                                compute(ActionKind::B, 0),
                                compute(ActionKind::W, 0),
                                Action{ActionKind::Step, -1, -1}};
  EXPECT_EQ(s->actions[0], stage0);
  EXPECT_EQ(s->actions[1][2], compute(ActionKind::BW, 0));
  EXPECT_EQ(s->actions[1][3], (Action{ActionKind::SendB, 0, 0}));
}

TEST(ScheduleCsv, ParseErrorsNameThePlace) {
  auto err = [](const std::string &text) {
    auto s = scheduleFromCsv(text, "bad.csv");
    return s ? std::string("parsed") : llvm::toString(s.takeError());
  };
  EXPECT_EQ(err("0F0,0UNSHARD\n"),
            "bad.csv: line 1, cell 2: cannot read '0UNSHARD' (cleave reads F, "
            "I, W, B, SEND_F, RECV_F, SEND_B, RECV_B actions with a "
            "microbatch, e.g. 0F3)");
  EXPECT_EQ(err("F0\n"),
            "bad.csv: line 1, cell 1: cannot read 'F0' (expected "
            "<stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B><microbatch>, e.g. "
            "0F3)");
  EXPECT_EQ(err("0F0\n0F1\n"),
            "bad.csv: line 2, cell 1: '0F1' is for stage 0, which line 1 "
            "(rank 0) already runs; a stage runs on one rank");
  EXPECT_EQ(err("0F0\n2F0\n"),
            "bad.csv: no row has actions of stage 1 (the stages run 0..2)");
  EXPECT_EQ(err("\n"), "bad.csv: no schedule actions in the CSV");
  auto missing = readScheduleCsvFile("/nonexistent/s.csv");
  EXPECT_EQ(llvm::toString(missing.takeError()),
            "cannot open '/nonexistent/s.csv': No such file or directory");
}

} // namespace unit_schedule_csv
