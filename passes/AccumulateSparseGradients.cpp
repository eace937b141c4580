// The last step of autodiff: autodiff sums the gradient contributions of a
// value with Add. Where one contribution is a GatherGrad or SliceGrad (a
// select, an index, a slice of the value: zeros but for the rows the
// forward read), the Add reads two whole tensors and writes a third, and
// the contribution was a whole tensor of mostly zeros first. This pass
// gives the GatherGrad / SliceGrad the other summand as its sum operand
// (Ops.def) instead: it then copies that summand and adds dY's rows, and
// where nothing reads the summand afterwards the memory plan gives the
// result its bytes (MemoryPlan.h inPlaceOperand), so the sum touches only
// the rows. A loop that writes a matrix row by row and reads rows of it
// back (the gated delta rule's chunks: 64 rows, each a select_scatter,
// selects and slices) had three such Adds of the whole matrix per row.
//
// The values are the Add's except where both summands' element is a zero
// of opposite signs (the Add gave +0, the sum keeps the summand's -0), and
// a GatherGrad with repeated indices now adds its rows to the summand one
// at a time, in index order, instead of to zero first.
//
// An Add is rewritten when one operand is made by a GatherGrad or
// SliceGrad without a sum operand that nothing else reads (nor is an output
// or stash entry), and both operands have the Add's type (no broadcast).
// Only activation gradients' sums (tagged B): a parameter's gradient summed
// from parts (a tied embedding's and output layer's) stays an Add, which
// pipeline stages sum once per step. The sum takes the Add's phase tag.
// Part of autodiff rather than a pass
// after it, so that verify-2bp, which differentiates the forward graph
// again and compares, derives the same ops.
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

#include "ir/TypeRules.h"

#include <algorithm>

namespace cleave::passes {

bool accumulateSparseGradients(ir::Graph &g) {
  using ir::Op;
  using ir::OpKind;
  using ir::Value;
  auto sparse = [&](Value *v) -> Op * {
    for (OpKind k : {OpKind::GatherGrad, OpKind::SliceGrad})
      if (Op *def = interior(g, v, k))
        if (def->numOperands() == (k == OpKind::GatherGrad ? 2u : 1u))
          return def;
    return nullptr;
  };
  std::vector<Op *> adds;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::Add && op->phase() == ir::Phase::B &&
        op->numOperands() == 2 &&
        op->operand(0)->type() == op->result()->type() &&
        op->operand(1)->type() == op->result()->type() &&
        (sparse(op->operand(0)) || sparse(op->operand(1))))
      adds.push_back(op.get());
  bool changed = false;
  for (Op *add : adds) {
    // Read again: an earlier rewrite may have taken this Add's summand.
    unsigned side = sparse(add->operand(1)) ? 1 : 0;
    Op *grad = sparse(add->operand(side));
    if (!grad)
      continue;
    Value *sum = add->operand(1 - side), *out = add->result();
    std::vector<Value *> operands(grad->operands().begin(),
                                  grad->operands().end());
    operands.push_back(sum);
    std::string name = out->name();
    Op *fused = g.insertOpBefore(add, grad->kind(), operands, {out->type()},
                                 {}, grad->attrs(), grad->loc());
    fused->setPhase(add->phase());
    g.replaceAllUsesWith(out, fused->result());
    g.eraseOp(add);
    g.eraseOp(grad);
    g.rename(fused->result(), name);
    changed = true;
  }
  return changed;
}

// The gradient of a sum over an axis is the incoming gradient copied along
// that axis: autodiff's Expand, a whole tensor written. Where the Expand's
// readers are elementwise ops that broadcast (Add, Sub, Mul, Div) and whose
// result keeps its shape when they read the Expand's operand instead, they
// read the operand: their kernels broadcast it, and the copy is never made
// (the row update of the chunked delta rule,
// (attn[..., i, :, None] * attn[..., :, :i]).sum(-2), had one of the row
// matrix's size per row). The values are the same. Gradient ops only (B
// and W); an Expand left with no reader is erased.
bool readExpandOperandsWhereTheyBroadcast(ir::Graph &g) {
  using ir::Op;
  using ir::OpKind;
  auto broadcasts = [](OpKind k) {
    return k == OpKind::Add || k == OpKind::Sub || k == OpKind::Mul ||
           k == OpKind::Div;
  };
  std::vector<Op *> expands;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::Expand &&
        (op->phase() == ir::Phase::B || op->phase() == ir::Phase::W))
      expands.push_back(op.get());
  bool changed = false;
  for (Op *expand : expands) {
    ir::Value *e = expand->result(), *x = expand->operand(0);
    if (x->type().dtype != e->type().dtype)
      continue;
    std::vector<std::pair<Op *, unsigned>> readers;
    for (const ir::Use &u : e->uses())
      readers.emplace_back(u.user, u.operandIndex);
    for (auto [user, index] : readers) {
      if (!broadcasts(user->kind()) || user->numOperands() != 2)
        continue;
      const ir::Value *other = user->operand(1 - index);
      if (other == e)
        continue;
      auto shape = ir::broadcastShapes(x->type().shape, other->type().shape);
      if (!shape) {
        llvm::consumeError(shape.takeError());
        continue;
      }
      if (*shape != user->result()->type().shape)
        continue;
      user->setOperand(index, x);
      changed = true;
      // What W ops read of the forward and B work is stashed (autodiff's
      // tags made the stash before this step): the operand now, not the
      // Expand.
      const Op *def = x->definingOp();
      if (user->phase() == ir::Phase::W &&
          (!def || def->phase() != ir::Phase::W)) {
        std::vector<ir::Value *> stash(g.stash().begin(), g.stash().end());
        if (std::find(stash.begin(), stash.end(), x) == stash.end()) {
          stash.push_back(x);
          g.setStash(std::move(stash));
        }
      }
    }
    if (!e->uses().empty())
      continue;
    std::vector<ir::Value *> stash;
    for (ir::Value *v : g.stash())
      if (v != e)
        stash.push_back(v);
    g.setStash(std::move(stash));
    if (!g.isPinned(e))
      g.eraseOp(expand);
  }
  return changed;
}

} // namespace cleave::passes
