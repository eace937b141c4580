// The split-stages pass: one graph per stage, with Send and Recv ops where
// values cross stages (passes/Planning.h).
#include "passes/Stages.h"
#include "passes/planning/PlanningSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::passes {

using namespace planning;

llvm::Error splitStagesPass(PipelineModule &m) {
  if (auto e = ensurePartition(m, "split-stages"))
    return e;
  auto graphs = splitStages(m.graph, m.partition->stageOfOp, m.stageCount());
  if (!graphs)
    return graphs.takeError();
  m.stageGraphs = std::move(*graphs);
  return llvm::Error::success();
}

int rankOfStage(const PipelineModule &m, int stage) {
  if (!m.schedule || m.schedule->rankOf.empty())
    return stage;
  return m.schedule->rankOf[size_t(stage)];
}

} // namespace cleave::passes
