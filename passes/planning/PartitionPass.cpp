// The partition pass: cut the training graph into stages of whole layers
// and tag every op with its stage (passes/Planning.h).
#include "passes/Recompute.h"
#include "passes/schedule/Generators.h"
#include "passes/planning/PlanningSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::passes {

using namespace planning;

// When the searched split is unbalanced, as when a whole encoder is one
// layer, the line that says how to cut finer: the layer count one
// name-scope deeper. Empty when balanced, when the split was given, with one
// microbatch, or when a deeper scope adds no layers.
static std::string coarseLayerHint(const ir::Graph &g,
                                   const PartitionResult &part,
                                   const PlanningOptions &o) {
  constexpr double kCoarse = 1.2;
  // With one microbatch the stages run one after the other anyway.
  if (!o.splitAt.empty() || part.imbalance <= kCoarse ||
      part.microbatches < 2 || part.layering.depth == 0)
    return "";
  unsigned depth = part.layering.depth + 1;
  auto deeper = groupLayers(g, {depth});
  if (!deeper || deeper->layers.size() <= part.layering.layers.size())
    return "";
  return llvm::formatv("hint: imbalance {0:F2}; finer layers may balance the "
                       "stages better: --layer-depth {1} cuts one name-scope "
                       "deeper ({2} layers instead of {3})\n",
                       part.imbalance, depth, deeper->layers.size(),
                       part.layering.layers.size())
      .str();
}

llvm::Error partitionPass(PipelineModule &m) {
  if (!m.graph.isTraining())
    return planningError("partition needs a training graph (run autodiff, "
                         "split-backward and optimizer first)");
  auto csv = readCsv(m.options);
  if (!csv)
    return csv.takeError();
  if (*csv && m.options.chunks)
    return planningError("--chunks does not go with a CSV schedule, which "
                         "places its stages itself");
  // `auto` without --chunks also weighs 2 stages per rank (not with
  // --split-at, whose cuts are for one stage per rank).
  const PlanningOptions &o = m.options;
  std::vector<int> tries = {o.chunks > 0 ? o.chunks
                                         : sched::defaultChunks(o.schedule)};
  if (o.schedule == "auto" && o.chunks == 0 && o.splitAt.empty())
    tries.push_back(2);
  // --recompute=auto under --mem-cap weighs every policy (the recompute
  // pass leaves the graph alone for auto); otherwise the graph is taken as
  // the recompute pass left it.
  std::vector<std::optional<RecomputePolicy>> policies = {std::nullopt};
  std::optional<Layering> layers;
  if (o.recompute == "auto" && o.memCap) {
    auto l = groupLayers(m.graph, {o.layerDepth});
    if (!l)
      return l.takeError();
    layers = std::move(*l);
    policies = {RecomputePolicy::None, RecomputePolicy::Selective,
                RecomputePolicy::Full};
  }
  bool several = tries.size() * policies.size() > 1;
  struct Candidate {
    PartitionResult part;
    int chunks;
    std::optional<RecomputePolicy> policy;
    std::string schedule; // the name `auto` chose
    double stepTime;
  };
  std::optional<Candidate> best;
  std::string tried, firstWhy;
  auto attempt = [&](int chunks, std::optional<RecomputePolicy> policy)
      -> llvm::Expected<Candidate> {
    int stages = 0;
    int64_t microbatches = 0;
    if (auto e = stageShape(m, *csv, chunks, stages, microbatches))
      return std::move(e);
    auto part = partitionFor(m, *csv, chunks, stages, microbatches, false);
    if (!part)
      return part.takeError();
    // With one candidate the schedule pass makes its schedule; with
    // several, each is scheduled here to compare their steps.
    if (!several)
      return Candidate{std::move(*part), chunks, policy, "", 0.0};
    auto s = scheduleFor(m, *csv, *part, chunks);
    if (!s)
      return s.takeError();
    return Candidate{std::move(*part), chunks, policy, s->schedule.name,
                     s->sim.stepTime};
  };
  auto recomputeAs = [&](std::optional<RecomputePolicy> policy) {
    if (!policy)
      return;
    stripRecomputation(m.graph);
    m.recomputeStats = applyRecomputation(m.graph, *policy, *layers);
    m.recompute = std::string(recomputePolicyName(*policy));
  };
  for (std::optional<RecomputePolicy> policy : policies) {
    recomputeAs(policy);
    for (int chunks : tries) {
      auto c = attempt(chunks, policy);
      if (!several) {
        if (!c)
          return c.takeError();
        best = std::move(*c);
        break;
      }
      std::string label;
      if (policy)
        label += "recompute " + std::string(recomputePolicyName(*policy)) +
                 ", ";
      label += std::to_string(chunks) + " stage(s) per rank: ";
      if (!c) {
        std::string why = llvm::toString(c.takeError());
        tried += "  " + label + "none (" + why + ")\n";
        // The reason given when nothing fits: one stage per rank's, with
        // the policy that holds least (full recomputation) when auto
        // weighed them.
        if (firstWhy.empty() || (policy && chunks == tries.front()))
          firstWhy = policy && policies.size() > 1
                         ? "even with --recompute=" +
                               std::string(recomputePolicyName(*policy)) +
                               ": " + why
                         : why;
        continue;
      }
      bool seconds = c->part.costs.timeUnit == "s";
      tried += llvm::formatv("  {0}{1}, step {2:F3} {3}\n", label,
                             c->schedule,
                             seconds ? 1e3 * c->stepTime : c->stepTime,
                             seconds ? "ms" : c->part.costs.timeUnit)
                   .str();
      if (!best || c->stepTime < best->stepTime)
        best = std::move(*c);
    }
  }
  if (!best) // every try failed
    return planningError(firstWhy);
  if (policies.size() > 1) {
    // The candidates' partitions name the ops of the graph each policy
    // made; make the chosen one's graph again and partition it again.
    recomputeAs(best->policy);
    auto again = attempt(best->chunks, best->policy);
    if (!again)
      return again.takeError();
    best->part = std::move(again->part);
  }
  m.chunks = best->chunks;
  m.partition = std::move(best->part);
  m.partitionSearched = o.splitAt.empty();
  m.autoTried = several ? tried : "";
  m.layerHint = coarseLayerHint(m.graph, *m.partition, o);
  m.schedule.reset();
  m.sim.reset();
  m.stageGraphs.clear();
  tagOps(m);
  return llvm::Error::success();
}

} // namespace cleave::passes
