// The partition pass: cut the training graph into stages of whole layers
// and tag every op with its stage (passes/Planning.h).
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
  struct Candidate {
    PartitionResult part;
    int chunks;
    std::string schedule; // the name `auto` chose
    double stepTime;
  };
  std::optional<Candidate> best;
  std::string tried, firstWhy;
  for (int chunks : tries) {
    int stages = 0;
    int64_t microbatches = 0;
    // With one candidate the schedule pass makes its schedule; with
    // several, each is scheduled here to compare their steps.
    auto attempt = [&]() -> llvm::Expected<Candidate> {
      if (auto e = stageShape(m, *csv, chunks, stages, microbatches))
        return std::move(e);
      auto part = partitionFor(m, *csv, chunks, stages, microbatches, false);
      if (!part)
        return part.takeError();
      if (tries.size() == 1)
        return Candidate{std::move(*part), chunks, "", 0.0};
      auto s = scheduleFor(m, *csv, *part, chunks);
      if (!s)
        return s.takeError();
      return Candidate{std::move(*part), chunks, s->schedule.name,
                       s->sim.stepTime};
    };
    auto c = attempt();
    if (tries.size() == 1) {
      if (!c)
        return c.takeError();
      best = std::move(*c);
      break;
    }
    std::string label = std::to_string(chunks) + " stage(s) per rank: ";
    if (!c) {
      std::string why = llvm::toString(c.takeError());
      tried += "  " + label + "none (" + why + ")\n";
      if (firstWhy.empty())
        firstWhy = why;
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
  if (!best) // every try failed: the one-stage-per-rank reason
    return planningError(firstWhy);
  m.chunks = best->chunks;
  m.partition = std::move(best->part);
  m.partitionSearched = o.splitAt.empty();
  m.autoTried = tries.size() > 1 ? tried : "";
  m.layerHint = coarseLayerHint(m.graph, *m.partition, o);
  m.schedule.reset();
  m.sim.reset();
  m.stageGraphs.clear();
  tagOps(m);
  return llvm::Error::success();
}

} // namespace cleave::passes
