// The planning passes (passes/Planning.h): partition tags every op, the
// tags survive the IR text, and schedule / split-stages run on a reparsed
// module give what the passes give in one run, for one and two stages per
// rank; plan-memory's peaks are codegen's, byte for byte.
#include "codegen/Codegen.h"
#include "frontend/OnnxImporter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "passes/Pass.h"
#include "passes/Planning.h"
#include "passes/MemoryPlan.h"
#include "passes/Recompute.h"
#include "ir/Verifier.h"
#include "passes/schedule/ScheduleCsv.h"

#include <gtest/gtest.h>

namespace unit_planning_passes {

using namespace cleave;
using namespace cleave::passes;

namespace {

std::unique_ptr<ir::Graph> gptTraining() {
  frontend::ImportOptions importOpts;
  importOpts.microbatchSize = 2;
  auto g = frontend::importOnnxFile(
      std::string(CLEAVE_SOURCE_DIR) + "/examples/gpt/gpt-tiny.onnx",
      importOpts);
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  PipelineOptions pipe;
  if (auto e = runPipeline(**g,
                           {"remove-identity", "dce", "autodiff",
                            "split-backward", "optimizer"},
                           pipe)) {
    ADD_FAILURE() << llvm::toString(std::move(e));
    return nullptr;
  }
  return std::move(*g);
}

// The printed module without the hint on finer layers, which only a
// searched split gets (as with --split-at, tags are a given split).
std::string moduleText(const PipelineModule &m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  printModule(m, os);
  os.flush();
  std::string out;
  llvm::SmallVector<llvm::StringRef, 64> lines;
  llvm::StringRef(s).split(lines, '\n');
  for (llvm::StringRef l : lines)
    if (!l.startswith("// hint:"))
      out += l.str() + "\n";
  return out;
}

// Partition, schedule and split in one module, and the same with the
// module printed and reparsed after partition.
void expectReparsedModuleAgrees(PlanningOptions o) {
  auto g = gptTraining();
  ASSERT_TRUE(g);
  PipelineModule whole(*g, o);
  ASSERT_FALSE(bool(runPlanningPasses(whole, planningPasses(), {})));

  auto g2 = gptTraining();
  ASSERT_TRUE(g2);
  PipelineModule first(*g2, o);
  ASSERT_FALSE(bool(partitionPass(first)));
  for (const auto &op : g2->ops())
    ASSERT_GE(op->stage(), 0) << op->describe();
  auto reparsed = ir::parseGraph(ir::printGraph(*g2), "module");
  ASSERT_TRUE(bool(reparsed)) << llvm::toString(reparsed.takeError());
  ASSERT_EQ((*reparsed)->ops().size(), g2->ops().size());
  for (size_t i = 0; i < g2->ops().size(); ++i)
    EXPECT_EQ((*reparsed)->ops()[i]->stage(), g2->ops()[i]->stage()) << i;

  PlanningOptions alone = o;
  alone.stagesGiven = false; // the tags say how many
  PipelineModule second(**reparsed, alone);
  ASSERT_FALSE(bool(schedulePass(second)));
  ASSERT_FALSE(bool(splitStagesPass(second)));
  ASSERT_FALSE(bool(planMemoryPass(second)));
  EXPECT_EQ(second.chunks, whole.chunks);
  EXPECT_EQ(second.stageCount(), whole.stageCount());
  EXPECT_EQ(schedule::scheduleToCsv(*second.schedule),
            schedule::scheduleToCsv(*whole.schedule));
  EXPECT_DOUBLE_EQ(second.sim->makespan, whole.sim->makespan);
  EXPECT_DOUBLE_EQ(second.sim->stepTime, whole.sim->stepTime);
  ASSERT_EQ(second.partition->stages.size(), whole.partition->stages.size());
  for (size_t s = 0; s < whole.partition->stages.size(); ++s) {
    const StageReport &a = whole.partition->stages[s],
                      &b = second.partition->stages[s];
    EXPECT_EQ(a.firstLayer, b.firstLayer);
    EXPECT_EQ(a.lastLayer, b.lastLayer);
    EXPECT_EQ(a.peakBytes, b.peakBytes);
    EXPECT_EQ(a.heldMicrobatches, b.heldMicrobatches);
  }
  ASSERT_EQ(second.stageGraphs.size(), whole.stageGraphs.size());
  for (size_t s = 0; s < whole.stageGraphs.size(); ++s)
    EXPECT_TRUE(ir::printGraph(*second.stageGraphs[s]) ==
                ir::printGraph(*whole.stageGraphs[s]))
        << "stage graph " << s;
  // What cleavec prints, from either module.
  EXPECT_TRUE(moduleText(second) == moduleText(whole));
}

TEST(PlanningPasses, ReparsedTagsGiveTheSamePlan) {
  PlanningOptions o;
  o.stages = 3;
  o.stagesGiven = true;
  o.microbatches = 4;
  o.schedule = "zb-h1";
  expectReparsedModuleAgrees(o);
}

TEST(PlanningPasses, ReparsedTagsGiveTheSamePlanWithTwoStagesPerRank) {
  PlanningOptions o;
  o.stages = 2;
  o.stagesGiven = true;
  o.chunks = 2;
  o.microbatches = 4;
  o.schedule = "zb-v";
  expectReparsedModuleAgrees(o);
}

TEST(PlanningPasses, TagsFollowTheLayersAndOrderOfStages) {
  auto g = gptTraining();
  ASSERT_TRUE(g);
  PlanningOptions o;
  o.stages = 2;
  o.stagesGiven = true;
  o.microbatches = 2;
  PipelineModule m(*g, o);
  ASSERT_FALSE(bool(partitionPass(m)));
  // Stage tags never decrease over the forward ops.
  int last = 0;
  for (const auto &op : g->ops())
    if (op->phase() == ir::Phase::Fwd) {
      EXPECT_GE(op->stage(), last) << op->describe();
      last = op->stage();
    }
  EXPECT_EQ(last, 1);
  // Moving one op of a layer to the other stage is refused by name.
  ir::Op *moved = nullptr;
  for (const auto &op : g->ops())
    if (op->phase() == ir::Phase::W && op->stage() == 1) {
      moved = op.get();
      break;
    }
  ASSERT_TRUE(moved);
  moved->setStage(0);
  PipelineModule again(*g, o);
  llvm::Error e = schedulePass(again);
  ASSERT_TRUE(bool(e));
  std::string msg = llvm::toString(std::move(e));
  EXPECT_NE(msg.find("has ops on stages 0 and 1"), std::string::npos) << msg;
}

// One memory planner: plan-memory's frame sizes and per-stage peaks are
// the plan's own, for one and two stages per rank, SGD and AdamW.
TEST(PlanningPasses, PlanMemoryPeaksAreThePlansPeaks) {
  struct Case {
    int stages, chunks;
    const char *schedule, *optimizer;
  };
  for (const Case &c : {Case{1, 0, "1f1b", "sgd"}, Case{3, 0, "zb-h1", "sgd"},
                        Case{2, 2, "zb-v", "adamw"},
                        Case{2, 2, "interleaved-1f1b", "sgd"}}) {
    frontend::ImportOptions importOpts;
    importOpts.microbatchSize = 2;
    auto g = frontend::importOnnxFile(
        std::string(CLEAVE_SOURCE_DIR) + "/examples/gpt/gpt-tiny.onnx",
        importOpts);
    ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
    PipelineOptions pipe;
    pipe.context.training.optimizer = c.optimizer;
    pipe.context.training.microbatches = 4;
    ASSERT_FALSE(bool(runPipeline(**g,
                                  {"remove-identity", "matmul-to-gemm", "dce",
                                   "autodiff", "split-backward", "optimizer"},
                                  pipe)));
    PlanningOptions o;
    o.stages = c.stages;
    o.stagesGiven = true;
    o.chunks = c.chunks;
    o.microbatches = 4;
    o.schedule = c.schedule;
    PipelineModule m(**g, o);
    ASSERT_FALSE(bool(runPlanningPasses(m, planningPasses(), {})));
    codegen::PlanInfo info;
    info.lossName = (*g)->outputs()[0]->name();
    info.optimizer = c.optimizer;
    info.lr = 0.01;
    info.referenceWeights = false;
    auto plan = codegen::buildPlan(m.stageGraphs, *m.schedule, info);
    ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
    ASSERT_EQ(plan->stages.size(), m.memory.size());
    for (size_t s = 0; s < m.memory.size(); ++s) {
      SCOPED_TRACE(std::string(c.schedule) + " stage " + std::to_string(s));
      EXPECT_EQ(m.memory[s].frameBytes, plan->stages[s].frameBytes);
      EXPECT_EQ(m.memory[s].stepFrameBytes, plan->stages[s].stepFrameBytes);
      EXPECT_EQ(m.memory[s].peakBytes, plan->stages[s].predictedPeakBytes);
      EXPECT_LE(m.memory[s].frameLivePeak, m.memory[s].frameBytes);
      EXPECT_GT(m.memory[s].frameLivePeak, 0);
      // The partitioner's sweep counts the same lifetimes on the training
      // graph, without the stage graph's Send and Recv: within 5%.
      EXPECT_NEAR(double(m.partition->stages[s].activationBytes),
                  double(m.memory[s].frameLivePeak),
                  0.05 * double(m.memory[s].frameLivePeak));
    }
  }
}

// The step's updates that the executor writes into their states' bytes
// take no room in the step frame: an SGD update and all three results of an
// AdamW; not an update whose state a later step op still reads (the old
// %t after its SGD), which keeps its place.
TEST(PlanningPasses, UpdatesWrittenInPlaceLeaveTheStepFrame) {
  auto g = ir::parseGraph(R"(graph @updates {
  input %g : f32[64]
  buffer %lr : f32[] = splat<0.1>
  buffer %step : f32[] = splat<1.0>
  param %a : f32[64] = splat<0.5>
  param %b : f32[64] = splat<0.5>
  param %t : f32[64] = splat<0.5>
  buffer %b.m : f32[64] = splat<0.0>
  buffer %b.v : f32[64] = splat<0.0>
  opt %a.next = SGD(%a, %g, %lr) {grad_scale = 1.0, weight_decay = 0.0} : f32[64] @"optimizer/a"
  opt %b.next, %b.m.next, %b.v.next = AdamW(%b, %g, %lr, %step, %b.m, %b.v) {beta1 = 0.9, beta2 = 0.999, epsilon = 1e-08, grad_scale = 1.0, weight_decay = 0.0} : f32[64], f32[64], f32[64] @"optimizer/b"
  opt %t.next = SGD(%t, %g, %lr) {grad_scale = 1.0, weight_decay = 0.0} : f32[64] @"optimizer/t"
  opt %t.old = Mul(%t, %g) : f32[64] @"after"
  update %a = %a.next
  update %b = %b.next
  update %b.m = %b.m.next
  update %b.v = %b.v.next
  update %t = %t.next
  output %t.old
})",
                          "test");
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
  auto value = [&](llvm::StringRef name) { return (*g)->lookup(name); };
  llvm::DenseSet<const ir::Value *> inPlace = updatedInPlace(**g);
  for (llvm::StringRef v : {"a.next", "b.next", "b.m.next", "b.v.next"})
    EXPECT_TRUE(inPlace.count(value(v))) << v.str();
  EXPECT_FALSE(inPlace.count(value("t.next")));
  StageFrames frames = planStageFrames(**g, nullptr);
  EXPECT_EQ(frames.inPlace.size(), 4u);
  // %t.next and %t.old, 256 bytes each and both live at the end, are laid
  // out; the rest is written into the states.
  EXPECT_EQ(frames.step.size, 512);
  for (llvm::StringRef v : {"a.next", "b.next", "b.v.next"})
    EXPECT_EQ(frames.offset.lookup(value(v)), 0) << v.str();
}

// A chain of scatters into one matrix (a loop filling it row by row) takes
// one buffer: each result is written over its operand, which nothing reads
// after; a scatter whose operand is read later, and one whose operand is
// the graph's input, get buffers of their own.
TEST(PlanningPasses, ScattersWriteOverADyingOperand) {
  auto g = ir::parseGraph(R"(graph @rows {
  input %x : f32[4,64]
  input %u : f32[1,64]
  buffer %i : i64[1,64] = splat<1>
  fwd %a = Relu(%x) : f32[4,64]
  fwd %s1 = ScatterElements(%a, %i, %u) {axis = 0, reduction = "none"} : f32[4,64]
  fwd %s2 = ScatterElements(%s1, %i, %u) {axis = 0, reduction = "none"} : f32[4,64]
  fwd %s3 = ScatterElements(%s2, %i, %u) {axis = 0, reduction = "none"} : f32[4,64]
  fwd %r = Reshape(%s3) {shape = [256]} : f32[256]
  fwd %t = ScatterElements(%s3, %i, %u) {axis = 0, reduction = "none"} : f32[4,64]
  fwd %y = Add(%t, %r) : f32[256]
  fwd %z = ScatterElements(%x, %i, %u) {axis = 0, reduction = "none"} : f32[4,64]
  output %y
  output %z
})",
                          "test");
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
  auto value = [&](llvm::StringRef name) { return (*g)->lookup(name); };
  StageFrames frames = planStageFrames(**g, nullptr);
  auto offset = [&](llvm::StringRef v) {
    return frames.offset.lookup(value(v));
  };
  for (llvm::StringRef v : {"s1", "s2", "s3", "r"}) {
    EXPECT_EQ(offset(v), offset("a")) << v.str();
    EXPECT_EQ(frames.sharesWith.lookup(value(v)), value("a")) << v.str();
  }
  // %s3's bytes are read after %t (through the view %r): %t gets its own.
  EXPECT_NE(offset("t"), offset("a"));
  EXPECT_FALSE(frames.sharesWith.count(value("t")));
  // %x is an input: %z does not write over it.
  EXPECT_FALSE(frames.sharesWith.count(value("z")));
}

} // namespace

// The pass manager's verifier catches a planning pass that breaks the
// module: a planted pass that moves an op to a later stage (behind the
// partition's back, or with it so that a forward value flows backwards),
// or one that puts a B before its F.
namespace {

llvm::Error retagBehindPartition(PipelineModule &m) {
  for (const auto &op : m.graph.ops())
    if (op->phase() == ir::Phase::Fwd && op->stage() == 0) {
      op->setStage(1);
      break;
    }
  return llvm::Error::success();
}

llvm::Error moveFirstForwardOpLast(PipelineModule &m) {
  // The first forward op of stage 0 whose result another forward op of
  // stage 0 reads goes to the last stage, in the partition too.
  auto readInStageZero = [](const ir::Value *v) {
    for (const ir::Use &u : v->uses())
      if (u.user->phase() == ir::Phase::Fwd && u.user->stage() == 0)
        return true;
    return false;
  };
  for (const auto &op : m.graph.ops())
    if (op->phase() == ir::Phase::Fwd && op->stage() == 0 &&
        !op->results().empty() && readInStageZero(op->results()[0])) {
      op->setStage(m.stageCount() - 1);
      m.partition->stageOfOp[op.get()] = m.stageCount() - 1;
      break;
    }
  return llvm::Error::success();
}

llvm::Error backwardFirst(PipelineModule &m) {
  auto &acts = m.schedule->actions[0];
  auto f = std::find_if(acts.begin(), acts.end(), [](const auto &a) {
    return a.kind == schedule::ActionKind::F;
  });
  auto b = std::find_if(acts.begin(), acts.end(), [&](const auto &a) {
    return (a.kind == schedule::ActionKind::B ||
            a.kind == schedule::ActionKind::BW) &&
           a.microbatch == f->microbatch;
  });
  std::iter_swap(f, b);
  return llvm::Error::success();
}

std::string plantedError(PlanningPassFn planted, const char *name,
                         bool afterSchedule) {
  auto g = gptTraining();
  if (!g)
    return "no graph";
  PlanningOptions o;
  o.stages = 2;
  o.stagesGiven = true;
  o.microbatches = 4;
  PipelineModule m(*g, o);
  std::vector<PlanningPassInfo> passes = {*lookupPlanningPass("partition")};
  if (afterSchedule)
    passes.push_back(*lookupPlanningPass("schedule"));
  passes.push_back({name, "planted", planted});
  llvm::Error e = runPlanningPasses(m, passes, {});
  return e ? llvm::toString(std::move(e)) : "";
}

} // namespace

TEST(PlanningPasses, VerifyEachCatchesAPassThatBreaksAStageTag) {
  std::string behind = plantedError(retagBehindPartition, "retag", false);
  EXPECT_NE(behind.find("invalid after pass retag"), std::string::npos)
      << behind;
  EXPECT_NE(behind.find("but the partition puts it in stage 0"),
            std::string::npos)
      << behind;
  std::string flow = plantedError(moveFirstForwardOpLast, "move-op", false);
  EXPECT_NE(flow.find("invalid after pass move-op"), std::string::npos)
      << flow;
  EXPECT_NE(flow.find("made in the later stage 1"), std::string::npos)
      << flow;
}

TEST(PlanningPasses, VerifyEachCatchesAPassThatBreaksTheSchedule) {
  std::string e = plantedError(backwardFirst, "b-first", true);
  EXPECT_NE(e.find("invalid after pass b-first: schedule"), std::string::npos)
      << e;
}

TEST(PlanningPasses, NoVerifyEachLetsThePlantedPassThrough) {
  auto g = gptTraining();
  ASSERT_TRUE(g);
  PlanningOptions o;
  o.stages = 2;
  o.stagesGiven = true;
  PipelineModule m(*g, o);
  PipelineOptions opts;
  opts.verifyEach = false;
  std::vector<PlanningPassInfo> passes = {
      *lookupPlanningPass("partition"), {"retag", "planted", retagBehindPartition}};
  EXPECT_FALSE(bool(runPlanningPasses(m, passes, opts)));
  EXPECT_TRUE(bool(verifyModule(m)));
}

// Recomputation is undone exactly: applying a policy and stripping it
// gives the graph back, text for text; applying it twice over a strip
// gives the same clones.
TEST(Recompute, StripGivesTheGraphBack) {
  auto g = gptTraining();
  ASSERT_TRUE(g);
  std::string before = ir::printGraph(*g);
  auto layers = groupLayers(*g, {});
  ASSERT_TRUE(bool(layers)) << llvm::toString(layers.takeError());
  for (StashPolicy p : {StashPolicy::Selective, StashPolicy::Full}) {
    StashStats st = applyStashPolicy(*g, p, *layers);
    EXPECT_GT(st.clonedOps, 0) << stashPolicyName(p);
    EXPECT_TRUE(hasRecomputation(*g));
    EXPECT_FALSE(bool(ir::verifyGraph(*g)));
    std::string once = ir::printGraph(*g);
    EXPECT_EQ(stripStashPolicy(*g), st.clonedOps);
    EXPECT_FALSE(hasRecomputation(*g));
    EXPECT_EQ(ir::printGraph(*g), before) << stashPolicyName(p);
    applyStashPolicy(*g, p, *layers);
    EXPECT_EQ(ir::printGraph(*g), once);
    stripStashPolicy(*g);
  }
  // Full makes more again than selective.
  StashStats sel = applyStashPolicy(*g, StashPolicy::Selective, *layers);
  stripStashPolicy(*g);
  StashStats full = applyStashPolicy(*g, StashPolicy::Full, *layers);
  EXPECT_GT(full.clonedOps, sel.clonedOps);
}

// Offload: every offloaded value's readers are Fetches, every backward
// reader of its layer reads a Fetch, the device value dies at its
// Offload, and stripping gives the graph back.
TEST(Offload, FetchesFeedTheBackwardAndStripGivesTheGraphBack) {
  auto g = gptTraining();
  ASSERT_TRUE(g);
  std::string before = ir::printGraph(*g);
  auto layers = groupLayers(*g, {});
  ASSERT_TRUE(bool(layers)) << llvm::toString(layers.takeError());
  StashStats st = applyStashPolicy(*g, StashPolicy::Offload, *layers);
  EXPECT_GT(st.offloadedValues, 0);
  EXPECT_EQ(st.clonedOps, 0);
  EXPECT_TRUE(hasOffload(*g));
  EXPECT_FALSE(bool(ir::verifyGraph(*g)));
  int offloads = 0, fetches = 0;
  for (const auto &op : g->ops()) {
    if (op->kind() == ir::OpKind::Offload) {
      ++offloads;
      EXPECT_EQ(op->phase(), ir::Phase::Fwd);
      for (const ir::Use &u : op->result()->uses())
        EXPECT_EQ(u.user->kind(), ir::OpKind::Fetch);
      // No backward op of the value's own layer reads the device copy.
      const ir::Value *v = op->operand(0);
      unsigned layer = layers->layerOfOp.lookup(v->definingOp());
      for (const ir::Use &u : v->uses())
        if (u.user->phase() != ir::Phase::Fwd) {
          EXPECT_NE(layers->layerOfOp.lookup(u.user), layer)
              << u.user->describe() << " reads " << v->name();
        }
    } else if (op->kind() == ir::OpKind::Fetch) {
      ++fetches;
      EXPECT_NE(op->phase(), ir::Phase::Fwd);
    }
  }
  EXPECT_EQ(offloads, st.offloadedValues);
  EXPECT_GE(fetches, offloads);
  // The frames: offloaded copies in the host arena, the device frame
  // smaller than keeping everything.
  StageFrames off = planStageFrames(*g, g->lookup("loss"));
  EXPECT_GT(off.host.size, 0);
  EXPECT_EQ(int64_t(off.inHost.size()), int64_t(offloads));
  EXPECT_EQ(stripStashPolicy(*g), offloads + fetches);
  EXPECT_FALSE(hasOffload(*g));
  EXPECT_EQ(ir::printGraph(*g), before);
  StageFrames kept = planStageFrames(*g, g->lookup("loss"));
  EXPECT_LT(off.micro.size, kept.micro.size);
  EXPECT_EQ(kept.host.size, 0);
}

} // namespace unit_planning_passes
