// recognize-rms-norm: exporters before ONNX opset 23 spell RMS norm (Llama's
// LlamaRMSNorm, T5's layer norm) out as Pow(x, 2), ReduceMean over the last
// axis, Add epsilon, Sqrt, a reciprocal (Div(1, .) or Reciprocal), Mul by x
// and Mul by the weight: seven passes over the activations forward and
// about as many gradient ops. This pass replaces the tree by one
// RMSNormalization(x, weight) {axis = -1, epsilon}, whose gradient is one
// op per part (docs/design/training.md).
//
// The match is structural, with either operand order of the Muls and the
// Add: x * 1/sqrt(mean(x^2) + eps) * w, or x / sqrt(...) * w, with x^2 as
// Pow(x, 2) or Mul(x, x), eps a scalar constant and w of the last axis's
// size. Every interior value must have that one use; anything else stays.
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

#include "llvm/ADT/SmallVector.h"

#include <optional>

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

// The ops of one match, root first; `x`, `weight` and `epsilon` found.
struct RmsNormMatch {
  llvm::SmallVector<Op *, 8> ops;
  Value *x = nullptr, *weight = nullptr;
  double epsilon = 0;
};

// mean(x^2) + eps under `s` = Sqrt(...); fills x (or checks it) and eps.
bool matchSqrt(const ir::Graph &g, Value *s, RmsNormMatch &m) {
  Op *sqrt = interior(g, s, OpKind::Sqrt);
  if (!sqrt)
    return false;
  Op *add = interior(g, sqrt->operand(0), OpKind::Add);
  if (!add)
    return false;
  for (int side = 0; side < 2; ++side) {
    std::optional<double> eps = scalarConstant(add->operand(1 - side));
    Op *mean = interior(g, add->operand(side), OpKind::ReduceMean);
    if (!eps || !mean || mean->getInt("keepdims") != 1)
      continue;
    int64_t rank = int64_t(mean->operand(0)->type().rank());
    const std::vector<int64_t> &axes = mean->getInts("axes");
    if (axes.size() != 1 || (axes[0] != -1 && axes[0] != rank - 1))
      continue;
    Value *sq = mean->operand(0);
    Value *base = nullptr;
    if (Op *pow = interior(g, sq, OpKind::Pow)) {
      std::optional<double> e = scalarConstant(pow->operand(1));
      if (e && *e == 2.0)
        base = pow->operand(0);
      m.ops.append({sqrt, add, mean, pow});
    } else if (Op *mul = interior(g, sq, OpKind::Mul)) {
      if (mul->operand(0) == mul->operand(1))
        base = mul->operand(0);
      m.ops.append({sqrt, add, mean, mul});
    }
    if (!base || (m.x && m.x != base))
      return false;
    m.x = base;
    m.epsilon = *eps;
    return true;
  }
  return false;
}

// x * (1 / sqrt(...)), x * Reciprocal(sqrt(...)) or x / sqrt(...) as `v`.
bool matchNormalized(const ir::Graph &g, Value *v, RmsNormMatch &m) {
  if (Op *div = interior(g, v, OpKind::Div)) {
    m.ops.push_back(div);
    m.x = div->operand(0);
    return matchSqrt(g, div->operand(1), m);
  }
  Op *mul = interior(g, v, OpKind::Mul);
  if (!mul)
    return false;
  m.ops.push_back(mul);
  for (int side = 0; side < 2; ++side) {
    Value *r = mul->operand(side);
    size_t mark = m.ops.size();
    Value *s = nullptr;
    if (Op *rec = interior(g, r, OpKind::Reciprocal)) {
      m.ops.push_back(rec);
      s = rec->operand(0);
    } else if (Op *inv = interior(g, r, OpKind::Div)) {
      std::optional<double> one = scalarConstant(inv->operand(0));
      if (one && *one == 1.0) {
        m.ops.push_back(inv);
        s = inv->operand(1);
      }
    }
    m.x = mul->operand(1 - side);
    if (s && matchSqrt(g, s, m))
      return true;
    m.ops.resize(mark);
  }
  return false;
}

std::optional<RmsNormMatch> matchRmsNorm(const ir::Graph &g, Op *root) {
  const ir::TensorType &type = root->result()->type();
  if (type.rank() < 1 || !ir::isFloat(type.dtype))
    return std::nullopt;
  int64_t d = type.shape.back();
  for (int side = 0; side < 2; ++side) {
    RmsNormMatch m;
    m.ops.push_back(root);
    Value *w = root->operand(side);
    const ir::Shape &ws = w->type().shape;
    if (ws.size() != 1 || ws[0] != d || w->type().dtype != type.dtype)
      continue;
    m.weight = w;
    if (matchNormalized(g, root->operand(1 - side), m) && m.x &&
        m.x->type() == type)
      return m;
  }
  return std::nullopt;
}

} // namespace

llvm::Expected<bool> recognizeRmsNorm(ir::Graph &g, const PassContext &) {
  std::vector<Op *> candidates;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::Mul)
      candidates.push_back(op.get());
  llvm::DenseSet<const Op *> erased;
  bool changed = false;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    Op *root = *it;
    if (erased.count(root))
      continue;
    std::optional<RmsNormMatch> m = matchRmsNorm(g, root);
    if (!m)
      continue;
    std::string name = root->result()->name();
    Op *norm = g.insertOpBefore(
        root, OpKind::RMSNormalization, {m->x, m->weight},
        {root->result()->type()}, {},
        {{"axis", int64_t(-1)}, {"epsilon", float(m->epsilon)}}, root->loc());
    g.replaceAllUsesWith(root->result(), norm->result());
    // Root first, then down the tree: each op's result has lost its one use
    // by the time it is erased.
    for (Op *op : m->ops) {
      erased.insert(op);
      g.eraseOp(op);
    }
    g.rename(norm->result(), name);
    changed = true;
  }
  return changed;
}

} // namespace cleave::passes
