#include "frontend/OnnxImporter.h"

#include "frontend/FunctionBody.h"
#include "frontend/OnnxNode.h"
#include "frontend/OnnxTensor.h"
#include "frontend/ShapeFolding.h"
#include "ir/TypeRules.h"
#include "passes/Pass.h"
#include "support/FileIO.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <google/protobuf/io/coded_stream.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <climits>
#include <set>
#include <tuple>

namespace cleave::frontend {

using namespace cleave::ir;
using Data = std::shared_ptr<TensorData>;

template <typename... Ts>
static llvm::Error err(const char *fmt, Ts &&...vals) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv(fmt, std::forward<Ts>(vals)...).str());
}

// ONNX's checker and shape inference spread one message over several lines
// (e.g. "... input 'y' of node: \nname: a OpType: Add\n is not output of
// any previous nodes."); cleave reports it as one line.
static std::string oneLine(llvm::StringRef msg) {
  std::string out;
  for (char c : msg.trim()) {
    bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space)
      out += c;
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  return out;
}

// ONNX ops that are accepted only when they fold to a constant.
static const std::set<std::string> kFoldOnly = {
    "Shape", "Size", "ConstantOfShape", "Range", "Constant"};

// ONNX attributes cleave reads itself (or that carry no meaning for it), per
// op, beyond the ones named in the IR op's declaration.
static bool isConsumedAttr(const std::string &op, const std::string &attr) {
  static const std::set<std::pair<std::string, std::string>> consumed = {
      {"Conv", "auto_pad"},           {"Conv", "kernel_shape"},
      {"MaxPool", "auto_pad"},        {"MaxPool", "storage_order"},
      {"AveragePool", "auto_pad"},    {"Reshape", "allowzero"},
      {"ReduceSum", "noop_with_empty_axes"},
      {"ReduceMean", "noop_with_empty_axes"},
      {"ReduceMax", "noop_with_empty_axes"},
      {"Cast", "to"},                 {"Squeeze", "axes"},
      {"Unsqueeze", "axes"},          {"Split", "split"},
      {"Pad", "pads"},                {"Pad", "value"},
      {"Split", "num_outputs"},       {"AveragePool", "dilations"},
  };
  return consumed.count({op, attr}) != 0;
}

// An op's location: its module path in the legacy exporter's form
// (`/m/transformer/h.0/attn/<node>`), which passes/Layers.h reads. The
// legacy exporter writes it as the node name; the dynamo exporter names
// nodes `node_MatMul_77` and keeps the path in the node's metadata,
// `pkg.torch.onnx.name_scopes`: "['', 'm', 'm.transformer',
// 'm.transformer.h.0', ..., 'matmul']", cumulative module paths and last
// the op's own name. An indexed child of a container (`m.layer1.0`) keeps
// the container's name (`layer1.0`), as in legacy names.
// " in module m.features.2.1.stochastic_depth": the innermost module the
// exporter recorded around the node (pkg.torch.onnx.name_scopes, whose
// last entry is the op itself), for errors about nodes a dynamo export
// names `n1` or `node_MatMul_7`; else nothing.
static std::string modulePathOf(const onnx::NodeProto &n) {
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

namespace {

class Importer {
public:
  Importer(onnx::ModelProto &model, std::string path, const ImportOptions &o)
      : model_(model), path_(std::move(path)), opts_(o) {
    modelDir_ = llvm::sys::path::parent_path(path_).str();
  }
  llvm::Expected<std::unique_ptr<Graph>> run();

private:
  struct Entry {
    TensorType type;
    Value *value = nullptr; // the IR value, once there is one
    Data data;              // initializer or constant bytes
    bool foldable = false;  // a compile-time constant the folder may use
  };

  llvm::Error checkOpset();
  llvm::Error bindInputs();
  llvm::Error addInitializers();
  llvm::Error importNode(const onnx::NodeProto &n, int index);
  llvm::Error importGradient(const onnx::NodeProto &n, int index);
  llvm::Error convert(const onnx::NodeProto &n, int index);
  // Appends the IR op for node `n`; `copyAttrs` also takes the node's ONNX
  // attributes that the IR op declares.
  llvm::Error emit(const onnx::NodeProto &n, int index, OpKind kind,
                   std::vector<Value *> operands, AttrMap attrs,
                   bool copyAttrs = true);
  llvm::Expected<Value *> operand(const onnx::NodeProto &n, int index,
                                  int k);
  llvm::Expected<std::vector<int64_t>> staticInts(const onnx::NodeProto &n,
                                                  int index, int k,
                                                  const char *what);
  // Input k as a scalar known at compile time (a constant or any
  // initializer, float ones included), or null when the input is absent.
  llvm::Expected<const TensorData *> staticScalar(const onnx::NodeProto &n,
                                                  int index, int k,
                                                  const char *what);
  Entry *input(const onnx::NodeProto &n, int k);
  // Expands `n` into its ONNX function body and imports the body's nodes;
  // false when its op has no body at this opset.
  llvm::Expected<bool> importFunctionBody(const onnx::NodeProto &n,
                                          int index);
  // A value name no value of the model has, based on `base`.
  std::string freshName(llvm::StringRef base);
  // The location of an op made for node `n`: its module path, or that of
  // the model's node whose function body `n` belongs to.
  std::string loc(const onnx::NodeProto &n) const;
  // ", in the ONNX function body of 'Attention' at node 'attn'" while a
  // body is being imported (innermost first), "" otherwise.
  std::string bodyContext() const;
  Value *materialize(const std::string &name, Entry &e);
  llvm::Error readSignature();
  void classifyParameters();
  llvm::Error crossCheck();
  const onnx::ModelProto &checkerView();
  llvm::Error importLargeFill(const onnx::NodeProto &n, int index);

  onnx::ModelProto &model_;
  std::string path_, modelDir_;
  const ImportOptions &opts_;
  int64_t opset_ = 0;
  std::unique_ptr<Graph> g_;
  llvm::StringMap<Entry> env_;
  std::unique_ptr<onnx::ModelProto> checkerCopy_;
  // Tensor sequences (SplitToSequence's result), by name: each element's
  // IR value. Only read by SequenceAt at a constant position.
  llvm::StringMap<std::vector<Value *>> sequences_;
  // The nodes whose function bodies are being imported, outermost first,
  // with the opset to return to.
  struct Call {
    const onnx::NodeProto *node;
    int64_t opset;
  };
  std::vector<Call> calls_;
  // Every value name of the model, and the fresh ones given out since.
  std::set<std::string> usedNames_;
  llvm::Error importSequenceOp(const onnx::NodeProto &n, int index);
  llvm::Error importGatherND(const onnx::NodeProto &n, int index);
  // The producer's own list of parameters and buffers (PyTorch's dynamo
  // exporter writes one), when the model has it.
  bool hasSignature_ = false;
  std::set<std::string> signatureParams_, signatureBuffers_;
  // The buffers the module updates when it runs (BUFFER_MUTATION outputs
  // of the signature): a BatchNorm's running statistics appear here only
  // when the module ran in train() mode.
  std::set<std::string> signatureMutated_;
  // PyTorch wrote the model (either exporter): its BatchNorms keep the
  // unbiased batch variance in running_var.
  bool fromPyTorch_ = false;
};

static const char kTrainingDomain[] = "ai.onnx.preview.training";
static const char kGradientOp[] = "Gradient (ai.onnx.preview.training)";

llvm::Error Importer::checkOpset() {
  bool found = false;
  for (const auto &imp : model_.opset_import()) {
    if (imp.domain() != "" && imp.domain() != "ai.onnx")
      continue;
    found = true;
    opset_ = imp.version();
  }
  if (!found)
    return err("'{0}' imports no opset of the default ONNX domain", path_);
  if (opset_ < kMinOpset || opset_ > kMaxOpset)
    return err("'{0}' uses opset {1} of the default ONNX domain; cleave "
               "supports opsets {2} to {3} (re-export with an opset_version "
               "in that range)",
               path_, opset_, kMinOpset, kMaxOpset);
  return llvm::Error::success();
}

// Binds symbolic dims of graph inputs and writes the bound shapes back into
// the model so ONNX shape inference sees static shapes too.
llvm::Error Importer::bindInputs() {
  std::set<std::string> inits;
  for (const auto &t : model_.graph().initializer())
    inits.insert(t.name());
  std::set<std::string> inputNames;
  for (auto &in : *model_.mutable_graph()->mutable_input()) {
    if (inits.count(in.name()))
      continue;
    inputNames.insert(in.name());
    auto fixed = opts_.constantInputs.find(in.name());
    if (fixed != opts_.constantInputs.end()) {
      const Data &d = fixed->second;
      auto declared = dtypeFromOnnx(in.type().tensor_type().elem_type());
      if (!declared || *declared != d->type().dtype)
        return err("constant input '{0}' is {1}, but the model declares "
                   "another element type",
                   in.name(), d->type().str());
      env_[in.name()] = Entry{d->type(), nullptr, d, true};
      // ONNX shape inference sees the constant's shape.
      auto *shape = in.mutable_type()->mutable_tensor_type()->mutable_shape();
      shape->clear_dim();
      for (int64_t dim : d->type().shape)
        shape->add_dim()->set_dim_value(dim);
      continue;
    }
    if (!in.type().has_tensor_type())
      return err("graph input '{0}' is not a tensor", in.name());
    auto *tt = in.mutable_type()->mutable_tensor_type();
    auto dt = dtypeFromOnnx(tt->elem_type());
    if (!dt)
      return err("graph input '{0}': {1}", in.name(),
                 llvm::toString(dt.takeError()));
    if (!tt->has_shape())
      return err("graph input '{0}' has no shape; give one with "
                 "--input-shape {0}=d0,d1,...",
                 in.name());
    auto *shape = tt->mutable_shape();
    auto flag = opts_.inputShapes.find(in.name());
    if (flag != opts_.inputShapes.end()) {
      if (int(flag->second.size()) != shape->dim_size())
        return err("--input-shape gives {0} dims for '{1}', which has rank "
                   "{2}",
                   flag->second.size(), in.name(), shape->dim_size());
      for (int i = 0; i < shape->dim_size(); ++i) {
        auto *d = shape->mutable_dim(i);
        if (d->has_dim_value() && d->dim_value() != flag->second[i])
          return err("--input-shape gives {0} for axis {1} of '{2}', which "
                     "the model fixes at {3}",
                     flag->second[i], i, in.name(), d->dim_value());
        d->set_dim_value(flag->second[i]);
      }
    }
    Shape dims;
    for (int i = 0; i < shape->dim_size(); ++i) {
      auto *d = shape->mutable_dim(i);
      if (!d->has_dim_value() && i == 0 && opts_.microbatchSize)
        d->set_dim_value(*opts_.microbatchSize);
      if (!d->has_dim_value()) {
        std::string sym = d->has_dim_param() ? " '" + d->dim_param() + "'"
                                             : "";
        return err("input '{0}' has a symbolic dimension{1} at axis {2}; "
                   "bind it with {3}--input-shape {0}=d0,d1,...",
                   in.name(), sym, i,
                   i == 0 ? "--microbatch-size N or " : "");
      }
      dims.push_back(d->dim_value());
    }
    if (auto e = checkShape(dims))
      return err("input '{0}': {1}", in.name(),
                 llvm::toString(std::move(e)));
    Value *v = g_->addInput(in.name(), TensorType(*dt, dims));
    env_[in.name()] = Entry{v->type(), v, nullptr, false};
  }
  for (const auto &[name, data] : opts_.constantInputs)
    if (!inputNames.count(name))
      return err("constant input '{0}' is not an input of the model", name);
  for (const auto &[name, dims] : opts_.inputShapes)
    if (!inputNames.count(name))
      return err("--input-shape names '{0}', which is not an input of the "
                 "model",
                 name);
  return llvm::Error::success();
}

llvm::Error Importer::addInitializers() {
  // Runs after ONNX shape inference, so the weights' bytes can be moved out
  // of the model instead of copied. Float tensors in external data stay in
  // their file (a RawFile origin, read when something needs the values:
  // codegen streams or references them); integer ones are shape arithmetic
  // the folder reads, so they are loaded.
  for (auto &t : *model_.mutable_graph()->mutable_initializer()) {
    DataOrigin origin{DataOrigin::Kind::OnnxInitializer, path_, t.name(), 0,
                      0};
    auto dt = dtypeFromOnnx(t.data_type());
    bool keepOnDisk = dt && isFloat(*dt);
    if (!dt)
      llvm::consumeError(dt.takeError()); // tensorFromOnnx says why
    auto data = tensorFromOnnx(t, modelDir_, origin,
                               t.has_raw_data() ? t.mutable_raw_data()
                                                : nullptr,
                               /*loadExternal=*/!keepOnDisk);
    if (!data)
      return data.takeError();
    bool fl = isFloat((*data)->type().dtype);
    env_[t.name()] = Entry{(*data)->type(), nullptr, *data, !fl};
  }
  return llvm::Error::success();
}

Importer::Entry *Importer::input(const onnx::NodeProto &n, int k) {
  if (k >= n.input_size() || n.input(k).empty())
    return nullptr;
  auto it = env_.find(n.input(k));
  return it == env_.end() ? nullptr : &it->second;
}

Value *Importer::materialize(const std::string &name, Entry &e) {
  if (!e.value)
    e.value = g_->addDeclared(e.foldable ? ValueKind::Const : ValueKind::Param,
                              name, e.data);
  return e.value;
}

llvm::Expected<Value *> Importer::operand(const onnx::NodeProto &n, int index,
                                          int k) {
  Entry *e = input(n, k);
  if (!e)
    return err("{0}: input {1} is missing", describeNode(n, index), k);
  return materialize(n.input(k), *e);
}

llvm::Expected<std::vector<int64_t>>
Importer::staticInts(const onnx::NodeProto &n, int index, int k,
                     const char *what) {
  Entry *e = input(n, k);
  if (!e || !e->foldable)
    return err("{0}: input '{1}' ({2}) must be a constant after folding; "
               "cleave needs static shapes",
               describeNode(n, index), k < n.input_size() ? n.input(k) : "",
               what);
  std::vector<int64_t> v(e->type.numElements());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = e->data->getInt(i);
  return v;
}

llvm::Expected<const TensorData *>
Importer::staticScalar(const onnx::NodeProto &n, int index, int k,
                       const char *what) {
  Entry *e = input(n, k);
  if (!e)
    return nullptr;
  if (!e->data || e->type.numElements() != 1)
    return err("{0}: {1} (input '{2}') must be a constant scalar",
               describeNode(n, index), what, n.input(k));
  if (auto le = e->data->load())
    return err("{0}: {1}", describeNode(n, index),
               llvm::toString(std::move(le)));
  return e->data.get();
}

llvm::Error Importer::emit(const onnx::NodeProto &n, int index, OpKind kind,
                           std::vector<Value *> operands, AttrMap attrs,
                           bool copyAttrs) {
  const OpInfo &info = opInfo(kind);
  for (const auto &a : n.attribute()) {
    if (!copyAttrs)
      break;
    if (isConsumedAttr(n.op_type(), a.name()) || attrs.count(a.name()))
      continue;
    const AttrSpec *spec = info.findAttr(a.name());
    if (!spec)
      return err("{0}: attribute '{1}' is not supported by cleave",
                 describeNode(n, index), a.name());
    using AP = onnx::AttributeProto;
    switch (spec->kind) {
    case AttrKind::Int:
      if (a.type() != AP::INT)
        break;
      attrs.emplace(a.name(), Attribute(int64_t(a.i())));
      continue;
    case AttrKind::Float:
      if (a.type() != AP::FLOAT)
        break;
      attrs.emplace(a.name(), Attribute(a.f()));
      continue;
    case AttrKind::String:
      if (a.type() != AP::STRING)
        break;
      attrs.emplace(a.name(), Attribute(a.s()));
      continue;
    case AttrKind::Ints:
      if (a.type() != AP::INTS)
        break;
      attrs.emplace(a.name(), Attribute(std::vector<int64_t>(
                                  a.ints().begin(), a.ints().end())));
      continue;
    case AttrKind::Floats:
      if (a.type() != AP::FLOATS)
        break;
      attrs.emplace(a.name(), Attribute(std::vector<float>(
                                  a.floats().begin(), a.floats().end())));
      continue;
    default:
      break;
    }
    return err("{0}: attribute '{1}' has the wrong kind",
               describeNode(n, index), a.name());
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
    return err("{0}: {1}", describeNode(n, index),
               llvm::toString(types.takeError()));
  for (const TensorType &t : *types)
    if (auto e = checkShape(t.shape))
      return err("{0}: result {1}", describeNode(n, index),
                 llvm::toString(std::move(e)));
  std::vector<std::string> names;
  for (int i = 0; i < numResults; ++i) {
    if (!n.output(i).empty() && env_.count(n.output(i)))
      return err("{0}: output '{1}' is defined twice",
                 describeNode(n, index), n.output(i));
    names.push_back(n.output(i));
  }
  Op *op = g_->appendOp(kind, operands, *types, names, std::move(attrs),
                        loc(n));
  for (int i = 0; i < numResults; ++i)
    if (!n.output(i).empty())
      env_[n.output(i)] = Entry{(*types)[i], op->result(i), nullptr, false};
  return llvm::Error::success();
}

// Pads for auto_pad SAME_UPPER / SAME_LOWER / VALID.
static llvm::Expected<std::vector<int64_t>>
autoPads(const std::string &mode, llvm::ArrayRef<int64_t> in,
         llvm::ArrayRef<int64_t> kernel, llvm::ArrayRef<int64_t> strides,
         llvm::ArrayRef<int64_t> dil) {
  size_t sp = in.size();
  std::vector<int64_t> pads(2 * sp, 0);
  if (mode == "VALID")
    return pads;
  if (mode != "SAME_UPPER" && mode != "SAME_LOWER")
    return err("auto_pad '{0}' is not one of NOTSET, SAME_UPPER, "
               "SAME_LOWER, VALID",
               mode);
  for (size_t i = 0; i < sp; ++i) {
    int64_t out = (in[i] + strides[i] - 1) / strides[i];
    int64_t span = (kernel[i] - 1) * dil[i] + 1;
    int64_t total = std::max<int64_t>(0, (out - 1) * strides[i] + span - in[i]);
    int64_t small = total / 2, big = total - small;
    pads[i] = mode == "SAME_UPPER" ? small : big;
    pads[sp + i] = mode == "SAME_UPPER" ? big : small;
  }
  return pads;
}

// ConstantOfShape whose result is too large to fold: Expand of its
// one-element value to the (constant) shape, an op of the plan.
llvm::Error Importer::importLargeFill(const onnx::NodeProto &n, int index) {
  auto dims = staticInts(n, index, 0, "shape");
  if (!dims)
    return dims.takeError();
  auto value = constantOfShapeValue(n);
  if (!value)
    return err("{0}: {1}", describeNode(n, index),
               llvm::toString(value.takeError()));
  std::string name = n.output(0) + ".value";
  env_[name] = Entry{(*value)->type(), nullptr, *value, true};
  Value *v = materialize(name, env_[name]);
  return emit(n, index, OpKind::Expand, {v}, {{"shape", Attribute(*dims)}},
              false);
}

llvm::Error Importer::convert(const onnx::NodeProto &n, int index) {
  const std::string &op = n.op_type();
  std::string where = describeNode(n, index);
  if (n.domain() != "" && n.domain() != "ai.onnx")
    return err("unsupported op '{0}' (domain '{1}') at node '{2}'{3}{4}; "
               "`cleavec --list-ops` lists the supported ops",
               op, n.domain(), n.name(), modulePathOf(n), bodyContext());
  if (kFoldOnly.count(op)) {
    std::string runtimeInput;
    for (int k = 0; k < n.input_size() && runtimeInput.empty(); ++k)
      if (Entry *e = input(n, k); e && !e->foldable)
        runtimeInput = n.input(k);
    // All inputs constant: folding refused because the result is too big.
    // A constant fill (a causal mask at a long sequence) is then computed
    // when the plan runs instead: the value broadcast to the shape.
    if (runtimeInput.empty() && op == "ConstantOfShape")
      return importLargeFill(n, index);
    if (runtimeInput.empty())
      return err("{0}: its constant result would have more than {1} "
                 "elements, too many to fold (cleave folds shape arithmetic "
                 "only)",
                 where, kMaxFoldElements);
    return err("{0}: its result depends on runtime data (input '{1}'), but "
               "cleave needs it to fold to a constant (static shapes)",
               where, runtimeInput);
  }
  if (op == "SplitToSequence" || op == "SequenceAt")
    return importSequenceOp(n, index);
  if (op == "GatherND")
    return importGatherND(n, index);
  if (op == "CastLike") {
    // Cast to the element type of the second input.
    Entry *like = input(n, 1);
    if (!like)
      return err("{0}: input 1 is missing", where);
    auto x = operand(n, index, 0);
    if (!x)
      return x.takeError();
    return emit(n, index, OpKind::Cast, {*x},
                {{"to", Attribute(std::string(dtypeName(like->type.dtype)))}},
                false);
  }
  auto kind = lookupOp(op);
  if (!kind || isTrainingOp(*kind)) {
    // No IR op of its own: ONNX may define it by a function body.
    auto expanded = importFunctionBody(n, index);
    if (!expanded)
      return expanded.takeError();
    if (*expanded)
      return llvm::Error::success();
    return err("unsupported op '{0}' (domain 'ai.onnx', opset {1}) at node "
               "'{2}'{3}{4}; `cleavec --list-ops` lists the supported ops",
               op, opset_, n.name(), modulePathOf(n), bodyContext());
  }
  const OpInfo &info = opInfo(*kind);

  // Operands that stay tensors; the rest become attributes below.
  int tensorInputs = info.maxOperands < 0 ? n.input_size()
                                          : std::min(n.input_size(),
                                                     info.maxOperands);
  while (tensorInputs > 0 && n.input(tensorInputs - 1).empty())
    --tensorInputs;
  std::vector<Value *> operands;
  for (int k = 0; k < tensorInputs; ++k) {
    if (n.input(k).empty())
      return err("{0}: an omitted optional input before the last one is "
                 "not supported",
                 where);
    auto v = operand(n, index, k);
    if (!v)
      return v.takeError();
    operands.push_back(*v);
  }
  for (int k = tensorInputs; k < n.input_size(); ++k)
    if (!n.input(k).empty() && !input(n, k))
      return err("{0}: input '{1}' is not defined", where, n.input(k));
  auto rankOf = [&](int k) -> int64_t {
    Entry *e = input(n, k);
    return e ? e->type.rank() : 0;
  };
  const Shape *xShape = input(n, 0) ? &input(n, 0)->type.shape : nullptr;
  AttrMap attrs;

  if (op == "Where" && operands.size() == 3 && input(n, 0)->foldable) {
    // A constant condition that picks one side everywhere is that side
    // (Attention's function body zeroes the rows whose bias is all -inf;
    // usually there are none).
    const TensorData &cond = *input(n, 0)->data;
    int64_t count = cond.type().numElements(), set = 0;
    for (int64_t i = 0; i < count; ++i)
      set += cond.getInt(i) != 0;
    int pick = count > 0 && set == count ? 1 : set == 0 ? 2 : 0;
    auto types = inferResultTypes(
        OpKind::Where,
        {operands[0]->type(), operands[1]->type(), operands[2]->type()}, {},
        1);
    if (!types)
      return err("{0}: {1}", where, llvm::toString(types.takeError()));
    if (pick && (*types)[0] == operands[pick]->type())
      return emit(n, index, OpKind::Identity, {operands[pick]}, {}, false);
  }
  if (op == "Reshape") {
    auto dims = staticInts(n, index, 1, "target shape");
    if (!dims)
      return dims.takeError();
    bool allowZero = attrInt(n, "allowzero", 0);
    int64_t known = 1, infer = -1;
    std::vector<int64_t> out;
    for (size_t i = 0; i < dims->size(); ++i) {
      int64_t d = (*dims)[i];
      if (d == 0 && !allowZero) {
        if (i >= xShape->size())
          return err("{0}: target dim {1} is 0 (copy) but the input has "
                     "rank {2}",
                     where, i, xShape->size());
        d = (*xShape)[i];
      }
      if (d == -1) {
        if (infer >= 0)
          return err("{0}: more than one -1 in the target shape", where);
        infer = i;
      } else if (d < 0) {
        return err("{0}: target dim {1} is {2}", where, i, d);
      } else if (d > (int64_t(1) << 48) ||
                 (d && known > (int64_t(1) << 48) / d)) {
        return err("{0}: target shape is too large", where);
      } else {
        known *= d;
      }
      out.push_back(d);
    }
    int64_t total = TensorType(DType::F32, *xShape).numElements();
    if (infer >= 0) {
      if (known == 0 || total % known)
        return err("{0}: cannot reshape {1} to {2}", where, shapeStr(*xShape),
                   shapeStr(*dims));
      out[infer] = total / known;
    }
    attrs.emplace("shape", Attribute(out));
  } else if (op == "Unsqueeze" || op == "Squeeze") {
    std::vector<int64_t> axes;
    if (auto a = attrInts(n, "axes")) {
      axes = *a;
    } else if (input(n, 1)) {
      auto v = staticInts(n, index, 1, "axes");
      if (!v)
        return v.takeError();
      axes = *v;
    }
    if (op == "Squeeze" && axes.empty())
      for (size_t i = 0; i < xShape->size(); ++i)
        if ((*xShape)[i] == 1)
          axes.push_back(i);
    attrs.emplace("axes", Attribute(axes));
  } else if (op == "Slice") {
    // Before opset 10, starts/ends/axes are attributes and steps are 1;
    // since then all four are (constant) inputs.
    std::vector<int64_t> starts, ends, axes, steps;
    if (opset_ < 10) {
      auto s = attrInts(n, "starts"), e = attrInts(n, "ends");
      if (!s || !e)
        return err("{0}: needs 'starts' and 'ends'", where);
      starts = *s;
      ends = *e;
      axes = attrInts(n, "axes").value_or(std::vector<int64_t>{});
    } else {
      for (auto [k, what, out] :
           {std::tuple{1, "starts", &starts}, {2, "ends", &ends},
            {3, "axes", &axes}, {4, "steps", &steps}}) {
        if (k > 2 && !input(n, k))
          continue;
        auto v = staticInts(n, index, k, what);
        if (!v)
          return v.takeError();
        *out = *v;
      }
    }
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i)
        axes.push_back(i);
    if (steps.empty())
      steps.assign(starts.size(), 1);
    for (int64_t &a : axes)
      if (a < 0)
        a += xShape->size();
    attrs.emplace("starts", Attribute(starts));
    attrs.emplace("ends", Attribute(ends));
    attrs.emplace("axes", Attribute(axes));
    attrs.emplace("steps", Attribute(steps));
  } else if (op == "Expand") {
    auto dims = staticInts(n, index, 1, "shape");
    if (!dims)
      return dims.takeError();
    attrs.emplace("shape", Attribute(*dims));
  } else if (op == "Split") {
    auto axis = normalizeAxis(attrInt(n, "axis", 0), xShape->size());
    if (!axis)
      return err("{0}: {1}", where, llvm::toString(axis.takeError()));
    std::vector<int64_t> sizes;
    if (auto a = attrInts(n, "split")) {
      sizes = *a;
    } else if (input(n, 1)) {
      auto v = staticInts(n, index, 1, "split");
      if (!v)
        return v.takeError();
      sizes = *v;
    } else if (findAttr(n, "num_outputs")) {
      // Split-18: num_outputs chunks of ceil(dim / num_outputs), the last
      // one smaller when the axis does not divide evenly.
      int64_t parts = attrInt(n, "num_outputs", 0), dim = (*xShape)[*axis];
      if (parts <= 0 || parts != n.output_size())
        return err("{0}: num_outputs {1} does not match its {2} outputs",
                   where, parts, n.output_size());
      int64_t chunk = (dim + parts - 1) / parts;
      for (int64_t i = 0, left = dim; i < parts; ++i, left -= chunk)
        sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
      if (sizes.back() == 0)
        return err("{0}: an axis of size {1} cannot make {2} chunks", where,
                   dim, parts);
    } else {
      int64_t parts = n.output_size(), dim = (*xShape)[*axis];
      if (parts == 0 || dim % parts)
        return err("{0}: axis of size {1} does not split evenly into {2}",
                   where, dim, parts);
      sizes.assign(parts, dim / parts);
    }
    attrs.emplace("split", Attribute(sizes));
  } else if (op == "Clip") {
    for (int k : {1, 2}) {
      auto bound = staticScalar(n, index, k, k == 1 ? "min" : "max");
      if (!bound)
        return bound.takeError();
      if (*bound)
        attrs.emplace(k == 1 ? "min" : "max",
                      Attribute(float((*bound)->getDouble(0))));
    }
  } else if (op == "ReduceSum" || op == "ReduceMean" || op == "ReduceMax") {
    std::vector<int64_t> axes;
    if (auto a = attrInts(n, "axes"))
      axes = *a;
    else if (input(n, 1)) {
      auto v = staticInts(n, index, 1, "axes");
      if (!v)
        return v.takeError();
      axes = *v;
    }
    if (axes.empty() && attrInt(n, "noop_with_empty_axes", 0))
      return emit(n, index, OpKind::Identity, operands, {}, false);
    if (!axes.empty())
      attrs.emplace("axes", Attribute(axes));
  } else if (op == "BatchNormalization") {
    // PyTorch's dynamo exporter writes a train()-mode BatchNorm in the
    // inference form (one output, no training_mode) and records in its
    // signature that the module updates its running statistics; that update
    // happens only in train() mode, so the op trains on batch statistics.
    bool mutated = signatureMutated_.count(n.input_size() > 3 ? n.input(3)
                                                              : "") ||
                   signatureMutated_.count(n.input_size() > 4 ? n.input(4)
                                                              : "");
    using Mode = ImportOptions::ModuleMode;
    if (opts_.moduleMode != Mode::Auto)
      attrs.emplace("training_mode",
                    Attribute(int64_t(opts_.moduleMode == Mode::Train)));
    else if (mutated)
      attrs.emplace("training_mode", Attribute(int64_t(1)));
    if (fromPyTorch_)
      attrs.emplace("unbiased_running_var", Attribute(int64_t(1)));
  } else if (op == "Dropout") {
    auto ratio = staticScalar(n, index, 1, "ratio");
    if (!ratio)
      return ratio.takeError();
    if (*ratio)
      attrs.emplace("ratio", Attribute(float((*ratio)->getDouble(0))));
    auto mode = staticScalar(n, index, 2, "training_mode");
    if (!mode)
      return mode.takeError();
    using Mode = ImportOptions::ModuleMode;
    if (opts_.moduleMode != Mode::Auto)
      attrs.emplace("training_mode",
                    Attribute(int64_t(opts_.moduleMode == Mode::Train)));
    else if (*mode)
      attrs.emplace("training_mode", Attribute((*mode)->getInt(0)));
  } else if ((op == "Softmax" || op == "LogSoftmax") && opset_ < 13) {
    // Before opset 13, softmax treats the input as 2-D, [prod(dims before
    // axis), prod(dims from axis on)] with axis defaulting to 1, and
    // normalizes over the second dim. When axis is the last dim that is the
    // same as today's op; otherwise it is a reshape, a softmax over the last
    // dim and a reshape back.
    int64_t r = xShape->size();
    int64_t axis = attrInt(n, "axis", 1);
    if (axis < 0)
      axis += r;
    if (axis < 0 || axis > r)
      return err("{0}: axis {1} is out of range", where,
                 attrInt(n, "axis", 1));
    if (axis == r - 1)
      return emit(n, index, *kind, operands, {{"axis", Attribute(int64_t(-1))}},
                  false);
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < r; ++i)
      (i < axis ? outer : inner) *= (*xShape)[i];
    TensorType flat((*operands[0]).type().dtype, Shape{outer, inner});
    Op *in2d = g_->appendOp(OpKind::Reshape, {operands[0]}, {flat}, {},
                            {{"shape", Attribute(std::vector<int64_t>{
                                           outer, inner})}},
                            loc(n));
    Op *sm = g_->appendOp(*kind, {in2d->result()}, {flat}, {},
                          {{"axis", Attribute(int64_t(-1))}}, loc(n));
    return emit(n, index, OpKind::Reshape, {sm->result()},
                {{"shape", Attribute(std::vector<int64_t>(xShape->begin(),
                                                          xShape->end()))}},
                false);
  } else if (op == "Trilu") {
    auto k = staticScalar(n, index, 1, "k");
    if (!k)
      return k.takeError();
    if (*k)
      attrs.emplace("k", Attribute((*k)->getInt(0)));
  } else if (op == "Cast") {
    auto dt = dtypeFromOnnx(attrInt(n, "to", 0));
    if (!dt)
      return err("{0}: {1}", where, llvm::toString(dt.takeError()));
    if (*dt == operands[0]->type().dtype) // as function bodies write them
      return emit(n, index, OpKind::Identity, operands, {}, false);
    attrs.emplace("to", Attribute(std::string(dtypeName(*dt))));
  } else if (op == "Transpose") {
    if (!findAttr(n, "perm")) {
      std::vector<int64_t> perm;
      for (int64_t i = rankOf(0); i-- > 0;)
        perm.push_back(i);
      attrs.emplace("perm", Attribute(perm));
    }
  } else if (op == "Pad" && opset_ < 11) {
    // Before opset 11, pads and value are attributes.
    auto pads = attrInts(n, "pads");
    if (!pads)
      return err("{0}: needs 'pads'", where);
    if (std::all_of(pads->begin(), pads->end(),
                    [](int64_t p) { return p == 0; }))
      return emit(n, index, OpKind::Identity, operands, {}, false);
    attrs.emplace("pads", Attribute(*pads));
    attrs.emplace("value", Attribute(attrFloat(n, "value", 0.0f)));
  } else if (op == "Pad") {
    auto pads = staticInts(n, index, 1, "pads");
    if (!pads)
      return pads.takeError();
    if (input(n, 3)) {
      // Pad-18: pads name only the listed axes; spread them over all.
      auto axes = staticInts(n, index, 3, "axes");
      if (!axes)
        return axes.takeError();
      int64_t r = xShape->size(), k = axes->size();
      if (int64_t(pads->size()) != 2 * k)
        return err("{0}: {1} pads for {2} axes", where, pads->size(), k);
      std::vector<int64_t> full(2 * r, 0);
      for (int64_t i = 0; i < k; ++i) {
        auto a = normalizeAxis((*axes)[i], r);
        if (!a)
          return err("{0}: {1}", where, llvm::toString(a.takeError()));
        full[*a] = (*pads)[i];
        full[r + *a] = (*pads)[k + i];
      }
      *pads = full;
    }
    auto value = staticScalar(n, index, 2, "constant_value");
    if (!value)
      return value.takeError();
    if (*value)
      attrs.emplace("value", Attribute(float((*value)->getDouble(0))));
    bool zero = std::all_of(pads->begin(), pads->end(),
                            [](int64_t p) { return p == 0; });
    if (zero)
      return emit(n, index, OpKind::Identity, operands, {}, false);
    attrs.emplace("pads", Attribute(*pads));
  } else if (op == "Conv" || op == "MaxPool" || op == "AveragePool") {
    size_t sp = xShape->size() >= 2 ? xShape->size() - 2 : 0;
    std::vector<int64_t> kernel;
    if (op == "Conv") {
      Entry *w = input(n, 1);
      if (w && w->type.rank() >= 2)
        kernel.assign(w->type.shape.begin() + 2, w->type.shape.end());
      if (auto ks = attrInts(n, "kernel_shape"); ks && *ks != kernel)
        return err("{0}: kernel_shape {1} disagrees with the weight's shape",
                   where, shapeStr(*ks));
    } else {
      kernel = attrInts(n, "kernel_shape").value_or(std::vector<int64_t>{});
      attrs.emplace("kernel_shape", Attribute(kernel));
    }
    if (kernel.size() != sp)
      return err("{0}: kernel has {1} dims for {2} spatial dims", where,
                 kernel.size(), sp);
    std::vector<int64_t> ones(sp, 1), zeros(2 * sp, 0);
    auto strides = attrInts(n, "strides").value_or(ones);
    auto dil = attrInts(n, "dilations").value_or(ones);
    auto pads = attrInts(n, "pads").value_or(zeros);
    std::string autoPad = attrString(n, "auto_pad", "NOTSET");
    if (autoPad != "NOTSET") {
      if (strides.size() != sp || dil.size() != sp)
        return err("{0}: strides and dilations need {1} entries", where, sp);
      auto p = autoPads(autoPad, llvm::ArrayRef<int64_t>(*xShape).drop_front(2),
                        kernel, strides, dil);
      if (!p)
        return err("{0}: {1}", where, llvm::toString(p.takeError()));
      pads = *p;
    }
    if (op == "AveragePool" &&
        std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; }))
      return err("{0}: dilated average pooling (AveragePool-19 dilations) "
                 "is not supported",
                 where);
    if (op == "MaxPool" && attrInt(n, "storage_order", 0) != 0)
      return err("{0}: storage_order=1 (column-major indices) is not "
                 "supported",
                 where);
    attrs.emplace("strides", Attribute(strides));
    attrs.emplace("pads", Attribute(pads));
    if (op != "AveragePool")
      attrs.emplace("dilations", Attribute(dil));
  }
  return emit(n, index, *kind, operands, std::move(attrs));
}

// PyTorch's dynamo exporter writes torch.split as SplitToSequence and each
// use of a part as SequenceAt at a constant position. cleave has no
// sequence values: the split becomes one Split op (its parts named
// "<sequence>.<i>") and SequenceAt picks a part.
llvm::Error Importer::importSequenceOp(const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  if (n.op_type() == "SequenceAt") {
    auto seq = sequences_.find(n.input_size() ? n.input(0) : "");
    if (seq == sequences_.end())
      return err("{0}: input '{1}' is not a sequence made by SplitToSequence",
                 where, n.input_size() ? n.input(0) : "");
    auto pos = staticInts(n, index, 1, "position");
    if (!pos)
      return pos.takeError();
    int64_t size = seq->second.size();
    int64_t p = pos->size() == 1 ? (*pos)[0] : size;
    if (p < 0)
      p += size;
    if (p < 0 || p >= size || n.output_size() != 1)
      return err("{0}: position is outside the sequence of {1} tensors",
                 where, size);
    if (env_.count(n.output(0)))
      return err("{0}: output '{1}' is defined twice", where, n.output(0));
    Value *v = seq->second[p];
    env_[n.output(0)] = Entry{v->type(), v, nullptr, false};
    return llvm::Error::success();
  }
  auto x = operand(n, index, 0);
  if (!x)
    return x.takeError();
  const Shape &shape = (*x)->type().shape;
  auto axis = normalizeAxis(attrInt(n, "axis", 0), shape.size());
  if (!axis)
    return err("{0}: {1}", where, llvm::toString(axis.takeError()));
  int64_t dim = shape[*axis];
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (input(n, 1)) {
    auto split = staticInts(n, index, 1, "split");
    if (!split)
      return split.takeError();
    if (input(n, 1)->type.rank() == 0 && split->size() == 1) {
      int64_t chunk = (*split)[0];
      if (chunk <= 0)
        return err("{0}: split size {1} is not positive", where, chunk);
      for (int64_t left = dim; left > 0; left -= chunk)
        sizes.push_back(std::min(chunk, left));
    } else {
      sizes = *split;
    }
  } else {
    sizes.assign(dim, 1);
    squeeze = attrInt(n, "keepdims", 1) == 0;
  }
  if (sizes.empty() || n.output_size() != 1)
    return err("{0}: an empty split", where);
  AttrMap attrs{{"axis", Attribute(int64_t(*axis))},
                {"split", Attribute(sizes)}};
  auto types = inferResultTypes(OpKind::Split, {(*x)->type()}, attrs,
                                sizes.size());
  if (!types)
    return err("{0}: {1}", where, llvm::toString(types.takeError()));
  std::vector<std::string> names;
  for (size_t i = 0; i < sizes.size(); ++i)
    names.push_back(n.output(0) + "." + std::to_string(i));
  Op *split = g_->appendOp(OpKind::Split, {*x}, *types, names,
                           std::move(attrs), loc(n));
  std::vector<Value *> parts(split->results().begin(),
                             split->results().end());
  if (squeeze)
    for (Value *&part : parts) {
      Shape s = part->type().shape;
      s.erase(s.begin() + *axis);
      part = g_->appendOp(OpKind::Squeeze, {part},
                          {TensorType(part->type().dtype, s)}, {},
                          {{"axes", Attribute(std::vector<int64_t>{*axis})}},
                          loc(n))
                 ->result();
    }
  sequences_[n.output(0)] = std::move(parts);
  return llvm::Error::success();
}

// GatherND with constant indices (what PyTorch exports for advanced
// indexing by aranges, as in attention-mask building) is a Gather over the
// flattened leading dims: data [d0..d(q-1), rest...] is reshaped to
// [d0*...*d(q-1), rest...] and gathered at the linear index of each index
// tuple. Both ops have gradients, so the path stays differentiable.
llvm::Error Importer::importGatherND(const onnx::NodeProto &n, int index) {
  std::string where = describeNode(n, index);
  if (attrInt(n, "batch_dims", 0) != 0)
    return err("{0}: GatherND with batch_dims is not supported", where);
  auto x = operand(n, index, 0);
  if (!x)
    return x.takeError();
  Entry *ind = input(n, 1);
  if (!ind || !ind->foldable)
    return err("{0}: input '{1}' (indices) must be a constant after "
               "folding; cleave gathers runtime data at constant indices only",
               where,
               n.input_size() > 1 ? n.input(1) : "");
  const Shape &data = (*x)->type().shape;
  const Shape &ishape = ind->type.shape;
  if (ishape.empty() || ishape.back() < 1 ||
      ishape.back() > int64_t(data.size()))
    return err("{0}: indices of shape {1} do not fit data of rank {2}", where,
               shapeStr(ishape), data.size());
  int64_t q = ishape.back(), lead = 1;
  for (int64_t j = 0; j < q; ++j)
    lead *= data[j];
  Shape flat{lead};
  flat.insert(flat.end(), data.begin() + q, data.end());
  Shape outIdx(ishape.begin(), ishape.end() - 1);
  int64_t tuples = TensorType(DType::I64, outIdx).numElements();
  std::vector<int64_t> linear(tuples);
  for (int64_t t = 0; t < tuples; ++t) {
    int64_t l = 0;
    for (int64_t j = 0; j < q; ++j) {
      int64_t v = ind->data->getInt(t * q + j);
      if (v < -data[j] || v >= data[j])
        return err("{0}: index {1} is out of range for axis {2} of size {3}",
                   where, v, j, data[j]);
      l = l * data[j] + (v < 0 ? v + data[j] : v);
    }
    linear[t] = l;
  }
  Op *reshape = g_->appendOp(
      OpKind::Reshape, {*x}, {TensorType((*x)->type().dtype, flat)}, {},
      {{"shape", Attribute(std::vector<int64_t>(flat.begin(), flat.end()))}},
      loc(n));
  Value *indices = g_->addDeclared(
      ValueKind::Const, n.output(0) + ".linear_indices",
      TensorData::fromInts(DType::I64, outIdx, linear));
  return emit(n, index, OpKind::Gather, {reshape->result(), indices},
              {{"axis", Attribute(int64_t(0))}}, false);
}

// An op ONNX defines by a function body (RotaryEmbedding and Attention of
// opset 23, Softplus, ...) and cleave has no IR op for: its body's nodes,
// built for this node's attributes and input types, are imported in its
// place through importNode, so the folder evaluates their shape and mask
// arithmetic, the rest maps to IR ops (with gradients) and a body op that
// is itself a function expands in turn. Every op keeps the node's module
// path.
llvm::Expected<bool> Importer::importFunctionBody(const onnx::NodeProto &n,
                                                  int index) {
  std::vector<const TensorType *> types;
  for (int k = 0; k < n.input_size(); ++k) {
    Entry *e = input(n, k);
    types.push_back(e ? &e->type : nullptr);
  }
  auto body = expandFunction(n, opset_, types, [&](llvm::StringRef base) {
    return freshName(base);
  });
  if (!body)
    return err("{0}: {1}", describeNode(n, index),
               llvm::toString(body.takeError()));
  if (!*body)
    return false;
  if (calls_.size() >= size_t(kMaxFunctionDepth))
    return err("{0}: ONNX function bodies nest more than {1} deep{2}",
               describeNode(n, index), kMaxFunctionDepth, bodyContext());
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
      return err("{0}: the ONNX function body of '{1}' does not compute "
                 "output '{2}'",
                 describeNode(n, index), n.op_type(), out);
  return true;
}

std::string Importer::freshName(llvm::StringRef base) {
  std::string name = base.str();
  for (int i = 1; usedNames_.count(name) || env_.count(name); ++i)
    name = (base + "." + llvm::Twine(i)).str();
  usedNames_.insert(name);
  return name;
}

std::string Importer::loc(const onnx::NodeProto &n) const {
  return locOf(calls_.empty() ? n : *calls_.front().node);
}

std::string Importer::bodyContext() const {
  std::string s;
  for (auto it = calls_.rbegin(); it != calls_.rend(); ++it)
    s += llvm::formatv("{0} the ONNX function body of '{1}' (opset {2}) at "
                       "node '{3}'",
                       s.empty() ? ", in" : ", of", it->node->op_type(),
                       it->opset, it->node->name())
             .str();
  return s;
}

// ONNX's own training form: Gradient(xs, y) in the ai.onnx.preview.training
// domain gives dy/dx for each x. The same autodiff the training pipeline
// uses appends the backward ops (tagged B); the node's outputs name them.
llvm::Error Importer::importGradient(const onnx::NodeProto &n, int index) {
  std::vector<std::string> xs;
  std::string y;
  for (const auto &a : n.attribute()) {
    if (a.name() == "xs")
      xs.assign(a.strings().begin(), a.strings().end());
    else if (a.name() == "y")
      y = a.s();
    else
      return err("{0}: attribute '{1}' of Gradient is not supported",
                 describeNode(n, index), a.name());
  }
  if (xs.empty() || y.empty() || int(xs.size()) != n.output_size())
    return err("{0}: Gradient needs attributes 'xs' and 'y' and one output "
               "per x",
               describeNode(n, index));
  auto valueOf = [&](const std::string &name) -> Value * {
    auto it = env_.find(name);
    return it == env_.end() ? nullptr : materialize(name, it->second);
  };
  Value *yv = valueOf(y);
  if (!yv)
    return err("{0}: y '{1}' is not defined before the Gradient node",
               describeNode(n, index), y);
  std::vector<Value *> xv;
  for (const std::string &x : xs) {
    Value *v = valueOf(x);
    if (!v || !isFloat(v->type().dtype))
      return err("{0}: x '{1}' is not a float value defined before the "
                 "Gradient node",
                 describeNode(n, index), x);
    xv.push_back(v);
  }
  size_t first = g_->ops().size();
  auto grads = passes::differentiate(*g_, yv, xv);
  if (!grads)
    return err("{0}: {1}", describeNode(n, index),
               llvm::toString(grads.takeError()));
  for (size_t i = first; i < g_->ops().size(); ++i)
    g_->ops()[i]->setPhase(Phase::B);
  for (int i = 0; i < n.output_size(); ++i) {
    if (env_.count(n.output(i)))
      return err("{0}: output '{1}' is defined twice", describeNode(n, index),
                 n.output(i));
    Value *d = (*grads)[i];
    env_[n.output(i)] = Entry{d->type(), d, nullptr, false};
  }
  return llvm::Error::success();
}

llvm::Error Importer::importNode(const onnx::NodeProto &n, int index) {
  for (const auto &a : n.attribute())
    if (a.type() == onnx::AttributeProto::GRAPH ||
        a.type() == onnx::AttributeProto::GRAPHS)
      return err("unsupported op '{0}' with a subgraph at node '{1}'{2} "
                 "(control flow is not supported); `cleavec --list-ops` "
                 "lists the supported ops",
                 n.op_type(), n.name(), bodyContext());
  if (n.op_type() == "Constant" && (n.domain().empty() ||
                                    n.domain() == "ai.onnx")) {
    const onnx::AttributeProto *a = n.attribute_size() == 1 ? &n.attribute(0)
                                                            : nullptr;
    Data d;
    if (a && a->name() == "value") {
      auto t = tensorFromOnnx(a->t(), modelDir_, {});
      if (!t)
        return err("{0}: {1}", describeNode(n, index),
                   llvm::toString(t.takeError()));
      d = *t;
    } else if (a && a->name() == "value_float") {
      d = TensorData::fromDoubles(DType::F32, {}, {a->f()});
    } else if (a && a->name() == "value_int") {
      d = TensorData::fromInts(DType::I64, {}, {a->i()});
    } else if (a && a->name() == "value_floats") {
      std::vector<double> v(a->floats().begin(), a->floats().end());
      d = TensorData::fromDoubles(DType::F32, {int64_t(v.size())}, v);
    } else if (a && a->name() == "value_ints") {
      std::vector<int64_t> v(a->ints().begin(), a->ints().end());
      d = TensorData::fromInts(DType::I64, {int64_t(v.size())}, v);
    } else {
      return err("{0}: only tensor, float and int constants are supported",
                 describeNode(n, index));
    }
    if (n.output_size() != 1 || env_.count(n.output(0)))
      return err("{0}: bad outputs", describeNode(n, index));
    env_[n.output(0)] = Entry{d->type(), nullptr, d, true};
    return llvm::Error::success();
  }
  if (n.domain() == kTrainingDomain && n.op_type() == "Gradient")
    return importGradient(n, index);
  if (n.domain().empty() || n.domain() == "ai.onnx") {
    std::vector<FoldInput> ins;
    for (int k = 0; k < n.input_size(); ++k) {
      Entry *e = input(n, k);
      if (!n.input(k).empty() && !e && !sequences_.count(n.input(k)))
        return err("{0}: input '{1}' is not defined by any earlier node, "
                   "input or initializer",
                   describeNode(n, index), n.input(k));
      ins.push_back(FoldInput{e ? &e->type : nullptr,
                              e && e->foldable ? e->data : nullptr});
    }
    auto folded = foldNode(n, ins);
    if (!folded)
      return err("{0}: {1}", describeNode(n, index),
                 llvm::toString(folded.takeError()));
    if (*folded) {
      for (size_t i = 0; i < (*folded)->size() && int(i) < n.output_size();
           ++i) {
        if (env_.count(n.output(i)))
          return err("{0}: output '{1}' is defined twice",
                     describeNode(n, index), n.output(i));
        const Data &d = (**folded)[i];
        env_[n.output(i)] = Entry{d->type(), nullptr, d, true};
      }
      return llvm::Error::success();
    }
  }
  return convert(n, index);
}

// PyTorch's dynamo exporter records the exported program's signature in
// the graph's metadata, one lifted input a line:
//   p_m_l_weight: PARAMETER target='m.l.weight'
//   b_m_inv_freq: BUFFER target='m.inv_freq' persistent=False
// With optimize=False each target is an initializer of that name. The
// default optimize=True folds most parameters into anonymous constants;
// training such a file would train constants and lose the names, so it is
// refused.
static const char kSignatureKey[] =
    "pkg.torch.export.ExportedProgram.graph_signature";

llvm::Error Importer::readSignature() {
  const std::string *text = nullptr;
  for (const auto &p : model_.graph().metadata_props())
    if (p.key() == kSignatureKey)
      text = &p.value();
  if (!text)
    return llvm::Error::success();
  hasSignature_ = true;
  llvm::SmallVector<llvm::StringRef> lines;
  llvm::StringRef(*text).split(lines, '\n');
  for (llvm::StringRef line : lines) {
    for (auto [kind, set] :
         {std::pair{"PARAMETER", &signatureParams_},
          std::pair{"BUFFER", &signatureBuffers_},
          std::pair{"CONSTANT_TENSOR", &signatureBuffers_},
          std::pair{"BUFFER_MUTATION", &signatureMutated_}}) {
      std::string marker = std::string(": ") + kind + " target='";
      size_t at = line.find(marker);
      if (at == llvm::StringRef::npos)
        continue;
      llvm::StringRef rest = line.substr(at + marker.size());
      set->insert(rest.take_until([](char c) { return c == '\''; }).str());
    }
  }
  // A parameter the signature names may be missing because the exporter
  // kept one initializer for tied parameters (GPT-2's lm_head.weight and
  // wte.weight). It is missing because it was folded when float
  // initializers the signature does not name hold its values instead.
  std::set<std::string> names, named(signatureParams_);
  named.insert(signatureBuffers_.begin(), signatureBuffers_.end());
  for (const auto &in : model_.graph().input())
    names.insert(in.name());
  std::string anonymous;
  for (const auto &t : model_.graph().initializer()) {
    names.insert(t.name());
    auto dt = dtypeFromOnnx(t.data_type());
    if (!dt)
      llvm::consumeError(dt.takeError());
    else if (isFloat(*dt) && !named.count(t.name()) && anonymous.empty())
      anonymous = t.name();
  }
  int missing = 0;
  std::string first;
  for (const std::string &p : signatureParams_)
    if (!names.count(p) && missing++ == 0)
      first = p;
  if (missing && !anonymous.empty())
    return err("'{0}': {1} of its {2} parameters (such as '{3}') are not "
               "among its initializers, which hold unnamed constants such as "
               "'{4}': the exporter folded them; export for training with "
               "torch.onnx.export(..., dynamo=True, optimize=False)",
               path_, missing, signatureParams_.size(), first, anonymous);
  // A module whose parameters are all gone and whose updated statistics are
  // gone too was folded away, not tied: the default optimize=True drops a
  // train()-mode BatchNorm with its weight, bias and running statistics
  // and leaves the convolution's names as they were.
  auto moduleOf = [](llvm::StringRef target) {
    return target.rsplit('.').first.str();
  };
  std::map<std::string, std::vector<std::string>> lostParams;
  for (const std::string &p : signatureParams_)
    if (!names.count(p))
      lostParams[moduleOf(p)].push_back(p);
  std::set<std::string> keptParamModules;
  for (const std::string &p : signatureParams_)
    if (names.count(p))
      keptParamModules.insert(moduleOf(p));
  std::vector<std::string> folded;
  std::string example;
  for (const std::string &b : signatureMutated_) {
    std::string module = moduleOf(b);
    if (names.count(b) || !lostParams.count(module) ||
        keptParamModules.count(module) ||
        (!folded.empty() && folded.back() == module))
      continue;
    if (folded.empty())
      example = llvm::formatv("'{0}' ({1} and the statistic '{2}')", module,
                              lostParams[module].front(), b)
                    .str();
    folded.push_back(module);
  }
  if (!folded.empty())
    return err("'{0}': {1} module(s) such as {2} are missing from the graph "
               "although the exporter recorded them: the exporter folded "
               "them away (the default optimize=True drops train()-mode "
               "BatchNorms); export for training with "
               "torch.onnx.export(..., dynamo=True, optimize=False)",
               path_, folded.size(), example);
  return llvm::Error::success();
}

// Leaf names of module buffers that models hold as float tensors and never
// train (used when the producer gives no signature).
static bool isBufferName(llvm::StringRef name) {
  llvm::StringRef leaf = name.rsplit('.').second.empty()
                             ? name
                             : name.rsplit('.').second;
  static const std::set<std::string> kLeaves = {
      "running_mean", "running_var", "num_batches_tracked", "inv_freq",
      "position_ids", "token_type_ids", "masked_bias", "original_inv_freq",
      "cos_cached", "sin_cached", "cos_cache", "sin_cache"};
  return kLeaves.count(leaf.str()) != 0;
}

// Names exporters give the constants they lift into initializers, as
// opposed to module parameters: onnx::Mul_12, val_26, /m/Constant_output_0.
static bool isExporterConstantName(llvm::StringRef name) {
  if (name.startswith("onnx::") || name.startswith("/") ||
      name.startswith("_v_"))
    return true;
  if (name.consume_front("val_") || name.consume_front("const_"))
    return !name.empty() && name.find_first_not_of("0123456789_") ==
                                llvm::StringRef::npos;
  return !name.empty() &&
         name.find_first_not_of("0123456789") == llvm::StringRef::npos;
}

// Which float initializers are trained. With the producer's signature, its
// PARAMETERs (buffers and lifted constants are held constant). Without
// one, an initializer is trained when it is named like a module parameter
// (not an exporter's constant, not a known buffer such as running_mean or
// inv_freq), holds more than one element (a scalar initializer is an
// epsilon or a scale, not a weight) and a differentiable path leads from it
// to a float graph output. Everything else is a buffer: kept, never
// trained. --trainable and --freeze refine the choice later.
void Importer::classifyParameters() {
  llvm::DenseSet<const Value *> relevant;
  for (const Value *v : g_->outputs())
    if (isFloat(v->type().dtype))
      relevant.insert(v);
  const auto &ops = g_->ops();
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    const Op &op = **it;
    bool live = false;
    for (const Value *r : op.results())
      live |= relevant.count(r) != 0;
    if (!live)
      continue;
    for (unsigned i = 0; i < op.numOperands(); ++i)
      if (op.info().isDifferentiableOperand(i) &&
          isFloat(op.operand(i)->type().dtype))
        relevant.insert(op.operand(i));
  }
  for (Value *v : g_->declared()) {
    if (v->kind() != ValueKind::Param)
      continue;
    bool trained = relevant.count(v) != 0;
    if (hasSignature_)
      trained &= signatureParams_.count(v->name()) != 0;
    else
      trained &= !isBufferName(v->name()) &&
                 !isExporterConstantName(v->name()) &&
                 v->type().numElements() > 1;
    if (!trained)
      g_->setKind(v, ValueKind::Buffer);
  }
}

// Compares cleave's result types with ONNX shape inference wherever ONNX
// found a fully static shape; a difference is a bug in one of the two.
llvm::Error Importer::crossCheck() {
  auto check = [&](const onnx::ValueInfoProto &vi) -> llvm::Error {
    auto it = env_.find(vi.name());
    if (it == env_.end() || !it->second.value ||
        !vi.type().has_tensor_type() ||
        !vi.type().tensor_type().has_shape())
      return llvm::Error::success();
    const auto &shape = vi.type().tensor_type().shape();
    Shape onnxShape;
    for (const auto &d : shape.dim()) {
      if (!d.has_dim_value())
        return llvm::Error::success();
      onnxShape.push_back(d.dim_value());
    }
    const TensorType &mine = it->second.value->type();
    if (mine.shape != onnxShape)
      return err("value '{0}': cleave infers shape {1} but ONNX shape "
                 "inference gives {2}",
                 vi.name(), shapeStr(mine.shape), shapeStr(onnxShape));
    return llvm::Error::success();
  };
  for (const auto &vi : model_.graph().value_info())
    if (auto e = check(vi))
      return e;
  for (const auto &vi : model_.graph().output())
    if (auto e = check(vi))
      return e;
  return llvm::Error::success();
}

// ONNX's checker looks for external data files relative to the working
// directory. cleave reads and confines those files itself (OnnxTensor.cpp),
// so the checker gets a copy in which each external initializer is a graph
// input of the same type instead (ONNX >= 1.16 checks an inline tensor's
// byte count, so a placeholder will not do); the copy is cheap because such
// models keep their weights outside.
const onnx::ModelProto &Importer::checkerView() {
  bool external = false;
  for (const auto &t : model_.graph().initializer())
    external |= t.data_location() == onnx::TensorProto::EXTERNAL;
  if (!external)
    return model_;
  checkerCopy_ = std::make_unique<onnx::ModelProto>(model_);
  onnx::GraphProto *graph = checkerCopy_->mutable_graph();
  std::set<std::string> inputs;
  for (const auto &vi : graph->input())
    inputs.insert(vi.name());
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto &t : *graph->mutable_initializer()) {
    if (t.data_location() != onnx::TensorProto::EXTERNAL) {
      *kept.Add() = std::move(t);
      continue;
    }
    if (inputs.insert(t.name()).second) {
      onnx::ValueInfoProto *vi = graph->add_input();
      vi->set_name(t.name());
      auto *tensor = vi->mutable_type()->mutable_tensor_type();
      tensor->set_elem_type(t.data_type());
      auto *shape = tensor->mutable_shape();
      for (int64_t d : t.dims())
        shape->add_dim()->set_dim_value(d);
    }
  }
  graph->mutable_initializer()->Swap(&kept);
  return *checkerCopy_;
}

llvm::Expected<std::unique_ptr<Graph>> Importer::run() {
  if (auto e = checkOpset())
    return std::move(e);
  // For these experimental ops (its own fixed list) ONNX's checker prints a
  // warning on stderr and skips the model; report them here, as the one
  // error line.
  static const std::set<std::string> kExperimental = {
      "ATen", "Affine", "ConstantFill", "Crop", "DynamicSlice", "GRUUnit",
      "GivenTensorFill", "ImageScaler", "ParametricSoftplus", "Scale",
      "ScaledTanh"};
  for (const auto &n : model_.graph().node())
    if ((n.domain().empty() || n.domain() == "ai.onnx") &&
        kExperimental.count(n.op_type()))
      return err("'{0}': node '{1}' uses the experimental ONNX op '{2}', "
                 "which cleave does not support",
                 path_, n.name(), n.op_type());
  // cleave imports no op of another domain and no model-local function,
  // but ONNX shape inference expands every call of such a function (one
  // that calls another twice, 40 levels deep, is 2^40 calls): refuse
  // those nodes before it runs.
  std::set<std::pair<std::string, std::string>> localFunctions;
  for (const auto &f : model_.functions())
    localFunctions.insert({f.domain(), f.name()});
  for (const auto &n : model_.graph().node())
    if ((!n.domain().empty() && n.domain() != "ai.onnx" &&
         n.domain() != kTrainingDomain) ||
        localFunctions.count({n.domain(), n.op_type()}))
      return err("unsupported op '{0}' (domain '{1}'{2}) at node '{3}'; "
                 "`cleavec --list-ops` lists the supported ops",
                 n.op_type(), n.domain(),
                 localFunctions.count({n.domain(), n.op_type()})
                     ? ", a function of the model"
                     : "",
                 n.name());
  // ONNX's shape inference divides by strides, dilations and groups
  // without checking them (a stride of 0 stops the process with SIGFPE):
  // refuse non-positive ones first.
  for (const auto &n : model_.graph().node())
    for (const auto &a : n.attribute()) {
      const std::string &name = a.name();
      if (name != "strides" && name != "dilations" && name != "group" &&
          name != "kernel_shape")
        continue;
      bool bad = a.type() == onnx::AttributeProto::INT && a.i() <= 0;
      for (int64_t v : a.ints())
        bad |= v <= 0;
      if (bad)
        return err("'{0}': node '{1}' ({2}): attribute {3} must be positive",
                   path_, n.name(), n.op_type(), name);
    }
  try {
    onnx::checker::check_model(checkerView());
  } catch (const std::exception &ex) {
    std::string msg = oneLine(ex.what());
    return err("'{0}' fails the ONNX checker: {1}", path_, msg);
  }
  fromPyTorch_ = model_.producer_name() == "pytorch";
  if (auto e = readSignature())
    return std::move(e);
  g_ = std::make_unique<Graph>();
  g_->setName(model_.graph().name().empty() ? "main" : model_.graph().name());
  if (auto e = bindInputs())
    return std::move(e);
  try {
    // No data propagation: cleave folds shape arithmetic itself, under its
    // own size limits (ShapeFolding.h); ONNX 1.23's propagation expands a
    // Range of 2^40 elements into a TensorShapeProto without a bound.
    onnx::ShapeInferenceOptions options(false, 0, false);
    onnx::shape_inference::InferShapes(model_, onnx::OpSchemaRegistry::Instance(),
                                       options);
  } catch (const std::exception &ex) {
    std::string msg = oneLine(ex.what());
    return err("'{0}': ONNX shape inference failed: {1}", path_, msg);
  }
  if (auto e = addInitializers())
    return std::move(e);
  for (const auto &vi : model_.graph().input())
    usedNames_.insert(vi.name());
  for (const auto &t : model_.graph().initializer())
    usedNames_.insert(t.name());
  for (const auto &n : model_.graph().node())
    usedNames_.insert(n.output().begin(), n.output().end());
  const auto &nodes = model_.graph().node();
  for (int i = 0; i < nodes.size(); ++i)
    if (auto e = importNode(nodes[i], i))
      return std::move(e);
  for (const auto &out : model_.graph().output()) {
    auto it = env_.find(out.name());
    if (it == env_.end())
      return err("graph output '{0}' is not produced by any node", out.name());
    g_->addOutput(materialize(out.name(), it->second));
  }
  classifyParameters();
  if (auto e = crossCheck())
    return std::move(e);
  return std::move(g_);
}

} // namespace

static llvm::Expected<std::unique_ptr<onnx::ModelProto>>
readModel(const std::string &path) {
  auto buf = support::readFile(path, "ONNX file");
  if (!buf)
    return buf.takeError();
  size_t size = (*buf)->getBufferSize();
  if (size == 0)
    return err("'{0}' is empty, not an ONNX model", path);
  if (size > size_t(INT_MAX))
    return err("'{0}' is larger than 2 GiB; save the model with its weights "
               "as external data",
               path);
  auto model = std::make_unique<onnx::ModelProto>();
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t *>((*buf)->getBufferStart()), int(size));
  in.SetTotalBytesLimit(INT_MAX);
  if (!model->ParseFromCodedStream(&in) || !in.ConsumedEntireMessage())
    return err("'{0}' is not a valid ONNX model (truncated or not an ONNX "
               "protobuf file)",
               path);
  if (!model->has_graph() || model->ir_version() <= 0)
    return err("'{0}' is not an ONNX model (no graph or IR version)", path);
  return model;
}

llvm::Expected<std::unique_ptr<Graph>>
importOnnxFile(const std::string &path, const ImportOptions &opts) {
  auto model = readModel(path);
  if (!model)
    return model.takeError();
  llvm::SmallString<256> abs(path);
  llvm::sys::fs::make_absolute(abs);
  llvm::sys::path::remove_dots(abs, true);
  return Importer(**model, std::string(abs), opts).run();
}

llvm::Expected<std::vector<std::string>>
onnxInputNames(const std::string &path) {
  auto model = readModel(path);
  if (!model)
    return model.takeError();
  std::set<std::string> inits;
  for (const auto &t : (*model)->graph().initializer())
    inits.insert(t.name());
  std::vector<std::string> names;
  for (const auto &in : (*model)->graph().input())
    if (!inits.count(in.name()))
      names.push_back(in.name());
  return names;
}

// Ops without an IR op of their own that import through their ONNX
// function bodies, each checked against onnxruntime (tests/models/opset23,
// tests/lit/cleavec/function-ops.test).
static const std::set<std::string> kFunctionBodyOps = {
    "Attention",    "Celu",          "Elu",          "HardSigmoid",
    "HardSwish",    "Mish",          "PRelu",        "ReduceL1",
    "ReduceL2",     "ReduceLogSumExp", "ReduceSumSquare", "RotaryEmbedding",
    "Selu",         "Shrink",        "Softplus",     "Softsign",
    "Swish",        "ThresholdedRelu"};

std::vector<std::string> supportedOnnxOps(std::vector<std::string> *foldedOnly,
                                          std::vector<std::string> *expanded) {
  std::set<std::string> ops(kFoldOnly.begin(), kFoldOnly.end());
  ops.insert(kFunctionBodyOps.begin(), kFunctionBodyOps.end());
  if (expanded)
    expanded->assign(kFunctionBodyOps.begin(), kFunctionBodyOps.end());
  for (const OpInfo &i : allOps())
    if (!isTrainingOp(i.kind))
      ops.insert(std::string(i.name));
  ops.insert(std::string(kGradientOp));
  // Translated into other IR ops at import.
  for (const char *op :
       {"CastLike", "GatherND", "SplitToSequence", "SequenceAt"})
    ops.insert(op);
  if (foldedOnly)
    foldedOnly->assign(kFoldOnly.begin(), kFoldOnly.end());
  return {ops.begin(), ops.end()};
}

namespace {
// Loads `onnx<"file", "initializer">` references, keeping the last model
// read so that a graph with many references parses the file once.
class OnnxDataResolver : public DataResolver {
public:
  llvm::Expected<std::vector<uint8_t>>
  load(const DataOrigin &origin, const TensorType &expected) override {
    if (origin.kind != DataOrigin::Kind::OnnxInitializer)
      return readRawFileData(origin, expected);
    if (!model_ || path_ != origin.path) {
      auto m = readModel(origin.path);
      if (!m)
        return m.takeError();
      model_ = std::move(*m);
      path_ = origin.path;
    }
    for (const auto &t : model_->graph().initializer()) {
      if (t.name() != origin.key)
        continue;
      auto d = tensorFromOnnx(
          t, llvm::sys::path::parent_path(origin.path).str(), origin);
      if (!d)
        return d.takeError();
      if ((*d)->type() != expected)
        return err("initializer '{0}' in '{1}' is {2}, but the IR declares "
                   "{3}",
                   origin.key, origin.path, (*d)->type().str(),
                   expected.str());
      llvm::ArrayRef<uint8_t> b = (*d)->bytes();
      return std::vector<uint8_t>(b.begin(), b.end());
    }
    return err("'{0}' has no initializer named '{1}'", origin.path,
               origin.key);
  }

private:
  std::unique_ptr<onnx::ModelProto> model_;
  std::string path_;
};
} // namespace

void installOnnxDataResolver() {
  static OnnxDataResolver resolver;
  setDataResolver(&resolver);
}

} // namespace cleave::frontend
