// What the autodiff pass and its gradient rules share: a builder that
// appends ops with inferred result types, and the per-op rule interface.
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/Error.h"

#include <map>
#include <string>
#include <vector>

namespace cleave::passes::grad {

// Appends backward ops at the end of the graph. Result types come from the
// op's type rule; a rule that fails here is a bug in a gradient rule (the
// forward graph verified), so it stops with an internal error.
class Builder {
public:
  explicit Builder(ir::Graph &g) : g_(g) {}

  // Ops built next carry `fwd`'s location and names derived from its first
  // result (`grad.<name>.t`, made unique).
  void setSource(const ir::Op *fwd);
  ir::Graph &graph() { return g_; }

  ir::Value *emit(ir::OpKind kind, llvm::ArrayRef<ir::Value *> operands,
                  ir::AttrMap attrs = {});
  std::vector<ir::Value *> emitN(ir::OpKind kind,
                                 llvm::ArrayRef<ir::Value *> operands,
                                 ir::AttrMap attrs, unsigned numResults);

  // A scalar constant of `dtype` (shared between uses).
  ir::Value *scalar(double v, ir::DType dtype);
  // A constant tensor of zeros.
  ir::Value *zeros(const ir::TensorType &type);
  // `v` summed down to `shape` (undoing broadcasting); `v` if already there.
  ir::Value *sumTo(ir::Value *v, llvm::ArrayRef<int64_t> shape);
  ir::Value *reshape(ir::Value *v, llvm::ArrayRef<int64_t> shape);
  ir::Value *mul(ir::Value *a, ir::Value *b) {
    return emit(ir::OpKind::Mul, {a, b});
  }

private:
  ir::Graph &g_;
  std::string loc_, base_;
  std::map<std::pair<int, double>, ir::Value *> scalars_;
};

// What a rule sees for one forward op: the gradients of its results (null
// where a result has none) and which operands need a gradient. It fills in
// `dX` for those operands (others may stay null).
struct RuleContext {
  Builder &b;
  ir::Op &op;
  std::vector<ir::Value *> dY;
  std::vector<bool> needs;
  std::vector<ir::Value *> dX;

  ir::Value *in(unsigned i) const { return op.operand(i); }
  ir::Value *out(unsigned i = 0) const { return op.result(i); }
};

using Rule = llvm::Error (*)(RuleContext &ctx);

// The rule for an op kind, or null when cleave cannot differentiate it.
Rule findRule(ir::OpKind kind);

// Results that carry gradients: not running statistics, masks or indices.
bool isDifferentiableResult(const ir::Op &op, unsigned i);

} // namespace cleave::passes::grad
