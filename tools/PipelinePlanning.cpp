#include "tools/PipelinePlanning.h"
#include "support/Errors.h"
#include "tools/HostProfile.h"

#include "passes/Pipelines.h"

#include "passes/Partition.h"
#include "passes/Stages.h"
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Simulator.h"
#include "passes/schedule/Timeline.h"
#include "passes/schedule/Validator.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

namespace cleave::tools {

std::vector<Flags::Spec> planningFlagSpecs() {
  return {{"stages", true, false},       {"schedule", true, false},
          {"chunks", true, false},
          {"mem-cap", true, false},      {"cost-model", true, false},
          {"device-profile", true, false}, {"split-at", true, false},
          {"layer-depth", true, false},  {"timeline", true, true},
          {"report", true, false},       {"recompute", true, false},
          {"offload", true, false},      {"devices", true, false}};
}

const char kPlanningHelp[] = R"(pipeline (needs a training graph):
  --stages=P             split the training step over P pipeline ranks
  --devices=N            instead of --stages and --data-parallel: weigh
                         every layout of N devices as P pipeline ranks x D
                         data-parallel replicas (P x D = N; the M
                         microbatches of --microbatches shared by the D
                         replicas, M/D each), each partitioned and scheduled
                         (with --schedule auto also 1 or 2 stages per
                         rank), its step predicted with the gradients'
                         ring all-reduce over the device profile's link;
                         prints the candidates and plans the fastest that
                         fits --mem-cap
  --schedule=NAME        gpipe, 1f1b (default), gpipe-2bp, 1f1b-2bp, zb-h1,
                         zb-h2, auto (fastest simulated schedule within
                         --mem-cap), or csv:FILE (PyTorch pipelining notation);
                         several stages per rank: interleaved-1f1b,
                         interleaved-1f1b-2bp, looped-bfs, looped-bfs-2bp,
                         zb-v, v-half, v-min, dualpipe-v (M >= 2P)
  --chunks=V             stages per rank for those (default 2; the V ones
                         take only 2): P x V stages in all
  --mem-cap=SIZE         bytes per rank (2GiB, 512MiB, ...): the partition
                         and the schedule must fit it (each of a rank's V
                         stages gets SIZE/V)
  --cost-model=analytic|uniform|profile:FILE
                         where times come from (default analytic: FLOPs and
                         bytes against --device-profile; profile:FILE: the
                         op times `cleave-run --profile FILE` measured)
  --device-profile=cpu|host|h200|a100
                         the device the analytic cost model times (its
                         FLOP rates and memory bandwidth); default host:
                         this machine's, measured when cleavec starts
                         with the threads each stage gets, and each
                         distinct op of the model run once with its own
                         kernel from cold caches (a second or two; at most
                         20 s, then the formulas), or $CLEAVE_DEVICE_PROFILE
                         if set; cpu: this machine kind's fixed figures,
                         the same plan on every machine
  --recompute=none|selective|full|auto
                         forward values the backward reads, made again in
                         the backward instead of held from the forward, on
                         every layer: none; selective (what cheap ops make:
                         everything but the matrix products and
                         convolutions, whose results are kept); full (only
                         each layer's input is kept). Same bits as none,
                         less memory, more time. auto (default): with
                         --mem-cap the planner weighs the three with every
                         split and takes the fastest that fits; without a
                         cap, none
  --offload=none|auto|all
                         forward values the backward reads, copied to host
                         memory after the forward and back before the
                         backward (GPU plans: --device cuda, or
                         cuda-emulated, which copies to a separate host
                         arena; the CPU backend has one memory and refuses
                         them). all: every layer; auto (default): with
                         --mem-cap and --recompute=auto on a device profile
                         with a host link (h200, a100), the planner weighs
                         it beside recomputation per stage and layer; none:
                         never. Same bits as keeping them
  --split-at=LAYER,...   first layers of stages 1..P-1 instead of the search
  --layer-depth=N        module-path components per layer (default: the
                         shallowest depth with repeated blocks, such as
                         transformer blocks; 0: cut points)
  --timeline=FILE.json|FILE.svg
                         the predicted step as a Perfetto trace or a Gantt
                         picture (repeatable)
  --report=FILE.json     stage table and schedule figures as JSON
)";

bool wantsPlanning(const Flags &flags) {
  return flags.has("stages") || flags.has("schedule") || flags.has("devices");
}

llvm::Expected<PlanningRequest> readPlanningFlags(const Flags &flags) {
  PlanningRequest req;
  if (auto s = flags.get("stages")) {
    auto n = parseCount("stages", *s);
    if (!n)
      return n.takeError();
    if (*n < 1)
      return cleave::fail("--stages must be at least 1");
    if (auto e = checkLimit(flags, "stages", *n, &support::SizeLimits::workers,
                            "stages"))
      return std::move(e);
    req.stages = int(*n);
    req.stagesGiven = true;
  }
  if (auto d = flags.get("devices")) {
    if (flags.has("stages") || flags.has("data-parallel"))
      return cleave::fail("--devices chooses the stages and the data-parallel "
                          "replicas itself: it does not go with --stages or "
                          "--data-parallel");
    auto n = parseCount("devices", *d);
    if (!n)
      return n.takeError();
    if (*n < 1)
      return cleave::fail("--devices must be at least 1");
    if (auto e = checkLimit(flags, "devices", *n,
                            &support::SizeLimits::workers, "devices"))
      return std::move(e);
    req.devices = int(*n);
  }
  if (auto m = flags.get("microbatches")) {
    auto n = parseCount("microbatches", *m);
    if (!n)
      return n.takeError();
    if (auto e = checkLimit(flags, "microbatches", *n,
                            &support::SizeLimits::microbatches, "microbatches"))
      return std::move(e);
    req.microbatches = std::max<int64_t>(*n, 1);
    req.microbatchesGiven = true;
  }
  req.schedule = flags.get("schedule").value_or("1f1b");
  bool fromCsv = llvm::StringRef(req.schedule).startswith("csv:");
  if (!fromCsv)
    if (auto e = sched::checkScheduleName(req.schedule))
      return std::move(e);
  if (fromCsv) {
    // Its size first, against the bounds the flags have.
    auto s = sched::readScheduleCsvFile(req.schedule.substr(4));
    if (!s)
      return s.takeError();
    if (auto e = checkCsvLimits(flags, req.schedule, s->stages,
                                sched::rankCount(*s), s->microbatches))
      return std::move(e);
  }
  if (auto c = flags.get("chunks")) {
    if (fromCsv)
      return cleave::fail(
          "--chunks does not go with a CSV schedule, which places "
          "its stages itself");
    auto n = parseCount("chunks", *c);
    if (!n)
      return n.takeError();
    if (*n < 1)
      return cleave::fail("--chunks must be at least 1");
    if (auto e = checkLimit(flags, "chunks", *n * req.stages,
                            &support::SizeLimits::workers, "stages"))
      return std::move(e);
    req.chunks = int(*n);
  }
  if (auto r = flags.get("recompute")) {
    if (*r != "auto" && !passes::parseStashPolicy(*r))
      return cleave::fail(
          "--recompute must be none, selective, full or auto, not '" + *r +
          "'");
    req.recompute = *r;
  }
  if (auto o = flags.get("offload")) {
    if (*o != "none" && *o != "auto" && *o != "all")
      return cleave::fail("--offload must be none, auto or all, not '" + *o +
                          "'");
    if (*o == "all" && req.recompute != "auto" && req.recompute != "none")
      return cleave::fail("--offload=all and --recompute=" + req.recompute +
                          " both decide every layer's stash; give one of them");
    req.offload = *o;
  }
  if (auto c = flags.get("mem-cap")) {
    auto bytes = passes::parseByteSize(*c);
    if (!bytes)
      return cleave::fail("--mem-cap: " + llvm::toString(bytes.takeError()));
    req.memCap = *bytes;
  }
  req.costModel = flags.get("cost-model").value_or("analytic");
  auto profile = chooseDeviceProfile(flags.get("device-profile"), req.stages);
  if (!profile)
    return profile.takeError();
  req.deviceProfile = *profile;
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
      return cleave::fail("--timeline needs a .json or .svg file, not '" + t +
                          "'");
  req.report = flags.get("report");
  req.emitCsv = flags.get("emit").value_or("") == "schedule-csv";
  req.emitOpTimes = flags.get("emit").value_or("") == "op-times";
  return req;
}

namespace {

// A profile measured while other work held the cores times that sharing
// (support/CpuShare.h): one note saying so, so that a plan made from it on
// a busy machine is not mistaken for one of a quiet machine.
void noteProfileSharing(llvm::StringRef costModel) {
  if (!costModel.consume_front("profile:"))
    return;
  auto profile = passes::OpProfile::load(costModel.str());
  if (!profile) { // the planning passes reported it already
    llvm::consumeError(profile.takeError());
    return;
  }
  const auto &sharing = profile->sharing();
  if (!sharing)
    return;
  double waited = 0;
  for (const auto &[stage, w] : sharing->coreWait)
    waited = std::max(waited, w);
  bool others = profile->sharesCores();
  if (!others && !(!sharing->otherCores && waited >= 1e-4))
    return;
  if (others)
    llvm::errs() << llvm::formatv(
        "note: {0} was measured while other processes wanted {1:F2} of its "
        "{2} core(s) (a rank waited up to {3:F3} ms a step for a core): the "
        "simulation shares the {4:F2} core(s) they left between the ranks, "
        "as then\n",
        costModel, *profile->otherCoresWanted(), sharing->cores, 1e3 * waited,
        profile->coresLeft());
  else
    llvm::errs() << llvm::formatv(
        "note: {0} was measured while its ranks waited for a core (up to "
        "{1:F3} ms a step): its op times and this plan's predictions hold "
        "that sharing\n",
        costModel, 1e3 * waited);
}

} // namespace

llvm::Expected<PlanningResult> planPipeline(ir::Graph &g,
                                            const PlanningRequest &req,
                                            const passes::PipelineOptions &opts) {
  passes::PipelineModule m(g, req);
  passes::PipelineOptions quiet = opts;
  quiet.planningErrorsNamePass = false;
  if (auto e = passes::runPlanningPasses(
          m, passes::passNames(passes::planningPipeline()), quiet))
    return std::move(e);
  noteHostOpTimes();
  noteProfileSharing(req.costModel);
  const passes::PartitionResult *part = &*m.partition;
  const sched::Schedule *schedule = &*m.schedule;
  const sched::SimResult *sim = &*m.sim;

  PlanningResult out;
  out.stageGraphs = std::move(m.stageGraphs);
  out.schedule = *schedule;
  out.stageReports = part->stages;
  // cleave-run finishes a step on every stage before it starts the next,
  // so what it measures is the isolated step (the makespan), not the
  // steady-state period of steps that overlap.
  out.predictedStepTime = sim->makespan;
  out.predictedPeriod = sim->stepTime;
  out.timeUnit = part->costs.timeUnit;
  out.memoryWarning = m.memoryWarning;
  llvm::raw_string_ostream text(out.text);
  if (req.emitCsv) {
    text << sched::scheduleToCsv(*schedule);
  } else if (req.emitOpTimes) {
    // The cost model's op times in the --profile format, to set beside a
    // measured one op by op.
    llvm::json::Array ops;
    for (const auto &[key, seconds] : part->opTimes)
      ops.push_back(llvm::json::Object{
          {"loc", key.first},
          {"phase", std::string(ir::phaseName(key.second))},
          {"time", seconds}});
    text << llvm::formatv("{0:2}\n", llvm::json::Value(llvm::json::Object{
                                          {"time_unit", "s"},
                                          {"ops", std::move(ops)}}));
  } else {
    text << passes::planningSummary(m);
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
      return cleave::fail(
          "internal error: the stage report is not a JSON object");
    (*obj)["schedule"] = sched::scheduleReport(*schedule, *sim, part->costs);
    std::string json;
    llvm::raw_string_ostream js(json);
    js << llvm::formatv("{0:2}", llvm::json::Value(std::move(*obj))) << "\n";
    js.flush();
    out.files.push_back({*req.report, json});
  }
  return out;
}

llvm::Expected<std::string> compareSchedules(ir::Graph &g,
                                             const PlanningRequest &req) {
  std::vector<std::string> names;
  for (const auto *list : {&sched::scheduleNames(),
                           &sched::chunkedScheduleNames()})
    for (const std::string &n : *list)
      if (n != "auto" &&
          std::find(names.begin(), names.end(), n) == names.end())
        names.push_back(n);
  names.push_back("auto");
  std::string out;
  llvm::raw_string_ostream os(out);
  std::string unit;
  bool header = false;
  for (const std::string &name : names) {
    passes::PlanningOptions o = req;
    o.schedule = name;
    // --chunks is for the schedules with several stages per rank.
    if (name != "auto" && !sched::isChunkedSchedule(name))
      o.chunks = 0;
    passes::PipelineModule m(g, o);
    passes::PipelineOptions quiet;
    quiet.planningErrorsNamePass = false;
    llvm::Error err = passes::runPlanningPasses(
        m, std::vector<std::string>{"recompute", "partition", "schedule"},
        quiet);
    if (!header) {
      os << llvm::formatv("{0,-28} {1,-7} {2,12} {3,12} {4,8} {5,14}\n",
                          "schedule", "P x V", "step", "steady", "bubble",
                          "peak bytes");
      header = true;
    }
    std::string label = name == "auto" && m.schedule
                            ? "auto: " + m.schedule->name
                            : name;
    if (err) {
      std::string why = llvm::toString(std::move(err));
      os << llvm::formatv("{0,-28} cannot run: {1}\n", label, why);
      continue;
    }
    const sched::SimResult &sim = *m.sim;
    bool seconds = m.partition->costs.timeUnit == "s";
    double k = seconds ? 1e3 : 1;
    unit = seconds ? "ms" : m.partition->costs.timeUnit;
    double bubble = 0;
    int64_t peak = 0;
    for (const sched::RankStats &r : sim.ranks) {
      bubble = std::max(bubble, r.bubble);
      peak = std::max(peak, r.peakBytes);
    }
    int ranks = sched::rankCount(*m.schedule);
    os << llvm::formatv("{0,-28} {1,-7} {2,12:F3} {3,12:F3} {4,7:F1}% {5,14}\n",
                        label,
                        std::to_string(ranks) + " x " +
                            std::to_string(m.schedule->stages / ranks),
                        k * sim.makespan, k * sim.stepTime, 100 * bubble,
                        passes::formatBytes(peak));
  }
  os << "step: one isolated step (what cleave-run measures); steady: the "
        "period of overlapping steps; times in "
     << (unit.empty() ? "ms" : unit)
     << ", bubble and peak bytes of the worst rank"
     << (req.memCap ? "; auto: the fastest within --mem-cap" : "") << "\n";
  os.flush();
  return out;
}

} // namespace cleave::tools
