// cleave-run --timeline: the measured step drawn from the trace's spans,
// with the waits for messages inside an action drawn as idle time and the
// bubble counted as cleave-run's table counts it.
#include "tools/MeasuredTimeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace unit_measured_timeline {

using namespace cleave;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

runtime::TraceTrack track(std::vector<runtime::StageStats::Span> spans) {
  return runtime::TraceTrack{"", std::move(spans)};
}

} // namespace

TEST(MeasuredTimeline, WaitsInsideAnActionAreIdle) {
  // Times in seconds: stage 1's F0 waits 1 ms for stage 0's activation,
  // stage 0's B0 waits 2 ms for stage 1's gradient.
  std::vector<runtime::TraceTrack> tracks{
      track({{"F", 0, 0.000, 0.001},
             {"B", 0, 0.001, 0.005},
             {"RECV", 0, 0.001, 0.003},
             {"STEP", -1, 0.005, 0.006}}),
      track({{"F", 0, 0.000, 0.002},
             {"RECV", 0, 0.000, 0.001},
             {"B", 0, 0.002, 0.003},
             {"STEP", -1, 0.003, 0.004}})};
  std::string svg = tools::measuredTimelineSvg("1f1b", 2, 1, tracks);
  // Each box starts where its wait ended.
  EXPECT_THAT(svg, HasSubstr("<title>B0: 3 to 5</title>"));
  EXPECT_THAT(svg, HasSubstr("<title>F0: 1 to 2</title>"));
  EXPECT_THAT(svg, Not(HasSubstr("<title>B0: 1 to 5</title>")));
  EXPECT_THAT(svg, Not(HasSubstr("<title>F0: 0 to 2</title>")));
  // Stage 0 computes F 1 + B 2 + STEP 1 = 4 of its 6 ms (33.3% idle);
  // stage 1 computes 3 of its 4 ms.
  EXPECT_THAT(svg, HasSubstr("1f1b (measured): P=2, M=1, step time 6 ms, "
                             "bubble up to 33.3%"));
  EXPECT_THAT(svg, HasSubstr("time (ms)"));
}

TEST(MeasuredTimeline, PredictionAboveTheMeasuredStep) {
  // Two stages, one microbatch, F, B and W of 1 ms each as predicted: the
  // plan's schedule simulated takes 5 ms (stage 0's B waits for stage 1's).
  runtime::Plan plan;
  plan.schedule = "zb-h1";
  plan.microbatches = 1;
  for (int st = 0; st < 2; ++st) {
    runtime::StagePlan sp;
    sp.index = st;
    sp.predictedF = sp.predictedB = sp.predictedW = 0.001;
    sp.actions = {{runtime::ActionKind::F, 0},
                  {runtime::ActionKind::B, 0},
                  {runtime::ActionKind::W, 0},
                  {runtime::ActionKind::Step, -1}};
    plan.stages.push_back(sp);
  }
  std::vector<runtime::TraceTrack> tracks{
      track({{"F", 0, 0.000, 0.001},
             {"B", 0, 0.003, 0.004},
             {"W", 0, 0.004, 0.005}}),
      track({{"F", 0, 0.001, 0.002},
             {"B", 0, 0.002, 0.003},
             {"W", 0, 0.003, 0.004}})};
  std::string svg = tools::timelineWithPrediction(plan, tracks);
  EXPECT_THAT(svg, HasSubstr("zb-h1 (predicted): P=2, M=1, step time 5 ms"));
  EXPECT_THAT(svg, HasSubstr("zb-h1 (measured): P=2, M=1, step time 5 ms"));
  EXPECT_LT(svg.find("(predicted)"), svg.find("(measured)"));
  EXPECT_EQ(svg.find("<svg", 1), std::string::npos); // one document
  // A plan without predicted times: the measured step alone.
  for (runtime::StagePlan &sp : plan.stages)
    sp.predictedF = 0;
  svg = tools::timelineWithPrediction(plan, tracks);
  EXPECT_THAT(svg, Not(HasSubstr("(predicted)")));
  EXPECT_THAT(svg, HasSubstr("(measured)"));
}

} // namespace unit_measured_timeline
