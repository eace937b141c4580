// The pipeline half of cleavec: the planning flags, and the planning passes
// (passes/Planning.h) run in order with what the user asked for rendered
// (stage table and schedule figures, timeline, JSON report, schedule CSV).
// Everything is computed before anything is written.
#pragma once

#include "ir/Graph.h"
#include "passes/Partition.h"
#include "passes/Planning.h"
#include "passes/schedule/Schedule.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/Error.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cleave::tools {

namespace sched = passes::schedule;

std::vector<Flags::Spec> planningFlagSpecs();
extern const char kPlanningHelp[];

// True when the flags ask for pipeline planning (--stages or --schedule).
bool wantsPlanning(const Flags &flags);

// The planning options (passes/Planning.h) and what cleavec writes of the
// plan besides it.
struct PlanningRequest : passes::PlanningOptions {
  std::vector<std::string> timelines; // .json or .svg paths
  std::optional<std::string> report;
  bool emitCsv = false; // --emit=schedule-csv
  bool emitOpTimes = false; // --emit=op-times
  // --devices: the layout (stages x data-parallel replicas) is chosen by
  // chooseLayout (tools/Compile.h) before planning.
  std::optional<int> devices;
};

llvm::Expected<PlanningRequest> readPlanningFlags(const Flags &flags);

struct PlanningResult {
  std::string text; // stage table and schedule figures, or the CSV
  std::vector<std::pair<std::string, std::string>> files; // path, contents
  // One graph per stage with its Send and Recv ops (passes/Stages.h).
  std::vector<std::unique_ptr<ir::Graph>> stageGraphs;
  sched::Schedule schedule;
  std::vector<passes::StageReport> stageReports;
  double predictedStepTime = 0; // simulated isolated step, in timeUnit
  double predictedPeriod = 0;   // simulated steady state of overlapping steps
  std::string timeUnit;
  // plan-memory's warning when a rank stays above --mem-cap; empty if none.
  std::string memoryWarning;
};

// Runs the planning passes partition, schedule, split-stages and
// plan-memory on `g` (which keeps the stage tags) through the pass manager
// (verify-each and dumps as `opts` says) and renders what the request asks
// for.
llvm::Expected<PlanningResult>
planPipeline(ir::Graph &g, const PlanningRequest &req,
             const passes::PipelineOptions &opts = {});

// cleavec --compare-schedules: every named schedule partitioned and
// simulated for `req` (its --schedule aside), one table row each: ranks x
// stages per rank, the predicted isolated step (what cleave-run measures)
// and steady-state period, the worst rank's bubble and peak bytes; a
// schedule that cannot run says why; the last line names what `auto` picks.
llvm::Expected<std::string> compareSchedules(ir::Graph &g,
                                             const PlanningRequest &req);

} // namespace cleave::tools
