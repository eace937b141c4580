#include "passes/Stages.h"

#include "ir/Verifier.h"
#include "passes/Pass.h"
#include "support/Errors.h"

#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <map>

namespace cleave::passes {

using ir::Graph;
using ir::Op;
using ir::OpKind;
using ir::Phase;
using ir::Value;

std::vector<const Op *> gradientSums(const Graph &g) {
  std::vector<const Op *> sums;
  auto isSum = [&](const Op *op) {
    return std::find(sums.begin(), sums.end(), op) != sums.end();
  };
  for (const auto &opt : g.ops()) {
    if (opt->kind() != OpKind::SGD && opt->kind() != OpKind::AdamW)
      continue;
    std::vector<const Value *> work{opt->operand(1)};
    while (!work.empty()) {
      const Value *v = work.back();
      work.pop_back();
      const Op *d = v->definingOp();
      if (!d || d->kind() != OpKind::Add ||
          (d->phase() != Phase::B && d->phase() != Phase::W) || isSum(d))
        continue;
      bool onlySummed = std::all_of(
          v->uses().begin(), v->uses().end(), [&](const ir::Use &u) {
            return u.user == opt.get() || isSum(u.user);
          });
      if (!onlySummed)
        continue;
      sums.push_back(d);
      for (const Value *x : d->operands())
        work.push_back(x);
    }
  }
  return sums;
}

namespace {

// A value made on one stage that another stage reads.
struct Need {
  Phase first = Phase::Opt;  // the earliest phase reading it there
  bool perMicrobatch = false; // read outside the step
  Value *local = nullptr;     // its Recv's result, once made
};

class StageSplitter {
public:
  StageSplitter(const Graph &g,
                const llvm::DenseMap<const Op *, int> &stageOf, int p)
      : g_(g), stageOf_(stageOf), p_(p) {}

  llvm::Expected<std::vector<std::unique_ptr<Graph>>> run();

private:
  Phase phaseOf(const Op *op) const {
    return deferred_.count(op) ? Phase::Opt : op->phase();
  }
  int stageOfValue(const Value *v) const {
    return stageOf_.lookup(v->definingOp());
  }
  llvm::Error collect();
  void need(const Value *v, int stage, Phase phase);
  Value *receive(const Value *v, int stage);
  void emitOp(const Op &op);

  const Graph &g_;
  const llvm::DenseMap<const Op *, int> &stageOf_;
  int p_;
  llvm::DenseSet<const Op *> deferred_;
  // Declared values and inputs: which stages hold a copy.
  llvm::DenseMap<const Value *, std::vector<bool>> holds_;
  std::map<std::pair<const Value *, int>, Need> needs_;
  llvm::DenseMap<const Value *, std::vector<int>> sendTo_;
  llvm::DenseMap<const Value *, int64_t> tags_;
  std::vector<std::unique_ptr<Graph>> out_;
  std::vector<llvm::DenseMap<const Value *, Value *>> local_;
};

void StageSplitter::need(const Value *v, int stage, Phase phase) {
  auto [it, fresh] = needs_.try_emplace({v, stage});
  Need &n = it->second;
  n.first = std::min(n.first, phase);
  n.perMicrobatch |= phase != Phase::Opt;
  if (fresh)
    sendTo_[v].push_back(stage);
}

llvm::Error StageSplitter::collect() {
  auto hold = [&](const Value *v, int s) {
    auto &h = holds_[v];
    h.resize(p_);
    h[s] = true;
  };
  for (const auto &op : g_.ops()) {
    auto it = stageOf_.find(op.get());
    if (it == stageOf_.end() || it->second < 0 || it->second >= p_)
      return fail(op->describe() + " has no stage in 0.." +
                  std::to_string(p_ - 1));
    int s = it->second;
    for (const Value *v : op->operands()) {
      if (!v->definingOp())
        hold(v, s);
      else if (stageOfValue(v) != s)
        need(v, s, phaseOf(op.get()));
    }
  }
  for (const ir::StateUpdate &u : g_.updates()) {
    if (!u.value->definingOp())
      return fail("update of %" + u.state->name() +
                  " by a declared value is not supported in stages");
    int a = stageOfValue(u.value);
    hold(u.state, a);
    for (int b = 0; b < p_; ++b)
      if (b != a && holds_[u.state][b])
        need(u.value, b, phaseOf(u.value->definingOp()));
  }
  for (auto &[v, stages] : sendTo_)
    std::sort(stages.begin(), stages.end());
  return llvm::Error::success();
}

Value *StageSplitter::receive(const Value *v, int stage) {
  Need &n = needs_.at({v, stage});
  if (n.local)
    return n.local;
  const Op *def = v->definingOp();
  ir::AttrMap attrs{{"peer", int64_t(stageOfValue(v))},
                    {"tag", tags_.lookup(v)},
                    {"dtype", std::string(ir::dtypeName(v->type().dtype))},
                    {"shape", std::vector<int64_t>(v->type().shape.begin(),
                                                   v->type().shape.end())}};
  Op *r = out_[stage]->appendOp(OpKind::Recv, {}, {v->type()}, {v->name()},
                                std::move(attrs), def->loc());
  r->setPhase(n.first);
  n.local = r->result();
  local_[stage][v] = n.local;
  return n.local;
}

void StageSplitter::emitOp(const Op &op) {
  int s = stageOf_.lookup(&op);
  std::vector<Value *> operands;
  for (const Value *v : op.operands()) {
    Value *l = local_[s].lookup(v);
    operands.push_back(l ? l : receive(v, s));
  }
  std::vector<ir::TensorType> types;
  std::vector<std::string> names;
  for (const Value *r : op.results()) {
    types.push_back(r->type());
    names.push_back(r->name());
  }
  Op *c = out_[s]->appendOp(op.kind(), operands, types, names, op.attrs(),
                            op.loc());
  c->setPhase(phaseOf(&op));
  for (unsigned i = 0; i < op.numResults(); ++i) {
    const Value *r = op.result(i);
    local_[s][r] = c->result(i);
    auto it = sendTo_.find(r);
    if (it == sendTo_.end())
      continue;
    int64_t tag = tags_.try_emplace(r, int64_t(tags_.size())).first->second;
    for (int b : it->second) {
      const Need &n = needs_.at({r, b});
      ir::AttrMap attrs{{"peer", int64_t(b)}, {"tag", tag}};
      Op *send = out_[s]->appendOp(OpKind::Send, {c->result(i)}, {}, {},
                                   std::move(attrs), op.loc());
      send->setPhase(n.perMicrobatch ? phaseOf(&op) : Phase::Opt);
    }
  }
}

llvm::Expected<std::vector<std::unique_ptr<Graph>>> StageSplitter::run() {
  if (p_ < 1)
    return fail("the number of stages must be at least 1");
  for (const Op *op : gradientSums(g_))
    deferred_.insert(op);
  if (auto e = collect())
    return std::move(e);
  out_.resize(p_);
  local_.resize(p_);
  for (int s = 0; s < p_; ++s) {
    out_[s] = std::make_unique<Graph>();
    out_[s]->setName(g_.name() + ".stage" + std::to_string(s));
  }
  auto holders = [&](const Value *v) {
    auto it = holds_.find(v);
    return it == holds_.end() ? std::vector<bool>(p_) : it->second;
  };
  for (const Value *v : g_.inputs()) {
    std::vector<bool> h = holders(v);
    for (int s = 0; s < p_; ++s)
      if (h[s])
        local_[s][v] = out_[s]->addInput(v->name(), v->type());
  }
  for (const Value *v : g_.declared()) {
    std::vector<bool> h = holders(v);
    for (int s = 0; s < p_; ++s)
      if (h[s])
        local_[s][v] = out_[s]->addDeclared(v->kind(), v->name(), v->data());
  }
  for (const auto &op : g_.ops())
    emitOp(*op);
  // Updated values a replica's stage receives after the step.
  for (const ir::StateUpdate &u : g_.updates()) {
    std::vector<bool> h = holders(u.state);
    for (int b = 0; b < p_; ++b)
      if (h[b] && !local_[b].count(u.value))
        receive(u.value, b);
  }
  for (const ir::StateUpdate &u : g_.updates()) {
    std::vector<bool> h = holders(u.state);
    for (int b = 0; b < p_; ++b)
      if (h[b])
        out_[b]->addUpdate(local_[b][u.state], local_[b][u.value]);
  }
  for (const Value *v : g_.outputs()) {
    int s = v->definingOp() ? stageOfValue(v) : 0;
    if (Value *l = local_[s].lookup(v))
      out_[s]->addOutput(l);
  }
  for (int s = 0; s < p_; ++s) {
    Graph &sg = *out_[s];
    sg.setStash(computeStash(sg));
    if (sg.outputs().empty())
      for (const ir::StateUpdate &u : sg.updates())
        if (!sg.isOutput(u.value))
          sg.addOutput(u.value);
    if (sg.outputs().empty())
      for (auto it = sg.ops().rbegin(); it != sg.ops().rend(); ++it)
        if ((*it)->numResults()) {
          sg.addOutput((*it)->result());
          break;
        }
    if (sg.outputs().empty())
      return fail("stage " + std::to_string(s) +
                  " has no work: use fewer stages");
    if (auto e = ir::verifyGraph(sg))
      return fail("stage " + std::to_string(s) + ": " +
                  llvm::toString(std::move(e)));
  }
  return std::move(out_);
}

} // namespace

llvm::Expected<std::vector<std::unique_ptr<Graph>>>
splitStages(const Graph &g, const llvm::DenseMap<const Op *, int> &stageOf,
            int numStages) {
  return StageSplitter(g, stageOf, numStages).run();
}

} // namespace cleave::passes
