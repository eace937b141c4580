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
  return llvm::json::Object{
      {"name", s.name},
      {"stages", s.stages},
      {"microbatches", s.microbatches},
      {"time_unit", costs.timeUnit},
      {"step_time", r.stepTime},
      {"makespan", r.makespan},
      {"bubble_fraction", std::move(bubble)},
      {"peak_activation_microbatches", std::move(peakMicrobatches)},
      {"peak_bytes", std::move(peakBytes)}};
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
  os << "schedule " << s.name << ": " << s.stages << " stages, "
     << s.microbatches << " microbatches\n";
  os << llvm::formatv("step time {0} {1} (one isolated step: {2})\n",
                      formatTime(r.stepTime), costs.timeUnit,
                      formatTime(r.makespan));
  os << "stage  bubble  peak activations (microbatches)  peak bytes\n";
  for (int st = 0; st < s.stages; ++st) {
    const StageStats &stats = r.stages[st];
    os << llvm::formatv("{0,5}  {1,6:P1}  {2,31}  {3,10}\n", st, stats.bubble,
                        stats.peakActivationMicrobatches, stats.peakBytes);
  }
  return os.str();
}

} // namespace cleave::passes::schedule
