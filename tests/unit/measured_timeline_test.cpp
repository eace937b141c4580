// cleave-run --timeline: the measured step drawn from the trace's spans,
// with the waits for messages inside an action drawn as idle time and the
// bubble counted as cleave-run's table counts it.
#include "tools/MeasuredTimeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
