// libFuzzer target: the .cplan reader on arbitrary bytes as a plan file
// (preamble, protobuf header, blobs and their checksums), whole and for
// stage 0 alone, with verifyPlan run again on what loads.
#include "FuzzSupport.h"

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
    if (!stage)
      llvm::consumeError(cleave::runtime::verifyPlan(*plan));
  }
  unlink(path.c_str());
  return 0;
}
