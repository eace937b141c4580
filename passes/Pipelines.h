// The pass lists cleavec runs, each entry with why it is there: one place,
// read by cleavec's driver, its --help and --dump-ir-after checks, and
// cleave-opt's --list-passes.
#pragma once

#include "llvm/ADT/ArrayRef.h"

#include <string>
#include <string_view>
#include <vector>

namespace cleave::passes {

struct PipelineStep {
  std::string_view pass;
  std::string_view why;
};

// After import, for every model.
llvm::ArrayRef<PipelineStep> graphPipeline();
// Then, for a model with a loss: the training graph.
llvm::ArrayRef<PipelineStep> trainingPipeline();
// Then, with --stages or -o FILE.cplan: the planning passes
// (passes/Planning.h), in this order.
llvm::ArrayRef<PipelineStep> planningPipeline();

std::vector<std::string> passNames(llvm::ArrayRef<PipelineStep> steps);

// True when `name` is in any of the three lists (or is "import").
bool inCompilePipeline(std::string_view name);

// "import, remove-identity, ..., dce" for one list and the two after it as
// prose: what --help and the --dump-ir-after error print.
std::string describeCompilePipeline();

} // namespace cleave::passes
