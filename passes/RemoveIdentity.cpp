// remove-identity: an Identity op only renames a value; its users (and the
// graph outputs) can read the operand directly. An Identity producing a
// graph output is kept, so the output keeps its name. An inert Dropout
// (inference mode, or ratio 0: PyTorch exports nn.Dropout(0.0) in training
// mode) whose mask nothing reads is an Identity too, and goes the same way.
// So is a view or a conversion that leaves its operand's type as it is: a
// Reshape, Flatten, Squeeze, Unsqueeze or Expand to the operand's own
// shape, a Transpose whose perm keeps every axis in place, a Cast to the
// operand's own type. The exporters emit those (PyTorch 2's
// scaled_dot_product_attention decomposition reshapes its result to the
// shape it has), and one between two ops hides the pair from the passes
// that match patterns (recognize-attention's layouts).
#include "passes/Pass.h"

#include "ir/OpInfo.h"

namespace cleave::passes {

static bool keepsItsOperand(const ir::Op &op) {
  using ir::OpKind;
  if (op.numOperands() != 1 || op.numResults() != 1 ||
      !(op.operand(0)->type() == op.result()->type()))
    return false;
  if (ir::opInfo(op.kind()).has(ir::optrait::LayoutOnly))
    return true; // a reshape-like op to the operand's own shape
  switch (op.kind()) {
  case OpKind::Expand:
  case OpKind::Cast:
    return true;
  case OpKind::Transpose: {
    const std::vector<int64_t> &perm = op.getInts("perm");
    for (size_t i = 0; i < perm.size(); ++i)
      if (perm[i] != int64_t(i))
        return false;
    return true;
  }
  default:
    return false;
  }
}

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
    if (op->kind() == ir::OpKind::Identity || inertDropout(*op) ||
        keepsItsOperand(*op))
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
