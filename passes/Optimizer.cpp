// optimizer: one SGD or AdamW update per trainable parameter, tagged opt,
// plus the state updates a training step makes (new parameters, optimizer
// state, BatchNorm running statistics). docs/design/training.md.
#include "passes/Pass.h"
#include "support/Errors.h"

#include "ir/Printer.h"

#include "llvm/Support/Regex.h"

namespace cleave::passes {

using ir::OpKind;
using ir::Value;

static Value *stateBuffer(ir::Graph &g, const std::string &name,
                          const ir::TensorType &type, double fill) {
  auto data = ir::TensorData::splat(type, fill);
  return g.addBuffer(g.uniqueName(name), std::move(data));
}

static ir::Op *appendOpt(ir::Graph &g, OpKind kind,
                         llvm::ArrayRef<Value *> operands,
                         llvm::ArrayRef<std::string> names, ir::AttrMap attrs,
                         const std::string &loc) {
  std::vector<ir::TensorType> types;
  for (size_t i = 0; i < names.size(); ++i)
    types.push_back(operands[0]->type());
  std::vector<std::string> unique;
  for (const std::string &n : names)
    unique.push_back(g.uniqueName(n));
  ir::Op *op = g.appendOp(kind, operands, types, unique, std::move(attrs), loc);
  op->setPhase(ir::Phase::Opt);
  return op;
}

// BatchNormalization in training mode computes new running statistics;
// they replace the buffers after the step.
static void addRunningStatUpdates(ir::Graph &g) {
  std::vector<ir::Op *> bns;
  for (const auto &op : g.ops())
    if (op->kind() == OpKind::BatchNormalization &&
        op->getInt("training_mode") && op->phase() == ir::Phase::Fwd)
      bns.push_back(op.get());
  for (ir::Op *op : bns)
    for (unsigned k = 1; k < 3; ++k) {
      Value *state = op->operand(2 + k);
      if (state->kind() != ir::ValueKind::Buffer)
        continue;
      while (op->numResults() <= k)
        g.appendResult(op, op->operand(2 + op->numResults())->type(),
                       state->name() + ".next");
      g.addUpdate(state, op->result(k));
    }
}

// Whether `p` is exempt from weight decay under `noDecay`.
static bool exemptFromDecay(const Value *p, const std::string &noDecay) {
  if (noDecay == "none")
    return false;
  if (noDecay == "1-d")
    return p->type().shape.size() < 2;
  return llvm::Regex("^(" + noDecay + ")$").match(p->name());
}

std::string noDecayRule(const TrainingOptions &t) {
  if (!t.noDecay.empty())
    return t.noDecay;
  return t.optimizer == "adamw" ? "1-d" : "none";
}

DecayGroups weightDecayGroups(const ir::Graph &g, const TrainingOptions &t) {
  DecayGroups out;
  std::string rule = noDecayRule(t);
  for (Value *v : g.declared())
    if (v->kind() == ir::ValueKind::Param)
      (exemptFromDecay(v, rule) ? out.exempt : out.decayed)
          .push_back(v->name());
  return out;
}

llvm::Expected<bool> addOptimizer(ir::Graph &g, const PassContext &ctx) {
  const TrainingOptions &t = ctx.training;
  for (const auto &op : g.ops())
    if (op->phase() == ir::Phase::Opt)
      return fail("the graph already has optimizer ops");
  std::vector<Value *> params;
  for (Value *v : g.declared())
    if (v->kind() == ir::ValueKind::Param)
      params.push_back(v);
  if (!g.isTraining() || g.outputs().size() != params.size() + 1)
    return fail("expected the outputs autodiff makes (the loss, "
                "then one gradient per trainable parameter); run autodiff "
                "first");
  if (t.optimizer != "sgd" && t.optimizer != "adamw")
    return fail("unknown optimizer '" + t.optimizer + "' (sgd, adamw)");
  if (t.microbatches < 1)
    return fail("the number of microbatches must be at least 1");

  bool adam = t.optimizer == "adamw";
  ir::TensorType scalarType(ir::DType::F32, {});
  Value *lr = stateBuffer(g, "optimizer.lr", scalarType, t.lr);
  Value *step = adam ? stateBuffer(g, "optimizer.step", scalarType, 0) : nullptr;
  if (t.dataParallel < 1)
    return fail("the number of data-parallel replicas must be at least 1");
  float gradScale = float(1.0 / double(t.microbatches * t.dataParallel));
  double wd = t.weightDecay.value_or(adam ? 0.01 : 0.0);
  std::string noDecay = noDecayRule(t);

  for (size_t i = 0; i < params.size(); ++i) {
    Value *p = params[i], *grad = g.outputs()[i + 1];
    std::string loc = "optimizer/" + p->name();
    std::vector<Value *> operands{p, grad, lr};
    std::vector<Value *> states{p};
    std::vector<std::string> names{p->name() + ".next"};
    ir::AttrMap attrs{
        {"grad_scale", gradScale},
        {"weight_decay", exemptFromDecay(p, noDecay) ? 0.0f : float(wd)}};
    OpKind kind = OpKind::SGD;
    if (adam) {
      kind = OpKind::AdamW;
      operands.push_back(step);
      for (const char *s : {".adam_m", ".adam_v"}) {
        Value *b = stateBuffer(g, p->name() + s, p->type(), 0);
        operands.push_back(b);
        states.push_back(b);
        names.push_back(b->name() + ".next");
      }
      attrs.emplace("beta1", float(t.beta1));
      attrs.emplace("beta2", float(t.beta2));
      attrs.emplace("epsilon", float(t.epsilon));
    } else if (t.momentum != 0.0) {
      Value *b = stateBuffer(g, p->name() + ".momentum", p->type(), 0);
      operands.push_back(b);
      states.push_back(b);
      names.push_back(b->name() + ".next");
      attrs.emplace("momentum", float(t.momentum));
      attrs.emplace("nesterov", int64_t(t.nesterov));
    }
    ir::Op *op = appendOpt(g, kind, operands, names, attrs, loc);
    for (size_t k = 0; k < states.size(); ++k)
      g.addUpdate(states[k], op->result(k));
  }
  if (adam) {
    Value *one = g.addConst(g.uniqueName("optimizer.one"),
                            ir::TensorData::fromDoubles(ir::DType::F32, {}, {1}));
    ir::Op *inc = g.appendOp(OpKind::Add, {step, one}, {scalarType},
                             {g.uniqueName("optimizer.step.next")}, {},
                             "optimizer");
    inc->setPhase(ir::Phase::Opt);
    g.addUpdate(step, inc->result());
  }
  addRunningStatUpdates(g);
  std::vector<Value *> outputs(g.outputs().begin(), g.outputs().end());
  for (const ir::StateUpdate &u : g.updates())
    if (std::find(outputs.begin(), outputs.end(), u.value) == outputs.end())
      outputs.push_back(u.value);
  g.setOutputs(outputs);
  return true;
}

} // namespace cleave::passes
