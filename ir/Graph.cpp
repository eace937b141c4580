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
    assert(!r->hasUses() && !isOutput(r) && "erasing an op still in use");
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
  assert(v->isDeclared() && !v->hasUses() && !isOutput(v));
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
