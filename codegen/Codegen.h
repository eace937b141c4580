// Code generation: stage graphs (passes/Stages.h) and a schedule become a
// runtime::Plan (runtime/Plan.h). The only place that knows both the IR
// and the Plan.
//
// Per stage graph: inputs become Input slots, parameters and buffers State
// slots (parameters trainable), constants Const slots, results of fwd/B/W
// ops MicroTemp slots and results of opt ops StepTemp slots. A per-
// microbatch value that an opt op reads gets an Accum slot (its microbatch
// sum), which the opt op reads instead. Ops go to the program of their
// phase in program order. Frame offsets come from liveness over the
// concatenated F, B and W programs (a value lives from the instruction that
// makes it to its last reader; stashed activations thus span F to W), with
// first-fit placement; the step frame likewise over the Step program.
#pragma once

#include "ir/Graph.h"
#include "passes/Partition.h"
#include "passes/schedule/Schedule.h"
#include "runtime/Plan.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <string>
#include <vector>

namespace cleave::codegen {

struct PlanInfo {
  std::string modelName;
  std::string sourceModel;
  uint64_t sourceModelSize = 0;   // runtime::Plan's fields of the same names
  std::string sourceModelSha256;
  std::vector<runtime::PlanTensor> modelTensors; // the model's parameters, buffers
  std::string lossName;  // the loss value of the training graph
  std::string optimizer; // "sgd" or "adamw"
  double lr = 0;
  std::string precision = "f32"; // --precision
  int dataParallel = 1;
  // Parameters and constants whose bytes are still in their file (ONNX
  // external data, never read by the compiler) become references to that
  // file's bytes instead of copies in the plan (cleavec --weights).
  bool referenceWeights = true;
  // W batching (cleavec --batch-w): each stage whose W program allows it
  // runs a run of consecutive microbatches' weight-gradient products as
  // one (runtime::planWBatch); its scratch is part of the planned peak.
  bool batchW = false;
  double predictedStepTime = 0; // seconds; 0 when not in seconds
  double predictedPeriod = 0;   // overlapping steps; the same
  std::vector<passes::StageReport> stageReports; // may be empty
  // The whole graph's inputs as analyzeInputs describes them (only the
  // use fields are read); inputs not here keep the defaults.
  std::vector<runtime::PlanInput> inputUses;
};

// How the model uses each integer input of `g` (runtime::PlanInput's
// indexes, labels and labelShift): followed through the ops that move
// values without computing on them (reshapes, casts, slices, pads) to a
// Gather's indices or a cross-entropy's labels.
std::vector<runtime::PlanInput> analyzeInputs(const ir::Graph &g);

llvm::Expected<runtime::Plan>
buildPlan(const std::vector<std::unique_ptr<ir::Graph>> &stages,
          const passes::schedule::Schedule &schedule, const PlanInfo &info);

} // namespace cleave::codegen
