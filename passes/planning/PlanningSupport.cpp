// What the planning passes share (passes/planning/PlanningSupport.h).
#include "passes/planning/PlanningSupport.h"

#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/Validator.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::passes::planning {

llvm::Error planningError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

static bool fromCsv(const PlanningOptions &o) {
  return llvm::StringRef(o.schedule).startswith("csv:");
}

llvm::Expected<std::optional<sched::Schedule>>
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

llvm::Error stageShape(const PipelineModule &m,
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

llvm::Expected<PartitionResult>
partitionFor(const PipelineModule &m,
             const std::optional<sched::Schedule> &csv, int chunks,
             int stages, int64_t microbatches, bool followTags) {
  const PlanningOptions &o = m.options;
  PartitionOptions popts;
  popts.stages = stages;
  popts.microbatches = microbatches;
  // A rank's cap is shared by its stages.
  if (o.memCap)
    popts.memCap = (*o.memCap - o.capMargin) / chunks;
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

llvm::Expected<Scheduled>
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

void tagOps(PipelineModule &m) {
  for (const auto &op : m.graph.ops())
    op->setStage(m.partition->stageOfOp.lookup(op.get()));
}

llvm::Error ensurePartition(PipelineModule &m, std::string_view pass) {
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

} // namespace cleave::passes::planning
