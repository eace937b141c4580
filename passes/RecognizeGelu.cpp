// recognize-gelu: exporters without a GELU op (ONNX before opset 20, and
// every legacy PyTorch export) spell it out in elementwise ops: the erf form
// as Div, Erf, Add, Mul, Mul and the tanh approximation as Mul, Pow, Mul,
// Add, Mul, Tanh, Add, Mul. Each of those ops is a pass over memory, and
// autodiff gives each its own gradient ops and stashes their operands. This
// pass replaces such a tree by one Gelu op (approximate "none" or "tanh"),
// whose gradient is one UnaryGrad.
//
// It does not match fixed op sequences (exporters order, commute and fold
// them differently). A candidate is the tree of elementwise ops under a Mul
// whose interior results have no other use, whose leaves are one tensor x of
// the Mul's type and scalar constants, and which contains an Erf or a Tanh.
// The tree is evaluated in double at probe points over [-8, 8] and accepted
// when it agrees with x * Phi(x) in one of the two forms to within a float's
// rounding of the constants; anything else is left alone.
#include "passes/Pass.h"
#include "passes/ScalarConstant.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <cmath>
#include <functional>

namespace cleave::passes {
namespace {

using ir::Op;
using ir::OpKind;
using ir::Value;

constexpr size_t kMaxTreeOps = 12; // the tanh form has 8

bool isTreeOp(OpKind k) {
  switch (k) {
  case OpKind::Add:
  case OpKind::Sub:
  case OpKind::Mul:
  case OpKind::Div:
  case OpKind::Pow:
  case OpKind::Erf:
  case OpKind::Tanh:
  case OpKind::Sqrt:
  case OpKind::Neg:
    return true;
  default:
    return false;
  }
}

// The tree under `root`: its ops (root first), the one tensor leaf x and
// the scalar constants; empty when `root` does not head such a tree.
struct Tree {
  llvm::SmallVector<Op *, 12> ops;
  Value *x = nullptr;
  llvm::DenseMap<const Value *, double> constants;
  bool hasErfOrTanh = false;
};

bool collect(const ir::Graph &g, Op *op, const ir::TensorType &type, Tree &t) {
  if (t.ops.size() >= kMaxTreeOps)
    return false;
  t.ops.push_back(op);
  t.hasErfOrTanh |= op->kind() == OpKind::Erf || op->kind() == OpKind::Tanh;
  for (Value *v : op->operands()) {
    if (std::optional<double> c = scalarConstant(v)) {
      t.constants[v] = *c;
      continue;
    }
    Op *def = v->definingOp();
    // A single-use result of a tree op with the tree's type is interior;
    // any other value is the leaf x (which every leaf must be).
    bool interior = def && isTreeOp(def->kind()) && v->uses().size() == 1 &&
                    !g.isPinned(v) && v->type() == type &&
                    def->numResults() == 1;
    if (interior) {
      if (!collect(g, def, type, t))
        return false;
      continue;
    }
    if (t.x && t.x != v)
      return false;
    if (v->type() != type)
      return false;
    t.x = v;
  }
  return true;
}

// The tree's value at x = p, in double.
double evaluate(const Tree &t, const Op *op, double p) {
  auto arg = [&](unsigned i) {
    const Value *v = op->operand(i);
    if (v == t.x)
      return p;
    auto c = t.constants.find(v);
    if (c != t.constants.end())
      return c->second;
    return evaluate(t, v->definingOp(), p);
  };
  switch (op->kind()) {
  case OpKind::Add:
    return arg(0) + arg(1);
  case OpKind::Sub:
    return arg(0) - arg(1);
  case OpKind::Mul:
    return arg(0) * arg(1);
  case OpKind::Div:
    return arg(0) / arg(1);
  case OpKind::Pow:
    return std::pow(arg(0), arg(1));
  case OpKind::Erf:
    return std::erf(arg(0));
  case OpKind::Tanh:
    return std::tanh(arg(0));
  case OpKind::Sqrt:
    return std::sqrt(arg(0));
  case OpKind::Neg:
    return -arg(0);
  default:
    return NAN;
  }
}

double geluErf(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double geluTanh(double x) {
  constexpr double kBeta = 0.7978845608028654; // sqrt(2 / pi)
  return 0.5 * x * (1 + std::tanh(kBeta * (x + 0.044715 * x * x * x)));
}

// "none" or "tanh" when the tree computes that GELU, else empty.
std::string_view whichGelu(const Tree &t) {
  // The two forms differ by up to 2e-4 near |x| = 2; the exported f32
  // constants move either by about 1e-7 relative.
  auto matches = [&](double (*f)(double)) {
    for (int i = -32; i <= 32; ++i) {
      double p = i / 4.0 + 0.0625; // off the integers, where Pow is exact
      double want = f(p), got = evaluate(t, t.ops.front(), p);
      if (!(std::abs(got - want) <= 1e-6 + 1e-6 * std::abs(want)))
        return false;
    }
    return true;
  };
  if (matches(geluErf))
    return "none";
  if (matches(geluTanh))
    return "tanh";
  return {};
}

} // namespace

llvm::Expected<bool> recognizeGelu(ir::Graph &g, const PassContext &) {
  std::vector<Op *> candidates;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::Mul && ir::isFloat(op->result()->type().dtype))
      candidates.push_back(op.get());
  // Later Muls first: a GELU's last Mul heads the largest tree, and a Mul
  // inside a tree that was replaced is gone by the time it comes up.
  llvm::DenseMap<const Op *, bool> erased;
  bool changed = false;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    Op *root = *it;
    if (erased.count(root))
      continue;
    Tree t;
    const ir::TensorType &type = root->result()->type();
    if (!collect(g, root, type, t) || !t.x || !t.hasErfOrTanh)
      continue;
    std::string_view form = whichGelu(t);
    if (form.empty())
      continue;
    Op *gelu =
        g.insertOpBefore(root, OpKind::Gelu, {t.x}, {type}, {},
                         {{"approximate", std::string(form)}}, root->loc());
    std::string name = root->result()->name();
    g.replaceAllUsesWith(root->result(), gelu->result());
    // Root first, then its operands' producers: each has no uses left when
    // its turn comes (the tree's interior results had one use each).
    for (Op *op : t.ops) {
      erased[op] = true;
      g.eraseOp(op);
    }
    g.rename(gelu->result(), name); // the GELU's result keeps its name
    changed = true;
  }
  return changed;
}

} // namespace cleave::passes
