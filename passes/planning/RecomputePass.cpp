// The recompute pass: a fixed --recompute policy, or --offload=all, applied
// to every layer (passes/Recompute.h); with auto the partition pass
// chooses.
#include "passes/Recompute.h"
#include "passes/planning/PlanningSupport.h"

namespace cleave::passes {

using namespace planning;

llvm::Error recomputePass(PipelineModule &m) {
  if (!m.graph.isTraining())
    return planningError("recompute needs a training graph (run autodiff, "
                         "split-backward and optimizer first)");
  const PlanningOptions &o = m.options;
  if (o.offload != "none" && o.offload != "auto" && o.offload != "all")
    return planningError("--offload must be none, auto or all, not '" +
                         o.offload + "'");
  if (o.offload == "all" && o.recompute != "auto" && o.recompute != "none")
    return planningError("--offload=all and --recompute=" + o.recompute +
                         " both decide every layer's stash; give one of "
                         "them");
  if (o.recompute == "auto" && o.offload != "all")
    return llvm::Error::success();
  std::optional<StashPolicy> policy =
      o.offload == "all" ? StashPolicy::Offload
                         : parseStashPolicy(m.options.recompute);
  if (!policy || (o.offload != "all" && *policy == StashPolicy::Offload))
    return planningError("--recompute must be none, selective, full or "
                         "auto, not '" +
                         m.options.recompute + "'");
  auto layers = groupLayers(m.graph, {m.options.layerDepth});
  if (!layers)
    return layers.takeError();
  stripStashPolicy(m.graph);
  m.recomputeStats = applyStashPolicy(m.graph, *policy, *layers);
  m.recompute = std::string(stashPolicyName(*policy));
  return llvm::Error::success();
}

} // namespace cleave::passes
