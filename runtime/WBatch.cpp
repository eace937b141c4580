// planWBatch (Plan.h): which W instructions run once for a run of
// microbatches, decided on the plan, so the compiler can plan its memory
// and the executor only follows it.
#include "runtime/Plan.h"

#include "ir/OpInfo.h"

#include <algorithm>

namespace cleave::runtime {

void planWBatch(StagePlan &stage) {
  const auto &prog = stage.programs[int(Phase::W)];
  const auto &slots = stage.slots;
  stage.wBatch = false;
  stage.wBatchProduct.assign(prog.size(), -1);
  stage.wBatchSummed.clear();
  stage.wBatchScratchBytes = 0;
  // Messages and offload copies stay per microbatch: no batching.
  for (const Instr &in : prog)
    if (in.kind != InstrKind::Kernel || in.op == ir::OpKind::Fetch) {
      stage.wBatchProduct.clear();
      return;
    }
  std::vector<std::vector<int>> readers(slots.size());
  for (size_t i = 0; i < prog.size(); ++i)
    for (int s : prog[i].inputs)
      readers[size_t(s)].push_back(int(i));
  auto perMicrobatch = [&](int s) {
    return slots[size_t(s)].kind == SlotKind::MicroTemp ||
           slots[size_t(s)].kind == SlotKind::Input;
  };
  auto layoutOnly = [](ir::OpKind k) {
    return k == ir::OpKind::Transpose || k == ir::OpKind::Reshape ||
           k == ir::OpKind::Identity || k == ir::OpKind::Cast ||
           k == ir::OpKind::Squeeze || k == ir::OpKind::Unsqueeze ||
           k == ir::OpKind::Flatten;
  };
  int64_t operandBytes = 0; // of one microbatch, the largest product
  for (size_t i = 0; i < prog.size(); ++i) {
    const Instr &in = prog[i];
    if (in.inputs.size() != 2 || in.outputs.size() != 1 ||
        !perMicrobatch(in.inputs[0]) || !perMicrobatch(in.inputs[1]))
      continue;
    const Slot &a = slots[size_t(in.inputs[0])],
               &dy = slots[size_t(in.inputs[1])],
               &out = slots[size_t(in.outputs[0])];
    bool concatenates =
        (in.op == ir::OpKind::MatMulGradB && out.shape.size() == 2 &&
         a.shape.size() == dy.shape.size() && a.shape.size() >= 2) ||
        (in.op == ir::OpKind::GemmGradB &&
         !ir::attrOrDefault(ir::opInfo(in.op), in.attrs, "transA").getInt()) ||
        in.op == ir::OpKind::ConvGradFilter;
    if (!concatenates || a.shape.empty() || dy.shape.empty() ||
        a.shape[0] != dy.shape[0])
      continue;
    std::vector<int> chain;
    int s = in.outputs[0];
    bool ok = true;
    while (slots[size_t(s)].accum < 0) {
      if (readers[size_t(s)].size() != 1) {
        ok = false;
        break;
      }
      const Instr &next = prog[size_t(readers[size_t(s)][0])];
      if (!layoutOnly(next.op) || next.inputs.size() != 1 ||
          next.outputs.size() != 1) {
        ok = false;
        break;
      }
      chain.push_back(readers[size_t(s)][0]);
      s = next.outputs[0];
    }
    if (!ok || !readers[size_t(s)].empty() ||
        slots[size_t(s)].kind != SlotKind::MicroTemp)
      continue;
    for (int c : chain)
      stage.wBatchProduct[size_t(c)] = int(i);
    stage.wBatchProduct[i] = int(i);
    stage.wBatchSummed.push_back(s);
    operandBytes = std::max(operandBytes, a.bytes + dy.bytes);
  }
  // The longest run of adjacent W actions of consecutive microbatches (the
  // runs the executor batches).
  int64_t longest = 0, run = 0;
  int previous = -2;
  for (const Action &act : stage.actions) {
    if (act.kind != ActionKind::W) {
      run = 0, previous = -2;
      continue;
    }
    run = act.microbatch == previous + 1 ? run + 1 : 1;
    previous = act.microbatch;
    longest = std::max(longest, run);
  }
  stage.wBatch = true;
  stage.wBatchScratchBytes = longest > 1 ? operandBytes * longest : 0;
}

} // namespace cleave::runtime
