// The ONNX frontend's core (OnnxImporter.h): takes the model that
// OnnxModel.h read, gates its opset, runs ONNX's checker and shape
// inference, binds input shapes, loads the initializers and walks the
// nodes. Each node is a constant, a piece of shape arithmetic the folder
// evaluates (ShapeFolding.h), or a translation from the table in
// frontend/translate/ (an op without an entry is expanded through its ONNX
// function body or refused by name). The parameter kinds are
// ParameterKinds.h's; the value table and the helpers translations use are
// ImportContext's, which the importer extends with the node loop.
#include "frontend/OnnxImporter.h"

#include "frontend/ImportContext.h"
#include "frontend/OnnxModel.h"
#include "frontend/OnnxNode.h"
#include "frontend/OnnxTensor.h"
#include "frontend/ParameterKinds.h"
#include "frontend/ShapeFolding.h"
#include "frontend/translate/Translation.h"
#include "ir/TypeRules.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <set>

namespace cleave::frontend {

using namespace cleave::ir;
using Data = std::shared_ptr<TensorData>;

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

namespace {

class Importer : public ImportContext {
public:
  Importer(onnx::ModelProto &model, std::string path, const ImportOptions &o)
      : ImportContext(o), model_(model), path_(std::move(path)) {
    modelDir_ = llvm::sys::path::parent_path(path_).str();
  }
  llvm::Expected<std::unique_ptr<Graph>> run();

private:
  llvm::Error checkOpset();
  llvm::Error bindInputs();
  llvm::Error addInitializers();
  llvm::Error importNode(const onnx::NodeProto &n, int index) override;
  // A node of the default domain that did not fold: its translation.
  llvm::Error convert(const onnx::NodeProto &n, int index);
  // The version of `domain` the model imports (0 when it does not).
  int64_t domainVersion(const std::string &domain) const;
  llvm::Error crossCheck();
  const onnx::ModelProto &checkerView();

  onnx::ModelProto &model_;
  std::string path_, modelDir_;
  std::unique_ptr<onnx::ModelProto> checkerCopy_;
};

llvm::Error Importer::checkOpset() {
  bool found = false;
  for (const auto &imp : model_.opset_import()) {
    if (imp.domain() != "" && imp.domain() != "ai.onnx")
      continue;
    found = true;
    opset_ = imp.version();
  }
  if (!found)
    return importError("'{0}' imports no opset of the default ONNX domain",
                       path_);
  if (opset_ < kMinOpset || opset_ > kMaxOpset)
    return importError(
        "'{0}' uses opset {1} of the default ONNX domain; cleave "
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
        return importError(
            "constant input '{0}' is {1}, but the model declares "
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
      return importError("graph input '{0}' is not a tensor", in.name());
    auto *tt = in.mutable_type()->mutable_tensor_type();
    auto dt = dtypeFromOnnx(tt->elem_type());
    if (!dt)
      return importError("graph input '{0}': {1}", in.name(),
                         llvm::toString(dt.takeError()));
    if (*dt == DType::U8)
      return importError("graph input '{0}': element type uint8 is not "
                         "supported for data (cleave takes uint8 only in "
                         "shape arithmetic it folds at import)",
                         in.name());
    if (!tt->has_shape())
      return importError("graph input '{0}' has no shape; give one with "
                         "--input-shape {0}=d0,d1,...",
                         in.name());
    auto *shape = tt->mutable_shape();
    auto flag = opts_.inputShapes.find(in.name());
    if (flag != opts_.inputShapes.end()) {
      if (int(flag->second.size()) != shape->dim_size())
        return importError(
            "--input-shape gives {0} dims for '{1}', which has rank "
            "{2}",
            flag->second.size(), in.name(), shape->dim_size());
      for (int i = 0; i < shape->dim_size(); ++i) {
        auto *d = shape->mutable_dim(i);
        if (d->has_dim_value() && d->dim_value() != flag->second[i])
          return importError(
              "--input-shape gives {0} for axis {1} of '{2}', which "
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
        return importError(
            "input '{0}' has a symbolic dimension{1} at axis {2}; "
            "bind it with {3}--input-shape {0}=d0,d1,...",
            in.name(), sym, i, i == 0 ? "--microbatch-size N or " : "");
      }
      dims.push_back(d->dim_value());
    }
    if (auto e = checkShape(dims))
      return importError("input '{0}': {1}", in.name(),
                         llvm::toString(std::move(e)));
    Value *v = g_->addInput(in.name(), TensorType(*dt, dims));
    env_[in.name()] = Entry{v->type(), v, nullptr, false};
  }
  for (const auto &[name, data] : opts_.constantInputs)
    if (!inputNames.count(name))
      return importError("constant input '{0}' is not an input of the model",
                         name);
  for (const auto &[name, dims] : opts_.inputShapes)
    if (!inputNames.count(name))
      return importError(
          "--input-shape names '{0}', which is not an input of the "
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
int64_t Importer::domainVersion(const std::string &domain) const {
  for (const auto &imp : model_.opset_import())
    if (imp.domain() == domain)
      return imp.version();
  return 0;
}

llvm::Error Importer::convert(const onnx::NodeProto &n, int index) {
  const std::string &op = n.op_type();
  if (n.domain() != "" && n.domain() != "ai.onnx")
    return importError("unsupported op '{0}' (domain '{1}') at node "
                       "'{2}'{3}{4}; `cleavec --list-ops` lists the supported "
                       "ops",
                       op, n.domain(), n.name(), modulePathOf(n),
                       bodyContext());
  if (const OpTranslation *t = findTranslation("", op, opset_))
    return t->translate(*this, n, index);
  // No entry: ONNX may define it by a function body.
  return translateThroughFunctionBody(*this, n, index);
}

llvm::Error Importer::importNode(const onnx::NodeProto &n, int index) {
  if (n.domain().empty() || n.domain() == "ai.onnx") {
    if (n.op_type() == "Loop")
      return unrollLoop(n, index);
    if (n.op_type() == "If")
      return inlineIf(n, index);
  }
  for (const auto &a : n.attribute())
    if (a.type() == onnx::AttributeProto::GRAPH ||
        a.type() == onnx::AttributeProto::GRAPHS)
      return importError(
          "unsupported op '{0}' with a subgraph at node '{1}'{2} (of "
          "the control-flow ops cleave imports only Loop and If, whose "
          "trip count and condition fold); `cleavec --list-ops` lists the "
          "supported ops",
          n.op_type(), n.name(), bodyContext());
  if (n.op_type() == "Constant" && (n.domain().empty() ||
                                    n.domain() == "ai.onnx")) {
    const onnx::AttributeProto *a = n.attribute_size() == 1 ? &n.attribute(0)
                                                            : nullptr;
    Data d;
    if (a && a->name() == "value") {
      auto t = tensorFromOnnx(a->t(), modelDir_, {});
      if (!t)
        return importError("{0}: {1}", describeNode(n, index),
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
      return importError(
          "{0}: only tensor, float and int constants are supported",
          describeNode(n, index));
    }
    if (n.output_size() != 1 || env_.count(n.output(0)))
      return importError("{0}: bad outputs", describeNode(n, index));
    env_[n.output(0)] = Entry{d->type(), nullptr, d, true};
    return llvm::Error::success();
  }
  bool defaultDomain = n.domain().empty() || n.domain() == "ai.onnx";
  // Ops of other domains that cleave translates (ONNX's Gradient).
  if (!defaultDomain)
    if (const OpTranslation *t =
            findTranslation(n.domain(), n.op_type(), domainVersion(n.domain())))
      return t->translate(*this, n, index);
  if (defaultDomain) {
    std::vector<FoldInput> ins;
    for (int k = 0; k < n.input_size(); ++k) {
      Entry *e = input(n, k);
      if (!n.input(k).empty() && !e && !sequences_.count(n.input(k)))
        return importError(
            "{0}: input '{1}' is not defined by any earlier node, "
            "input or initializer",
            describeNode(n, index), n.input(k));
      ins.push_back(FoldInput{e ? &e->type : nullptr,
                              e && e->foldable ? e->data : nullptr});
    }
    auto folded = foldNode(n, ins);
    if (!folded)
      return importError("{0}: {1}", describeNode(n, index),
                         llvm::toString(folded.takeError()));
    if (*folded) {
      for (size_t i = 0; i < (*folded)->size() && int(i) < n.output_size();
           ++i) {
        if (env_.count(n.output(i)))
          return importError("{0}: output '{1}' is defined twice",
                             describeNode(n, index), n.output(i));
        const Data &d = (**folded)[i];
        env_[n.output(i)] = Entry{d->type(), nullptr, d, true};
      }
      return llvm::Error::success();
    }
  }
  return convert(n, index);
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
      return importError("value '{0}': cleave infers shape {1} but ONNX shape "
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

// The one domain besides ONNX's own that has a translation (Gradient,
// translate/Training.cpp).
static const char kTrainingDomain[] = "ai.onnx.preview.training";

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
      return importError(
          "'{0}': node '{1}' uses the experimental ONNX op '{2}', "
          "which cleave does not support",
          path_, n.name(), n.op_type());
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
        return importError(
            "'{0}': node '{1}' ({2}): attribute {3} must be positive", path_,
            n.name(), n.op_type(), name);
    }
  try {
    onnx::checker::check_model(checkerView());
  } catch (const std::exception &ex) {
    std::string msg = oneLine(ex.what());
    return importError("'{0}' fails the ONNX checker: {1}", path_, msg);
  }
  fromPyTorch_ = model_.producer_name() == "pytorch";
  auto signature = readSignature(model_, path_);
  if (!signature)
    return signature.takeError();
  signature_ = *signature;
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
      return importError("unsupported op '{0}' (domain '{1}'{2}) at node "
                         "'{3}'; `cleavec --list-ops` lists the supported ops",
                         n.op_type(), n.domain(),
                         localFunctions.count({n.domain(), n.op_type()})
                             ? ", a function of the model"
                             : "",
                         n.name());
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
    return importError("'{0}': ONNX shape inference failed: {1}", path_, msg);
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
      return importError("graph output '{0}' is not produced by any node",
                         out.name());
    g_->addOutput(materialize(out.name(), it->second));
  }
  std::vector<std::string> guessed = classifyParameters(*g_, signature_);
  if (!guessed.empty() && opts_.warn)
    opts_.warn(llvm::formatv(
                   "'{0}' says nothing of which initializers are parameters "
                   "(no signature, no cleave.parameters): {1} one-element "
                   "initializer(s) named like module parameters, such as "
                   "'{2}', are held constant, taken for a scale; if the "
                   "module trains them, record its parameters with "
                   "annotate_export (README, From PyTorch 2)",
                   path_, guessed.size(), guessed.front())
                   .str());
  if (auto e = crossCheck())
    return std::move(e);
  return std::move(g_);
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>>
importOnnxFile(const std::string &path, const ImportOptions &opts) {
  auto model = readOnnxModel(path);
  if (!model)
    return model.takeError();
  llvm::SmallString<256> abs(path);
  llvm::sys::fs::make_absolute(abs);
  llvm::sys::path::remove_dots(abs, true);
  return Importer(**model, std::string(abs), opts).run();
}

} // namespace cleave::frontend
