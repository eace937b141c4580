// What a simulated schedule reports: the `"schedule"` section of cleavec's
// --report JSON and the text table the tools print.
#pragma once

#include "passes/PipelineCosts.h"
#include "passes/schedule/Schedule.h"
#include "passes/schedule/Simulator.h"

#include "llvm/Support/JSON.h"

#include <string>

namespace cleave::passes::schedule {

// {"name", "stages", "microbatches", "time_unit", "step_time", "makespan",
//  "bubble_fraction": [per stage], "peak_activation_microbatches": [...],
//  "peak_bytes": [...]} — the value of the report's "schedule" key.
llvm::json::Object scheduleReport(const Schedule &s, const SimResult &r,
                                  const PipelineCosts &costs);

// `{"schedule": ...}` as indented JSON text.
std::string scheduleReportJson(const Schedule &s, const SimResult &r,
                               const PipelineCosts &costs);

// The step time and, per stage, bubble, peak activations and peak bytes.
std::string scheduleSummary(const Schedule &s, const SimResult &r,
                            const PipelineCosts &costs);

} // namespace cleave::passes::schedule
