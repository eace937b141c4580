// cleave-run --timeline: the measured last step as the same SVG Gantt chart
// `cleavec --timeline` draws for the predicted one (passes/schedule/
// Timeline.h), so the two can be laid side by side: one row per stage of
// replica 0, its F/B/W/BW spans as boxes less the waits for messages inside
// them (idle time), times in milliseconds from the step's first span, each
// stage's bubble as cleave-run's table counts it (its busy time against its
// own step).
#pragma once

#include "runtime/Plan.h"
#include "runtime/trace/ChromeTrace.h"

#include <string>
#include <vector>

namespace cleave::tools {

// `tracks` are the trainer's (runtime::Trainer::traceTracks); the first
// `stages` of them are replica 0's, in stage order.
std::string measuredTimelineSvg(const std::string &schedule, int stages,
                                int microbatches,
                                const std::vector<runtime::TraceTrack> &tracks,
                                const std::vector<int> &stageRank = {});

// The plan's schedule (its actions, ranks and rank programs, with the
// messages they imply) simulated on its predicted per-stage F, B and W
// times (messages taken as free) over the measured step, at one time
// scale; a plan without predicted times (a uniform cost model) gets the
// measured step alone.
std::string timelineWithPrediction(
    const runtime::Plan &plan, const std::vector<runtime::TraceTrack> &tracks);

} // namespace cleave::tools
