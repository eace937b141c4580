// The planning passes: partition, schedule, split-stages, plan-memory
// (docs/design/planning-passes.md).
#include "passes/Planning.h"

#include "passes/MemoryPlan.h"
#include "passes/Stages.h"
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Validator.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>

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
    // The CSV decides, but a flag that says otherwise is refused rather
    // than silently overridden.
    int ranks = sched::rankCount(*csv);
    if (m.options.stagesGiven && ranks != m.options.stages)
      return planningError(llvm::formatv(
          "{0} has {1} ranks, but --stages is {2} (drop --stages or make "
          "them agree)",
          m.options.schedule, ranks, m.options.stages));
    if (m.options.microbatchesGiven &&
        csv->microbatches != m.options.microbatches)
      return planningError(llvm::formatv(
          "{0} has {1} microbatches, but --microbatches is {2} (drop "
          "--microbatches or make them agree)",
          m.options.schedule, csv->microbatches, m.options.microbatches));
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
  m.partitionSearched = false; // the tags are a given split
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

int rankOfStage(const PipelineModule &m, int stage) {
  if (!m.schedule || m.schedule->rankOf.empty())
    return stage;
  return m.schedule->rankOf[size_t(stage)];
}

// The most microbatch frames stage `stage` holds at once: one from each
// microbatch's F to its last compute action there (what the executor
// keeps, and codegen's plannedPeakBytes counts).
static int heldFrames(const sched::Schedule &s, int stage) {
  const std::vector<sched::Action> &acts = s.actions[size_t(stage)];
  auto computes = [](sched::ActionKind k) {
    return k == sched::ActionKind::F || k == sched::ActionKind::B ||
           k == sched::ActionKind::W || k == sched::ActionKind::BW;
  };
  std::vector<size_t> last(size_t(s.microbatches), 0);
  for (size_t i = 0; i < acts.size(); ++i)
    if (computes(acts[i].kind) && acts[i].microbatch >= 0)
      last[size_t(acts[i].microbatch)] = i;
  int live = 0, most = 0;
  for (size_t i = 0; i < acts.size(); ++i) {
    if (!computes(acts[i].kind) || acts[i].microbatch < 0)
      continue;
    if (acts[i].kind == sched::ActionKind::F)
      most = std::max(most, ++live);
    if (last[size_t(acts[i].microbatch)] == i)
      --live;
  }
  return most;
}

static void layOutMemory(PipelineModule &m) {
  m.memory.clear();
  const ir::Value *loss =
      m.graph.outputs().empty() ? nullptr : m.graph.outputs()[0];
  for (size_t s = 0; s < m.stageGraphs.size(); ++s) {
    const ir::Graph &stage = *m.stageGraphs[s];
    StageFrames frames = planStageFrames(
        stage, loss ? stage.lookup(loss->name()) : nullptr);
    PipelineModule::StageMemory mem;
    mem.frameBytes = frames.micro.size;
    mem.frameLivePeak = frames.micro.livePeak;
    mem.stepFrameBytes = frames.step.size;
    mem.persistentBytes = frames.persistentBytes;
    mem.heldFrames = heldFrames(*m.schedule, int(s));
    mem.peakBytes = mem.persistentBytes + mem.stepFrameBytes +
                    int64_t(mem.heldFrames) * mem.frameBytes;
    m.memory.push_back(mem);
  }
}

namespace {
struct RankOver {
  int rank = 0;
  std::string stages;
  int64_t peak = 0;
};
} // namespace

// The rank furthest above the cap, if one is.
static std::optional<RankOver> worstRank(const PipelineModule &m,
                                         int64_t cap) {
  std::map<int, RankOver> ranks;
  for (size_t s = 0; s < m.memory.size(); ++s) {
    RankOver &r = ranks[rankOfStage(m, int(s))];
    r.rank = rankOfStage(m, int(s));
    r.peak += m.memory[s].peakBytes;
    r.stages += (r.stages.empty() ? "" : ",") + std::to_string(s);
  }
  std::optional<RankOver> worst;
  for (const auto &[rank, r] : ranks)
    if (r.peak > cap && (!worst || r.peak > worst->peak))
      worst = r;
  return worst;
}

llvm::Error planMemoryPass(PipelineModule &m) {
  if (auto e = ensurePartition(m, "plan-memory"))
    return e;
  if (m.stageGraphs.empty())
    if (auto e = splitStagesPass(m))
      return e;
  if (!m.schedule)
    if (auto e = schedulePass(m))
      return e;
  layOutMemory(m);
  m.memoryWarning.clear();
  m.memoryRefits = 0;
  if (!m.options.memCap)
    return llvm::Error::success();
  // --mem-cap bounds the partitioner's count: the peak of live bytes of
  // each stage's frames (docs/design/memory-count.md). Laying the frames out
  // can leave gaps of a few percent: where that puts a rank above the cap,
  // partition again under a cap smaller by the overshoot (at most three
  // times, and only where the partition was searched), and say so if a rank
  // is still above it.
  int64_t cap = *m.options.memCap;
  PlanningOptions tighter = m.options;
  for (int refit = 0; refit < 3 && m.partitionSearched; ++refit) {
    std::optional<RankOver> over = worstRank(m, cap);
    if (!over)
      break;
    *tighter.memCap -= over->peak - cap;
    PipelineModule again(m.graph, tighter);
    llvm::Error e = partitionPass(again);
    if (!e)
      e = schedulePass(again);
    if (!e)
      e = splitStagesPass(again);
    if (e) { // no split fits the tighter count: keep this one
      llvm::consumeError(std::move(e));
      tagOps(m);
      break;
    }
    layOutMemory(again);
    m.partition = std::move(again.partition);
    m.chunks = again.chunks;
    m.autoTried = std::move(again.autoTried);
    m.layerHint = std::move(again.layerHint);
    m.schedule = std::move(again.schedule);
    m.sim = std::move(again.sim);
    m.stageGraphs = std::move(again.stageGraphs);
    m.memory = std::move(again.memory);
    // The table shows the user's cap, not the tightened one.
    m.partition->memCap = cap / m.chunks;
    ++m.memoryRefits;
  }
  if (std::optional<RankOver> over = worstRank(m, cap))
    m.memoryWarning = llvm::formatv(
        "the memory plan of rank {0} (stage {1}) peaks at {2} ({3} bytes), "
        "above --mem-cap {4}: the partition counts the peak of live bytes, "
        "and laying out the frames left gaps that no other split avoided",
        over->rank, over->stages, formatBytes(over->peak), over->peak,
        formatBytes(cap));
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
    {"plan-memory",
     "lay out every stage's frames as codegen does and check each rank's "
     "peak under the schedule against --mem-cap (partitioning again under "
     "a tighter cap where the layout's gaps overshoot it)",
     planMemoryPass},
};

llvm::ArrayRef<PlanningPassInfo> planningPasses() { return kPlanningPasses; }

const PlanningPassInfo *lookupPlanningPass(std::string_view name) {
  return findPass(planningPasses(), name);
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
  if (!m.memory.empty()) {
    os << "// memory plan (bytes; peak = persistent + step frame + held x "
          "frame):\n";
    os << llvm::formatv("// {0,5} {1,4} {2,12} {3,12} {4,12} {5,12} {6,4} "
                        "{7,12}\n",
                        "stage", "rank", "frame", "live peak", "step frame",
                        "persistent", "held", "peak");
    std::map<int, int64_t> rankPeak;
    for (size_t s = 0; s < m.memory.size(); ++s) {
      const PipelineModule::StageMemory &x = m.memory[s];
      int rank = rankOfStage(m, int(s));
      rankPeak[rank] += x.peakBytes;
      os << llvm::formatv("// {0,5} {1,4} {2,12} {3,12} {4,12} {5,12} {6,4} "
                          "{7,12}\n",
                          s, rank, x.frameBytes, x.frameLivePeak,
                          x.stepFrameBytes, x.persistentBytes, x.heldFrames,
                          x.peakBytes);
    }
    for (const auto &[rank, peak] : rankPeak) {
      os << "// rank " << rank << ": peak " << peak << " (" << formatBytes(peak)
         << ")";
      if (m.options.memCap)
        os << (peak > *m.options.memCap ? ", above" : ", within")
           << " --mem-cap " << formatBytes(*m.options.memCap);
      os << "\n";
    }
    if (m.memoryRefits)
      os << "// partitioned again " << m.memoryRefits
         << " time(s) under a tighter cap: the first layout overshot it\n";
  }
  os.flush();
}

} // namespace cleave::passes
