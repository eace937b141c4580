#include "tools/MeasuredTimeline.h"

#include "passes/schedule/Simulator.h"
#include "passes/schedule/Timeline.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace cleave::tools {

namespace sched = passes::schedule;

// The trace's compute spans by name; anything else (RECVn) is a wait.
static std::optional<sched::ActionKind> computeKind(const std::string &name) {
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
  return std::nullopt;
}

// The measured step as a schedule and its "simulation": the spans drawn.
static std::pair<sched::Schedule, sched::SimResult>
measuredStep(const std::string &schedule, int stages, int microbatches,
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
  // Each stage's [first start, last end]: its step, as the summary table
  // measures it.
  std::vector<std::pair<double, double>> window(size_t(stages),
                                                {INFINITY, 0});
  for (int st = 0; st < stages; ++st) {
    const auto &spans = tracks[size_t(st)].spans;
    // An action's span holds its waits for incoming messages (RECV spans
    // inside it): those are idle time, so the action is drawn as the
    // pieces between them, and only those count as busy.
    std::vector<std::pair<double, double>> waits;
    for (const auto &span : spans)
      if (!computeKind(span.name))
        waits.push_back({1e3 * (span.start - t0), 1e3 * (span.end - t0)});
    std::sort(waits.begin(), waits.end());
    for (const auto &span : spans) {
      auto kind = computeKind(span.name);
      if (!kind)
        continue;
      double start = 1e3 * (span.start - t0), end = 1e3 * (span.end - t0);
      window[size_t(st)].first = std::min(window[size_t(st)].first, start);
      window[size_t(st)].second = std::max(window[size_t(st)].second, end);
      r.makespan = std::max(r.makespan, end);
      double from = start;
      auto piece = [&](double a, double b) {
        if (b <= a)
          return;
        sched::Action act;
        act.kind = *kind;
        act.microbatch = span.microbatch;
        s.actions[size_t(st)].push_back(act);
        r.spans[size_t(st)].push_back({a, b});
        r.stages[size_t(st)].busy += b - a;
      };
      for (const auto &[ws, we] : waits) {
        if (we <= from || ws >= end)
          continue;
        piece(from, std::min(ws, end));
        from = std::max(from, we);
      }
      piece(from, end);
    }
  }
  // Several stages per rank: one row per rank, its busy time its stages'
  // together over the rank's window.
  if (!stageRank.empty() && int(stageRank.size()) == stages) {
    s.rankOf = stageRank;
    for (int rk = 0; rk < sched::rankCount(s); ++rk) {
      double busy = 0;
      std::pair<double, double> w{INFINITY, 0};
      for (int st = 0; st < stages; ++st)
        if (stageRank[size_t(st)] == rk) {
          busy += r.stages[size_t(st)].busy;
          w.first = std::min(w.first, window[size_t(st)].first);
          w.second = std::max(w.second, window[size_t(st)].second);
        }
      for (int st = 0; st < stages; ++st)
        if (stageRank[size_t(st)] == rk) {
          r.stages[size_t(st)].busy = busy;
          window[size_t(st)] = w;
        }
    }
  }
  // The spans of one step, drawn from its first: the step is the makespan.
  r.stepTime = r.makespan;
  for (int st = 0; st < stages; ++st) {
    double span = window[size_t(st)].second - window[size_t(st)].first;
    sched::StageStats &stats = r.stages[size_t(st)];
    stats.bubble = span > 0 ? std::max(0.0, 1 - stats.busy / span) : 0;
  }
  return {std::move(s), std::move(r)};
}

static passes::PipelineCosts inMilliseconds() {
  passes::PipelineCosts costs;
  costs.timeUnit = "ms";
  return costs;
}

std::string measuredTimelineSvg(const std::string &schedule, int stages,
                                int microbatches,
                                const std::vector<runtime::TraceTrack> &tracks,
                                const std::vector<int> &stageRank) {
  auto [s, r] = measuredStep(schedule, stages, microbatches, tracks, stageRank);
  return sched::ganttSvg(s, r, inMilliseconds());
}

// The plan's schedule with its messages, and its predicted costs (seconds).
static std::optional<std::pair<sched::Schedule, passes::PipelineCosts>>
predictedStep(const runtime::Plan &plan) {
  int stages = int(plan.stages.size());
  sched::Schedule s;
  s.name = plan.schedule + " (predicted)";
  s.stages = stages;
  s.microbatches = int(plan.microbatches);
  s.actions.resize(size_t(stages));
  passes::PipelineCosts costs;
  costs.timeUnit = "s";
  costs.bwSendsAfterB = true; // as cleave's runtime runs a BW
  for (int st = 0; st < stages; ++st) {
    const runtime::StagePlan &sp = plan.stages[size_t(st)];
    if (sp.predictedF <= 0)
      return std::nullopt;
    passes::StageCost c;
    c.f = sp.predictedF, c.b = sp.predictedB, c.w = sp.predictedW;
    costs.stages.push_back(c);
    for (const runtime::Action &a : sp.actions) {
      auto kind = computeKind(runtime::actionKindName(a.kind));
      if (!kind)
        return std::nullopt;
      sched::Action act;
      act.kind = *kind;
      act.microbatch = a.microbatch;
      s.actions[size_t(st)].push_back(act);
    }
  }
  if (!plan.stageRank.empty()) {
    s.rankOf = plan.stageRank;
    s.order = plan.rankPrograms;
    // A rank runs its stages' STEPs after the rest, in stage order.
    for (int st = 0; st < stages; ++st)
      for (const runtime::Action &a : plan.stages[size_t(st)].actions)
        if (a.kind == runtime::ActionKind::Step &&
            size_t(plan.stageRank[size_t(st)]) < s.order.size())
          s.order[size_t(plan.stageRank[size_t(st)])].push_back(st);
  }
  sched::insertCommunication(s);
  return std::make_pair(std::move(s), std::move(costs));
}

std::string timelineWithPrediction(
    const runtime::Plan &plan, const std::vector<runtime::TraceTrack> &tracks) {
  auto [measured, spans] =
      measuredStep(plan.schedule, int(plan.stages.size()),
                   int(plan.microbatches), tracks, plan.stageRank);
  if (auto predicted = predictedStep(plan)) {
    if (auto sim = sched::simulate(predicted->first, predicted->second))
      return sched::ganttSvgPair(predicted->first, *sim, predicted->second,
                                 measured, spans, inMilliseconds());
    else
      llvm::consumeError(sim.takeError()); // drawn without the prediction
  }
  return sched::ganttSvg(measured, spans, inMilliseconds());
}

} // namespace cleave::tools
