#include "passes/schedule/ScheduleReport.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdio>

namespace cleave::passes::schedule {

namespace {

// Short numbers: 33, 2.5, 0.000125.
std::string formatTime(double v) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

} // namespace

llvm::json::Object scheduleReport(const Schedule &s, const SimResult &r,
                                  const PipelineCosts &costs) {
  llvm::json::Array bubble, peakMicrobatches, peakBytes;
  for (const StageStats &st : r.stages) {
    bubble.push_back(st.bubble);
    peakMicrobatches.push_back(st.peakActivationMicrobatches);
    peakBytes.push_back(st.peakBytes);
  }
  llvm::json::Object out{
      {"name", s.name},
      {"stages", s.stages},
      {"ranks", rankCount(s)},
      {"microbatches", s.microbatches},
      {"time_unit", costs.timeUnit},
      {"step_time", r.stepTime},
      {"makespan", r.makespan},
      {"bubble_fraction", std::move(bubble)},
      {"peak_activation_microbatches", std::move(peakMicrobatches)},
      {"peak_bytes", std::move(peakBytes)}};
  if (sharesRanks(s)) {
    llvm::json::Array rankOf, rankBubble, rankPeak, rankHeld;
    for (int st = 0; st < s.stages; ++st)
      rankOf.push_back(rankOfStage(s, st));
    for (const RankStats &rk : r.ranks) {
      rankBubble.push_back(rk.bubble);
      rankPeak.push_back(rk.peakBytes);
      rankHeld.push_back(rk.peakActivationMicrobatches);
    }
    out["rank_peak_activation_microbatches"] = std::move(rankHeld);
    out["rank_of_stage"] = std::move(rankOf);
    out["rank_bubble_fraction"] = std::move(rankBubble);
    out["rank_peak_bytes"] = std::move(rankPeak);
  }
  return out;
}

std::string scheduleReportJson(const Schedule &s, const SimResult &r,
                               const PipelineCosts &costs) {
  llvm::json::Value report(
      llvm::json::Object{{"schedule", scheduleReport(s, r, costs)}});
  return llvm::formatv("{0:2}\n", report).str();
}

std::string scheduleSummary(const Schedule &s, const SimResult &r,
                            const PipelineCosts &costs) {
  std::string out;
  llvm::raw_string_ostream os(out);
  os << "schedule " << s.name << ": " << s.stages << " stages, ";
  if (sharesRanks(s))
    os << rankCount(s) << " ranks, ";
  os << s.microbatches << " microbatches\n";
  os << llvm::formatv("step time {0} {1} (one isolated step: {2})\n",
                      formatTime(r.stepTime), costs.timeUnit,
                      formatTime(r.makespan));
  if (sharesRanks(s)) {
    auto stages = stagesOfRanks(s);
    os << "rank  stages  bubble  peak activations (microbatches)  peak bytes\n";
    for (size_t rk = 0; rk < stages.size(); ++rk) {
      std::string list;
      for (int st : stages[rk])
        list += (list.empty() ? "" : ",") + std::to_string(st);
      os << llvm::formatv("{0,4}  {1,6}  {2,6:P1}  {3,31}  {4,10}\n", rk, list,
                          r.ranks[rk].bubble,
                          r.ranks[rk].peakActivationMicrobatches,
                          r.ranks[rk].peakBytes);
    }
    return os.str();
  }
  os << "stage  bubble  peak activations (microbatches)  peak bytes\n";
  for (int st = 0; st < s.stages; ++st) {
    const StageStats &stats = r.stages[st];
    os << llvm::formatv("{0,5}  {1,6:P1}  {2,31}  {3,10}\n", st, stats.bubble,
                        stats.peakActivationMicrobatches, stats.peakBytes);
  }
  return os.str();
}

} // namespace cleave::passes::schedule
