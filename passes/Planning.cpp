// The planning passes: partition, schedule, split-stages
// (docs/design/planning-passes.md).
#include "passes/Planning.h"

#include "passes/Stages.h"
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Validator.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::passes {

namespace sched = schedule;

static llvm::Error planningError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

static bool fromCsv(const PlanningOptions &o) {
  return llvm::StringRef(o.schedule).startswith("csv:");
}

static llvm::Expected<std::optional<sched::Schedule>>
readCsv(const PlanningOptions &o) {
  if (!fromCsv(o))
    return std::nullopt;
  auto s = sched::readScheduleCsvFile(o.schedule.substr(4));
  if (!s)
    return s.takeError();
  return std::optional<sched::Schedule>(std::move(*s));
}

// The microbatches each stage holds at most, for the partitioner's memory
// check: what the schedule itself holds at equal costs, simulated (the
// count the validator and the schedule report use too), for every named
// schedule and a CSV alike. For `auto`, per stage the least that any
// schedule it may pick holds: the split must fit at least one of them, and
// the schedule is then chosen under the cap with the real costs.
static llvm::Expected<std::vector<int64_t>>
heldMicrobatches(const std::optional<sched::Schedule> &csv,
                 const std::string &name, int stages, int64_t microbatches,
                 int chunks) {
  PipelineCosts uniform = PipelineCosts::uniform(stages);
  std::vector<std::string> names = {name};
  if (!csv && name == "auto") {
    names.clear();
    for (const std::string &n : chunks == 1 ? sched::scheduleNames()
                                            : sched::chunkedScheduleNames())
      if (n != "auto")
        names.push_back(n);
  }
  std::vector<int64_t> out(size_t(stages), microbatches);
  for (const std::string &n : names) {
    if (!csv) {
      if (llvm::Error e =
              sched::checkChunks(n, stages, int(microbatches), chunks)) {
        if (names.size() == 1)
          return std::move(e);
        llvm::consumeError(std::move(e)); // not one `auto` may pick
        continue;
      }
    }
    llvm::Expected<sched::Schedule> s =
        csv ? llvm::Expected<sched::Schedule>(*csv)
            : sched::makeSchedule(n, stages, int(microbatches), uniform,
                                  sched::HeldCap(), chunks);
    if (!s)
      return s.takeError();
    if (s->stages != stages)
      return planningError(llvm::formatv(
          "the schedule has {0} stages, the plan {1}", s->stages, stages));
    auto sim = sched::simulate(*s, uniform);
    if (!sim) { // the validator reports it with the real costs
      llvm::consumeError(sim.takeError());
      continue;
    }
    for (int st = 0; st < stages; ++st)
      out[size_t(st)] = std::min<int64_t>(
          out[size_t(st)], sim->stages[size_t(st)].peakActivationMicrobatches);
  }
  return out;
}

// The stages in all and the microbatches a plan with `chunks` stages per
// rank has: the CSV's own, or the options'.
static llvm::Error stageShape(const PipelineModule &m,
                              const std::optional<sched::Schedule> &csv,
                              int &chunks, int &stages,
                              int64_t &microbatches) {
  stages = m.options.stages * chunks;
  microbatches = m.options.microbatches;
  if (csv) {
    stages = csv->stages;
    microbatches = csv->microbatches;
    chunks = std::max(1, stages / sched::rankCount(*csv));
    return llvm::Error::success();
  }
  return sched::checkChunks(m.options.schedule, stages, int(microbatches),
                            chunks);
}

// Partitions the module's graph into `stages` stages, `chunks` per rank: by
// search, by --split-at, or (followTags) as the ops' stage tags say.
static llvm::Expected<PartitionResult>
partitionFor(const PipelineModule &m,
             const std::optional<sched::Schedule> &csv, int chunks,
             int stages, int64_t microbatches, bool followTags) {
  const PlanningOptions &o = m.options;
  PartitionOptions popts;
  popts.stages = stages;
  popts.microbatches = microbatches;
  // A rank's cap is shared by its stages.
  if (o.memCap)
    popts.memCap = *o.memCap / chunks;
  auto held = heldMicrobatches(csv, o.schedule, stages, microbatches, chunks);
  if (!held)
    return held.takeError();
  popts.heldMicrobatches = std::move(*held);
  popts.splitAt = followTags ? std::vector<std::string>() : o.splitAt;
  popts.followStageTags = followTags;
  auto model = parseCostModel(o.costModel);
  if (!model)
    return model.takeError();
  popts.costModel = *model;
  popts.deviceProfile = o.deviceProfile;
  popts.layers.depth = o.layerDepth;
  return partition(m.graph, popts);
}

namespace {
struct Scheduled {
  sched::Schedule schedule;
  sched::SimResult sim;
};
} // namespace

// The schedule for a partition: generated (or the CSV's) with the
// activations each stage may hold under the cap, counted as the
// partitioner counted them, validated and simulated.
static llvm::Expected<Scheduled>
scheduleFor(const PipelineModule &m, std::optional<sched::Schedule> csv,
            const PartitionResult &part, int chunks) {
  int stages = int(part.stages.size());
  sched::HeldCap cap = part.memCap
                           ? sched::heldCapFor(part.costs, *part.memCap)
                           : sched::HeldCap();
  llvm::Expected<sched::Schedule> s =
      csv ? llvm::Expected<sched::Schedule>(std::move(*csv))
          : sched::makeSchedule(m.options.schedule, stages,
                                int(part.microbatches), part.costs, cap,
                                chunks);
  if (!s)
    return s.takeError();
  if (auto e = sched::validateSchedule(*s, part.costs, cap))
    return planningError(s->name + ": " + llvm::toString(std::move(e)));
  auto sim = sched::simulate(*s, part.costs);
  if (!sim)
    return sim.takeError();
  return Scheduled{std::move(*s), std::move(*sim)};
}

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

static void tagOps(PipelineModule &m) {
  for (const auto &op : m.graph.ops())
    op->setStage(m.partition->stageOfOp.lookup(op.get()));
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
  std::string tried;
  std::optional<llvm::Error> firstError;
  for (int chunks : tries) {
    int stages = 0;
    int64_t microbatches = 0;
    auto attempt = [&]() -> llvm::Expected<Candidate> {
      if (auto e = stageShape(m, *csv, chunks, stages, microbatches))
        return std::move(e);
      auto part = partitionFor(m, *csv, chunks, stages, microbatches, false);
      if (!part)
        return part.takeError();
      auto s = scheduleFor(m, *csv, *part, chunks);
      if (!s)
        return s.takeError();
      return Candidate{std::move(*part), chunks, s->schedule.name,
                       s->sim.stepTime};
    };
    auto c = attempt();
    std::string label = std::to_string(chunks) + " stage(s) per rank: ";
    if (!c) {
      std::string why = llvm::toString(c.takeError());
      if (tries.size() == 1)
        return planningError(why);
      tried += "  " + label + "none (" + why + ")\n";
      if (!firstError)
        firstError = planningError(why);
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
    return std::move(*firstError);
  if (firstError)
    llvm::consumeError(std::move(*firstError));
  m.chunks = best->chunks;
  m.partition = std::move(best->part);
  m.autoTried = tries.size() > 1 ? tried : "";
  m.layerHint = coarseLayerHint(m.graph, *m.partition, o);
  m.schedule.reset();
  m.sim.reset();
  m.stageGraphs.clear();
  tagOps(m);
  return llvm::Error::success();
}

// The partition the stage tags give, for a pass run on a module printed
// after `partition`.
static llvm::Error ensurePartition(PipelineModule &m, std::string_view pass) {
  if (m.partition)
    return llvm::Error::success();
  int tagged = -1;
  for (const auto &op : m.graph.ops())
    tagged = std::max(tagged, op->stage());
  if (tagged < 0)
    return planningError(std::string(pass) +
                         " needs a partitioned module: run partition before "
                         "it, or give it IR with stage tags ([s] before each "
                         "op)");
  if (!m.graph.isTraining())
    return planningError(std::string(pass) + " needs a training graph");
  auto csv = readCsv(m.options);
  if (!csv)
    return csv.takeError();
  int stages = tagged + 1;
  int chunks = 1;
  int64_t microbatches = m.options.microbatches;
  if (*csv) {
    if (auto e = stageShape(m, *csv, chunks, stages, microbatches))
      return e;
  } else {
    chunks = m.options.chunks ? m.options.chunks
                              : sched::defaultChunks(m.options.schedule);
    if (m.options.stagesGiven && !m.options.chunks)
      chunks = std::max(1, stages / m.options.stages);
    if (stages % chunks ||
        (m.options.stagesGiven && stages != m.options.stages * chunks))
      return planningError(llvm::formatv(
          "the stage tags make {0} stages, which is not {1} rank(s) x {2} "
          "stage(s) per rank",
          stages, m.options.stagesGiven ? m.options.stages : stages / chunks,
          chunks));
    if (auto e = sched::checkChunks(m.options.schedule, stages,
                                    int(microbatches), chunks))
      return e;
  }
  auto part = partitionFor(m, *csv, chunks, stages, microbatches, true);
  if (!part)
    return part.takeError();
  m.partition = std::move(*part);
  m.chunks = chunks;
  m.layerHint.clear();
  return llvm::Error::success();
}

llvm::Error schedulePass(PipelineModule &m) {
  if (auto e = ensurePartition(m, "schedule"))
    return e;
  auto csv = readCsv(m.options);
  if (!csv)
    return csv.takeError();
  auto s = scheduleFor(m, std::move(*csv), *m.partition, m.chunks);
  if (!s)
    return s.takeError();
  m.schedule = std::move(s->schedule);
  m.sim = std::move(s->sim);
  return llvm::Error::success();
}

llvm::Error splitStagesPass(PipelineModule &m) {
  if (auto e = ensurePartition(m, "split-stages"))
    return e;
  auto graphs = splitStages(m.graph, m.partition->stageOfOp, m.stageCount());
  if (!graphs)
    return graphs.takeError();
  m.stageGraphs = std::move(*graphs);
  return llvm::Error::success();
}

static const PlanningPassInfo kPlanningPasses[] = {
    {"partition",
     "cut the training graph into --stages x --chunks stages of whole "
     "layers (searched under --mem-cap, or --split-at) and tag every op "
     "[s] with its stage",
     partitionPass},
    {"schedule",
     "order every rank's F, B and W actions (--schedule), check them "
     "against the memory cap and simulate the step",
     schedulePass},
    {"split-stages",
     "make one graph per stage, with Send and Recv ops where values cross "
     "stages",
     splitStagesPass},
};

llvm::ArrayRef<PlanningPassInfo> planningPasses() { return kPlanningPasses; }

const PlanningPassInfo *lookupPlanningPass(std::string_view name) {
  for (const PlanningPassInfo &p : kPlanningPasses)
    if (p.name == name)
      return &p;
  return nullptr;
}

std::string planningSummary(const PipelineModule &m) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (m.partition) {
    printStageTable(*m.partition, os);
    os << m.layerHint;
    if (!m.autoTried.empty())
      os << "auto tried:\n" << m.autoTried;
  }
  if (m.schedule && m.sim)
    os << sched::scheduleSummary(*m.schedule, *m.sim, m.partition->costs);
  os.flush();
  return text;
}

static void printCommented(llvm::StringRef text, llvm::raw_ostream &os) {
  llvm::SmallVector<llvm::StringRef, 32> lines;
  text.rtrim('\n').split(lines, '\n');
  for (llvm::StringRef l : lines)
    os << (l.empty() ? "//" : "// ") << l << "\n";
}

void printModule(const PipelineModule &m, llvm::raw_ostream &os,
                 const ir::PrintOptions &opts) {
  if (m.stageGraphs.empty()) {
    ir::printGraph(m.graph, os, opts);
  } else {
    for (size_t s = 0; s < m.stageGraphs.size(); ++s) {
      if (s)
        os << "\n";
      ir::printGraph(*m.stageGraphs[s], os, opts);
    }
  }
  std::string summary = planningSummary(m);
  if (!summary.empty()) {
    os << "// pipeline: " << m.stageCount() << " stage(s), " << m.chunks
       << " per rank\n";
    printCommented(summary, os);
  }
  if (m.schedule) {
    os << "// schedule (PyTorch pipelining notation):\n";
    printCommented(sched::scheduleToCsv(*m.schedule), os);
  }
  os.flush();
}

} // namespace cleave::passes
