// The partition pass: cut the training graph into stages of whole layers
// and tag every op with its stage (passes/Planning.h).
#include "passes/Recompute.h"
#include "passes/schedule/Generators.h"
#include "passes/planning/PlanningSupport.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

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

// The stash policies --recompute=auto weighs, cheapest in time first (the
// per-layer easing tries them in this order): offload only with
// --offload=auto on a device profile with a host link.
static std::vector<StashPolicy> searchedPolicies(const PlanningOptions &o) {
  std::vector<StashPolicy> all = {StashPolicy::None, StashPolicy::Selective};
  if (o.offload == "auto") {
    auto device = lookupDeviceProfile(o.deviceProfile);
    if (device && device->canOffload())
      all.push_back(StashPolicy::Offload);
    else if (!device)
      llvm::consumeError(device.takeError());
  }
  all.push_back(StashPolicy::Full);
  return all;
}

// "recompute selective", "offload".
static std::string policyLabel(StashPolicy p) {
  return p == StashPolicy::Offload
             ? "offload"
             : "recompute " + std::string(stashPolicyName(p));
}

namespace {
// Recomputation chosen per stage on a given split.
struct PerStage {
  PartitionResult part;
  std::vector<StashPolicy> policy;      // by stage
  std::vector<StashPolicy> layerPolicy; // by layer
  int eased = 0; // layers given less than their stage's policy
  std::string table;                   // what each stage weighed
  StashStats stats;
};
} // namespace

// On the split `part` (its stage tags on the graph), each stage takes the
// policy with the least time that fits its share of the cap, weighed from
// every policy applied to the whole split: a stage's frame depends on its
// own ops only, so the choices are independent. Nothing when one policy
// suits every stage, or no policy fits some stage. Leaves the graph
// rewritten as chosen (stripped of recomputation when it returns nothing).
static llvm::Expected<std::optional<PerStage>>
choosePerStage(PipelineModule &m, const std::optional<sched::Schedule> &csv,
               const PartitionResult &part, int chunks,
               const Layering &layers) {
  const std::vector<StashPolicy> all = searchedPolicies(m.options);
  int stages = int(part.stages.size());
  for (const auto &op : m.graph.ops())
    op->setStage(part.stageOfOp.lookup(op.get()));
  PlanningOptions uncapped = m.options;
  uncapped.memCap.reset();
  PipelineModule probe(m.graph, uncapped);
  std::vector<std::vector<StageReport>> reports; // by policy
  for (StashPolicy p : all) {
    stripStashPolicy(m.graph);
    applyStashPolicy(m.graph, p, layers);
    auto r = partitionFor(probe, csv, chunks, stages, part.microbatches, true);
    if (!r) {
      llvm::consumeError(r.takeError());
      stripStashPolicy(m.graph);
      return std::nullopt;
    }
    reports.push_back(r->stages);
  }
  stripStashPolicy(m.graph);
  int64_t cap = (*m.options.memCap - m.options.capMargin) / chunks;
  PerStage out;
  std::string table;
  llvm::raw_string_ostream os(table);
  bool seconds = part.costs.timeUnit == "s";
  for (int st = 0; st < stages; ++st) {
    std::optional<size_t> pick;
    for (size_t k = 0; k < all.size(); ++k)
      if (reports[k][size_t(st)].peakBytes <= cap &&
          (!pick ||
           reports[k][size_t(st)].time() < reports[*pick][size_t(st)].time()))
        pick = k;
    if (!pick)
      return std::nullopt;
    out.policy.push_back(all[*pick]);
    os << llvm::formatv("  stage {0}: {1,-9} (", st,
                        stashPolicyName(all[*pick]));
    for (size_t k = 0; k < all.size(); ++k) {
      const StageReport &r = reports[k][size_t(st)];
      os << (k ? "; " : "") << stashPolicyName(all[k]) << " "
         << formatBytes(r.peakBytes)
         << (r.peakBytes > cap ? " over" : "")
         << llvm::formatv(" {0:F3} {1}", seconds ? 1e3 * r.time() : r.time(),
                          seconds ? "ms" : part.costs.timeUnit);
    }
    os << ")\n";
  }
  // Then per layer: in each stage that recomputes, one layer at a time
  // goes back to a cheaper policy (none, else selective) where the stage
  // still fits, each try one liveness sweep of the split (at most
  // kMostTries in all).
  constexpr int kMostTries = 48;
  size_t layerCount = layers.layers.size();
  std::vector<int> stageOfLayer(layerCount, -1);
  for (const auto &op : m.graph.ops())
    if (op->phase() == ir::Phase::Fwd && layers.layerOfOp.count(op.get()))
      stageOfLayer[layers.layerOfOp.lookup(op.get())] = op->stage();
  out.layerPolicy.assign(layerCount, StashPolicy::None);
  for (size_t l = 0; l < layerCount; ++l)
    if (stageOfLayer[l] >= 0 && stageOfLayer[l] < stages)
      out.layerPolicy[l] = out.policy[size_t(stageOfLayer[l])];
  auto byLayer = [&](const ir::Op &op) {
    auto it = layers.layerOfOp.find(&op);
    return it == layers.layerOfOp.end() ? StashPolicy::None
                                        : out.layerPolicy[it->second];
  };
  int tries = 0;
  for (int st = 0; st < stages && tries < kMostTries; ++st) {
    if (out.policy[size_t(st)] == StashPolicy::None)
      continue;
    for (size_t l = layerCount; l-- > 0 && tries < kMostTries;) {
      if (stageOfLayer[l] != st)
        continue;
      StashPolicy was = out.layerPolicy[l];
      for (StashPolicy cheaper : all) {
        if (cheaper == was || tries >= kMostTries)
          break;
        out.layerPolicy[l] = cheaper;
        stripStashPolicy(m.graph);
        applyStashPolicy(m.graph, byLayer, layers);
        ++tries;
        auto r =
            partitionFor(probe, csv, chunks, stages, part.microbatches, true);
        bool fits = r && r->stages[size_t(st)].peakBytes <= cap;
        if (!r)
          llvm::consumeError(r.takeError());
        if (fits)
          break;
        out.layerPolicy[l] = was;
      }
    }
  }
  stripStashPolicy(m.graph);
  for (int st = 0; st < stages; ++st) {
    std::string mixed;
    for (size_t l = 0; l < layerCount; ++l)
      if (stageOfLayer[l] == st &&
          out.layerPolicy[l] != out.policy[size_t(st)])
        mixed += (mixed.empty() ? "" : ", ") + layers.layers[l].name + " " +
                 std::string(stashPolicyName(out.layerPolicy[l]));
    if (!mixed.empty())
      os << "    stage " << st << ", layers that fit with less: " << mixed
         << "\n";
  }
  for (size_t l = 0; l < layerCount; ++l)
    if (stageOfLayer[l] >= 0 && stageOfLayer[l] < stages &&
        out.layerPolicy[l] != out.policy[size_t(stageOfLayer[l])])
      ++out.eased;
  {
  }
  os.flush();
  if (std::all_of(out.layerPolicy.begin(), out.layerPolicy.end(),
                  [&](StashPolicy p) { return p == out.layerPolicy[0]; }))
    return std::nullopt;
  out.stats = applyStashPolicy(m.graph, byLayer, layers);
  auto mixed = partitionFor(m, csv, chunks, stages, part.microbatches, true);
  if (!mixed) {
    llvm::consumeError(mixed.takeError());
    stripStashPolicy(m.graph);
    return std::nullopt;
  }
  out.part = std::move(*mixed);
  out.table = std::move(table);
  return std::optional<PerStage>(std::move(out));
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
  std::vector<std::optional<StashPolicy>> policies = {std::nullopt};
  std::optional<Layering> layers;
  if (o.recompute == "auto" && o.offload != "all" && o.memCap) {
    auto l = groupLayers(m.graph, {o.layerDepth});
    if (!l)
      return l.takeError();
    layers = std::move(*l);
    policies.clear();
    for (StashPolicy p : searchedPolicies(o))
      policies.push_back(p);
  }
  bool several = tries.size() * policies.size() > 1;
  struct Candidate {
    PartitionResult part;
    int chunks;
    std::optional<StashPolicy> policy;
    std::string schedule; // the name `auto` chose
    double stepTime;
  };
  std::optional<Candidate> best;
  std::string tried, firstWhy;
  auto attempt = [&](int chunks, std::optional<StashPolicy> policy)
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
  auto recomputeAs = [&](std::optional<StashPolicy> policy) {
    if (!policy)
      return;
    stripStashPolicy(m.graph);
    m.recomputeStats = applyStashPolicy(m.graph, *policy, *layers);
    m.recompute = std::string(stashPolicyName(*policy));
  };
  for (std::optional<StashPolicy> policy : policies) {
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
        label += policyLabel(*policy) + ", ";
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
                               std::string(stashPolicyName(*policy)) +
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
  m.recomputeByStage.clear();
  m.recomputeTable.clear();
  if (policies.size() > 1) {
    // The candidates' partitions name the ops of the graph each policy
    // made; make the chosen one's graph again and partition it again.
    recomputeAs(best->policy);
    auto again = attempt(best->chunks, best->policy);
    if (!again)
      return again.takeError();
    best->part = std::move(again->part);
    // Then, on that split, a policy per stage where that is faster.
    auto perStage =
        choosePerStage(m, *csv, best->part, best->chunks, *layers);
    if (!perStage)
      return perStage.takeError();
    std::optional<double> mixedStep;
    if (*perStage) {
      auto s = scheduleFor(m, *csv, (*perStage)->part, best->chunks);
      if (s)
        mixedStep = s->sim.stepTime;
      else
        llvm::consumeError(s.takeError());
    }
    if (mixedStep && *mixedStep < best->stepTime) {
      bool seconds = best->part.costs.timeUnit == "s";
      tried += llvm::formatv("  recompute per stage, {0} stage(s) per rank: "
                             "{1}, step {2:F3} {3}\n",
                             best->chunks, best->schedule,
                             seconds ? 1e3 * *mixedStep : *mixedStep,
                             seconds ? "ms" : best->part.costs.timeUnit)
                   .str();
      best->part = std::move((*perStage)->part);
      best->stepTime = *mixedStep;
      for (StashPolicy p : (*perStage)->policy)
        m.recomputeByStage.push_back(std::string(stashPolicyName(p)));
      m.recomputeTable = std::move((*perStage)->table);
      m.recomputeStats = (*perStage)->stats;
      m.recomputeEased = (*perStage)->eased;
      m.recompute = "per stage";
    } else {
      recomputeAs(best->policy);
      auto uniform = attempt(best->chunks, best->policy);
      if (!uniform)
        return uniform.takeError();
      best->part = std::move(uniform->part);
      if (*perStage)
        m.recomputeTable = std::move((*perStage)->table);
    }
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
