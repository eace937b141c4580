// checkPlanKernels: every kernel call of a plan checked against the op
// table, as the IR's verifier checks an op: its attributes (kinds, required
// ones, values such as axes and permutations in range) and its output slots'
// types, which the op's type rule must give for its input slots' types. A
// plan read from a file passes this before it runs (cleave-run), so no
// kernel reads an attribute or a buffer its op would not allow; the
// runtime's own checks (runtime/PlanFile.h: verifyPlan, verifyRunnable)
// cover the plan's structure, memory and schedule. Here, not in the
// runtime, because it is the IR's type rules that say what an op accepts.
#pragma once

#include "runtime/Plan.h"

#include "llvm/Support/Error.h"

namespace cleave::codegen {

// "invalid plan: stage 0 F instr 3 (/fc1/Gemm): Transpose: ..." on the first
// kernel that does not fit its op.
llvm::Error checkPlanKernels(const runtime::Plan &plan);

// Everything a plan that passed verifyPlan must hold before it runs:
// runtime::verifyRunnable (memory, schedule), then checkPlanKernels.
llvm::Error checkRunnable(const runtime::Plan &plan);

} // namespace cleave::codegen
