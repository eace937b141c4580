// The compile driver: what cleavec does between its flags and its outputs,
// as a library that cleavec and the tests call. Import an ONNX model, run
// the graph passes, make the training graph when the model has a loss,
// plan the pipeline through the planning pass manager when asked, and
// build the runnable plan. Every step's figures and errors come back; the
// caller decides what to print and write.
#pragma once

#include "codegen/Codegen.h"
#include "frontend/OnnxImporter.h"
#include "ir/Graph.h"
#include "passes/Pass.h"
#include "runtime/Plan.h"
#include "tools/PipelinePlanning.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cleave::tools {

// An error of the request (exit status 2), not of the model (1).
class UsageError : public llvm::ErrorInfo<UsageError> {
public:
  static char ID;
  explicit UsageError(std::string message) : message_(std::move(message)) {}
  void log(llvm::raw_ostream &os) const override { os << message_; }
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }

private:
  std::string message_;
};

struct CompileOptions {
  std::string model; // the .onnx file
  frontend::ImportOptions import;
  // The training options, --dump-ir-after, verify-each and how dumps print.
  passes::PipelineOptions pipeline;
  std::optional<LossRequest> addLoss;
  bool inference = false; // never a training graph (--inference)
  bool lossNamed = false; // --loss or --add-loss: always one
  // Pipeline planning: the request, and whether to run it (false for
  // --compare-schedules, which plans every schedule itself but needs a
  // training graph just the same). What needs a training graph names it.
  std::optional<PlanningRequest> planning;
  bool plan = true;
  std::string planningWhat = "pipeline planning (--stages, --schedule)";
  // Load tensors of at most this many elements for printing the IR
  // (--emit=ir, dumps); unset: none.
  std::optional<int64_t> loadForPrint;
};

struct CompileResult {
  // The graph after the graph passes and, for training, the training
  // passes; with planning, its ops carry the stage tags.
  std::unique_ptr<ir::Graph> graph;
  bool training = false;
  // What a plan's --save writes back: the model's own parameters and
  // buffers, as imported (before training adds optimizer state).
  std::vector<runtime::PlanTensor> modelTensors;
  std::optional<PlanningResult> plan;
};

llvm::Expected<CompileResult> compile(const CompileOptions &opts);

// --devices N: every layout P x D = N (P pipeline ranks, D data-parallel
// replicas sharing the request's microbatches) compiled and planned, its
// predicted step the pipeline's isolated step plus the ring all-reduce of
// the largest stage's gradients over the device profile's link. Returns
// the fastest that plans (within --mem-cap), with `opts` set to it, and the
// candidates as text; fails with every candidate's reason when none plans.
struct Layout {
  int stages = 1, dataParallel = 1;
  std::string candidates; // one line each
};
llvm::Expected<Layout> chooseLayout(CompileOptions &opts);

// True when the graph's only output is a float scalar: a loss.
bool hasScalarLoss(const ir::Graph &g);

struct PlanOutputOptions {
  bool referenceWeights = true; // --weights=reference (else embed)
  bool batchW = false;          // --batch-w
};

// The plan cleave-run trains, from a planned compile (its stage graphs are
// moved out of `result.plan`). Checked as cleave-run checks it: a failure
// there is a compiler bug and says so.
llvm::Expected<runtime::Plan> buildRunnablePlan(CompileResult &result,
                                                const CompileOptions &opts,
                                                const PlanOutputOptions &out);

} // namespace cleave::tools
