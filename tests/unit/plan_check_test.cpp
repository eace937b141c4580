// A plan is checked before it runs, completely (codegen/PlanCheck.h,
// runtime/PlanFile.h verifyRunnable): the edits of a plan that once passed
// verifyPlan and then crashed or hung cleave-run are each refused with a
// line naming the stage and what is wrong, while every plan cleavec makes
// passes.
#include "codegen/PlanCheck.h"
#include "runtime/PlanFile.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

#include <functional>

namespace unit_plan_check {

using namespace cleave;
using runtime::Instr;
using runtime::InstrKind;
using runtime::Plan;

namespace {

std::string checkText(const Plan &p) {
  if (auto e = runtime::verifyPlan(p))
    return "verifyPlan: " + llvm::toString(std::move(e));
  llvm::Error e = codegen::checkRunnable(p);
  return e ? llvm::toString(std::move(e)) : std::string();
}

const Plan &gptPlan() {
  static Plan plan = [] {
    auto p = testsupport::compileTrainingPlan("gpt", 2, 4, "zb-h1");
    EXPECT_TRUE(bool(p)) << (p ? "" : llvm::toString(p.takeError()));
    return p ? std::move(*p) : Plan();
  }();
  return plan;
}

// The first kernel of `op` in any program of any stage.
Instr *firstKernel(Plan &p, ir::OpKind op) {
  for (runtime::StagePlan &s : p.stages)
    for (auto &prog : s.programs)
      for (Instr &in : prog)
        if (in.kind == InstrKind::Kernel && in.op == op)
          return &in;
  return nullptr;
}

Instr *firstOf(Plan &p, int stage, runtime::Phase phase, InstrKind kind) {
  for (Instr &in : p.stages[size_t(stage)].programs[int(phase)])
    if (in.kind == kind)
      return &in;
  return nullptr;
}

// Applies `edit` to a copy of the GPT plan and expects the checks to refuse
// it with a message containing `want`.
void expectRefused(const std::string &what, std::function<bool(Plan &)> edit,
                   const std::string &want) {
  Plan p = gptPlan();
  ASSERT_TRUE(edit(p)) << what << ": the plan has nothing to edit";
  std::string got = checkText(p);
  EXPECT_NE(got.find(want), std::string::npos)
      << what << ": got '" << got << "'";
  EXPECT_EQ(got.find('\n'), std::string::npos) << got;
}

TEST(PlanCheck, EveryCompiledPlanPasses) {
  EXPECT_EQ(checkText(gptPlan()), "");
  for (const char *model : {"mlp", "cnn", "mlp_mse"})
    for (const char *schedule : {"1f1b", "zb-h1", "zb-h2", "gpipe"}) {
      auto p = testsupport::compileTrainingPlan(model, 2, 4, schedule);
      ASSERT_TRUE(bool(p)) << llvm::toString(p.takeError());
      EXPECT_EQ(checkText(*p), "") << model << " " << schedule;
    }
}

TEST(PlanCheck, KernelAttributesAndSlotTypesFitTheirOps) {
  expectRefused("a Transpose perm entry of 2^40", [](Plan &p) {
    Instr *in = firstKernel(p, ir::OpKind::Transpose);
    if (!in)
      return false;
    std::vector<int64_t> perm = in->attrs.at("perm").getInts();
    perm[0] = int64_t(1) << 40;
    in->attrs.insert_or_assign("perm", ir::Attribute(perm));
    return true;
  }, "Transpose");
  expectRefused("a Softmax axis of -1163265", [](Plan &p) {
    Instr *in = firstKernel(p, ir::OpKind::Softmax);
    if (!in)
      return false;
    in->attrs.insert_or_assign("axis", ir::Attribute(int64_t(-1163265)));
    return true;
  }, "Softmax");
  expectRefused("a LayerNormalization axis out of range", [](Plan &p) {
    Instr *in = firstKernel(p, ir::OpKind::LayerNormalization);
    if (!in)
      return false;
    in->attrs.insert_or_assign("axis", ir::Attribute(int64_t(7)));
    return true;
  }, "LayerNormalization");
  expectRefused("an Erf output slot pointed at a slot of another shape",
                [](Plan &p) {
                  for (runtime::StagePlan &s : p.stages)
                    for (auto &prog : s.programs)
                      for (Instr &in : prog) {
                        if (in.kind != InstrKind::Kernel ||
                            in.op != ir::OpKind::Erf)
                          continue;
                        for (size_t k = 0; k < s.slots.size(); ++k)
                          if (s.slots[k].kind == runtime::SlotKind::MicroTemp &&
                              s.slots[k].shape !=
                                  s.slots[size_t(in.outputs[0])].shape) {
                            in.outputs[0] = int(k);
                            return true;
                          }
                      }
                  return false;
                },
                "but the op makes");
}

TEST(PlanCheck, MemoryIsBoundedByTheFile) {
  expectRefused("a step_frame_bytes of 2^62", [](Plan &p) {
    p.stages[0].stepFrameBytes = int64_t(1) << 62;
    return true;
  }, "stage 0: frames of");
  expectRefused("a state slot without its blob", [](Plan &p) {
    for (runtime::Slot &sl : p.stages[1].slots)
      if (sl.kind == runtime::SlotKind::State) {
        sl.blob = -1;
        return true;
      }
    return false;
  }, "a state or constant slot without its blob");
}

// SGD writes each new parameter into the parameter's own bytes
// (runtime::stepUpdatesInPlace), so the step frame has no room for them;
// an update the executor would not write in place (here its value written
// a second time in the step) must have its room, or the plan is refused.
TEST(PlanCheck, UpdatesWrittenInPlaceNeedNoRoomElseTheyAreRefused) {
  const runtime::StagePlan &s = gptPlan().stages[0];
  std::vector<int> alias = runtime::stepUpdatesInPlace(s);
  ASSERT_FALSE(s.stepUpdates.empty());
  int64_t updateBytes = 0;
  for (const runtime::StateUpdate &u : s.stepUpdates) {
    EXPECT_EQ(alias[size_t(u.value)], u.state) << s.slots[u.value].name;
    updateBytes += s.slots[size_t(u.value)].bytes;
  }
  EXPECT_LT(s.stepFrameBytes, updateBytes);
  // (An update larger than what the frame holds for other values.)
  expectRefused("an SGD update written twice", [](Plan &p) {
    for (runtime::StagePlan &st : p.stages) {
      auto &step = st.programs[int(runtime::Phase::Step)];
      for (const Instr &in : step)
        if (in.kind == InstrKind::Kernel && in.op == ir::OpKind::SGD &&
            st.slots[size_t(in.outputs[0])].bytes > st.stepFrameBytes) {
          Instr again = in;
          step.push_back(again);
          return true;
        }
    }
    return false;
  }, "outside its frame");
}

TEST(PlanCheck, ASchedulethatCannotCompleteIsRefused) {
  expectRefused("a Send's tag changed", [](Plan &p) {
    Instr *in = firstOf(p, 0, runtime::Phase::F, InstrKind::Send);
    if (!in)
      return false;
    in->tag += 1000;
    return true;
  }, "the schedule cannot complete: stage 1");
  expectRefused("a Recv's tag changed in the step program", [](Plan &p) {
    for (int s = 0; s < 2; ++s)
      if (Instr *in = firstOf(p, s, runtime::Phase::Step, InstrKind::Recv)) {
        in->tag += 1000;
        return true;
      }
    // No message in the step: change a backward Recv instead.
    Instr *in = firstOf(p, 0, runtime::Phase::B, InstrKind::Recv);
    if (!in)
      return false;
    in->tag += 1000;
    return true;
  }, "that is never sent");
  expectRefused("stage 0's STEP action removed", [](Plan &p) {
    auto &acts = p.stages[0].actions;
    for (size_t i = 0; i < acts.size(); ++i)
      if (acts[i].kind == runtime::ActionKind::Step) {
        acts.erase(acts.begin() + long(i));
        return true;
      }
    return false;
  }, "stage 0 has 0 STEP actions");
  expectRefused("a received size that is not the sent one", [](Plan &p) {
    Instr *in = firstOf(p, 1, runtime::Phase::F, InstrKind::Recv);
    if (!in)
      return false;
    runtime::StagePlan &s = p.stages[1];
    for (size_t k = 0; k < s.slots.size(); ++k)
      if (s.slots[k].kind == runtime::SlotKind::MicroTemp &&
          s.slots[k].bytes != s.slots[size_t(in->outputs[0])].bytes) {
        in->outputs[0] = int(k);
        return true;
      }
    return false;
  }, "bytes from stage 0");
}

} // namespace

} // namespace unit_plan_check
