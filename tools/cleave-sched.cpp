// cleave-sched: builds, checks and simulates one pipeline schedule without a
// model, for the lit tests and the pictures in docs/schedules.md. Its flags
// are the ones cleavec takes for schedules; all the work is in
// passes/schedule.
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Simulator.h"
#include "passes/schedule/Timeline.h"
#include "passes/schedule/Validator.h"
#include "support/Errors.h"
#include "tools/ToolSupport.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <climits>
#include <cmath>

using namespace cleave;
using namespace cleave::passes::schedule;
using tools::fail;

static const char kTool[] = "cleave-sched";

static const char kHelp[] = R"(usage: cleave-sched --stages P --microbatches M --schedule NAME [options]

Builds a pipeline schedule for P stages and M microbatches, checks it and
simulates one training step: step time, bubble fraction, peak activation
memory per stage.

  --schedule=NAME        gpipe, 1f1b, gpipe-2bp, 1f1b-2bp, zb-h1, zb-h2, auto
                         (fastest that fits --mem-cap), or csv:FILE (PyTorch
                         torch.distributed.pipelining notation; P and M come
                         from the file); with several stages per rank:
                         interleaved-1f1b, interleaved-1f1b-2bp, looped-bfs,
                         looped-bfs-2bp, zb-v, v-half, v-min,
                         dualpipe-v
  --stages=P             pipeline ranks (devices)
  --chunks=V             stages per rank (default 2 for the schedules with
                         several, else 1): P x V stages in all
  --microbatches=M       microbatches per step
  --costs=F,B,W          time of a forward, input-gradient and
                         weight-gradient step of one rank's share of the
                         model (default 1,1,1); each of its V stages takes
                         1/V of it
  --mem-cap=N            at most N microbatches of activations held on any
                         stage
  --emit=summary|schedule-csv
                         print the figures (default) or the schedule as CSV
  -o FILE                write that output to FILE instead of stdout
  --timeline=FILE        FILE.json: Chrome trace / Perfetto; FILE.svg: Gantt
                         chart (repeatable)
  --report=FILE          the figures as JSON ({"schedule": {...}})
  -h, --help             show this help
)";

static const char kExitStatus[] = R"(
exit status: 0 success, 1 bad schedule, 2 bad usage. No file is written
unless everything succeeds.
)";

namespace {

struct Request {
  std::string schedule;
  std::optional<int> stages, microbatches, memCap, chunks;
  double f = 1, b = 1, w = 1;
  std::string emit = "summary";
};

// A count of at least 1 and at most the `limit` of support/Limits.h (the
// --mem-cap, a bound itself, is only kept within int).
llvm::Error readCount(const tools::Flags &flags, const char *name,
                      std::optional<int> &out,
                      int64_t support::SizeLimits::*limit, const char *what) {
  auto v = flags.get(name);
  if (!v)
    return llvm::Error::success();
  auto n = tools::parseCount(name, *v);
  if (!n)
    return n.takeError();
  if (*n < 1)
    return cleave::fail(std::string("--") + name + " must be at least 1");
  if (limit)
    if (auto e = tools::checkLimit(flags, name, *n, limit, what))
      return e;
  out = int(std::min<int64_t>(*n, INT_MAX));
  return llvm::Error::success();
}

llvm::Error readCosts(const std::string &text, Request &req) {
  auto parts = tools::splitList(text);
  double v[3];
  for (size_t i = 0; i < parts.size() && i < 3; ++i)
    if (llvm::StringRef(parts[i]).getAsDouble(v[i]) || !std::isfinite(v[i]))
      parts.clear();
  if (parts.size() != 3 || !(v[0] > 0) || !(v[1] > 0) || v[2] < 0)
    return cleave::fail(
        "--costs needs F,B,W with F and B above 0 and W at least 0, "
        "not '" +
        text + "'");
  req.f = v[0], req.b = v[1], req.w = v[2];
  return llvm::Error::success();
}

llvm::Expected<Request> readRequest(const tools::Flags &flags) {
  Request req;
  req.schedule = flags.get("schedule").value_or("");
  if (req.schedule.empty())
    return cleave::fail("--schedule is required (see --help)");
  struct Count {
    const char *name;
    std::optional<int> *dst;
    int64_t support::SizeLimits::*limit;
    const char *what;
  };
  for (Count c : {Count{"stages", &req.stages, &support::SizeLimits::workers,
                        "stages"},
                  Count{"microbatches", &req.microbatches,
                        &support::SizeLimits::microbatches, "microbatches"},
                  Count{"mem-cap", &req.memCap, nullptr, ""},
                  Count{"chunks", &req.chunks, &support::SizeLimits::workers,
                        "stages per rank"}})
    if (auto e = readCount(flags, c.name, *c.dst, c.limit, c.what))
      return std::move(e);
  bool fromCsv = llvm::StringRef(req.schedule).startswith("csv:");
  if (!fromCsv)
    if (auto e = checkScheduleName(req.schedule))
      return std::move(e);
  if (!fromCsv && (!req.stages || !req.microbatches))
    return cleave::fail("--schedule " + req.schedule +
                        " needs --stages and --microbatches");
  if (fromCsv && req.chunks)
    return cleave::fail(
        "--chunks does not go with a CSV schedule, which places its "
        "stages itself");
  if (auto c = flags.get("costs"))
    if (auto e = readCosts(*c, req))
      return std::move(e);
  req.emit = flags.get("emit").value_or("summary");
  if (req.emit != "summary" && req.emit != "schedule-csv")
    return cleave::fail("--emit must be 'summary' or 'schedule-csv', not '" +
                        req.emit + "'");
  for (const std::string &t : flags.getAll("timeline"))
    if (!llvm::StringRef(t).endswith(".json") &&
        !llvm::StringRef(t).endswith(".svg"))
      return cleave::fail("--timeline needs a .json or .svg file, not '" + t +
                          "'");
  return req;
}

// Each of the `stages` stages takes 1/v of a rank's share, v = stages per
// rank.
passes::PipelineCosts costsFor(const Request &req, int stages, int ranks) {
  passes::PipelineCosts costs = passes::PipelineCosts::uniform(stages);
  double v = ranks > 0 ? double(stages) / double(ranks) : 1;
  for (passes::StageCost &c : costs.stages)
    c.f = req.f / v, c.b = req.b / v, c.w = req.w / v;
  return costs;
}

// The CSV's own P and M, checked against --stages / --microbatches if given.
llvm::Expected<Schedule> loadCsv(const Request &req,
                                 const tools::Flags &flags) {
  auto s = readScheduleCsvFile(req.schedule.substr(4));
  if (!s)
    return s.takeError();
  if (auto e = tools::checkCsvLimits(flags, req.schedule, s->stages,
                                     rankCount(*s), s->microbatches))
    return std::move(e);
  if (req.stages && *req.stages != rankCount(*s))
    return cleave::fail(req.schedule + " has " + std::to_string(rankCount(*s)) +
                        " ranks, but --stages is " +
                        std::to_string(*req.stages));
  if (req.microbatches && *req.microbatches != s->microbatches)
    return cleave::fail(req.schedule + " has " +
                        std::to_string(s->microbatches) +
                        " microbatches, but --microbatches is " +
                        std::to_string(*req.microbatches));
  return s;
}

} // namespace

static int toolMain(int argc, char **argv) {
  tools::Flags flags({{"schedule", true, false},
                      {"stages", true, false},
                      {"microbatches", true, false},
                      {"costs", true, false},
                      {"mem-cap", true, false},
                      {"chunks", true, false},
                      {"emit", true, false},
                      {"o", true, false},
                      {"timeline", true, true},
                      {"report", true, false},
                      tools::allowLargeFlagSpec(),
                      {"help", false, false},
                      {"h", false, false}});
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help") || flags.has("h"))
    return tools::printHelp(
        kTool, flags,
        std::string(kHelp) + "\n" +
            tools::allowLargeHelp({tools::LargeBound::Stages,
                                   tools::LargeBound::Microbatches}) +
            kExitStatus);
  if (!flags.positional().empty())
    return fail(kTool, "unexpected argument '" + flags.positional()[0] + "'",
                tools::kUsage);
  auto req = readRequest(flags);
  if (!req)
    return fail(kTool, llvm::toString(req.takeError()), tools::kUsage);

  if (auto e = tools::checkOutputs(flags, {"o", "timeline", "report"}))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  bool fromCsv = llvm::StringRef(req->schedule).startswith("csv:");
  int chunks = req->chunks.value_or(defaultChunks(req->schedule));
  auto sched = [&]() -> llvm::Expected<Schedule> {
    if (fromCsv)
      return loadCsv(*req, flags);
    int64_t total = int64_t(*req->stages) * chunks;
    if (auto e = tools::checkLimit(flags, "chunks", total,
                                   &support::SizeLimits::workers, "stages"))
      return std::move(e);
    return makeSchedule(
        req->schedule, int(total), *req->microbatches,
        costsFor(*req, int(total), *req->stages),
        req->memCap ? HeldCap(size_t(total), *req->memCap) : HeldCap(), chunks);
  }();
  if (!sched)
    return fail(kTool, llvm::toString(sched.takeError()), tools::kBadInput);
  passes::PipelineCosts costs =
      costsFor(*req, sched->stages, rankCount(*sched));
  if (auto e = validateSchedule(*sched, costs, req->memCap))
    return fail(kTool, sched->name + ": " + llvm::toString(std::move(e)),
                tools::kBadInput);
  auto sim = simulate(*sched, costs);
  if (!sim)
    return fail(kTool, llvm::toString(sim.takeError()), tools::kBadInput);

  // Every output is made before any is written.
  std::vector<std::pair<std::string, std::string>> outputs;
  outputs.push_back({flags.get("o").value_or("-"),
                     req->emit == "schedule-csv"
                         ? scheduleToCsv(*sched)
                         : scheduleSummary(*sched, *sim, costs)});
  for (const std::string &t : flags.getAll("timeline"))
    outputs.push_back({t, llvm::StringRef(t).endswith(".svg")
                              ? ganttSvg(*sched, *sim, costs)
                              : chromeTrace(*sched, *sim, costs)});
  if (auto r = flags.get("report"))
    outputs.push_back({*r, scheduleReportJson(*sched, *sim, costs)});
  for (const auto &[path, text] : outputs)
    if (auto e = tools::writeOutput(path, text))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  return tools::kOk;
}

int main(int argc, char **argv) {
  return tools::guardedMain(kTool, argc, argv, toolMain);
}
