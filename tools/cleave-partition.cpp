// cleave-partition: partitions a training graph into pipeline stages and
// prints the stage table; the standalone driver of passes/Partition.h for
// tests and experiments (cleavec takes the same flags).
#include "frontend/OnnxImporter.h"
#include "ir/Parser.h"
#include "ir/Verifier.h"
#include "passes/Partition.h"
#include "passes/Pass.h"
#include "passes/Pipelines.h"
#include "support/FileIO.h"
#include "tools/HostProfile.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

using namespace cleave;
using tools::fail;

static const char kTool[] = "cleave-partition";

static const char kHelp[] = R"(usage: cleave-partition MODEL.onnx|GRAPH.cir [options]

Cuts a training graph into pipeline stages that minimise the predicted step
time of a 1F1B pipeline under a per-stage memory cap, and prints the stage
table. A .cir input must already be a training graph; an .onnx model is
made into one as cleavec does.

  --stages=P             pipeline stages (default: from --split-at, or 1)
  --mem-cap=SIZE         memory per stage, e.g. 2GiB, 512MiB, 1.5GB
  --split-at=LAYER,...   cut before these layers instead of searching
  --cost-model=analytic|uniform|profile:FILE
                         where op times come from (default analytic)
  --device-profile=cpu|host|h200|a100
                         the device of the analytic model (default host:
                         this machine, measured when the tool starts, or
                         $CLEAVE_DEVICE_PROFILE; cpu: this machine kind's
                         fixed figures)
  --layer-depth=N        scope components per layer name (default: the
                         shallowest depth with repeated blocks);
                         0 cuts at single-value cut points instead
  --report=FILE.json     also write the stage table as JSON
  --microbatch-size=N    for .onnx input: bind a symbolic leading dimension
  --input-shape=NAME=D0,D1,...
                         for .onnx input: give input NAME a static shape
  --module-mode=auto|train|eval
                         the mode BatchNorm and Dropout run in (default
                         auto: as the exporter recorded it; a dynamo
                         export's BatchNorm trains on batch statistics when
                         its signature says the module updated its running
                         statistics, i.e. it ran in train())
  --trust-dir=DIR        .cir input: also read the files its tensors name
                         inside DIR (repeatable); without it they must lie
                         in the .cir's folder
  --help                 show this help

cleavec's training flags make the training graph of an .onnx input
(--precision bf16 products are timed at the device's bf16 rate):
)";

static const char kExitStatus[] =
    "\nexit status: 0 success, 1 bad input, 2 bad usage.\n";

// The training graph from a .cir file, or made from an .onnx model with
// the passes cleavec runs.
// cleavec's graph and training passes, in its order.
static std::vector<std::string> trainingPasses() {
  std::vector<std::string> names =
      passes::passNames(passes::graphPipeline());
  for (std::string &n : passes::passNames(passes::trainingPipeline()))
    names.push_back(std::move(n));
  return names;
}

static llvm::Expected<std::unique_ptr<ir::Graph>>
loadTrainingGraph(const std::string &path, const tools::Flags &flags,
                  const passes::PipelineOptions &pipe,
                  const std::optional<tools::LossRequest> &addLoss) {
  std::unique_ptr<ir::Graph> g;
  if (llvm::StringRef(path).endswith(".onnx")) {
    frontend::ImportOptions importOpts;
    if (auto e = tools::readImportFlags(flags, importOpts))
      return std::move(e);
    auto imported = frontend::importOnnxFile(path, importOpts);
    if (!imported)
      return imported.takeError();
    if (auto e = tools::checkMicrobatchSizeUsed(**imported, importOpts))
      return std::move(e);
    if (addLoss)
      if (auto e = passes::addLoss(**imported, addLoss->kind, addLoss->output,
                                   addLoss->target))
        return std::move(e);
    if (auto e = passes::runPipeline(
            **imported,
            trainingPasses(),
            pipe))
      return std::move(e);
    return imported;
  }
  for (const char *f : {"microbatch-size", "input-shape"})
    if (flags.has(f))
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          std::string("--") + f +
              " binds the inputs of an .onnx model; IR text states its "
              "shapes");
  auto buf = support::readFile(path, "IR file", support::kMaxIrTextBytes);
  if (!buf)
    return buf.takeError();
  auto trusted = tools::readTrustDirs(flags);
  if (!trusted)
    return trusted.takeError();
  ir::ParseOptions parse;
  parse.confine = true;
  parse.baseDir = support::folderOf(path);
  parse.trusted = std::move(*trusted);
  auto parsed = ir::parseGraph((*buf)->getBuffer(), path, parse);
  if (!parsed)
    return parsed.takeError();
  if (auto e = ir::verifyGraph(**parsed))
    return std::move(e);
  if (!(*parsed)->isTraining())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "'" + path +
                                       "' is not a training graph (no B, W "
                                       "or opt ops); make one with cleavec "
                                       "--emit=ir");
  return parsed;
}

static llvm::Error readPartitionFlags(const tools::Flags &flags,
                                      passes::PartitionOptions &opts) {
  if (auto v = flags.get("stages")) {
    auto p = tools::parseCount("stages", *v);
    if (!p)
      return p.takeError();
    if (*p < 1)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "--stages must be at least 1");
    if (auto e = tools::checkLimit(flags, "stages", *p,
                                   &support::SizeLimits::workers, "stages"))
      return e;
    opts.stages = int(*p);
  }
  if (auto v = flags.get("mem-cap")) {
    auto cap = passes::parseByteSize(*v);
    if (!cap)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "--mem-cap: " +
                                         llvm::toString(cap.takeError()));
    opts.memCap = *cap;
  }
  if (auto v = flags.get("split-at"))
    opts.splitAt = tools::splitList(*v);
  if (auto v = flags.get("cost-model")) {
    auto spec = passes::parseCostModel(*v);
    if (!spec)
      return spec.takeError();
    opts.costModel = *spec;
  }
  {
    auto profile =
        tools::chooseDeviceProfile(flags.get("device-profile"), opts.stages);
    if (!profile)
      return profile.takeError();
    opts.deviceProfile = *profile;
  }
  if (auto v = flags.get("layer-depth")) {
    auto depth = tools::parseCount("layer-depth", *v);
    if (!depth)
      return depth.takeError();
    opts.layers.depth = unsigned(*depth);
  }
  return llvm::Error::success();
}

static int toolMain(int argc, char **argv) {
  std::vector<tools::Flags::Spec> specs = tools::trainingFlagSpecs();
  specs.insert(specs.end(), {{"stages", true, false},
                             {"mem-cap", true, false},
                             {"split-at", true, false},
                             {"cost-model", true, false},
                             {"device-profile", true, false},
                             {"layer-depth", true, false},
                             {"report", true, false},
                             {"microbatch-size", true, false},
                             {"input-shape", true, true},
                      {"module-mode", true, false},
                             tools::trustDirFlagSpec(),
                             {"help", false, false}});
  tools::Flags flags(specs);
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help"))
    return tools::printHelp(
        kTool, flags,
        std::string(kHelp) + tools::kTrainingHelp + "\n" +
            tools::allowLargeHelp({tools::LargeBound::Workers,
                                   tools::LargeBound::Microbatches}) +
            kExitStatus);
  if (flags.positional().size() != 1)
    return fail(kTool, "expected one input (MODEL.onnx or GRAPH.cir; see --help)",
                tools::kUsage);
  passes::PipelineOptions pipe;
  std::optional<tools::LossRequest> addLoss;
  if (auto e = tools::readTrainingFlags(flags, pipe.context.training, addLoss))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  passes::PartitionOptions opts;
  opts.microbatches = pipe.context.training.microbatches;
  if (auto e = readPartitionFlags(flags, opts))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);

  if (auto e = tools::checkOutputs(flags, {"report"}))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  auto graph = loadTrainingGraph(flags.positional()[0], flags, pipe, addLoss);
  if (!graph)
    return fail(kTool, llvm::toString(graph.takeError()), tools::kBadInput);
  auto result = passes::partition(**graph, opts);
  if (!result)
    return fail(kTool, llvm::toString(result.takeError()), tools::kBadInput);
  if (auto report = flags.get("report")) {
    std::string json;
    llvm::raw_string_ostream os(json);
    passes::writeStageReportJson(*result, os);
    if (auto e = tools::writeOutput(*report, os.str()))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  }
  passes::printStageTable(*result, llvm::outs());
  return tools::kOk;
}

int main(int argc, char **argv) {
  return tools::guardedMain(kTool, argc, argv, toolMain);
}
