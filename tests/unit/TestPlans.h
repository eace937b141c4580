// Plans compiled in-process from the committed training models
// (tests/models/training/NAME/model.onnx), as cleavec compiles them, for
// the tests of the runtime and of the plan checks.
#ifndef CLEAVE_TESTS_UNIT_TESTPLANS_H
#define CLEAVE_TESTS_UNIT_TESTPLANS_H

#include "codegen/Codegen.h"
#include "frontend/OnnxImporter.h"
#include "passes/Pass.h"
#include "runtime/Plan.h"
#include "tools/PipelinePlanning.h"

#include <string>

namespace cleave::testsupport {

// The model at `path` trained with `optimizer` (lr 0.1, SGD's momentum
// 0.9) on `stages` stages and `microbatches` microbatches under `schedule`
// (uniform costs); external-data weights referenced or copied.
inline llvm::Expected<runtime::Plan>
compilePlanFrom(const std::string &path, int stages, int64_t microbatches,
                const std::string &schedule,
                const std::string &optimizer = "sgd",
                bool referenceWeights = true) {
  auto g = frontend::importOnnxFile(path, {});
  if (!g)
    return g.takeError();
  std::vector<runtime::PlanTensor> tensors;
  for (const ir::Value *v : (*g)->declared())
    if (v->kind() != ir::ValueKind::Const)
      tensors.push_back({v->name(), v->type().dtype,
                         {v->type().shape.begin(), v->type().shape.end()}});
  passes::PipelineOptions opts;
  opts.context.training.microbatches = microbatches;
  opts.context.training.lr = 0.1;
  opts.context.training.momentum = 0.9;
  opts.context.training.optimizer = optimizer;
  if (auto e = passes::runPipeline(
          **g,
          {"remove-identity", "dce", "autodiff", "split-backward", "optimizer"},
          opts))
    return std::move(e);
  tools::PlanningRequest req;
  req.stages = stages;
  req.microbatches = microbatches;
  req.schedule = schedule;
  req.costModel = "uniform";
  auto planned = tools::planPipeline(**g, req);
  if (!planned)
    return planned.takeError();
  codegen::PlanInfo info;
  info.modelName = path;
  info.referenceWeights = referenceWeights;
  info.modelTensors = tensors;
  info.lossName = (*g)->outputs()[0]->name();
  info.optimizer = optimizer;
  info.lr = 0.1;
  return codegen::buildPlan(planned->stageGraphs, planned->schedule, info);
}

// The committed training model `model` (tests/models/training/NAME).
inline llvm::Expected<runtime::Plan>
compileTrainingPlan(const std::string &model, int stages,
                    int64_t microbatches, const std::string &schedule,
                    const std::string &optimizer = "sgd") {
  auto plan = compilePlanFrom(std::string(CLEAVE_SOURCE_DIR) +
                                  "/tests/models/training/" + model +
                                  "/model.onnx",
                              stages, microbatches, schedule, optimizer);
  if (plan)
    plan->modelName = model;
  return plan;
}

} // namespace cleave::testsupport

#endif // CLEAVE_TESTS_UNIT_TESTPLANS_H
