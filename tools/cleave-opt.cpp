// cleave-opt: the IR workbench. Reads .cir text (or imports an .onnx), runs
// the named passes with the verifier between them, and prints .cir text. It
// is also the driver of the FileCheck tests.
#include "frontend/OnnxImporter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"
#include "passes/Pipelines.h"
#include "passes/Planning.h"
#include "tools/PipelinePlanning.h"
#include "tools/RunGraph.h"
#include "support/FileIO.h"
#include "tools/ToolSupport.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

using namespace cleave;
using tools::fail;

static const char kTool[] = "cleave-opt";

static const char kHelp[] = R"(usage: cleave-opt INPUT [options]

Reads cleave IR text (.cir, or - for stdin) or an ONNX model (.onnx), runs
the named passes in order with the verifier after each, and prints the
result as cleave IR text.

  --passes=A,B,...       passes to run, in order (see --list-passes);
                         `gradients` stands for cleavec's graph passes,
                         autodiff, split-backward and verify-2bp (outputs:
                         the loss and grad.<parameter> for each parameter)
  --dump-ir-after=PASS|all
                         print the IR to stderr after PASS (repeatable)
  --no-verify-each       do not run the verifier between passes (it still
                         runs on the input and the output)
  -o FILE                write the result to FILE instead of stdout
  --inline-limit=N       spell out tensors of at most N elements (default 16)
  --microbatch-size=N    for .onnx input: bind a symbolic leading dimension
  --input-shape=NAME=D0,D1,...
                         for .onnx input: give input NAME a static shape
  --module-mode=auto|train|eval
                         the mode BatchNorm and Dropout run in (default
                         auto: as the exporter recorded it; a dynamo
                         export's BatchNorm trains on batch statistics when
                         its signature says the module updated its running
                         statistics, i.e. it ran in train())
  --run                  after the passes, execute the graph (on the CPU
                         unless --device says otherwise)
  --device=cpu|cuda-emulated|cuda
                         with --run: the backend it runs on (default cpu;
                         cuda-emulated runs the CUDA backend's kernels one
                         element at a time on the host, to check them
                         without a GPU)
  --inputs=DIR           with --run: one file per graph input, either
                         input_0.pb, input_1.pb, ... (ONNX TensorProto, in
                         graph-input order) or <input name>.npy
  --outputs=DIR          with --run: where outputs go, in the inputs' form
                         (output_K.pb or <output name>.npy); created if
                         needed. With --run, IR is printed only with -o.
  --trust-dir=DIR        .cir input: also read the files its tensors name
                         (file<...>, onnx<...>) inside DIR (repeatable);
                         without it they must lie in the .cir's folder (the
                         current folder for stdin)
  --list-passes          list the passes and exit
  -h, --help             show this help

Pipeline planning passes (recompute, partition, schedule, split-stages,
plan-memory) run after the graph passes, on a training graph. `partition` tags every op
with its stage ([s] before the op); a pass run on tagged IR rebuilds what
it needs from the tags, so each planning pass runs alone on the output of
the one before it. The planning figures follow the IR as // comments;
after split-stages the stage graphs are printed instead of the training
graph, and plan-memory adds each stage's frames and each rank's peak.

pipeline (with the planning passes; cleavec --help says what each does):
  --stages=P, --schedule=NAME, --chunks=V, --mem-cap=SIZE,
  --cost-model=analytic|uniform|profile:FILE, --device-profile=NAME,
  --split-at=LAYER,..., --layer-depth=N,
  --recompute=none|selective|full|auto, --offload=none|auto|all
)";

static const char kExitStatus[] =
    "\nexit status: 0 success, 1 bad input, 2 bad usage.\n";

static llvm::Expected<std::unique_ptr<ir::Graph>>
readInput(const std::string &path, const frontend::ImportOptions &opts,
          int64_t inlineLimit, const support::TrustedFolders &trusted) {
  if (llvm::StringRef(path).endswith(".onnx")) {
    auto g = frontend::importOnnxFile(path, opts);
    if (g)
      if (auto e = tools::checkMicrobatchSizeUsed(**g, opts))
        return std::move(e);
    if (g)
      if (auto e = tools::loadSmallTensors(**g, inlineLimit))
        return std::move(e);
    return g;
  }
  if (opts.microbatchSize || !opts.inputShapes.empty())
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        std::string(opts.microbatchSize ? "--microbatch-size"
                                        : "--input-shape") +
            " binds the inputs of an .onnx model; IR text states its shapes");
  auto buf = path == "-"
                 ? support::readStdin("IR file", support::kMaxIrTextBytes)
                 : support::readFile(path, "IR file", support::kMaxIrTextBytes);
  if (!buf)
    return buf.takeError();
  ir::ParseOptions parse;
  parse.confine = true;
  parse.baseDir = path == "-" ? "." : support::folderOf(path);
  parse.trusted = trusted;
  return ir::parseGraph((*buf)->getBuffer(), path == "-" ? "<stdin>" : path,
                        parse);
}

static std::string unknownPass(const std::string &name) {
  std::string known;
  for (const passes::PassInfo &p : passes::allPasses())
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  for (const passes::PlanningPassInfo &p : passes::planningPasses())
    known += ", " + std::string(p.name);
  return "unknown pass '" + name + "' (known passes: " + known + ")";
}

static int toolMain(int argc, char **argv) {
  std::vector<tools::Flags::Spec> specs = tools::trainingFlagSpecs();
  specs.insert(specs.end(), {{"passes", true, false},
                      {"dump-ir-after", true, true},
                      {"no-verify-each", false, false},
                      {"o", true, false},
                      {"inline-limit", true, false},
                      {"microbatch-size", true, false},
                      {"input-shape", true, true},
                      {"module-mode", true, false},
                      {"list-passes", false, false},
                      {"run", false, false},
                      {"device", true, false},
                      {"inputs", true, false},
                      {"outputs", true, false},
                      {"help", false, false},
                      tools::trustDirFlagSpec(),
                      {"h", false, false}});
  for (const tools::Flags::Spec &p : tools::planningFlagSpecs())
    if (p.name != "timeline" && p.name != "report" && p.name != "devices")
      specs.push_back(p);
  tools::Flags flags(specs);
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help") || flags.has("h"))
    return tools::printHelp(
        kTool, flags,
        std::string(kHelp) + "\n" + tools::kTrainingHelp +
            "  (--add-loss is applied before the passes)\n\n" +
            tools::allowLargeHelp({tools::LargeBound::Workers,
                                   tools::LargeBound::Microbatches}) +
            kExitStatus);
  if (flags.has("list-passes")) {
    for (const passes::PassInfo &p : passes::allPasses())
      llvm::outs() << "  " << p.name << "  " << p.summary << "\n";
    llvm::outs() << "pipeline planning (after the graph passes):\n";
    for (const passes::PlanningPassInfo &p : passes::planningPasses())
      llvm::outs() << "  " << p.name << "  " << p.summary << "\n";
    return tools::kOk;
  }
  if (flags.positional().size() != 1)
    return fail(kTool,
                flags.positional().empty()
                    ? "no input given (usage: cleave-opt INPUT [options]; "
                      "see --help)"
                    : "expected one input, got " +
                          std::to_string(flags.positional().size()),
                tools::kUsage);
  std::vector<std::string> names;
  // `gradients`: cleavec's graph pipeline, then autodiff, split-backward
  // and verify-2bp: the graph whose outputs are the loss and every
  // grad.<parameter>, as cleavec trains it (annotate_export's
  // check_export compares them with PyTorch's).
  for (const std::string &n :
       tools::splitList(flags.get("passes").value_or(""))) {
    if (n != "gradients") {
      names.push_back(n);
      continue;
    }
    for (const std::string &p : passes::passNames(passes::graphPipeline()))
      names.push_back(p);
    for (const std::string &p : passes::passNames(passes::trainingPipeline()))
      if (p != "optimizer")
        names.push_back(p);
  }
  // Graph passes first, then planning passes.
  std::vector<std::string> graphNames, planningNames;
  for (const std::string &n : names) {
    if (passes::lookupPlanningPass(n)) {
      planningNames.push_back(n);
    } else if (!passes::lookupPass(n)) {
      return fail(kTool, unknownPass(n), tools::kUsage);
    } else if (!planningNames.empty()) {
      return fail(kTool,
                  "graph pass '" + n + "' comes after planning pass '" +
                      planningNames.back() + "'; the planning passes run last",
                  tools::kUsage);
    } else {
      graphNames.push_back(n);
    }
  }
  names = std::move(graphNames);
  std::optional<tools::PlanningRequest> planning;
  if (!planningNames.empty()) {
    auto req = tools::readPlanningFlags(flags);
    if (!req)
      return fail(kTool, llvm::toString(req.takeError()), tools::kUsage);
    planning = std::move(*req);
  } else {
    for (const tools::Flags::Spec &p : tools::planningFlagSpecs())
      if (flags.has(p.name))
        return fail(kTool,
                    "--" + p.name +
                        " is a pipeline flag: it goes with the planning "
                        "passes (recompute, partition, schedule, "
                        "split-stages, plan-memory)",
                    tools::kUsage);
  }
  passes::PipelineOptions pipe;
  pipe.dumpAfter = flags.getAll("dump-ir-after");
  pipe.verifyEach = !flags.has("no-verify-each");
  for (const std::string &d : pipe.dumpAfter)
    if (d != "all" &&
        std::find(names.begin(), names.end(), d) == names.end() &&
        std::find(planningNames.begin(), planningNames.end(), d) ==
            planningNames.end())
      return fail(kTool,
                  "--dump-ir-after names '" + d +
                      "', which is not among --passes",
                  tools::kUsage);
  std::optional<tools::LossRequest> addLoss;
  if (auto e = tools::readTrainingFlags(flags, pipe.context.training, addLoss))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  bool run = flags.has("run");
  if (run && planning)
    return fail(kTool,
                "--run executes one graph; it does not go with the planning "
                "passes",
                tools::kUsage);
  if (run && (!flags.has("inputs") || !flags.has("outputs")))
    return fail(kTool, "--run needs --inputs DIR and --outputs DIR",
                tools::kUsage);
  if (!run && (flags.has("inputs") || flags.has("outputs") ||
               flags.has("device")))
    return fail(kTool, "--inputs, --outputs and --device go with --run",
                tools::kUsage);
  std::string device = flags.get("device").value_or("cpu");
  if (device != "cpu" && device != "cuda" && device != "cuda-emulated")
    return fail(kTool,
                "--device must be 'cpu', 'cuda' or 'cuda-emulated', not '" +
                    device + "'",
                tools::kUsage);
  ir::PrintOptions print;
  if (auto e = tools::readPrintFlags(flags, print))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  frontend::ImportOptions importOpts;
  if (auto e = tools::readImportFlags(flags, importOpts))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  importOpts.warn = [](const std::string &w) {
    llvm::errs() << kTool << ": warning: " << w << "\n";
  };
  frontend::installOnnxDataResolver();
  if (auto e = tools::checkOutputs(flags, {"o"}, {"outputs"}))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);

  auto trusted = tools::readTrustDirs(flags);
  if (!trusted)
    return fail(kTool, llvm::toString(trusted.takeError()), tools::kUsage);
  auto graph = readInput(flags.positional()[0], importOpts, print.inlineLimit,
                         *trusted);
  if (!graph)
    return fail(kTool, llvm::toString(graph.takeError()), tools::kBadInput);
  if (auto e = ir::verifyGraph(**graph))
    return fail(kTool, "invalid IR: " + llvm::toString(std::move(e)),
                tools::kBadInput);
  if (addLoss)
    if (auto e = passes::addLoss(**graph, addLoss->kind, addLoss->output,
                                 addLoss->target))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  if (auto e = passes::runPipeline(**graph, names, pipe))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  if (!pipe.verifyEach)
    if (auto e = ir::verifyGraph(**graph))
      return fail(kTool, "invalid IR: " + llvm::toString(std::move(e)),
                  tools::kBadInput);
  if (planning) {
    passes::PipelineModule module(**graph, *planning);
    pipe.print = print;
    if (auto e = passes::runPlanningPasses(module, planningNames, pipe))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
    if (!module.memoryWarning.empty())
      llvm::errs() << kTool << ": warning: " << module.memoryWarning << "\n";
    std::string text;
    llvm::raw_string_ostream os(text);
    passes::printModule(module, os, print);
    os.flush();
    if (auto e = tools::writeOutput(flags.get("o").value_or("-"), text))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
    return tools::kOk;
  }
  if (run) {
    if (auto e = tools::runGraphOnFiles(**graph, *flags.get("inputs"),
                                        *flags.get("outputs"), device,
                                        llvm::outs()))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
    if (!flags.has("o"))
      return tools::kOk;
  }
  if (auto e = tools::writeOutput(flags.get("o").value_or("-"),
                                  ir::printGraph(**graph, print)))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  return tools::kOk;
}

int main(int argc, char **argv) {
  return tools::guardedMain(kTool, argc, argv, toolMain);
}
