#include "codegen/PlanCheck.h"

#include "ir/OpInfo.h"
#include "runtime/PlanFile.h"

#include "llvm/Support/FormatVariadic.h"

namespace cleave::codegen {

using runtime::Instr;
using runtime::InstrKind;
using runtime::Slot;

static llvm::Error invalid(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "invalid plan: " + msg);
}

static ir::TensorType typeOf(const Slot &s) {
  return ir::TensorType(s.dtype, ir::Shape(s.shape.begin(), s.shape.end()));
}

llvm::Error checkPlanKernels(const runtime::Plan &plan) {
  for (const runtime::StagePlan &s : plan.stages)
    for (int p = 0; p < runtime::kNumPhases; ++p)
      for (size_t i = 0; i < s.programs[p].size(); ++i) {
        const Instr &in = s.programs[p][i];
        if (in.kind != InstrKind::Kernel)
          continue;
        std::string where =
            llvm::formatv("stage {0} {1} instr {2}{3}: {4}", s.index,
                          runtime::phaseName(runtime::Phase(p)), i,
                          in.loc.empty() ? "" : " (" + in.loc + ")",
                          ir::opInfo(in.op).name)
                .str();
        std::vector<ir::TensorType> operands;
        for (int x : in.inputs)
          operands.push_back(typeOf(s.slots[size_t(x)]));
        auto results = ir::inferResultTypes(in.op, operands, in.attrs,
                                            unsigned(in.outputs.size()));
        if (!results)
          return invalid(where + ": " + llvm::toString(results.takeError()));
        for (size_t r = 0; r < in.outputs.size() && r < results->size(); ++r) {
          const Slot &out = s.slots[size_t(in.outputs[r])];
          if (typeOf(out) != (*results)[r])
            return invalid(where + ": its output slot '" + out.name +
                           "' is " + typeOf(out).str() + ", but the op makes " +
                           (*results)[r].str());
        }
      }
  return llvm::Error::success();
}

llvm::Error checkRunnable(const runtime::Plan &plan) {
  if (auto e = runtime::verifyRunnable(plan))
    return e;
  return checkPlanKernels(plan);
}

} // namespace cleave::codegen
