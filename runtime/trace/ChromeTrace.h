// cleave-run --trace: a Chrome trace (chrome://tracing, Perfetto) of the
// measured last step.
#pragma once

#include "runtime/Executor.h"

#include <string>
#include <vector>

namespace cleave::runtime {

// --trace: one track per executor (tid = its index, replica * P + stage,
// which is also its world rank under MPI), each with the spans of its last
// step, times from the earliest span of all.
struct TraceTrack {
  std::string name;
  std::vector<StageStats::Span> spans;
};

// "stage S", or "replica R stage S" when there are several replicas.
std::string traceTrackName(int stage, int replica, int replicas);

// The trace file's text: one thread per track, an "X" event per span.
std::string chromeTraceJson(const std::vector<TraceTrack> &tracks);

} // namespace cleave::runtime
