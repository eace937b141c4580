// remove-identity: an Identity op only renames a value; its users (and the
// graph outputs) can read the operand directly. An Identity producing a
// graph output is kept, so the output keeps its name. An inert Dropout
// (inference mode, or ratio 0: PyTorch exports nn.Dropout(0.0) in training
// mode) whose mask nothing reads is an Identity too, and goes the same way.
#include "passes/Pass.h"

namespace cleave::passes {

llvm::Expected<bool> removeIdentities(ir::Graph &g, const PassContext &) {
  auto inertDropout = [&](const ir::Op &op) {
    if (op.kind() != ir::OpKind::Dropout ||
        (op.getInt("training_mode") && op.getFloat("ratio") != 0.0f))
      return false;
    return op.numResults() < 2 ||
           (op.result(1)->uses().empty() && !g.isOutput(op.result(1)));
  };
  std::vector<ir::Op *> identities;
  for (const auto &op : g.ops())
    if (op->kind() == ir::OpKind::Identity || inertDropout(*op))
      identities.push_back(op.get());
  bool changed = false;
  for (ir::Op *op : identities) {
    ir::Value *in = op->operand(0), *out = op->result();
    if (g.isOutput(out))
      continue;
    g.replaceAllUsesWith(out, in);
    g.eraseOp(op);
    changed = true;
  }
  return changed;
}

} // namespace cleave::passes
