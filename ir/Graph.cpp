#include "ir/Graph.h"

#include <algorithm>
#include <cassert>

namespace cleave::ir {

std::string_view valueKindName(ValueKind k) {
  switch (k) {
  case ValueKind::Input:
    return "input";
  case ValueKind::Param:
    return "param";
  case ValueKind::Buffer:
    return "buffer";
  case ValueKind::Const:
    return "const";
  case ValueKind::Result:
    return "result";
  }
  return "?";
}

static void removeUse(Value *v, Op *user, unsigned idx,
                      std::vector<Use> &uses) {
  auto it = std::find_if(uses.begin(), uses.end(), [&](const Use &u) {
    return u.user == user && u.operandIndex == idx;
  });
  assert(it != uses.end() && "use list out of sync");
  uses.erase(it);
  (void)v;
}

void Op::setOperand(unsigned i, Value *v) {
  Value *old = operands_[i];
  if (old == v)
    return;
  removeUse(old, this, i, old->uses_);
  operands_[i] = v;
  v->uses_.push_back({this, i});
}

const Attribute &Op::attr(std::string_view n) const {
  return attrOrDefault(info(), attrs_, n);
}

std::string Op::describe() const {
  std::string s(name());
  if (!loc_.empty())
    return s + " '" + loc_ + "'";
  if (!results_.empty())
    return s + " producing %" + results_[0]->name();
  return s;
}

Value *Graph::newValue(const std::string &name, TensorType type,
                       ValueKind kind) {
  assert(!name.empty() && !byName_.count(name) && "value names are unique");
  auto v = std::make_unique<Value>();
  v->name_ = name;
  v->type_ = std::move(type);
  v->kind_ = kind;
  Value *raw = v.get();
  byName_[name] = raw;
  values_.push_back(std::move(v));
  return raw;
}

Value *Graph::addInput(const std::string &name, TensorType type) {
  Value *v = newValue(name, std::move(type), ValueKind::Input);
  inputs_.push_back(v);
  return v;
}

Value *Graph::addDeclared(ValueKind kind, const std::string &name,
                          std::shared_ptr<TensorData> data) {
  assert(kind != ValueKind::Input && kind != ValueKind::Result);
  Value *v = newValue(name, data->type(), kind);
  v->data_ = std::move(data);
  declared_.push_back(v);
  return v;
}

void Graph::setKind(Value *v, ValueKind kind) {
  assert(v->isDeclared() && v->kind_ != ValueKind::Input &&
         kind != ValueKind::Input && kind != ValueKind::Result);
  v->kind_ = kind;
}

std::string_view phaseName(Phase p) {
  switch (p) {
  case Phase::Fwd:
    return "fwd";
  case Phase::B:
    return "B";
  case Phase::W:
    return "W";
  case Phase::Opt:
    return "opt";
  }
  return "?";
}

std::optional<Phase> parsePhase(std::string_view s) {
  for (Phase p : {Phase::Fwd, Phase::B, Phase::W, Phase::Opt})
    if (phaseName(p) == s)
      return p;
  return std::nullopt;
}

Op *Graph::insertOpBefore(Op *before, OpKind kind,
                          llvm::ArrayRef<Value *> operands,
                          llvm::ArrayRef<TensorType> resultTypes,
                          llvm::ArrayRef<std::string> resultNames,
                          AttrMap attrs, std::string loc) {
  Op *op = appendOp(kind, operands, resultTypes, resultNames, std::move(attrs),
                    std::move(loc));
  auto pos = std::find_if(ops_.begin(), ops_.end(),
                          [&](auto &p) { return p.get() == before; });
  assert(pos != ops_.end());
  std::rotate(pos, ops_.end() - 1, ops_.end());
  return op;
}

Value *Graph::appendResult(Op *op, TensorType type, const std::string &name) {
  Value *r = newValue(uniqueName(name), std::move(type), ValueKind::Result);
  r->def_ = op;
  r->resultIndex_ = op->results_.size();
  op->results_.push_back(r);
  return r;
}

void Graph::rename(Value *v, const std::string &name) {
  assert(!byName_.count(name) && "renaming onto a name in use");
  byName_.erase(v->name_);
  v->name_ = name;
  byName_[name] = v;
}

bool Graph::isTraining() const {
  return std::any_of(ops_.begin(), ops_.end(),
                     [](auto &op) { return op->phase() != Phase::Fwd; });
}

bool Graph::isPinned(const Value *v) const {
  if (isOutput(v) || std::find(stash_.begin(), stash_.end(), v) != stash_.end())
    return true;
  return std::any_of(updates_.begin(), updates_.end(), [&](auto &u) {
    return u.state == v || u.value == v;
  });
}

Op *Graph::appendOp(OpKind kind, llvm::ArrayRef<Value *> operands,
                    llvm::ArrayRef<TensorType> resultTypes,
                    llvm::ArrayRef<std::string> resultNames, AttrMap attrs,
                    std::string loc) {
  auto op = std::make_unique<Op>();
  op->kind_ = kind;
  op->attrs_ = std::move(attrs);
  op->loc_ = std::move(loc);
  for (unsigned i = 0; i < operands.size(); ++i) {
    op->operands_.push_back(operands[i]);
    operands[i]->uses_.push_back({op.get(), i});
  }
  for (unsigned i = 0; i < resultTypes.size(); ++i) {
    std::string name = i < resultNames.size() ? resultNames[i] : "";
    if (name.empty() || byName_.count(name))
      name = uniqueName(name.empty() ? "t" + std::to_string(nextTemp_++)
                                     : name);
    Value *r = newValue(name, resultTypes[i], ValueKind::Result);
    r->def_ = op.get();
    r->resultIndex_ = i;
    op->results_.push_back(r);
  }
  Op *raw = op.get();
  ops_.push_back(std::move(op));
  return raw;
}

void Graph::eraseOp(Op *op) {
  for (unsigned i = 0; i < op->operands_.size(); ++i)
    removeUse(op->operands_[i], op, i, op->operands_[i]->uses_);
  for (Value *r : op->results_) {
    assert(!r->hasUses() && !isPinned(r) && "erasing an op still in use");
    byName_.erase(r->name_);
    auto it = std::find_if(values_.begin(), values_.end(),
                           [&](auto &p) { return p.get() == r; });
    values_.erase(it);
  }
  auto it = std::find_if(ops_.begin(), ops_.end(),
                         [&](auto &p) { return p.get() == op; });
  ops_.erase(it);
}

void Graph::eraseDeclared(Value *v) {
  assert(v->isDeclared() && !v->hasUses() && !isPinned(v));
  auto &list = v->kind_ == ValueKind::Input ? inputs_ : declared_;
  list.erase(std::find(list.begin(), list.end(), v));
  byName_.erase(v->name_);
  values_.erase(std::find_if(values_.begin(), values_.end(),
                             [&](auto &p) { return p.get() == v; }));
}

void Graph::replaceAllUsesWith(Value *from, Value *to) {
  assert(from != to);
  std::vector<Use> uses = from->uses_;
  for (const Use &u : uses)
    u.user->setOperand(u.operandIndex, to);
  for (Value *&o : outputs_)
    if (o == from)
      o = to;
  for (Value *&s : stash_)
    if (s == from)
      s = to;
  for (StateUpdate &u : updates_)
    if (u.value == from)
      u.value = to;
}

bool Graph::isOutput(const Value *v) const {
  return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}

Value *Graph::lookup(llvm::StringRef name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : it->second;
}

std::string Graph::uniqueName(llvm::StringRef base) const {
  if (!byName_.count(base))
    return base.str();
  for (unsigned i = 1;; ++i) {
    std::string n = base.str() + "." + std::to_string(i);
    if (!byName_.count(n))
      return n;
  }
}

} // namespace cleave::ir
