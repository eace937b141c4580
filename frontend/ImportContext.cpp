// The importer's value table and the helpers op translations share
// (ImportContext.h): reading inputs as operands or static values, emitting
// IR ops with inferred result types, module-path locations, and expanding
// a node into its ONNX function body.
#include "frontend/ImportContext.h"

#include "frontend/FunctionBody.h"
#include "frontend/OnnxNode.h"
#include "frontend/translate/Translation.h"
#include "ir/TypeRules.h"

#include "llvm/ADT/SmallVector.h"

namespace cleave::frontend {

using namespace cleave::ir;

std::string modulePathOf(const onnx::NodeProto &n) {
  for (const auto &p : n.metadata_props()) {
    if (p.key() != "pkg.torch.onnx.name_scopes")
      continue;
    llvm::SmallVector<llvm::StringRef> items;
    llvm::StringRef(p.value()).trim().trim("[]").split(items, ',');
    if (items.size() < 2)
      return "";
    llvm::StringRef module = items[items.size() - 2].trim().trim("'\"");
    return module.empty() ? "" : " in module " + module.str();
  }
  return "";
}

// An op's location: its module path in the legacy exporter's form
// (`/m/transformer/h.0/attn/<node>`), which passes/Layers.h reads. The
// legacy exporter writes it as the node name; the dynamo exporter names
// nodes `node_MatMul_77` and keeps the path in the node's metadata,
// `pkg.torch.onnx.name_scopes`: "['', 'm', 'm.transformer',
// 'm.transformer.h.0', ..., 'matmul']", cumulative module paths and last
// the op's own name. An indexed child of a container (`m.layer1.0`) keeps
// the container's name (`layer1.0`), as in legacy names.
static std::string locOf(const onnx::NodeProto &n) {
  const std::string *scopes = nullptr;
  for (const auto &p : n.metadata_props())
    if (p.key() == "pkg.torch.onnx.name_scopes")
      scopes = &p.value();
  if (!scopes)
    return n.name();
  llvm::SmallVector<llvm::StringRef> items;
  llvm::StringRef(*scopes).trim().trim("[]").split(items, ',');
  std::vector<std::string> paths;
  for (llvm::StringRef item : items) {
    item = item.trim().trim("'\"");
    if (!item.empty())
      paths.push_back(item.str());
  }
  if (paths.size() < 2) // no module around the op
    return n.name();
  paths.pop_back(); // the op's own name
  std::string loc, previous;
  for (const std::string &path : paths) {
    llvm::StringRef child(path);
    if (!previous.empty()) {
      if (!child.consume_front(previous + "."))
        return n.name(); // not nested: not a path this reads
    }
    std::string part = child.str();
    if (!part.empty() &&
        part.find_first_not_of("0123456789") == std::string::npos &&
        !previous.empty()) {
      llvm::StringRef parent(previous);
      part = parent.rsplit('.').second.empty()
                 ? (parent + "." + part).str()
                 : (parent.rsplit('.').second + "." + part).str();
    }
    loc += "/" + part;
    previous = path;
  }
  return loc + "/" + n.name();
}

ImportContext::Entry *ImportContext::input(const onnx::NodeProto &n, int k) {
  if (k >= n.input_size() || n.input(k).empty())
    return nullptr;
  return lookup(n.input(k));
}

ImportContext::Entry *ImportContext::lookup(llvm::StringRef name) {
  auto it = env_.find(name);
  return it == env_.end() ? nullptr : &it->second;
}

Value *ImportContext::materialize(const std::string &name, Entry &e) {
  if (!e.value)
    e.value = g_->addDeclared(e.foldable ? ValueKind::Const : ValueKind::Param,
                              name, e.data);
  return e.value;
}

llvm::Expected<Value *> ImportContext::operand(const onnx::NodeProto &n,
                                               int index, int k) {
  Entry *e = input(n, k);
  if (!e)
    return importError("{0}: input {1} is missing", describeNode(n, index), k);
  return materialize(n.input(k), *e);
}

llvm::Expected<std::vector<int64_t>>
ImportContext::staticInts(const onnx::NodeProto &n, int index, int k,
                          const char *what) {
  Entry *e = input(n, k);
  if (!e || !e->foldable)
    return importError(
        "{0}: input '{1}' ({2}) must be a constant after folding; cleave "
        "needs static shapes",
        describeNode(n, index), k < n.input_size() ? n.input(k) : "", what);
  std::vector<int64_t> v(e->type.numElements());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = e->data->getInt(i);
  return v;
}

llvm::Expected<const TensorData *>
ImportContext::staticScalar(const onnx::NodeProto &n, int index, int k,
                            const char *what) {
  Entry *e = input(n, k);
  if (!e)
    return nullptr;
  if (!e->data || e->type.numElements() != 1)
    return importError("{0}: {1} (input '{2}') must be a constant scalar",
                       describeNode(n, index), what, n.input(k));
  if (auto le = e->data->load())
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(std::move(le)));
  return e->data.get();
}

llvm::Expected<std::vector<Value *>>
ImportContext::tensorOperands(const onnx::NodeProto &n, int index,
                              OpKind kind) {
  const OpInfo &info = opInfo(kind);
  int tensorInputs = info.maxOperands < 0
                         ? n.input_size()
                         : std::min(n.input_size(), info.maxOperands);
  while (tensorInputs > 0 && n.input(tensorInputs - 1).empty())
    --tensorInputs;
  std::vector<Value *> operands;
  for (int k = 0; k < tensorInputs; ++k) {
    if (n.input(k).empty())
      return importError("{0}: an omitted optional input before the last "
                         "one is not supported",
                         describeNode(n, index));
    auto v = operand(n, index, k);
    if (!v)
      return v.takeError();
    operands.push_back(*v);
  }
  for (int k = tensorInputs; k < n.input_size(); ++k)
    if (!n.input(k).empty() && !input(n, k))
      return importError("{0}: input '{1}' is not defined",
                         describeNode(n, index), n.input(k));
  return operands;
}

// The node's attribute `a` as the IR attribute `spec` declares, or
// std::nullopt when its ONNX kind does not match.
static std::optional<Attribute> convertAttr(const onnx::AttributeProto &a,
                                            const AttrSpec &spec) {
  using AP = onnx::AttributeProto;
  switch (spec.kind) {
  case AttrKind::Int:
    if (a.type() == AP::INT)
      return Attribute(int64_t(a.i()));
    break;
  case AttrKind::Float:
    if (a.type() == AP::FLOAT)
      return Attribute(a.f());
    break;
  case AttrKind::String:
    if (a.type() == AP::STRING)
      return Attribute(a.s());
    break;
  case AttrKind::Ints:
    if (a.type() == AP::INTS)
      return Attribute(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
    break;
  case AttrKind::Floats:
    if (a.type() == AP::FLOATS)
      return Attribute(
          std::vector<float>(a.floats().begin(), a.floats().end()));
    break;
  default:
    break;
  }
  return std::nullopt;
}

llvm::Expected<std::vector<int64_t>>
ImportContext::axesOf(const onnx::NodeProto &n, int index) {
  if (auto a = attrInts(n, "axes"))
    return *a;
  if (input(n, 1))
    return staticInts(n, index, 1, "axes");
  return std::vector<int64_t>();
}

llvm::Expected<std::optional<std::vector<int64_t>>>
ImportContext::reductionAxesOf(const onnx::NodeProto &n, int index) {
  auto axes = axesOf(n, index);
  if (!axes)
    return axes.takeError();
  if (axes->empty() && attrInt(n, "noop_with_empty_axes", 0))
    return std::nullopt;
  return std::move(*axes);
}

// uint8 exists in the IR for shape arithmetic folded at import; no kernel
// takes it, so an op that would compute on it at run time is refused.
static llvm::Error refuseUint8(const onnx::NodeProto &n, int index,
                               llvm::ArrayRef<TensorType> types) {
  for (const TensorType &t : types)
    if (t.dtype == DType::U8)
      return importError("{0}: computes on uint8 data ({1}) at run time; "
                         "cleave takes uint8 only in shape arithmetic it "
                         "folds at import",
                         describeNode(n, index), t.str());
  return llvm::Error::success();
}

llvm::Expected<Value *> ImportContext::append(const onnx::NodeProto &n,
                                              int index, OpKind kind,
                                              std::vector<Value *> operands,
                                              AttrMap attrs) {
  std::vector<TensorType> types;
  for (Value *v : operands)
    types.push_back(v->type());
  auto out = inferResultTypes(kind, types, attrs, 1);
  if (!out)
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(out.takeError()));
  if (auto e = refuseUint8(n, index, types))
    return std::move(e);
  if (auto e = refuseUint8(n, index, *out))
    return std::move(e);
  return g_->appendOp(kind, operands, *out, {}, std::move(attrs), loc(n))
      ->result();
}

llvm::Error ImportContext::emit(const onnx::NodeProto &n, int index,
                                OpKind kind, std::vector<Value *> operands,
                                AttrMap attrs, bool copyAttrs) {
  const OpInfo &info = opInfo(kind);
  for (const auto &a : n.attribute()) {
    if (!copyAttrs)
      break;
    if (consumesAttr(n.op_type(), a.name()) || attrs.count(a.name()))
      continue;
    const AttrSpec *spec = info.findAttr(a.name());
    if (!spec)
      return importError("{0}: attribute '{1}' is not supported by cleave",
                         describeNode(n, index), a.name());
    auto attr = convertAttr(a, *spec);
    if (!attr)
      return importError("{0}: attribute '{1}' has the wrong kind",
                         describeNode(n, index), a.name());
    attrs.emplace(a.name(), std::move(*attr));
  }
  // Outputs up to the last named one; unnamed ones in between get fresh
  // names.
  int numResults = n.output_size();
  while (numResults > 0 && n.output(numResults - 1).empty())
    --numResults;
  std::vector<TensorType> operandTypes;
  for (Value *v : operands)
    operandTypes.push_back(v->type());
  auto types = inferResultTypes(kind, operandTypes, attrs, numResults);
  if (!types)
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(types.takeError()));
  if (auto e = refuseUint8(n, index, operandTypes))
    return e;
  if (auto e = refuseUint8(n, index, *types))
    return e;
  for (const TensorType &t : *types)
    if (auto e = checkShape(t.shape))
      return importError("{0}: result {1}", describeNode(n, index),
                         llvm::toString(std::move(e)));
  std::vector<std::string> names;
  for (int i = 0; i < numResults; ++i) {
    if (!n.output(i).empty() && env_.count(n.output(i)))
      return importError("{0}: output '{1}' is defined twice",
                         describeNode(n, index), n.output(i));
    names.push_back(n.output(i));
  }
  Op *op =
      g_->appendOp(kind, operands, *types, names, std::move(attrs), loc(n));
  for (int i = 0; i < numResults; ++i)
    if (!n.output(i).empty())
      env_[n.output(i)] = Entry{(*types)[i], op->result(i), nullptr, false};
  return llvm::Error::success();
}

llvm::Error ImportContext::define(const onnx::NodeProto &n, int index,
                                  const std::string &name, Value *value) {
  if (env_.count(name))
    return importError("{0}: output '{1}' is defined twice",
                       describeNode(n, index), name);
  env_[name] = Entry{value->type(), value, nullptr, false};
  return llvm::Error::success();
}

void ImportContext::defineConstant(const std::string &name,
                                   std::shared_ptr<TensorData> data) {
  env_[name] = Entry{data->type(), nullptr, data, true};
}

void ImportContext::defineSequence(const std::string &name,
                                   std::vector<Value *> elements) {
  sequences_[name] = std::move(elements);
}

const std::vector<Value *> *
ImportContext::sequence(llvm::StringRef name) const {
  auto it = sequences_.find(name);
  return it == sequences_.end() ? nullptr : &it->second;
}

// An op ONNX defines by a function body (RotaryEmbedding and Attention of
// opset 23, Softplus, ...) and cleave has no IR op for: its body's nodes,
// built for this node's attributes and input types, are imported in its
// place through importNode, so the folder evaluates their shape and mask
// arithmetic, the rest maps to IR ops (with gradients) and a body op that
// is itself a function expands in turn. Every op keeps the node's module
// path.
llvm::Expected<bool> ImportContext::importFunctionBody(const onnx::NodeProto &n,
                                                       int index) {
  std::vector<const TensorType *> types;
  for (int k = 0; k < n.input_size(); ++k) {
    Entry *e = input(n, k);
    types.push_back(e ? &e->type : nullptr);
  }
  auto body = expandFunction(
      n, opset_, types, [&](llvm::StringRef base) { return freshName(base); });
  if (!body)
    return importError("{0}: {1}", describeNode(n, index),
                       llvm::toString(body.takeError()));
  if (!*body)
    return false;
  if (calls_.size() >= size_t(kMaxFunctionDepth))
    return importError("{0}: ONNX function bodies nest more than {1} deep{2}",
                       describeNode(n, index), kMaxFunctionDepth,
                       bodyContext());
  calls_.push_back(Call{&n, opset_});
  opset_ = (*body)->opset;
  llvm::Error failure = llvm::Error::success();
  for (size_t i = 0; i < (*body)->nodes.size() && !failure; ++i)
    failure = importNode((*body)->nodes[i], int(i));
  opset_ = calls_.back().opset;
  calls_.pop_back();
  if (failure)
    return std::move(failure);
  for (const std::string &out : n.output())
    if (!out.empty() && !env_.count(out) && !sequences_.count(out))
      return importError("{0}: the ONNX function body of '{1}' does not "
                         "compute output '{2}'",
                         describeNode(n, index), n.op_type(), out);
  return true;
}

std::string ImportContext::freshName(llvm::StringRef base) {
  std::string name = base.str();
  for (int i = 1; usedNames_.count(name) || env_.count(name); ++i)
    name = (base + "." + llvm::Twine(i)).str();
  usedNames_.insert(name);
  return name;
}

std::string ImportContext::loc(const onnx::NodeProto &n) const {
  return locOf(calls_.empty() ? n : *calls_.front().node);
}

std::string ImportContext::bodyContext() const {
  std::string s;
  for (auto it = calls_.rbegin(); it != calls_.rend(); ++it)
    s += llvm::formatv("{0} the ONNX function body of '{1}' (opset {2}) at "
                       "node '{3}'",
                       s.empty() ? ", in" : ", of", it->node->op_type(),
                       it->opset, it->node->name())
             .str();
  return s;
}

} // namespace cleave::frontend
