#include "runtime/trace/ChromeTrace.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>

namespace cleave::runtime {

std::string traceTrackName(int stage, int replica, int replicas) {
  std::string track = "stage " + std::to_string(stage);
  if (replicas > 1)
    track = "replica " + std::to_string(replica) + " " + track;
  return track;
}

std::string chromeTraceJson(const std::vector<TraceTrack> &tracks) {
  double t0 = INFINITY;
  for (const TraceTrack &t : tracks)
    for (const auto &span : t.spans)
      t0 = std::min(t0, span.start);
  llvm::json::Array events;
  for (size_t i = 0; i < tracks.size(); ++i) {
    events.push_back(llvm::json::Object{
        {"name", "thread_name"}, {"ph", "M"}, {"pid", 0},
        {"tid", int64_t(i)},
        {"args", llvm::json::Object{{"name", tracks[i].name}}}});
    for (const auto &span : tracks[i].spans) {
      std::string name = span.name;
      if (span.microbatch >= 0)
        name += std::to_string(span.microbatch);
      events.push_back(llvm::json::Object{
          {"name", name}, {"cat", span.name}, {"ph", "X"}, {"pid", 0},
          {"tid", int64_t(i)}, {"ts", 1e6 * (span.start - t0)},
          {"dur", 1e6 * (span.end - span.start)}});
    }
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}\n", llvm::json::Value(llvm::json::Object{
                                     {"traceEvents", std::move(events)},
                                     {"displayTimeUnit", "ms"}}));
  os.flush();
  return text;
}

} // namespace cleave::runtime
