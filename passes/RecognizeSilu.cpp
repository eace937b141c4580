// recognize-silu: exporters write SiLU (swish; PyTorch's F.silu, nn.SiLU,
// the gate of every SwiGLU MLP) as Mul(x, Sigmoid(x)). That is two passes
// over memory forward, and autodiff gives the Mul two gradient products and
// the Sigmoid a third, summed into x's gradient. This pass replaces the
// pair by one Silu op, whose gradient is one UnaryGrad (PyTorch's
// silu_backward formula). The forward's values are the same bits: the Silu
// kernels compute x times the same sigmoid, rounded the same way.
//
// A pair is replaced when the Sigmoid's result has no other use (and is not
// an output), the Mul's other operand is the Sigmoid's own operand, and both
// have its type.
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

namespace cleave::passes {

llvm::Expected<bool> recognizeSilu(ir::Graph &g, const PassContext &) {
  using ir::Op;
  using ir::OpKind;
  using ir::Value;
  // The Mul of x and Sigmoid(x), and the Sigmoid, or nothing.
  auto pairOf = [&](Op *mul) -> std::pair<Op *, Value *> {
    if (mul->kind() != OpKind::Mul || !ir::isFloat(mul->result()->type().dtype))
      return {nullptr, nullptr};
    for (unsigned side = 0; side < 2; ++side) {
      Op *sigmoid = interior(g, mul->operand(side), OpKind::Sigmoid);
      Value *x = mul->operand(1 - side);
      if (sigmoid && sigmoid->operand(0) == x &&
          x->type() == mul->result()->type())
        return {sigmoid, x};
    }
    return {nullptr, nullptr};
  };
  std::vector<Op *> found;
  for (const auto &op : g.ops())
    if (pairOf(op.get()).first)
      found.push_back(op.get());
  // Read again at the replacement: an earlier one may have replaced x (a
  // SiLU of a SiLU).
  for (Op *mul : found) {
    auto [sigmoid, x] = pairOf(mul);
    if (!sigmoid)
      continue;
    Value *out = mul->result();
    std::string name = out->name();
    Value *silu = g.insertOpBefore(mul, OpKind::Silu, {x}, {out->type()}, {},
                                   {}, mul->loc())
                      ->result();
    g.replaceAllUsesWith(out, silu);
    g.eraseOp(mul);
    g.eraseOp(sigmoid);
    g.rename(silu, name);
  }
  return !found.empty();
}

} // namespace cleave::passes
