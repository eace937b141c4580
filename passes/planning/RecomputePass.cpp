// The recompute pass: a fixed --recompute policy applied to every layer
// (passes/Recompute.h); with auto the partition pass chooses.
#include "passes/Recompute.h"
#include "passes/planning/PlanningSupport.h"

namespace cleave::passes {

using namespace planning;

llvm::Error recomputePass(PipelineModule &m) {
  if (!m.graph.isTraining())
    return planningError("recompute needs a training graph (run autodiff, "
                         "split-backward and optimizer first)");
  if (m.options.recompute == "auto")
    return llvm::Error::success();
  std::optional<RecomputePolicy> policy =
      parseRecomputePolicy(m.options.recompute);
  if (!policy)
    return planningError("--recompute must be none, selective, full or "
                         "auto, not '" +
                         m.options.recompute + "'");
  auto layers = groupLayers(m.graph, {m.options.layerDepth});
  if (!layers)
    return layers.takeError();
  stripRecomputation(m.graph);
  m.recomputeStats = applyRecomputation(m.graph, *policy, *layers);
  m.recompute = std::string(recomputePolicyName(*policy));
  return llvm::Error::success();
}

} // namespace cleave::passes
