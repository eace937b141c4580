// dce: removes ops none of whose results reach a graph output (or a state
// update or the stash), then declared
// tensors (parameters, buffers, constants) nothing uses. Graph inputs stay:
// they are the graph's interface.
#include "passes/Pass.h"

#include "llvm/ADT/DenseSet.h"

namespace cleave::passes {

llvm::Expected<bool> eliminateDeadCode(ir::Graph &g, const PassContext &) {
  bool changed = false;
  // Walk backwards so an op's users are gone before it is looked at.
  std::vector<ir::Op *> order;
  for (const auto &op : g.ops())
    order.push_back(op.get());
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ir::Op *op = *it;
    bool used = false;
    for (ir::Value *r : op->results())
      used |= r->hasUses() || g.isPinned(r);
    if (!used) {
      g.eraseOp(op);
      changed = true;
    }
  }
  std::vector<ir::Value *> declared(g.declared().begin(), g.declared().end());
  for (ir::Value *v : declared)
    if (!v->hasUses() && !g.isPinned(v)) {
      g.eraseDeclared(v);
      changed = true;
    }
  return changed;
}

} // namespace cleave::passes
