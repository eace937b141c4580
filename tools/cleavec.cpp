// cleavec: the cleave compiler driver. It imports an ONNX model, makes the
// training graph when the model has a loss (autodiff, the 2BP split,
// optimizer), plans the pipeline when asked (partition, schedule,
// simulation; tools/PipelinePlanning.h) and prints IR, a summary or the
// schedule. The Plan file joins its outputs with the runtime.
#include "codegen/Codegen.h"
#include "codegen/PlanCheck.h"
#include "frontend/OnnxImporter.h"
#include "ir/Printer.h"
#include "ir/Summary.h"
#include "ir/Verifier.h"
#include "passes/Partition.h"
#include "passes/Pass.h"
#include "passes/Pipelines.h"
#include "passes/Planning.h"
#include "runtime/PlanFile.h"
#include "support/TrustedPaths.h"
#include "tools/Compile.h"
#include "tools/PipelinePlanning.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

using namespace cleave;
using tools::fail;

static const char kTool[] = "cleavec";

static const char kHelp[] = R"(usage: cleavec MODEL.onnx [options]

Compiles an ONNX model for pipeline-parallel training. cleavec imports the
model (ONNX checker and shape inference, shape folding, static shapes); when
the model's output is a scalar loss (or --loss / --add-loss name one) it
makes the training graph: autodiff, the split of every backward op into
input-gradient (B) and weight-gradient (W) work, and the optimizer update,
every op tagged fwd, B, W or opt. With --stages it cuts the training step
into pipeline stages (one graph per stage with explicit Send and Recv ops:
--emit=ir prints them), builds the schedule, checks it and predicts the
step by simulation. -o FILE.cplan writes the plan cleave-run trains.

output:
  --emit=summary|ir|schedule-csv|op-times
                         what to print (default: summary): inputs, counts
                         of parameters, ops and training work, and with
                         --stages the stage table and the schedule's
                         figures; or the whole graph as cleave IR text
                         (.cir); or the schedule in PyTorch's notation;
                         or the cost model's time of every op in the
                         format of cleave-run --profile, to set beside
                         one measured (both keyed by location and phase)
  --verbose              the summary in full: every output of the graph
                         (a training graph's gradients and updated state)
                         and every op kind's count
  -o FILE                write the output to FILE instead of stdout; FILE is
                         written only when compilation succeeds. FILE.cplan:
                         the training plan that cleave-run trains (per stage
                         programs, messages, schedule, memory plan,
                         parameters; one stage unless --stages says more),
                         with the summary on stdout
  --weights=reference|embed
                         with -o FILE.cplan: parameters whose bytes are in
                         the model's external data file are referenced
                         (file, range, checksum; default), so the plan stays
                         small and each rank reads only its own weights
                         from that file, which must stay unchanged; or
                         copied into the plan (embed). Weights inside the
                         .onnx are always copied
  --batch-w              with -o FILE.cplan: each run of W actions of
                         consecutive microbatches computes each weight-
                         gradient product once, over their operands side by
                         side (fewer, larger GEMMs; the same sums up to
                         rounding); its scratch is in the planned peak
  --inline-limit=N       in IR text, spell out tensors of at most N elements
                         (default 16); larger ones refer to their file

shapes:
  --microbatch-size=N    bind a symbolic leading (batch) dimension of every
                         input to N (refused when the model fixes it:
                         re-export with a dynamic batch dimension)
  --input-shape=NAME=D0,D1,...
                         give input NAME this static shape (repeatable)
  --module-mode=auto|train|eval
                         the mode BatchNorm and Dropout run in (default
                         auto: as the exporter recorded it; a dynamo
                         export's BatchNorm trains on batch statistics when
                         its signature says the module updated its running
                         statistics, i.e. it ran in train())

  --inference            do not make a training graph, even when the model
                         has a scalar loss

%TRAINING%
%PLANNING%
inspection:
  --dump-ir-after=PASS|all
                         print the IR to stderr after PASS (repeatable):
%PASSES%; the verifier runs after every pass
  --compare-schedules    with --stages: partition and simulate every
                         schedule (one row each: ranks x stages per rank,
                         predicted step and steady-state period, worst
                         bubble and peak bytes; the one auto picks) and
                         print that table instead of a plan
  --list-ops             list the ONNX ops cleave imports and exit
  -h, --help             show this help
  --version              show the version

exit status: 0 success, 1 bad input (model, data), 2 bad usage.
)";

static std::string helpText() {
  std::string h = kHelp;
  h.replace(h.find("%TRAINING%"), 10, tools::kTrainingHelp);
  h.replace(h.find("%PASSES%"), 8,
            tools::wrapText(passes::describeCompilePipeline(), 25, 79));
  h.replace(h.find("%PLANNING%"), 10,
            tools::kPlanningHelp +
                tools::allowLargeHelp({tools::LargeBound::Workers,
                                       tools::LargeBound::Microbatches}));
  return h;
}

static int listOps() {
  std::vector<std::string> folded, expanded, unrolled;
  auto ops = frontend::supportedOnnxOps(&folded, &expanded, &unrolled);
  llvm::outs() << "ONNX ops imported by cleave (default domain, opsets "
               << frontend::kMinOpset << "-" << frontend::kMaxOpset << "):\n";
  auto has = [](const std::vector<std::string> &v, const std::string &op) {
    return std::find(v.begin(), v.end(), op) != v.end();
  };
  for (const std::string &op : ops)
    llvm::outs() << "  " << op
                 << (has(folded, op) ? "  (must fold to a constant)"
                     : has(expanded, op)
                         ? "  (expanded into its ONNX function body)"
                     : !has(unrolled, op) ? ""
                     : op == "Loop"
                         ? "  (unrolled: its trip count and condition must "
                           "fold)"
                         : "  (its condition must fold: the taken branch is "
                           "inlined)")
                 << "\n";
  llvm::outs() << "Other ops that ONNX defines by a function body are "
                  "expanded the same way; they import when every op of the "
                  "body does.\n";
  return tools::kOk;
}

// -o FILE.cplan: the plan built and checked, the memory warnings, the
// timeline and report files, then the plan; the summary on stdout.
static int writePlan(tools::CompileResult &compiled,
                     const tools::CompileOptions &copts,
                     const tools::Flags &flags, const std::string &weights,
                     const std::string &summary,
                     std::optional<int64_t> memCap) {
  tools::PlanOutputOptions po;
  po.referenceWeights = weights == "reference";
  po.batchW = flags.has("batch-w");
  auto built = tools::buildRunnablePlan(compiled, copts, po);
  if (!built)
    return fail(kTool, llvm::toString(built.takeError()), tools::kBadInput);
  const tools::PlanningResult &plan = *compiled.plan;
  // plan-memory has partitioned again where the frames' layout overshot
  // --mem-cap; what is still above it (or above it only with --batch-w's
  // scratch, which codegen adds) is said here.
  auto worstOver = [&](const runtime::Plan &p)
      -> std::optional<std::pair<int, int64_t>> {
    std::map<int, int64_t> rankPeak;
    for (size_t s = 0; s < p.stages.size(); ++s)
      rankPeak[p.stageRank.empty() ? int(s) : p.stageRank[s]] +=
          p.stages[s].predictedPeakBytes;
    std::optional<std::pair<int, int64_t>> worst;
    for (const auto &[r, peak] : rankPeak)
      if (peak > *memCap && (!worst || peak > worst->second))
        worst = std::make_pair(r, peak);
    return worst;
  };
  if (!plan.memoryWarning.empty())
    llvm::errs() << "cleavec: warning: " << plan.memoryWarning << "\n";
  else if (memCap)
    if (auto over = worstOver(*built))
      llvm::errs() << llvm::formatv(
          "cleavec: warning: with --batch-w's scratch the memory plan of "
          "rank {0} peaks at {1} ({2} bytes), above --mem-cap {3}\n",
          over->first, passes::formatBytes(over->second), over->second,
          passes::formatBytes(*memCap));
  for (const auto &[path, text] : plan.files)
    if (auto e = tools::writeOutput(path, text))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  if (auto e = runtime::writePlanFile(*built, *flags.get("o")))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  llvm::outs() << summary << "\n" << plan.text << "wrote " << *flags.get("o")
               << "\n";
  // cleave-run reads what a plan names only inside the plan's folder
  // unless told to trust another (docs/reliability.md): say so now rather
  // than after a training run.
  llvm::SmallString<256> planDir, modelDir;
  llvm::SmallString<256> planAbs(*flags.get("o"));
  llvm::sys::fs::make_absolute(planAbs);
  llvm::SmallString<256> modelAbs(copts.model);
  llvm::sys::fs::make_absolute(modelAbs);
  if (!llvm::sys::fs::real_path(llvm::sys::path::parent_path(planAbs),
                                planDir) &&
      !llvm::sys::fs::real_path(llvm::sys::path::parent_path(modelAbs),
                                modelDir) &&
      !(modelDir.str() == planDir.str() ||
        modelDir.str().startswith((planDir + "/").str())))
    llvm::outs() << "note: the model is outside the plan's folder: run it "
                    "with cleave-run --trust-dir "
                 << modelDir << " (for --save and the model's weights)\n";
  return tools::kOk;
}

static int toolMain(int argc, char **argv) {
  std::vector<tools::Flags::Spec> specs = tools::trainingFlagSpecs();
  for (const tools::Flags::Spec &p : tools::planningFlagSpecs())
    specs.push_back(p);
  specs.insert(specs.end(), {{"emit", true, false},
                      {"o", true, false},
                      {"weights", true, false},
                      {"batch-w", false, false},
                      {"inline-limit", true, false},
                      {"microbatch-size", true, false},
                      {"input-shape", true, true},
                      {"module-mode", true, false},
                      {"dump-ir-after", true, true},
                      {"list-ops", false, false},
                      {"help", false, false},
                      {"h", false, false},
                      {"verbose", false, false},
                      {"compare-schedules", false, false},
                      {"inference", false, false},
                      {"version", false, false}});
  tools::Flags flags(specs);
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help") || flags.has("h"))
    return tools::printHelp(kTool, flags, helpText());
  if (flags.has("version")) {
    llvm::outs() << "cleavec " << CLEAVE_VERSION << "\n";
    return tools::kOk;
  }
  if (flags.has("list-ops"))
    return listOps();
  if (flags.positional().size() != 1)
    return fail(kTool,
                flags.positional().empty()
                    ? "no input model given (usage: cleavec MODEL.onnx "
                      "[options]; see --help)"
                    : "expected one input model, got " +
                          std::to_string(flags.positional().size()),
                tools::kUsage);
  std::string emit = flags.get("emit").value_or("summary");
  if (emit != "summary" && emit != "ir" && emit != "schedule-csv" &&
      emit != "op-times")
    return fail(kTool,
                "--emit must be 'summary', 'ir', 'schedule-csv' or 'op-times', "
                "not '" +
                    emit + "'",
                tools::kUsage);
  std::optional<tools::PlanningRequest> planning;
  bool planOut = llvm::StringRef(flags.get("o").value_or("")).endswith(".cplan");
  std::string weights = flags.get("weights").value_or("reference");
  if (weights != "reference" && weights != "embed")
    return fail(kTool,
                "--weights must be 'reference' or 'embed', not '" + weights +
                    "'",
                tools::kUsage);
  if (flags.has("weights") && !planOut)
    return fail(kTool, "--weights goes with -o FILE.cplan", tools::kUsage);
  bool compare = flags.has("compare-schedules");
  if (compare && (!flags.has("stages") || flags.has("o") ||
                  flags.has("emit") || flags.has("timeline") ||
                  flags.has("report") || flags.has("schedule")))
    return fail(kTool,
                "--compare-schedules needs --stages and prints a table: it "
                "does not go with -o, --emit, --schedule, --timeline or "
                "--report",
                tools::kUsage);
  if (flags.has("verbose") && emit != "summary")
    return fail(kTool, "--verbose lengthens the summary; it does not go with "
                       "--emit=" + emit,
                tools::kUsage);
  if (flags.has("batch-w") && !planOut)
    return fail(kTool, "--batch-w goes with -o FILE.cplan", tools::kUsage);
  if (planOut && emit != "summary")
    return fail(kTool, "-o FILE.cplan writes a plan; it does not go with --emit",
                tools::kUsage);
  if (tools::wantsPlanning(flags) || emit == "schedule-csv" ||
      emit == "op-times" || planOut) {
    auto req = tools::readPlanningFlags(flags);
    if (!req)
      return fail(kTool, llvm::toString(req.takeError()), tools::kUsage);
    planning = std::move(*req);
  } else {
    for (const char *f : {"chunks", "mem-cap", "cost-model", "device-profile",
                          "split-at", "layer-depth", "timeline", "report"})
      if (flags.has(f))
        return fail(kTool,
                    std::string("--") + f +
                        " goes with --stages or --schedule (pipeline "
                        "planning)",
                    tools::kUsage);
  }
  ir::PrintOptions print;
  if (auto e = tools::readPrintFlags(flags, print))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  frontend::ImportOptions importOpts;
  if (auto e = tools::readImportFlags(flags, importOpts))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  importOpts.warn = [](const std::string &w) {
    llvm::errs() << kTool << ": warning: " << w << "\n";
  };
  passes::PipelineOptions pipe;
  std::optional<tools::LossRequest> addLoss;
  if (auto e = tools::readTrainingFlags(flags, pipe.context.training, addLoss))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (planning)
    if (auto e = tools::checkWorkers(flags, planning->stages,
                                     pipe.context.training.dataParallel))
      return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("inference") && (addLoss || flags.has("loss")))
    return fail(kTool, "--inference does not go with --loss or --add-loss",
                tools::kUsage);
  pipe.dumpAfter = flags.getAll("dump-ir-after");
  for (const std::string &d : pipe.dumpAfter)
    if (d != "all" && !passes::inCompilePipeline(d))
      return fail(kTool,
                  "--dump-ir-after names '" + d +
                      "', which is not in cleavec's pipeline (" +
                      passes::describeCompilePipeline() + "; or all)",
                  tools::kUsage);

  if (!planning)
    for (const std::string &d : pipe.dumpAfter)
      if (passes::lookupPlanningPass(d))
        return fail(kTool,
                    "--dump-ir-after=" + d +
                        " is a planning pass: it goes with --stages, "
                        "--schedule or -o FILE.cplan",
                    tools::kUsage);
  if (auto e = tools::checkOutputs(flags, {"o", "timeline", "report"}))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);

  tools::CompileOptions copts;
  copts.model = flags.positional()[0];
  copts.import = importOpts;
  pipe.print = print;
  copts.pipeline = pipe;
  copts.addLoss = addLoss;
  copts.inference = flags.has("inference");
  copts.lossNamed = flags.has("loss") || flags.has("add-loss");
  copts.planning = planning;
  copts.plan = !compare;
  if (planOut && !tools::wantsPlanning(flags))
    copts.planningWhat = "a plan (-o FILE.cplan)";
  if (emit == "ir" || !pipe.dumpAfter.empty())
    copts.loadForPrint = print.inlineLimit;
  std::string layoutText;
  if (planning && planning->devices) {
    auto layout = tools::chooseLayout(copts);
    if (!layout) {
      int code = layout.errorIsA<tools::UsageError>() ? tools::kUsage
                                                      : tools::kBadInput;
      return fail(kTool, llvm::toString(layout.takeError()), code);
    }
    planning = copts.planning;
    pipe.context.training = copts.pipeline.context.training;
    layoutText = llvm::formatv("layout of {0} device(s): {1} stage rank(s) "
                               "x {2} data-parallel replica(s); weighed:\n",
                               *planning->devices, layout->stages,
                               layout->dataParallel)
                     .str() +
                 layout->candidates;
  }
  auto compiled = tools::compile(copts);
  if (!compiled) {
    int code = compiled.errorIsA<tools::UsageError>() ? tools::kUsage
                                                      : tools::kBadInput;
    return fail(kTool, llvm::toString(compiled.takeError()), code);
  }
  ir::Graph &graph = *compiled->graph;
  if (!compiled->training && !copts.inference)
    // Flags that only mean something for training must not pass silently.
    for (const char *f : {"freeze", "trainable", "optimizer", "lr", "momentum",
                          "nesterov", "weight-decay", "no-decay", "adam-betas",
                          "adam-eps"})
      if (flags.has(f))
        return fail(kTool,
                    std::string("--") + f +
                        " needs a training graph, but the model's outputs "
                        "are not a scalar loss; name the loss with --loss or "
                        "add one with --add-loss",
                    tools::kUsage);

  if (compare) {
    auto table = tools::compareSchedules(graph, *planning);
    if (!table)
      return fail(kTool, llvm::toString(table.takeError()), tools::kBadInput);
    llvm::outs() << *table;
    return tools::kOk;
  }
  std::vector<std::pair<std::string, std::string>> files;
  std::string out =
      emit == "ir" ? ir::printGraph(graph, print)
                   : ir::summarizeGraph(graph, flags.has("verbose")
                                                   ? ir::SummaryDetail::Full
                                                   : ir::SummaryDetail::Short);
  const passes::TrainingOptions &topts = pipe.context.training;
  if (compiled->training && emit != "ir" &&
      (flags.has("no-decay") ||
       topts.weightDecay.value_or(topts.optimizer == "adamw" ? 0.01 : 0.0) !=
           0.0))
    out += tools::decayGroupsText(graph, topts);
  if (planning) {
    tools::PlanningResult &plan = *compiled->plan;
    if (planOut)
      return writePlan(*compiled, copts, flags, weights,
                       layoutText.empty() ? out : out + "\n" + layoutText,
                       planning->memCap);
    if (emit == "schedule-csv" || emit == "op-times") {
      out = plan.text;
    } else if (emit == "ir") {
      out.clear();
      for (const auto &stage : plan.stageGraphs)
        out += ir::printGraph(*stage, print);
    } else if (emit == "summary") {
      out += "\n" + layoutText + plan.text;
    }
    files = std::move(plan.files);
  }
  // Every output is made before any is written.
  files.insert(files.begin(), {flags.get("o").value_or("-"), out});
  for (const auto &[path, text] : files)
    if (auto e = tools::writeOutput(path, text))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  return tools::kOk;
}

int main(int argc, char **argv) {
  return tools::guardedMain(kTool, argc, argv, toolMain);
}
