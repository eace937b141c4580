#include "tools/MeasuredTimeline.h"

#include "passes/schedule/Timeline.h"

#include <algorithm>
#include <cmath>

namespace cleave::tools {

namespace sched = passes::schedule;

static sched::ActionKind kindOf(const std::string &name) {
  if (name == "F")
    return sched::ActionKind::F;
  if (name == "B")
    return sched::ActionKind::B;
  if (name == "W")
    return sched::ActionKind::W;
  if (name == "BW")
    return sched::ActionKind::BW;
  if (name == "STEP")
    return sched::ActionKind::Step;
  return sched::ActionKind::RecvF; // a wait: drawn as idle time
}

std::string measuredTimelineSvg(const std::string &schedule, int stages,
                                int microbatches,
                                const std::vector<runtime::TraceTrack> &tracks,
                                const std::vector<int> &stageRank) {
  stages = std::min<int>(stages, int(tracks.size()));
  double t0 = INFINITY;
  for (int st = 0; st < stages; ++st)
    for (const auto &span : tracks[size_t(st)].spans)
      t0 = std::min(t0, span.start);
  sched::Schedule s;
  s.name = schedule + " (measured)";
  s.stages = stages;
  s.microbatches = microbatches;
  s.actions.resize(size_t(stages));
  sched::SimResult r;
  r.spans.resize(size_t(stages));
  r.stages.resize(size_t(stages));
  for (int st = 0; st < stages; ++st) {
    sched::StageStats &stats = r.stages[size_t(st)];
    for (const auto &span : tracks[size_t(st)].spans) {
      sched::Action a;
      a.kind = kindOf(span.name);
      a.microbatch = span.microbatch;
      s.actions[size_t(st)].push_back(a);
      double start = 1e3 * (span.start - t0), end = 1e3 * (span.end - t0);
      r.spans[size_t(st)].push_back({start, end});
      r.makespan = std::max(r.makespan, end);
      if (a.kind != sched::ActionKind::RecvF && a.kind != sched::ActionKind::Step)
        stats.busy += end - start;
    }
  }
  // Several stages per rank: one row per rank, its bubble its stages' idle
  // time together.
  if (!stageRank.empty() && int(stageRank.size()) == stages) {
    s.rankOf = stageRank;
    for (int rk = 0; rk < sched::rankCount(s); ++rk) {
      double busy = 0;
      for (int st = 0; st < stages; ++st)
        if (stageRank[size_t(st)] == rk)
          busy += r.stages[size_t(st)].busy;
      for (int st = 0; st < stages; ++st)
        if (stageRank[size_t(st)] == rk)
          r.stages[size_t(st)].busy = busy;
    }
  }
  // The spans of one step, drawn from its first: the step is the makespan.
  r.stepTime = r.makespan;
  for (sched::StageStats &stats : r.stages)
    stats.bubble = r.makespan > 0 ? std::max(0.0, 1 - stats.busy / r.makespan) : 0;
  passes::PipelineCosts costs;
  costs.timeUnit = "ms";
  return sched::ganttSvg(s, r, costs);
}

} // namespace cleave::tools
