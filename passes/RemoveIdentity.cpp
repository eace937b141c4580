// remove-identity: an Identity op only renames a value; its users (and the
// graph outputs) can read the operand directly. An Identity producing a
// graph output is kept, so the output keeps its name.
#include "passes/Pass.h"

namespace cleave::passes {

llvm::Expected<bool> removeIdentities(ir::Graph &g, const PassContext &) {
  std::vector<ir::Op *> identities;
  for (const auto &op : g.ops())
    if (op->kind() == ir::OpKind::Identity)
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
