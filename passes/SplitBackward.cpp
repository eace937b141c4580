// split-backward: the 2BP split. Every combined gradient op becomes its data
// part and its weight part (but those Ops.def keeps whole: BatchNorm's,
// whose two results share one pass over its operands, stays one op in B);
// then every backward op is tagged B (some
// activation gradient depends on it) or W (it only feeds parameter
// gradients), and the stash (what W needs from fwd and B) is recorded.
// verify-2bp re-derives all of it and compares.
#include "passes/Pass.h"
#include "support/Errors.h"

#include "ir/Parser.h"
#include "ir/Printer.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace cleave::passes {

using ir::Op;
using ValueSet = llvm::DenseSet<const ir::Value *>;
using ir::OpKind;
using ir::Phase;
using ir::Value;

// Replaces `op` by its two parts (its op record's split, ir/Ops.def), which
// take over its result names. A part whose forward operand depends on the
// data makes an activation gradient: it joins `seeds`.
static void splitOp(ir::Graph &g, Op *op, const ir::GradientSplit &rule,
                    const ValueSet &dataDependent, ValueSet &seeds) {
  Value *results[2] = {op->result(0), op->result(1)};
  Value *parts[2];
  for (unsigned i = 0; i < 2; ++i) {
    const ir::GradientPart &p = rule.part(i);
    std::vector<Value *> operands;
    for (unsigned k : p.operands)
      operands.push_back(op->operand(k));
    ir::AttrMap attrs = op->attrs();
    if (p.shapeOf >= 0) {
      const auto &s = op->operand(p.shapeOf)->type().shape;
      attrs.insert_or_assign("shape", std::vector<int64_t>(s.begin(), s.end()));
    }
    Op *part = g.insertOpBefore(op, p.kind, operands, {results[i]->type()},
                                {}, std::move(attrs), op->loc());
    part->setPhase(op->phase());
    parts[i] = part->result(0);
    if (dataDependent.count(op->operand(ir::GradientSplit::differentiates(i))))
      seeds.insert(parts[i]);
  }
  std::string names[2] = {results[0]->name(), results[1]->name()};
  for (int i = 0; i < 2; ++i)
    g.replaceAllUsesWith(results[i], parts[i]);
  g.eraseOp(op);
  for (int i = 0; i < 2; ++i)
    g.rename(parts[i], names[i]);
}

static bool isBackward(const Op &op) {
  return op.phase() == Phase::B || op.phase() == Phase::W;
}

// The phase every op should have: fwd and opt stay; a backward op is B when
// one of its results is an activation gradient (a seed) or is read by a B
// op, else W (it only feeds parameter gradients). One reverse sweep: the
// dependency slice of the activation gradients.
static std::vector<Phase> computePhases(const ir::Graph &g,
                                        const ValueSet &seeds) {
  const auto &ops = g.ops();
  llvm::DenseMap<const Op *, Phase> phase;
  std::vector<Phase> out(ops.size());
  for (size_t i = ops.size(); i-- > 0;) {
    const Op &op = *ops[i];
    Phase p = op.phase();
    if (isBackward(op)) {
      bool data = false;
      for (const Value *r : op.results()) {
        data |= seeds.count(r) != 0;
        for (const ir::Use &u : r->uses())
          data |= phase.lookup(u.user) == Phase::B;
      }
      p = data ? Phase::B : Phase::W;
    }
    phase[&op] = p;
    out[i] = p;
  }
  return out;
}

// Values made by fwd or B ops, or fed as graph inputs, that W ops read.
std::vector<Value *> computeStash(const ir::Graph &g) {
  llvm::DenseSet<const Value *> read;
  for (const auto &op : g.ops())
    if (op->phase() == Phase::W)
      for (Value *v : op->operands())
        read.insert(v);
  std::vector<Value *> stash;
  for (Value *v : g.inputs())
    if (read.count(v))
      stash.push_back(v);
  for (const auto &op : g.ops())
    if (op->phase() == Phase::Fwd || op->phase() == Phase::B)
      for (Value *r : op->results())
        if (read.count(r))
          stash.push_back(r);
  return stash;
}

void tagPhases(ir::Graph &g, const ValueSet &activationGradients) {
  std::vector<Phase> phases = computePhases(g, activationGradients);
  for (size_t i = 0; i < phases.size(); ++i)
    g.ops()[i]->setPhase(phases[i]);
  g.setStash(computeStash(g));
}

llvm::Expected<bool> splitBackward(ir::Graph &g, const PassContext &) {
  if (!g.isTraining())
    return fail("the graph has no backward ops; run autodiff first");
  // Results of B ops stay activation gradients; the parts of combined ops
  // are judged by the operand they differentiate.
  ValueSet seeds;
  std::vector<Op *> combined;
  for (const auto &op : g.ops()) {
    const ir::GradientSplit *split = ir::gradientSplit(op->kind());
    if (split && !split->keptWhole)
      combined.push_back(op.get());
    else if (op->phase() == Phase::B)
      seeds.insert(op->results().begin(), op->results().end());
  }
  ValueSet dataDependent = dataDependentValues(g);
  for (Op *op : combined)
    splitOp(g, op, *ir::gradientSplit(op->kind()), dataDependent, seeds);
  tagPhases(g, seeds);
  return true;
}

static std::string phaseStr(Phase p) { return std::string(ir::phaseName(p)); }

// The tags must be what the passes derive: the forward part of the graph,
// differentiated and split again, gives the same backward ops with the same
// tags, in the same order. Applies to graphs shaped by autodiff (the loss
// first among the outputs, then one gradient per parameter).
static llvm::Error checkTagsByRegeneration(const ir::Graph &g) {
  size_t params = llvm::count_if(g.declared(), [](const Value *v) {
    return v->kind() == ir::ValueKind::Param;
  });
  if (g.outputs().size() < params + 1 || params == 0)
    return llvm::Error::success();
  auto copy = ir::parseGraph(ir::printGraph(g), "<verify-2bp>");
  if (!copy)
    return copy.takeError();
  ir::Graph &f = **copy;
  f.setOutputs({f.outputs()[0]});
  f.setStash({});
  f.clearUpdates();
  std::vector<Op *> later;
  for (const auto &op : f.ops())
    if (op->phase() != Phase::Fwd)
      later.push_back(op.get());
  for (auto it = later.rbegin(); it != later.rend(); ++it)
    f.eraseOp(*it);
  PassContext ctx;
  ctx.training.loss = f.outputs()[0]->name();
  auto ad = autodiff(f, ctx);
  if (!ad)
    return ad.takeError();
  auto split = splitBackward(f, ctx);
  if (!split)
    return split.takeError();
  std::vector<const Op *> mine, derived;
  for (const auto &op : g.ops())
    if (isBackward(*op))
      mine.push_back(op.get());
  for (const auto &op : f.ops())
    if (isBackward(*op))
      derived.push_back(op.get());
  for (size_t i = 0; i < std::min(mine.size(), derived.size()); ++i) {
    if (mine[i]->kind() != derived[i]->kind())
      return fail("backward op " + mine[i]->describe() +
                  " is not what autodiff and split-backward make from the "
                  "forward graph (" + std::string(derived[i]->name()) +
                  " expected)");
    if (mine[i]->phase() != derived[i]->phase())
      return fail(mine[i]->describe() + " is tagged " +
                  phaseStr(mine[i]->phase()) +
                  " but the dependency slice of the activation gradients "
                  "makes it " + phaseStr(derived[i]->phase()));
  }
  if (mine.size() != derived.size())
    return fail("the graph has " + std::to_string(mine.size()) +
                " backward ops; autodiff and split-backward make " +
                std::to_string(derived.size()) + " from its forward part");
  return llvm::Error::success();
}

llvm::Expected<bool> verify2BP(ir::Graph &g, const PassContext &) {
  if (!g.isTraining())
    return fail("the graph has no backward ops; run autodiff first");
  auto producer = [](const Value *v) {
    return v->definingOp() ? v->definingOp()->phase() : Phase::Fwd;
  };
  for (const auto &opPtr : g.ops()) {
    const Op &op = *opPtr;
    for (const Value *v : op.operands()) {
      Phase from = producer(v);
      bool ok = true;
      switch (op.phase()) {
      case Phase::Fwd:
        ok = from == Phase::Fwd;
        break;
      case Phase::B:
        ok = from == Phase::Fwd || from == Phase::B;
        break;
      case Phase::W:
        ok = from != Phase::Opt;
        break;
      case Phase::Opt:
        break;
      }
      if (!ok)
        return fail( phaseStr(op.phase()) + " op " +
                    op.describe() + " reads " + ir::valueRef(v->name()) +
                    ", made by a " + phaseStr(from) + " op");
    }
    if (op.phase() == Phase::Fwd &&
        ir::isTrainingOp(op.kind()))
      return fail("gradient op " + op.describe() +
                  " is tagged fwd");
    if (op.phase() == Phase::W)
      for (const Value *r : op.results())
        for (const ir::Use &u : r->uses())
          if (u.user->phase() != Phase::W && u.user->phase() != Phase::Opt)
            return fail("W op " + op.describe() + " feeds " +
                        phaseStr(u.user->phase()) + " op " +
                        u.user->describe());
  }
  if (auto e = checkTagsByRegeneration(g))
    return e;
  std::vector<Value *> stash = computeStash(g);
  if (stash != std::vector<Value *>(g.stash().begin(), g.stash().end()))
    return fail("the recorded stash differs from the values W "
                "ops read from fwd and B (" +
                std::to_string(g.stash().size()) + " recorded, " +
                std::to_string(stash.size()) + " expected)");
  return false;
}

} // namespace cleave::passes
