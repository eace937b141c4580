#include "tools/PipelinePlanning.h"

#include "passes/Partition.h"
#include "passes/Stages.h"
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Simulator.h"
#include "passes/schedule/Timeline.h"
#include "passes/schedule/Validator.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace cleave::tools {


static llvm::Error usage(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

std::vector<Flags::Spec> planningFlagSpecs() {
  return {{"stages", true, false},       {"schedule", true, false},
          {"chunks", true, false},
          {"mem-cap", true, false},      {"cost-model", true, false},
          {"device-profile", true, false}, {"split-at", true, false},
          {"layer-depth", true, false},  {"timeline", true, true},
          {"report", true, false}};
}

const char kPlanningHelp[] = R"(pipeline (needs a training graph):
  --stages=P             split the training step over P pipeline ranks
  --schedule=NAME        gpipe, 1f1b (default), gpipe-2bp, 1f1b-2bp, zb-h1,
                         zb-h2, auto (fastest simulated schedule within
                         --mem-cap), or csv:FILE (PyTorch pipelining notation);
                         several stages per rank: interleaved-1f1b,
                         interleaved-1f1b-2bp, looped-bfs, looped-bfs-2bp,
                         zb-v, v-half, dualpipe-v (M >= 2P)
  --chunks=V             stages per rank for those (default 2; the V ones
                         take only 2): P x V stages in all
  --microbatches=M       microbatches per step (also averages the gradients)
  --mem-cap=SIZE         bytes per rank (2GiB, 512MiB, ...): the partition
                         and the schedule must fit it (each of a rank's V
                         stages gets SIZE/V)
  --cost-model=analytic|uniform|profile:FILE
                         where times come from (default analytic: FLOPs and
                         bytes against --device-profile cpu|h200|a100)
  --split-at=LAYER,...   first layers of stages 1..P-1 instead of the search
  --layer-depth=N        module-path components per layer (default: the
                         shallowest depth with repeated blocks, such as
                         transformer blocks; 0: cut points)
  --timeline=FILE.json|FILE.svg
                         the predicted step as a Perfetto trace or a Gantt
                         picture (repeatable)
  --report=FILE.json     stage table and schedule figures as JSON
  --emit=schedule-csv    print the schedule in PyTorch's notation
)";

bool wantsPlanning(const Flags &flags) {
  return flags.has("stages") || flags.has("schedule");
}

llvm::Expected<PlanningRequest> readPlanningFlags(const Flags &flags) {
  PlanningRequest req;
  if (auto s = flags.get("stages")) {
    auto n = parseCount("stages", *s);
    if (!n)
      return n.takeError();
    if (*n < 1)
      return usage("--stages must be at least 1");
    if (auto e = checkLimit(flags, "stages", *n, &support::SizeLimits::workers,
                            "stages"))
      return std::move(e);
    req.stages = int(*n);
  }
  if (auto m = flags.get("microbatches")) {
    auto n = parseCount("microbatches", *m);
    if (!n)
      return n.takeError();
    if (auto e = checkLimit(flags, "microbatches", *n,
                            &support::SizeLimits::microbatches, "microbatches"))
      return std::move(e);
    req.microbatches = std::max<int64_t>(*n, 1);
  }
  req.schedule = flags.get("schedule").value_or("1f1b");
  bool fromCsv = llvm::StringRef(req.schedule).startswith("csv:");
  if (!fromCsv)
    if (auto e = sched::checkScheduleName(req.schedule))
      return std::move(e);
  if (auto c = flags.get("chunks")) {
    if (fromCsv)
      return usage("--chunks does not go with a CSV schedule, which places "
                   "its stages itself");
    auto n = parseCount("chunks", *c);
    if (!n)
      return n.takeError();
    if (*n < 1)
      return usage("--chunks must be at least 1");
    if (auto e = checkLimit(flags, "chunks", *n * req.stages,
                            &support::SizeLimits::workers, "stages"))
      return std::move(e);
    req.chunks = int(*n);
  }
  if (auto c = flags.get("mem-cap")) {
    auto bytes = passes::parseByteSize(*c);
    if (!bytes)
      return usage("--mem-cap: " + llvm::toString(bytes.takeError()));
    req.memCap = *bytes;
  }
  req.costModel = flags.get("cost-model").value_or("analytic");
  req.deviceProfile = flags.get("device-profile").value_or("cpu");
  if (auto s = flags.get("split-at"))
    req.splitAt = splitList(*s);
  if (auto d = flags.get("layer-depth")) {
    auto n = parseCount("layer-depth", *d);
    if (!n)
      return n.takeError();
    req.layerDepth = unsigned(*n);
  }
  req.timelines = flags.getAll("timeline");
  for (const std::string &t : req.timelines)
    if (!llvm::StringRef(t).endswith(".json") &&
        !llvm::StringRef(t).endswith(".svg"))
      return usage("--timeline needs a .json or .svg file, not '" + t + "'");
  req.report = flags.get("report");
  req.emitCsv = flags.get("emit").value_or("") == "schedule-csv";
  return req;
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
  passes::PipelineCosts uniform = passes::PipelineCosts::uniform(stages);
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
      if (llvm::Error e = sched::checkChunks(n, stages, int(microbatches),
                                             chunks)) {
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
      return usage(llvm::formatv("the schedule has {0} stages, the plan {1}",
                                 s->stages, stages));
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

// When the searched split is unbalanced, as when a whole encoder is one
// layer, the line that says how to cut finer: the layer count one
// name-scope deeper. Empty when balanced, when the split was given, with one
// microbatch, or when a deeper scope adds no layers.
static std::string coarseLayerHint(const ir::Graph &g,
                                   const passes::PartitionResult &part,
                                   const PlanningRequest &req) {
  constexpr double kCoarse = 1.2;
  // With one microbatch the stages run one after the other anyway.
  if (!req.splitAt.empty() || part.imbalance <= kCoarse ||
      part.microbatches < 2 || part.layering.depth == 0)
    return "";
  unsigned depth = part.layering.depth + 1;
  auto deeper = passes::groupLayers(g, {depth});
  if (!deeper || deeper->layers.size() <= part.layering.layers.size())
    return "";
  return llvm::formatv("hint: imbalance {0:F2}; finer layers may balance the "
                       "stages better: --layer-depth {1} cuts one name-scope "
                       "deeper ({2} layers instead of {3})\n",
                       part.imbalance, depth,
                       deeper->layers.size(), part.layering.layers.size())
      .str();
}

namespace {

// One partition and schedule: what planPipeline weighs and then emits.
struct Planned {
  passes::PartitionResult part;
  sched::Schedule schedule;
  sched::SimResult sim;
  int stages = 0;
};

} // namespace

// Partitions `g` into req.stages x chunks stages and schedules them (or
// follows the CSV `csv`).
static llvm::Expected<Planned> planWith(const ir::Graph &g,
                                        const PlanningRequest &req, int chunks,
                                        std::optional<sched::Schedule> csv) {
  int stages = req.stages * chunks; // in all, over req.stages ranks
  int64_t microbatches = req.microbatches;
  if (csv) {
    stages = csv->stages;
    microbatches = csv->microbatches;
    chunks = std::max(1, stages / sched::rankCount(*csv));
  } else if (auto e = sched::checkChunks(req.schedule, stages,
                                         int(microbatches), chunks)) {
    return std::move(e);
  }

  passes::PartitionOptions popts;
  popts.stages = stages;
  popts.microbatches = microbatches;
  // A rank's cap is shared by its stages.
  if (req.memCap)
    popts.memCap = *req.memCap / chunks;
  auto held =
      heldMicrobatches(csv, req.schedule, stages, microbatches, chunks);
  if (!held)
    return held.takeError();
  popts.heldMicrobatches = std::move(*held);
  popts.splitAt = req.splitAt;
  auto model = passes::parseCostModel(req.costModel);
  if (!model)
    return model.takeError();
  popts.costModel = *model;
  popts.deviceProfile = req.deviceProfile;
  popts.layers.depth = req.layerDepth;
  auto part = passes::partition(g, popts);
  if (!part)
    return part.takeError();

  // The activations each stage may hold under the cap, counted as the
  // partitioner counted them.
  sched::HeldCap cap = popts.memCap
                           ? sched::heldCapFor(part->costs, *popts.memCap)
                           : sched::HeldCap();
  llvm::Expected<sched::Schedule> schedule =
      csv ? llvm::Expected<sched::Schedule>(std::move(*csv))
          : sched::makeSchedule(req.schedule, stages, int(microbatches),
                                part->costs, cap, chunks);
  if (!schedule)
    return schedule.takeError();
  if (auto e = sched::validateSchedule(*schedule, part->costs, cap))
    return usage(schedule->name + ": " + llvm::toString(std::move(e)));
  auto sim = sched::simulate(*schedule, part->costs);
  if (!sim)
    return sim.takeError();
  return Planned{std::move(*part), std::move(*schedule), std::move(*sim),
                 stages};
}

llvm::Expected<PlanningResult> planPipeline(const ir::Graph &g,
                                            const PlanningRequest &req) {
  std::optional<sched::Schedule> csv;
  if (llvm::StringRef(req.schedule).startswith("csv:")) {
    auto s = sched::readScheduleCsvFile(req.schedule.substr(4));
    if (!s)
      return s.takeError();
    csv = std::move(*s);
  }
  // `auto` without --chunks also weighs 2 stages per rank (not with
  // --split-at, whose cuts are for one stage per rank).
  std::vector<int> tries = {req.chunks > 0 ? req.chunks
                                           : sched::defaultChunks(req.schedule)};
  if (req.schedule == "auto" && req.chunks == 0 && req.splitAt.empty())
    tries.push_back(2);
  std::optional<Planned> best;
  std::string tried;
  for (int chunks : tries) {
    auto p = planWith(g, req, chunks, csv);
    if (tries.size() == 1 && !p)
      return p.takeError();
    std::string label = std::to_string(chunks) + " stage(s) per rank: ";
    if (!p) {
      tried += "  " + label + "none (" + llvm::toString(p.takeError()) + ")\n";
      continue;
    }
    bool seconds = p->part.costs.timeUnit == "s";
    tried += llvm::formatv("  {0}{1}, step {2:F3} {3}\n", label,
                           p->schedule.name,
                           seconds ? 1e3 * p->sim.stepTime : p->sim.stepTime,
                           seconds ? "ms" : p->part.costs.timeUnit)
                 .str();
    if (!best || p->sim.stepTime < best->sim.stepTime)
      best = std::move(*p);
  }
  if (!best) // every try failed: the one-stage-per-rank reason
    return planWith(g, req, tries[0], csv).takeError();
  passes::PartitionResult *part = &best->part;
  sched::Schedule *schedule = &best->schedule;
  sched::SimResult *sim = &best->sim;
  int stages = best->stages;

  PlanningResult out;
  auto stageGraphs = passes::splitStages(g, part->stageOfOp, stages);
  if (!stageGraphs)
    return stageGraphs.takeError();
  out.stageGraphs = std::move(*stageGraphs);
  out.schedule = *schedule;
  out.stageReports = part->stages;
  // cleave-run finishes a step on every stage before it starts the next,
  // so what it measures is the isolated step (the makespan), not the
  // steady-state period of steps that overlap.
  out.predictedStepTime = sim->makespan;
  out.predictedPeriod = sim->stepTime;
  out.timeUnit = part->costs.timeUnit;
  llvm::raw_string_ostream text(out.text);
  if (req.emitCsv) {
    text << sched::scheduleToCsv(*schedule);
  } else {
    passes::printStageTable(*part, text);
    text << coarseLayerHint(g, *part, req);
    if (tries.size() > 1)
      text << "auto tried:\n" << tried;
    text << sched::scheduleSummary(*schedule, *sim, part->costs);
  }
  text.flush();
  for (const std::string &t : req.timelines)
    out.files.push_back({t, llvm::StringRef(t).endswith(".svg")
                                ? sched::ganttSvg(*schedule, *sim, part->costs)
                                : sched::chromeTrace(*schedule, *sim,
                                                     part->costs)});
  if (req.report) {
    std::string stageJson;
    llvm::raw_string_ostream os(stageJson);
    passes::writeStageReportJson(*part, os);
    os.flush();
    auto parsed = llvm::json::parse(stageJson);
    if (!parsed)
      return parsed.takeError();
    llvm::json::Object *obj = parsed->getAsObject();
    if (!obj)
      return usage("internal error: the stage report is not a JSON object");
    (*obj)["schedule"] = sched::scheduleReport(*schedule, *sim, part->costs);
    std::string json;
    llvm::raw_string_ostream js(json);
    js << llvm::formatv("{0:2}", llvm::json::Value(std::move(*obj))) << "\n";
    js.flush();
    out.files.push_back({*req.report, json});
  }
  return out;
}

} // namespace cleave::tools
