// autodiff: appends the backward graph of the loss with respect to every
// trainable parameter (docs/design/training.md).
//
// Reverse-mode differentiation over the straight-line program: the loss's
// gradient is 1, ops are visited last to first, and each op whose results
// carry a gradient runs its rule (GradientRules.cpp) for the operands that
// need one. Only values on a differentiable path from a trainable parameter
// to the loss get gradients, so integer inputs, masks, shape arithmetic and
// frozen parameters cost nothing.
#include "passes/GradientBuilder.h"
#include "passes/Pass.h"

#include "ir/Printer.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Regex.h"

namespace cleave::passes {

using ir::Op;
using ir::Value;

static llvm::Error fail(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

static llvm::Expected<Value *> findLoss(const ir::Graph &g,
                                        const std::string &name) {
  Value *loss = nullptr;
  if (!name.empty()) {
    for (Value *v : g.outputs())
      if (v->name() == name)
        loss = v;
    if (!loss) {
      std::string names;
      for (Value *v : g.outputs())
        names += (names.empty() ? "" : ", ") + ir::valueRef(v->name());
      return fail("--loss: the graph has no output named '" + name +
                  "' (outputs: " + names + ")");
    }
  } else if (g.outputs().size() == 1) {
    loss = g.outputs()[0];
  } else {
    return fail("the graph has " + std::to_string(g.outputs().size()) +
                " outputs; name the loss with --loss NAME");
  }
  const ir::TensorType &t = loss->type();
  if (!ir::isFloat(t.dtype) || t.numElements() != 1)
    return fail("the loss " + ir::valueRef(loss->name()) +
                " must be a float scalar, but it is " + t.str() +
                " (add a loss with --add-loss, or pick one with --loss)");
  return loss;
}

// Turns parameters matching `regex` into buffers: kept, never trained.
static llvm::Error freezeParameters(ir::Graph &g, const std::string &regex) {
  if (regex.empty())
    return llvm::Error::success();
  llvm::Regex re("^(" + regex + ")$");
  std::string why;
  if (!re.isValid(why))
    return fail("--freeze: invalid regular expression '" + regex +
                "': " + why);
  std::vector<Value *> declared(g.declared().begin(), g.declared().end());
  for (Value *v : declared)
    if (v->kind() == ir::ValueKind::Param && re.match(v->name()))
      g.setKind(v, ir::ValueKind::Buffer);
  return llvm::Error::success();
}

namespace {

class Autodiff {
public:
  Autodiff(ir::Graph &g, Value *loss) : g_(g), loss_(loss), b_(g) {}

  llvm::Error run();
  // Gradients of forward activations (not of parameters): what B computes.
  const llvm::DenseSet<const Value *> &activationGradients() const {
    return activationGradients_;
  }

private:
  void markNeeded();
  bool needs(const Value *v) const { return needed_.count(v); }
  void contribute(Value *v, Value *grad) { parts_[v].push_back(grad); }
  // Sums the contributions to `v` into one value named grad.<v> (null when
  // nothing contributed).
  Value *gradientOf(Value *v);

  ir::Graph &g_;
  Value *loss_;
  grad::Builder b_;
  llvm::DenseSet<const Value *> needed_;
  llvm::DenseMap<Value *, std::vector<Value *>> parts_;
  llvm::DenseSet<const Value *> activationGradients_;
};

} // namespace

void Autodiff::markNeeded() {
  // Forward: values a trainable parameter reaches through differentiable
  // operands and float results.
  llvm::DenseSet<const Value *> active;
  for (Value *v : g_.declared())
    if (v->kind() == ir::ValueKind::Param)
      active.insert(v);
  std::vector<Op *> ops;
  for (const auto &op : g_.ops())
    ops.push_back(op.get());
  for (Op *op : ops) {
    bool any = false;
    for (unsigned i = 0; i < op->numOperands(); ++i)
      any |= op->info().isDifferentiableOperand(i) &&
             active.count(op->operand(i));
    if (any)
      for (unsigned i = 0; i < op->numResults(); ++i)
        if (grad::isDifferentiableResult(*op, i))
          active.insert(op->result(i));
  }
  // Backward: of those, the ones the loss depends on.
  if (active.count(loss_))
    needed_.insert(loss_);
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    Op *op = *it;
    bool live = false;
    for (unsigned i = 0; i < op->numResults(); ++i)
      live |= needed_.count(op->result(i)) && grad::isDifferentiableResult(*op, i);
    if (!live)
      continue;
    for (unsigned i = 0; i < op->numOperands(); ++i)
      if (op->info().isDifferentiableOperand(i) && active.count(op->operand(i)))
        needed_.insert(op->operand(i));
  }
}

Value *Autodiff::gradientOf(Value *v) {
  auto it = parts_.find(v);
  if (it == parts_.end() || it->second.empty())
    return nullptr;
  std::vector<Value *> &parts = it->second;
  Value *sum = parts[0];
  if (v->definingOp())
    b_.setSource(v->definingOp());
  for (size_t i = 1; i < parts.size(); ++i)
    sum = b_.emit(ir::OpKind::Add, {sum, parts[i]});
  parts = {sum};
  if (!v->isDeclared())
    activationGradients_.insert(sum);
  return sum;
}

llvm::Error Autodiff::run() {
  markNeeded();
  std::vector<Value *> params;
  for (Value *v : g_.declared())
    if (v->kind() == ir::ValueKind::Param)
      params.push_back(v);
  if (params.empty())
    return fail("the graph has no trainable parameters (all frozen or none "
                "imported)");
  if (std::none_of(params.begin(), params.end(),
                   [&](Value *p) { return needs(p); }))
    return fail("the loss " + ir::valueRef(loss_->name()) +
                " does not depend on any trainable parameter");

  contribute(loss_, b_.scalar(1.0, loss_->type().dtype));
  std::vector<Op *> ops;
  for (const auto &op : g_.ops())
    ops.push_back(op.get());
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    Op &op = **it;
    grad::RuleContext ctx{b_, op, {}, {}, {}};
    bool anyResult = false;
    for (unsigned i = 0; i < op.numResults(); ++i) {
      Value *r = op.result(i);
      Value *d = needs(r) && grad::isDifferentiableResult(op, i)
                     ? gradientOf(r)
                     : nullptr;
      ctx.dY.push_back(d);
      anyResult |= d != nullptr;
    }
    bool anyOperand = false;
    for (unsigned i = 0; i < op.numOperands(); ++i) {
      bool n = op.info().isDifferentiableOperand(i) && needs(op.operand(i));
      ctx.needs.push_back(n);
      anyOperand |= n;
    }
    if (!anyResult || !anyOperand)
      continue;
    grad::Rule rule = grad::findRule(op.kind());
    if (!rule)
      return fail("no gradient rule for " + op.describe() +
                  " (it lies between a trainable parameter and the loss; "
                  "freeze the parameters before it with --freeze)");
    ctx.dX.assign(op.numOperands(), nullptr);
    b_.setSource(&op);
    if (auto e = rule(ctx))
      return e;
    for (unsigned i = 0; i < op.numOperands(); ++i)
      if (ctx.needs[i] && ctx.dX[i]) {
        contribute(op.operand(i), ctx.dX[i]);
        if (!op.operand(i)->isDeclared())
          activationGradients_.insert(ctx.dX[i]);
      }
  }

  // Outputs: the loss, then one gradient per trainable parameter.
  std::vector<Value *> outputs{loss_};
  for (Value *p : params) {
    Value *d = gradientOf(p);
    std::string name = "grad." + p->name();
    if (!d) { // the loss does not depend on this parameter
      d = g_.addConst(g_.uniqueName(name),
                      std::make_shared<ir::TensorData>(
                          p->type(), std::string(p->type().byteSize(), '\0')));
    } else if (d->name() != name && !g_.lookup(name) &&
               d->definingOp() && !g_.isOutput(d) &&
               std::find(outputs.begin(), outputs.end(), d) == outputs.end()) {
      g_.rename(d, name);
    }
    if (std::find(outputs.begin(), outputs.end(), d) != outputs.end() ||
        d->isDeclared()) {
      // Two parameters with one gradient value (or a constant): give each
      // output a value of its own.
      d = b_.emit(ir::OpKind::Identity, {d});
      if (!g_.lookup(name))
        g_.rename(d, name);
    }
    outputs.push_back(d);
  }
  g_.setOutputs(outputs);
  return llvm::Error::success();
}

llvm::Expected<bool> autodiff(ir::Graph &g, const PassContext &ctx) {
  if (g.isTraining())
    return fail("the graph already has backward ops");
  if (auto e = freezeParameters(g, ctx.training.freeze))
    return std::move(e);
  auto loss = findLoss(g, ctx.training.loss);
  if (!loss)
    return loss.takeError();
  size_t numForward = g.ops().size();
  Autodiff ad(g, *loss);
  if (auto e = ad.run())
    return std::move(e);
  // Every new op is backward work; the dependency slice says which is W.
  for (size_t i = numForward; i < g.ops().size(); ++i)
    g.ops()[i]->setPhase(ir::Phase::B);
  tagPhases(g, ad.activationGradients());
  return true;
}

} // namespace cleave::passes
