// The compile driver (tools/Compile.h).
#include "tools/Compile.h"

#include "codegen/PlanCheck.h"
#include "ir/Verifier.h"
#include "passes/Cost.h"
#include "passes/Pipelines.h"
#include "passes/Planning.h"
#include "support/TrustedPaths.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

namespace cleave::tools {

char UsageError::ID = 0;

static llvm::Error usageError(const llvm::Twine &msg) {
  return llvm::make_error<UsageError>(msg.str());
}

static llvm::Error inputError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

bool hasScalarLoss(const ir::Graph &g) {
  return g.outputs().size() == 1 &&
         ir::isFloat(g.outputs()[0]->type().dtype) &&
         g.outputs()[0]->type().numElements() == 1 &&
         g.outputs()[0]->type().rank() == 0;
}

llvm::Expected<CompileResult> compile(const CompileOptions &opts) {
  CompileResult r;
  auto graph = frontend::importOnnxFile(opts.model, opts.import);
  if (!graph)
    return graph.takeError();
  if (auto e = checkMicrobatchSizeUsed(**graph, opts.import))
    return usageError(llvm::toString(std::move(e)));
  if (auto e = ir::verifyGraph(**graph))
    return inputError("imported IR is invalid: " +
                      llvm::toString(std::move(e)));
  if (opts.loadForPrint)
    if (auto e = loadSmallTensors(**graph, *opts.loadForPrint))
      return std::move(e);
  const passes::PipelineOptions &pipe = opts.pipeline;
  if (passes::wantsDump(pipe, "import"))
    passes::dumpIR(**graph, "import", *pipe.dumpStream);
  for (const ir::Value *v : (*graph)->declared())
    if (v->kind() != ir::ValueKind::Const)
      r.modelTensors.push_back(
          {v->name(), v->type().dtype,
           {v->type().shape.begin(), v->type().shape.end()}});
  if (opts.addLoss)
    if (auto e = passes::addLoss(**graph, opts.addLoss->kind,
                                 opts.addLoss->output, opts.addLoss->target))
      return std::move(e);
  std::vector<std::string> passes = passes::passNames(passes::graphPipeline());
  std::vector<std::string> training =
      passes::passNames(passes::trainingPipeline());
  r.training = !opts.inference && (opts.lossNamed || hasScalarLoss(**graph));
  if (opts.planning && !r.training)
    return usageError(opts.planningWhat +
                      " needs a training graph, but the model's outputs are "
                      "not a scalar loss; name the loss with --loss or add "
                      "one with --add-loss");
  if (r.training)
    passes.insert(passes.end(), training.begin(), training.end());
  else
    for (const std::string &d : pipe.dumpAfter)
      if (std::find(training.begin(), training.end(), d) != training.end() ||
          passes::lookupPlanningPass(d))
        return usageError("--dump-ir-after=" + d +
                          ": this model gets no training graph (its outputs "
                          "are not a scalar loss; see --loss, --add-loss)");
  if (auto e = passes::runPipeline(**graph, passes, pipe))
    return std::move(e);
  if (opts.planning && opts.plan) {
    auto plan = planPipeline(**graph, *opts.planning, pipe);
    if (!plan)
      return plan.takeError();
    r.plan = std::move(*plan);
  }
  r.graph = std::move(*graph);
  return r;
}

// The request for P ranks x D replicas of the layout search.
static void setLayout(CompileOptions &o, int64_t microbatches, int stages,
                      int dataParallel) {
  o.planning->stages = stages;
  o.planning->stagesGiven = true;
  o.planning->microbatches = microbatches / dataParallel;
  o.planning->microbatchesGiven = true;
  o.pipeline.context.training.microbatches = microbatches / dataParallel;
  o.pipeline.context.training.dataParallel = dataParallel;
}

llvm::Expected<Layout> chooseLayout(CompileOptions &opts) {
  int devices = *opts.planning->devices;
  int64_t microbatches = opts.planning->microbatches;
  auto profile = passes::lookupDeviceProfile(opts.planning->deviceProfile);
  if (!profile)
    return profile.takeError();
  if (opts.planning->costModel == "uniform")
    return llvm::make_error<UsageError>(
        "--devices weighs layouts by predicted time: it needs a cost model "
        "in seconds (analytic or profile:FILE), not --cost-model uniform");
  // What is wrong with the model or the flags is said once, not per layout.
  {
    CompileOptions first = opts;
    first.pipeline.dumpAfter.clear();
    first.plan = false;
    auto r = compile(first);
    if (!r)
      return r.takeError();
  }
  Layout best;
  std::optional<double> bestStep;
  std::string firstWhy;
  llvm::raw_string_ostream os(best.candidates);
  for (int d = 1; d <= devices; ++d) {
    if (devices % d)
      continue;
    int p = devices / d;
    std::string label = llvm::formatv("  {0} stage rank(s) x {1} replica(s): ",
                                      p, d)
                            .str();
    if (microbatches % d) {
      os << label << "none (" << microbatches << " microbatches do not "
         << "divide among " << d << " replicas)\n";
      continue;
    }
    CompileOptions c = opts;
    c.pipeline.dumpAfter.clear();
    setLayout(c, microbatches, p, d);
    auto r = compile(c);
    if (!r) {
      if (r.errorIsA<UsageError>())
        return r.takeError();
      std::string why = llvm::toString(r.takeError());
      os << label << "none (" << why << ")\n";
      if (firstWhy.empty())
        firstWhy = llvm::StringRef(label).trim().str() + " " + why;
      continue;
    }
    const PlanningResult &plan = *r->plan;
    int64_t gradBytes = 0;
    for (const passes::StageReport &st : plan.stageReports)
      gradBytes = std::max(gradBytes, st.paramBytes);
    double allReduce =
        d == 1 ? 0.0
               : 2.0 * (d - 1) / d * double(gradBytes) /
                         profile->linkBandwidth +
                     2.0 * (d - 1) * profile->linkLatency;
    double step = plan.predictedStepTime + allReduce;
    os << label
       << llvm::formatv("{0} x {1} microbatches, {2}, step {3:F3} ms "
                        "(pipeline {4:F3} + all-reduce {5:F3})\n",
                        d, microbatches / d, plan.schedule.name, 1e3 * step,
                        1e3 * plan.predictedStepTime, 1e3 * allReduce);
    if (!bestStep || step < *bestStep) {
      bestStep = step;
      best.stages = p;
      best.dataParallel = d;
    }
  }
  os.flush();
  if (!bestStep)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "no layout of %d device(s) plans; %s",
                                   devices, firstWhy.c_str());
  setLayout(opts, microbatches, best.stages, best.dataParallel);
  return best;
}

llvm::Expected<runtime::Plan> buildRunnablePlan(CompileResult &result,
                                                const CompileOptions &opts,
                                                const PlanOutputOptions &out) {
  if (!result.plan)
    return inputError("internal error: a plan needs a planned compile");
  const PlanningResult &p = *result.plan;
  const passes::TrainingOptions &t = opts.pipeline.context.training;
  codegen::PlanInfo info;
  info.modelName = llvm::sys::path::stem(opts.model).str();
  llvm::SmallString<256> abs(opts.model);
  llvm::sys::fs::make_absolute(abs);
  info.sourceModel = abs.str().str();
  // Its identity, which --save checks before writing into a copy.
  if (std::error_code ec =
          llvm::sys::fs::file_size(info.sourceModel, info.sourceModelSize))
    return inputError(info.sourceModel + ": " + ec.message());
  auto digest = support::sha256OfFile(info.sourceModel, "ONNX model");
  if (!digest)
    return digest.takeError();
  info.sourceModelSha256 = *digest;
  info.modelTensors = result.modelTensors;
  info.lossName = result.graph->outputs()[0]->name();
  info.inputUses = codegen::analyzeInputs(*result.graph);
  info.optimizer = t.optimizer;
  info.lr = t.lr;
  info.precision = t.precision;
  info.dataParallel = int(t.dataParallel);
  info.referenceWeights = out.referenceWeights;
  info.batchW = out.batchW;
  if (p.timeUnit == "s") {
    info.predictedStepTime = p.predictedStepTime;
    info.predictedPeriod = p.predictedPeriod;
  }
  info.stageReports = p.stageReports;
  auto built = codegen::buildPlan(p.stageGraphs, p.schedule, info);
  if (!built)
    return built.takeError();
  // What cleave-run checks before it runs a plan holds for every plan
  // cleavec writes; a failure here is a compiler bug.
  if (auto e = codegen::checkRunnable(*built))
    return inputError("internal error: the plan codegen built does not pass "
                      "cleave-run's checks: " +
                      llvm::toString(std::move(e)));
  return built;
}

} // namespace cleave::tools
