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
#include "support/Errors.h"

#include "ir/Printer.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Regex.h"

namespace cleave::passes {

using ir::Op;
using ir::Value;

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

// Turns parameters into buffers (kept, never trained): those whose whole
// name matches `flag`'s regex (--freeze), or with `keepMatches`, those that
// do not match it (--trainable).
static llvm::Error restrictParameters(ir::Graph &g, const std::string &flag,
                                      const std::string &regex,
                                      bool keepMatches) {
  if (regex.empty())
    return llvm::Error::success();
  llvm::Regex re("^(" + regex + ")$");
  std::string why;
  if (!re.isValid(why))
    return fail("--" + flag + ": invalid regular expression '" + regex +
                "': " + why);
  bool any = false;
  std::vector<Value *> declared(g.declared().begin(), g.declared().end());
  for (Value *v : declared) {
    if (v->kind() != ir::ValueKind::Param)
      continue;
    bool match = re.match(v->name());
    any |= match;
    if (match != keepMatches)
      g.setKind(v, ir::ValueKind::Buffer);
  }
  if (!any)
    return fail("--" + flag + ": '" + regex + "' matches no parameter");
  return llvm::Error::success();
}

// A trainable parameter that `v` depends on through differentiable
// operands (for error messages), or "" when there is none.
static std::string someParameterBehind(const Value *v) {
  std::vector<const Value *> work{v};
  llvm::DenseSet<const Value *> seen;
  while (!work.empty()) {
    const Value *x = work.back();
    work.pop_back();
    if (!seen.insert(x).second)
      continue;
    if (x->kind() == ir::ValueKind::Param)
      return x->name();
    if (const ir::Op *def = x->definingOp())
      for (unsigned i = 0; i < def->numOperands(); ++i)
        if (def->info().isDifferentiableOperand(i))
          work.push_back(def->operand(i));
  }
  return "";
}

namespace {

// Reverse-mode differentiation of `y` with respect to a set of source values.
class Autodiff {
public:
  Autodiff(ir::Graph &g, Value *y, llvm::ArrayRef<Value *> sources)
      : g_(g), y_(y), sources_(sources.begin(), sources.end()), b_(g) {}

  // Appends the backward ops; afterwards gradientOf(source) is its gradient
  // (null when y does not depend on it).
  llvm::Error run();
  bool reaches(const Value *source) const { return needed_.count(source); }
  // Sums the contributions to `v` into one value (null when nothing
  // contributed).
  Value *gradientOf(Value *v);
  // Gradients of forward activations (not of parameters): what B computes.
  const llvm::DenseSet<const Value *> &activationGradients() const {
    return activationGradients_;
  }

private:
  void markNeeded();
  bool needs(const Value *v) const { return needed_.count(v); }
  void contribute(Value *v, Value *grad) { parts_[v].push_back(grad); }

  ir::Graph &g_;
  Value *y_;
  std::vector<Value *> sources_;
  grad::Builder b_;
  llvm::DenseSet<const Value *> needed_;
  llvm::DenseMap<Value *, std::vector<Value *>> parts_;
  llvm::DenseSet<const Value *> activationGradients_;
  llvm::DenseSet<const Value *> dataDependent_;
};

} // namespace

void Autodiff::markNeeded() {
  // Forward: values a source reaches through differentiable operands and
  // float results.
  llvm::DenseSet<const Value *> active(sources_.begin(), sources_.end());
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
  // Backward: of those, the ones y depends on.
  if (active.count(y_))
    needed_.insert(y_);
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
  if (dataDependent_.count(v))
    activationGradients_.insert(sum);
  return sum;
}

llvm::Error Autodiff::run() {
  markNeeded();
  dataDependent_ = dataDependentValues(g_);
  // dy = 1 everywhere: the gradient of y (of its sum, when not a scalar).
  const ir::TensorType &t = y_->type();
  contribute(y_, t.numElements() == 1 && t.rank() == 0
                     ? b_.scalar(1.0, t.dtype)
                     : g_.addConst(g_.uniqueName("grad.ones"),
                                   ir::TensorData::fromDoubles(
                                       t.dtype, t.shape,
                                       std::vector<double>(t.numElements(), 1))));
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
    if (!rule) {
      std::string param;
      for (unsigned i = 0; i < op.numOperands() && param.empty(); ++i)
        if (ctx.needs[i])
          param = someParameterBehind(op.operand(i));
      return fail("no gradient rule for " + op.describe() +
                  " (it lies between the trainable parameter " +
                  ir::valueRef(param) +
                  " and the loss; freeze the parameters before it with "
                  "--freeze)");
    }
    ctx.dX.assign(op.numOperands(), nullptr);
    b_.setSource(&op);
    if (auto e = rule(ctx))
      return e;
    for (unsigned i = 0; i < op.numOperands(); ++i)
      if (ctx.needs[i] && ctx.dX[i]) {
        contribute(op.operand(i), ctx.dX[i]);
        if (dataDependent_.count(op.operand(i)))
          activationGradients_.insert(ctx.dX[i]);
      }
  }
  return llvm::Error::success();
}

// A value of its own named `name` (when free) holding gradient `d`, so each
// gradient output is a distinct, recognisable value.
static Value *namedGradient(ir::Graph &g, grad::Builder &b, Value *d,
                            const std::string &name,
                            llvm::ArrayRef<Value *> taken) {
  bool shared = d->isDeclared() || g.isOutput(d) ||
                std::find(taken.begin(), taken.end(), d) != taken.end();
  if (shared) {
    if (!d->isDeclared())
      b.setSource(d->definingOp());
    d = b.emit(ir::OpKind::Identity, {d});
  }
  if (d->name() != name && !g.lookup(name))
    g.rename(d, name);
  return d;
}

static Value *zerosLike(ir::Graph &g, const Value *v, const std::string &name) {
  return g.addConst(g.uniqueName(name),
                    std::make_shared<ir::TensorData>(
                        v->type(), std::string(v->type().byteSize(), '\0')));
}

llvm::DenseSet<const Value *> dataDependentValues(const ir::Graph &g) {
  llvm::DenseSet<const Value *> dep(g.inputs().begin(), g.inputs().end());
  for (const auto &op : g.ops())
    if (llvm::any_of(op->operands(), [&](Value *v) { return dep.count(v); }))
      dep.insert(op->results().begin(), op->results().end());
  return dep;
}

llvm::Expected<std::vector<Value *>>
differentiate(ir::Graph &g, Value *y, llvm::ArrayRef<Value *> xs) {
  Autodiff ad(g, y, xs);
  if (auto e = ad.run())
    return std::move(e);
  grad::Builder b(g);
  std::vector<Value *> grads;
  for (Value *x : xs) {
    std::string name = "grad." + x->name();
    Value *d = ad.gradientOf(x);
    grads.push_back(d ? namedGradient(g, b, d, name, grads)
                      : zerosLike(g, x, name));
  }
  return grads;
}

llvm::Expected<bool> autodiff(ir::Graph &g, const PassContext &ctx) {
  if (g.isTraining())
    return fail("the graph already has backward ops");
  if (auto e = restrictParameters(g, "trainable", ctx.training.trainable,
                                  /*keepMatches=*/true))
    return e;
  if (auto e = restrictParameters(g, "freeze", ctx.training.freeze,
                                  /*keepMatches=*/false))
    return std::move(e);
  auto loss = findLoss(g, ctx.training.loss);
  if (!loss)
    return loss.takeError();
  std::vector<Value *> params;
  for (Value *v : g.declared())
    if (v->kind() == ir::ValueKind::Param)
      params.push_back(v);
  if (params.empty())
    return fail("the graph has no trainable parameters (all frozen or none "
                "imported)");

  size_t numForward = g.ops().size();
  Autodiff ad(g, *loss, params);
  if (auto e = ad.run())
    return std::move(e);
  if (std::none_of(params.begin(), params.end(),
                   [&](Value *p) { return ad.reaches(p); }))
    return fail("the loss " + ir::valueRef((*loss)->name()) +
                " does not depend on any trainable parameter");
  // Outputs: the loss, then one gradient per trainable parameter.
  grad::Builder b(g);
  std::vector<Value *> outputs{*loss};
  for (Value *p : params) {
    std::string name = "grad." + p->name();
    Value *d = ad.gradientOf(p);
    outputs.push_back(d ? namedGradient(g, b, d, name, outputs)
                        : zerosLike(g, p, name));
  }
  g.setOutputs(outputs);
  // Every new op is backward work; the dependency slice says which is W.
  for (size_t i = numForward; i < g.ops().size(); ++i)
    g.ops()[i]->setPhase(ir::Phase::B);
  tagPhases(g, ad.activationGradients());
  accumulateSparseGradients(g);
  readExpandOperandsWhereTheyBroadcast(g);
  return true;
}

} // namespace cleave::passes
