// What an op translation (frontend/translate/) works with while the
// importer walks an ONNX graph: the table of values imported so far (each
// ONNX value name's IR value, or its compile-time constant bytes), the IR
// graph being built, and the helpers every translation needs: read an input
// as an IR operand or as static integers, append the IR op for a node with
// its result types inferred and its outputs recorded, expand a node into its
// ONNX function body. The importer (OnnxImporter.cpp) owns the node loop and
// derives from this class; translations only see this interface, so adding
// an ONNX op is a table entry and a function over it.
#pragma once

#include "frontend/OnnxImporter.h"
#include "frontend/ParameterKinds.h"
#include "ir/Graph.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"

#include <onnx/onnx_pb.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace cleave::frontend {

// The frontend's one error helper: a formatv message as an llvm::Error.
template <typename... Ts>
llvm::Error importError(const char *fmt, Ts &&...vals) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv(fmt, std::forward<Ts>(vals)...).str());
}

// " in module m.features.2.1": the innermost module the exporter recorded
// around the node, for error lines about nodes a dynamo export names `n1`
// or `node_MatMul_7`; "" when the node carries no module path.
std::string modulePathOf(const onnx::NodeProto &n);

class ImportContext {
public:
  // One ONNX value name as imported so far.
  struct Entry {
    ir::TensorType type;
    ir::Value *value = nullptr;           // the IR value, once there is one
    std::shared_ptr<ir::TensorData> data; // initializer or constant bytes
    bool foldable = false; // a compile-time constant the folder may use
  };

  virtual ~ImportContext() = default;

  const ImportOptions &options() const { return opts_; }
  // The producer's signature (empty without one) and whether PyTorch wrote
  // the model (either exporter): what translations read to follow the
  // module's mode (a train()-mode BatchNorm, its unbiased running variance).
  const ExporterSignature &signature() const { return signature_; }
  bool fromPyTorch() const { return fromPyTorch_; }
  ir::Graph &graph() { return *g_; }
  // The default-domain opset the current node is written for (a function
  // body's own while its nodes are imported).
  int64_t opset() const { return opset_; }

  // Input k of `n` as imported, or null when absent or not (yet) defined.
  Entry *input(const onnx::NodeProto &n, int k);
  // The entry of value `name`, or null.
  Entry *lookup(llvm::StringRef name);
  // Input k as an IR value (a constant or initializer is declared on first
  // use); an error naming the node when it is missing.
  llvm::Expected<ir::Value *> operand(const onnx::NodeProto &n, int index,
                                      int k);
  // The IR value of entry `e` named `name`, declaring it when needed.
  ir::Value *materialize(const std::string &name, Entry &e);
  // Input k's values when it is a compile-time constant; else an error that
  // says `what` the input is and that cleave needs static shapes.
  llvm::Expected<std::vector<int64_t>>
  staticInts(const onnx::NodeProto &n, int index, int k, const char *what);
  // Input k as a scalar known at compile time (a constant or any
  // initializer, float ones included), or null when the input is absent.
  llvm::Expected<const ir::TensorData *>
  staticScalar(const onnx::NodeProto &n, int index, int k, const char *what);
  // The operands of the IR op `kind` for node `n`: its inputs up to the
  // op's declared operand count (trailing omitted ones dropped), each an IR
  // value; the inputs after those (static ones that translations turn into
  // attributes) must at least be defined.
  llvm::Expected<std::vector<ir::Value *>>
  tensorOperands(const onnx::NodeProto &n, int index, ir::OpKind kind);

  // The `axes` of a reduction or (un)squeeze: the attribute before opset
  // 13 / 18, the constant input 1 since; empty when the node gives none.
  llvm::Expected<std::vector<int64_t>> axesOf(const onnx::NodeProto &n,
                                              int index);
  // A reduction's axes (axesOf; empty: every axis), or nullopt where the
  // node reduces nothing (noop_with_empty_axes and no axes given).
  llvm::Expected<std::optional<std::vector<int64_t>>>
  reductionAxesOf(const onnx::NodeProto &n, int index);

  // Appends one intermediate IR op of node `n`'s translation (a
  // decomposition's step), its single result type inferred, located at the
  // node; an error naming the node when the types do not fit.
  llvm::Expected<ir::Value *> append(const onnx::NodeProto &n, int index,
                                     ir::OpKind kind,
                                     std::vector<ir::Value *> operands,
                                     ir::AttrMap attrs);

  // Appends the IR op for node `n` and records its outputs; `copyAttrs`
  // also takes the node's ONNX attributes that the IR op declares (except
  // those its translation consumes itself).
  llvm::Error emit(const onnx::NodeProto &n, int index, ir::OpKind kind,
                   std::vector<ir::Value *> operands, ir::AttrMap attrs,
                   bool copyAttrs = true);
  // Records `value` as the node's output `name` (an error when the name is
  // already defined).
  llvm::Error define(const onnx::NodeProto &n, int index,
                     const std::string &name, ir::Value *value);
  // Records a compile-time constant under `name`.
  void defineConstant(const std::string &name,
                      std::shared_ptr<ir::TensorData> data);

  // Tensor sequences (SplitToSequence's result), by name: each element's IR
  // value. cleave has no sequence values; SequenceAt picks an element.
  void defineSequence(const std::string &name,
                      std::vector<ir::Value *> elements);
  const std::vector<ir::Value *> *sequence(llvm::StringRef name) const;

  // Expands `n` into its ONNX function body and imports the body's nodes;
  // false when its op has no body at this opset.
  llvm::Expected<bool> importFunctionBody(const onnx::NodeProto &n, int index);
  // The location of an op made for node `n`: its module path, or that of
  // the model's node whose function body `n` belongs to.
  std::string loc(const onnx::NodeProto &n) const;
  // ", in the ONNX function body of 'Attention' at node 'attn'" while a
  // body is being imported (innermost first), "" otherwise.
  std::string bodyContext() const;
  // A value name no value of the model has, based on `base`.
  std::string freshName(llvm::StringRef base);

  // Control flow over static work (ControlFlow.cpp): a Loop whose trip
  // count and condition fold is unrolled, an If whose condition folds is
  // its taken branch; sequences are lists of IR values.
  llvm::Error unrollLoop(const onnx::NodeProto &n, int index);
  llvm::Error inlineIf(const onnx::NodeProto &n, int index);
  llvm::Error importSequenceOp(const onnx::NodeProto &n, int index);

protected:
  explicit ImportContext(const ImportOptions &opts) : opts_(opts) {}
  // Defines `to` as the value or sequence `from` (node n's output).
  llvm::Error alias(const onnx::NodeProto &n, int index, const std::string &to,
                    const std::string &from);
  // Imports the nodes of `body` (a subgraph of node n) with its inputs
  // bound to the values named `bound`, each output renamed "<name>@<tag>";
  // returns the names its outputs got.
  llvm::Expected<std::vector<std::string>>
  importSubgraph(const onnx::NodeProto &n, int index,
                 const onnx::GraphProto &body,
                 const std::vector<std::string> &bound,
                 const std::string &tag);
  // Imports one node (of the model or of a function body) by the
  // importer's steps: constants, folding, then its translation.
  virtual llvm::Error importNode(const onnx::NodeProto &n, int index) = 0;

  const ImportOptions &opts_;
  ExporterSignature signature_;
  bool fromPyTorch_ = false;
  int64_t opset_ = 0;
  std::unique_ptr<ir::Graph> g_;
  llvm::StringMap<Entry> env_;
  llvm::StringMap<std::vector<ir::Value *>> sequences_;
  // Every value name of the model, and the fresh ones given out since.
  std::set<std::string> usedNames_;

private:
  // The nodes whose function bodies are being imported, outermost first,
  // with the opset to return to.
  struct Call {
    const onnx::NodeProto *node;
    int64_t opset;
  };
  std::vector<Call> calls_;
};

} // namespace cleave::frontend
