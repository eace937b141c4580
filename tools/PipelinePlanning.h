// The pipeline half of cleavec: partition the training graph into stages,
// build and validate the schedule, simulate it, and produce what the user
// asked for (stage table and schedule figures, timeline, JSON report,
// schedule CSV). Everything is computed before anything is written.
#pragma once

#include "ir/Graph.h"
#include "passes/Partition.h"
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

struct PlanningRequest {
  int stages = 1;  // ranks
  int chunks = 0;  // stages per rank (--chunks); 0: the schedule's default
  int64_t microbatches = 1;
  std::string schedule = "1f1b"; // a name or csv:FILE
  std::optional<int64_t> memCap; // bytes per rank
  std::string costModel = "analytic";
  std::string deviceProfile = "cpu";
  std::vector<std::string> splitAt;
  std::optional<unsigned> layerDepth; // unset: found (passes/Layers.h)
  std::vector<std::string> timelines; // .json or .svg paths
  std::optional<std::string> report;
  bool emitCsv = false; // --emit=schedule-csv
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
};

llvm::Expected<PlanningResult> planPipeline(const ir::Graph &g,
                                            const PlanningRequest &req);

} // namespace cleave::tools
