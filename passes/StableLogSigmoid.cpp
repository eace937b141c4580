// stable-log-sigmoid: exporters write PyTorch's F.logsigmoid as
// Log(Sigmoid(x)), and the legacy one binary_cross_entropy_with_logits as
// Log(Sigmoid(x)) and Log(1 - Sigmoid(x)). Sigmoid rounds to 0 in float32
// below x = -104 (to 1 above 17), and Log of it is -inf where PyTorch's
// log_sigmoid (and its BCE with logits) gives x: a loss of inf, or a NaN
// gradient. This pass computes each Log(Sigmoid(x)) as PyTorch's kernel
// does, min(x, 0) - log(1 + exp(-|x|)), and Log(1 - Sigmoid(x)) as the same
// of -x; the Sigmoid stays where something else reads it. (log(1 + e) is 0 where PyTorch's log1p(e) is e,
// below 4e-8 for |x| > 17: the same values to the float's rounding, and
// gradients whose exp term is that same e.)
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

namespace cleave::passes {

llvm::Expected<bool> stableLogSigmoid(ir::Graph &g, const PassContext &) {
  using ir::Op;
  using ir::OpKind;
  using ir::Value;
  // For a Log op: the Sigmoid under it, and whether through 1 - Sigmoid.
  auto sigmoidUnder = [](Op *log) -> std::pair<Op *, bool> {
    if (log->kind() != OpKind::Log || !ir::isFloat(log->result()->type().dtype))
      return {nullptr, false};
    auto sigmoidOf = [&](Value *v) -> Op * {
      Op *def = v->definingOp();
      return def && def->kind() == OpKind::Sigmoid &&
                     def->operand(0)->type() == log->result()->type()
                 ? def
                 : nullptr;
    };
    Value *in = log->operand(0);
    if (Op *s = sigmoidOf(in))
      return {s, false};
    Op *sub = in->definingOp();
    if (sub && sub->kind() == OpKind::Sub &&
        scalarConstant(sub->operand(0)) == 1.0)
      if (Op *s = sigmoidOf(sub->operand(1)))
        return {s, true};
    return {nullptr, false};
  };
  std::vector<Op *> found;
  for (const auto &op : g.ops())
    if (sigmoidUnder(op.get()).first)
      found.push_back(op.get());
  for (Op *log : found) {
    auto [sigmoid, complement] = sigmoidUnder(log);
    Op *sub = complement ? log->operand(0)->definingOp() : nullptr;
    Value *x = sigmoid->operand(0);
    const ir::TensorType t = x->type();
    auto scalar = [&](const char *name, double v) {
      return g.addConst(g.uniqueName(log->result()->name() + name),
                        ir::TensorData::fromDoubles(t.dtype, {}, {v}));
    };
    auto before = [&](OpKind kind, std::vector<Value *> operands) {
      return g.insertOpBefore(log, kind, operands, {t}, {}, {}, log->loc())
          ->result();
    };
    if (complement)
      x = before(OpKind::Neg, {x});
    Value *minus = before(OpKind::Neg, {before(OpKind::Abs, {x})});
    Value *onePlus = before(OpKind::Add, {before(OpKind::Exp, {minus}),
                                          scalar(".one", 1.0)});
    Value *below = before(OpKind::Min, {x, scalar(".zero", 0.0)});
    Value *y = before(OpKind::Sub, {below, before(OpKind::Log, {onePlus})});
    Value *out = log->result();
    std::string name = out->name();
    g.replaceAllUsesWith(out, y);
    g.eraseOp(log);
    if (sub && sub->result()->uses().empty() && !g.isPinned(sub->result()))
      g.eraseOp(sub);
    if (sigmoid->result()->uses().empty() && !g.isPinned(sigmoid->result()))
      g.eraseOp(sigmoid);
    g.rename(y, name);
  }
  return !found.empty();
}

} // namespace cleave::passes
