// The simulator's link and memory model, its deadlock report, and the
// outputs made from a simulation: report JSON, Chrome trace, SVG Gantt.
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Simulator.h"
#include "passes/schedule/Timeline.h"

#include "llvm/Support/JSON.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace unit_schedule_simulator {

using namespace cleave::passes;
using namespace cleave::passes::schedule;
using ::testing::HasSubstr;

namespace {

Schedule make(const std::string &name, int P, int M,
              const PipelineCosts &costs) {
  auto s = makeSchedule(name, P, M, costs);
  EXPECT_TRUE(bool(s)) << llvm::toString(s.takeError());
  return s ? *s : Schedule{};
}

SimResult sim(const Schedule &s, const PipelineCosts &costs) {
  auto r = simulate(s, costs);
  EXPECT_TRUE(bool(r)) << llvm::toString(r.takeError());
  return r ? *r : SimResult{};
}

// Two stages of unequal F, B and W (stage 0 with an update), and their
// work over 4 microbatches: what one shared core takes for a step.
PipelineCosts unevenStages() {
  PipelineCosts costs = PipelineCosts::uniform(2);
  costs.stages[0] = StageCost{1, 2, 0.5};
  costs.stages[1] = StageCost{1.5, 1, 0.75};
  costs.stages[0].step = 0.25;
  costs.bwSendsAfterB = true;
  return costs;
}
constexpr double kUnevenWork = 4 * (1 + 2 + 0.5 + 1.5 + 1 + 0.75) + 0.25;

} // namespace

TEST(ScheduleSimulator, LinkLatencyAndBandwidth) {
  PipelineCosts costs = PipelineCosts::uniform(2);
  costs.linkLatency = 0.5;
  costs.linkBytesPerUnit = 100;
  costs.stages[0].sendBytes = 100; // activations: 0.5 + 1 to arrive
  costs.stages[1].recvBytes = 200; // its input's gradient: 0.5 + 2
  Schedule s = make("1f1b", 2, 1, costs);
  SimResult r = sim(s, costs);
  // Stage 0: F0 [0,1]; stage 1: F0 [2.5,3.5], BW0 [3.5,5.5]; stage 0: BW0
  // after the gradient arrives at 8, until 10.
  EXPECT_DOUBLE_EQ(r.stages[1].start, 2.5);
  EXPECT_DOUBLE_EQ(r.stages[1].finish, 5.5);
  EXPECT_DOUBLE_EQ(r.stages[0].finish, 10);
  EXPECT_DOUBLE_EQ(r.makespan, 10);
  EXPECT_DOUBLE_EQ(r.stepTime, 10);
  EXPECT_DOUBLE_EQ(r.stages[0].bubble, 0.7); // busy 1 + 2 of 10
  // Sent when BW0's B part ends (cleave's runtime), the gradient leaves at
  // 4.5 and arrives at 7; stage 0's BW0 runs until 9.
  costs.bwSendsAfterB = true;
  r = sim(s, costs);
  EXPECT_DOUBLE_EQ(r.stages[0].finish, 9);
  EXPECT_DOUBLE_EQ(r.stepTime, 9);
  EXPECT_DOUBLE_EQ(r.stages[0].bubble, 6.0 / 9); // busy 1 + 2 of 9
}

// A message to a stage arrives its recvLatency (a profile's measured delay
// of that stage's waiting receives) after the link delivers it, on top of
// the link's latency.
TEST(ScheduleSimulator, ReceivingStagesLatency) {
  PipelineCosts costs = PipelineCosts::uniform(2);
  costs.linkLatency = 0.5;
  costs.stages[1].recvLatency = 0.25; // the activations: 0.75 to arrive
  costs.stages[0].recvLatency = 1;    // the gradient: 1.5
  Schedule s = make("1f1b", 2, 1, costs);
  SimResult r = sim(s, costs);
  // Stage 0: F0 [0,1]; stage 1: F0 [1.75,2.75], BW0 [2.75,4.75]; stage 0:
  // BW0 from 6.25 to 8.25.
  EXPECT_DOUBLE_EQ(r.stages[1].start, 1.75);
  EXPECT_DOUBLE_EQ(r.stages[1].finish, 4.75);
  EXPECT_DOUBLE_EQ(r.stages[0].finish, 8.25);
  EXPECT_DOUBLE_EQ(r.stepTime, 8.25);
}

// A stage's update (its STEP action) takes the stage's step time after its
// last backward action; the next step's F waits for it.
TEST(ScheduleSimulator, StepTakesTheStagesUpdateTime) {
  PipelineCosts costs = PipelineCosts::uniform(2);
  Schedule s = make("1f1b", 2, 2, costs);
  SimResult before = sim(s, costs);
  costs.stages[0].step = 0.25;
  costs.stages[1].step = 3;
  SimResult r = sim(s, costs);
  EXPECT_DOUBLE_EQ(r.stages[0].finish, before.stages[0].finish + 0.25);
  EXPECT_DOUBLE_EQ(r.stages[1].finish, before.stages[1].finish + 3);
  EXPECT_DOUBLE_EQ(r.stages[1].busy, before.stages[1].busy + 3);
  EXPECT_DOUBLE_EQ(r.makespan,
                   std::max(before.stages[0].finish + 0.25,
                            before.stages[1].finish + 3));
  EXPECT_GT(r.stepTime, before.stepTime);
}

// Ranks sharing fewer cores than there are of them (a busy machine:
// PipelineCosts::sharedCores): while k compute, each runs at
// min(1, cores / k) of its speed. With one core and free messages the core
// never idles while work is left, so the step is all the work, whatever the
// schedule; with as many cores as ranks nothing changes. Steps that overlap:
// the period is what the steps after one add (each rank going on as soon as
// its own part is done), the step's work on one core, never less than the
// work spread over the cores.
TEST(ScheduleSimulator, RanksSharingCores) {
  PipelineCosts costs = unevenStages();
  const double work = kUnevenWork;
  for (const char *name : {"1f1b", "zb-h1", "gpipe", "zb-h2"}) {
    SCOPED_TRACE(name);
    Schedule s = make(name, 2, 4, costs);
    SimResult own = sim(s, costs);
    PipelineCosts shared = costs;
    shared.sharedCores = 2;
    SimResult two = sim(s, shared);
    EXPECT_DOUBLE_EQ(two.makespan, own.makespan);
    shared.sharedCores = 1;
    SimResult one = sim(s, shared);
    EXPECT_NEAR(one.makespan, work, 1e-9);
    EXPECT_NEAR(one.stepTime, work, 1e-9);
    EXPECT_GT(one.makespan, own.makespan);
    // Each stage computes for its work at least; busy counts the time its
    // actions took, slowed.
    EXPECT_GE(one.stages[0].busy, 4 * 3.5 + 0.25 - 1e-9);
    EXPECT_GE(one.stages[1].busy, 4 * 3.25 - 1e-9);
    // In between, between the two.
    shared.sharedCores = 1.5;
    SimResult between = sim(s, shared);
    EXPECT_GT(between.makespan, own.makespan);
    EXPECT_LT(between.makespan, one.makespan);
    EXPECT_GE(between.stepTime, work / 1.5 - 1e-9);
    EXPECT_LE(between.stepTime, between.makespan + 1e-9);
    EXPECT_EQ(between.stages[0].peakActivationMicrobatches,
              own.stages[0].peakActivationMicrobatches);
  }
}

// One microbatch, one core shared by two stages: stage 0's F runs alone
// at full speed, then stage 1's F and BW alone, then stage 0's BW: nothing
// overlaps, so the times are the plain sums, message latency included.
TEST(ScheduleSimulator, SharedCoreTimesByHand) {
  PipelineCosts costs = PipelineCosts::uniform(2);
  costs.linkLatency = 0.5;
  costs.sharedCores = 1;
  costs.bwSendsAfterB = true;
  Schedule s = make("1f1b", 2, 1, costs);
  SimResult r = sim(s, costs);
  // F0 [0,1]; the activations arrive at 1.5: stage 1 F0 [1.5,2.5], BW0
  // [2.5,4.5] with its B part done at 3.5; the gradient arrives at 4 while
  // stage 1's W runs, so both compute at half speed from 4: stage 1 has
  // 0.5 of W left (done at 5), stage 0's BW has done 0.5 of 2 by then and
  // finishes the rest alone at 6.5.
  EXPECT_DOUBLE_EQ(r.stages[1].start, 1.5);
  EXPECT_NEAR(r.stages[1].finish, 5, 1e-12);
  EXPECT_NEAR(r.stages[0].finish, 6.5, 1e-12);
  EXPECT_NEAR(r.stepTime, 6.5, 1e-12);
}

TEST(ScheduleSimulator, PeakBytes) {
  PipelineCosts costs = PipelineCosts::uniform(4);
  for (StageCost &c : costs.stages) {
    c.activationBytes = 1000;
    c.staticBytes = 7;
  }
  SimResult r = sim(make("1f1b", 4, 8, costs), costs);
  for (int s = 0; s < 4; ++s)
    EXPECT_EQ(r.stages[s].peakBytes, 1000 * (4 - s) + 7);
}

// Under 2BP a microbatch stays held until its W, so deferring every W holds
// every microbatch.
TEST(ScheduleSimulator, TwoBPHoldsUntilW) {
  PipelineCosts costs = PipelineCosts::uniform(1);
  Schedule s{"hand", 1, 3, {{}}};
  for (int mb = 0; mb < 3; ++mb)
    s.actions[0].insert(s.actions[0].end(),
                        {compute(ActionKind::F, mb), compute(ActionKind::B, mb)});
  for (int mb = 0; mb < 3; ++mb)
    s.actions[0].push_back(compute(ActionKind::W, mb));
  EXPECT_EQ(sim(s, costs).stages[0].peakActivationMicrobatches, 3);
}

TEST(ScheduleSimulator, RecvWithoutSend) {
  Schedule s{"hand", 2, 1,
             {{compute(ActionKind::F, 0), compute(ActionKind::BW, 0)},
              {Action{ActionKind::RecvF, 0, 0}, compute(ActionKind::F, 0),
               compute(ActionKind::BW, 0)}}};
  auto r = simulate(s, PipelineCosts::uniform(2));
  EXPECT_EQ(llvm::toString(r.takeError()),
            "stage 1, action 0 (RECV_F0): its SEND_F0 from stage 0 never "
            "comes");
}

TEST(ScheduleSimulator, ReportJson) {
  PipelineCosts costs = PipelineCosts::uniform(4);
  Schedule s = make("1f1b", 4, 4, costs);
  SimResult r = sim(s, costs);
  auto parsed = llvm::json::parse(scheduleReportJson(s, r, costs));
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  const llvm::json::Object *sched =
      parsed->getAsObject()->getObject("schedule");
  ASSERT_TRUE(sched);
  EXPECT_EQ(sched->getString("name").getValue(), "1f1b");
  EXPECT_DOUBLE_EQ(sched->getNumber("step_time").getValue(), 21);
  const llvm::json::Array *bubble = sched->getArray("bubble_fraction");
  ASSERT_EQ(bubble->size(), 4u);
  EXPECT_DOUBLE_EQ((*bubble)[0].getAsNumber().getValue(), 3.0 / 7);
  const llvm::json::Array *peaks =
      sched->getArray("peak_activation_microbatches");
  EXPECT_EQ((*peaks)[3].getAsInteger().getValue(), 1);
  EXPECT_EQ(sched->getArray("peak_bytes")->size(), 4u);
}

TEST(ScheduleSimulator, ChromeTrace) {
  PipelineCosts costs = PipelineCosts::uniform(2);
  costs.linkLatency = 0.25;
  Schedule s = make("zb-h1", 2, 4, costs);
  auto parsed = llvm::json::parse(chromeTrace(s, sim(s, costs), costs));
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  const llvm::json::Array *events =
      parsed->getAsObject()->getArray("traceEvents");
  ASSERT_TRUE(events);
  std::set<std::string> names, threads;
  for (const llvm::json::Value &e : *events) {
    const llvm::json::Object *o = e.getAsObject();
    if (o->getString("ph") == llvm::StringRef("M"))
      threads.insert(o->getObject("args")->getString("name")->str());
    else
      names.insert(o->getString("name")->str());
  }
  EXPECT_TRUE(threads.count("stage 0") && threads.count("stage 1 sends"));
  for (const char *n : {"F3", "B3", "W3", "STEP", "SEND_F3 to stage 1",
                        "SEND_B0 to stage 0"})
    EXPECT_TRUE(names.count(n)) << n;
}

TEST(ScheduleSimulator, GanttSvg) {
  PipelineCosts costs = PipelineCosts::uniform(4);
  Schedule s = make("zb-h1", 4, 8, costs);
  std::string svg = ganttSvg(s, sim(s, costs), costs);
  EXPECT_THAT(svg, HasSubstr("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_THAT(svg, HasSubstr("zb-h1: P=4, M=8, step time 27 unit"));
  for (const char *text : {">stage 3<", "F forward", "B input gradient",
                           "W weight gradient", ">idle<", "<title>W7: "})
    EXPECT_THAT(svg, HasSubstr(text));
  EXPECT_THAT(svg, ::testing::EndsWith("</svg>\n"));
}

} // namespace unit_schedule_simulator
