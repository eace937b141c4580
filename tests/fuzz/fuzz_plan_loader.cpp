// libFuzzer target: the .cplan reader on arbitrary bytes as a plan file
// (preamble, protobuf header, blobs and their checksums), whole and for
// stage 0 alone, with verifyPlan run again on what loads, then the checks
// cleave-run makes before it runs a plan (codegen::checkRunnable: memory,
// schedule simulation, every kernel against its op's type rule). Running
// mutated plans for a step is tests/fuzz/plan_mutation_sweep.py's job (the
// kernels instrumented here would take minutes to build).
#include "FuzzSupport.h"

#include "codegen/PlanCheck.h"
#include "runtime/PlanFile.h"

#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = cleave::fuzz::writeInput("plan.cplan", data, size);
  for (std::optional<int> stage : {std::optional<int>(), std::optional(0)}) {
    auto plan = cleave::runtime::readPlanFile(path, stage);
    if (!plan) {
      llvm::consumeError(plan.takeError());
      continue;
    }
    if (!stage) {
      llvm::consumeError(cleave::runtime::verifyPlan(*plan));
      llvm::consumeError(cleave::codegen::checkRunnable(*plan));
    }
  }
  unlink(path.c_str());
  return 0;
}
