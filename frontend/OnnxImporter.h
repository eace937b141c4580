// The ONNX frontend: ModelProto -> cleave IR Graph.
//
// Loading runs ONNX's checker and shape inference, binds symbolic input
// dimensions from the user's flags, folds shape arithmetic to constants (see
// ShapeFolding.h) and translates each remaining ONNX node into IR ops, its
// static operands turned into attributes, by the table of op translations
// (frontend/translate/Translation.h). Which float initializers are trained
// parameters and which are buffers (running statistics, masks) follows the
// producer's declaration or naming rules (ParameterKinds.h); integer ones
// are constants. The frontend knows no passes: the one op that needs one,
// ONNX's Gradient, takes autodiff from the caller (ImportOptions).
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/Error.h"

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cleave::frontend {

struct ImportOptions {
  // Full shapes for named graph inputs (--input-shape name=d0,d1,...).
  std::map<std::string, std::vector<int64_t>> inputShapes;
  // Binds a symbolic leading dimension of every input (--microbatch-size).
  std::optional<int64_t> microbatchSize;
  // Graph inputs to treat as compile-time constants with these values (they
  // stop being inputs). For models that pass static operands, such as a
  // Reshape target, as inputs; the conformance suite uses it.
  std::map<std::string, std::shared_ptr<ir::TensorData>> constantInputs;
  // Appends to the graph the gradients of y (of its sum) with respect to
  // each x, one value per x: what ONNX's Gradient op
  // (ai.onnx.preview.training) imports as. The tools and tests pass
  // passes::differentiate; without it a Gradient node is refused in one
  // line.
  std::function<llvm::Expected<std::vector<ir::Value *>>(
      ir::Graph &, ir::Value *, llvm::ArrayRef<ir::Value *>)>
      differentiate;
  // The mode the module's BatchNorm and Dropout train in (--module-mode).
  // Auto follows the producer: PyTorch's dynamo export records a train()
  // BatchNorm as a BUFFER_MUTATION of its running statistics (the graph's
  // op is in inference form), the legacy export and ONNX set training_mode.
  // Train and Eval override every such op.
  enum class ModuleMode { Auto, Train, Eval };
  ModuleMode moduleMode = ModuleMode::Auto;
  // Receives a line about what the import could not be sure of (one-element
  // initializers held by a guess); the tools print it as a warning.
  std::function<void(const std::string &)> warn;
};

// Reads and imports `path`. Every failure is one line naming the file and,
// where there is one, the node, input or tensor at fault.
llvm::Expected<std::unique_ptr<ir::Graph>>
importOnnxFile(const std::string &path, const ImportOptions &opts = {});

// The model's graph inputs that are not initializers, in order (the order
// of input_K.pb files in ONNX test data).
llvm::Expected<std::vector<std::string>>
onnxInputNames(const std::string &path);

// The ONNX op types the frontend accepts (the translation table's), sorted;
// an op of another domain than the default one is followed by its domain in
// parentheses. `foldedOnly` receives
// those accepted only when they fold to constants (such as Shape or Range),
// `expanded` those imported through their ONNX function bodies (tested:
// Attention, RotaryEmbedding, Softplus, ...). Any other op ONNX defines by
// a function body is expanded the same way and imports when every op of
// its body does. `unrolled` receives the control-flow ops imported by
// unrolling (Loop, when its trip count and condition fold) or inlining (If,
// when its condition folds: frontend/ControlFlow.cpp).
std::vector<std::string> supportedOnnxOps(std::vector<std::string> *foldedOnly,
                                          std::vector<std::string> *expanded =
                                              nullptr,
                                          std::vector<std::string> *unrolled =
                                              nullptr);

// The lowest and highest default-domain opset versions accepted: up to the
// last one the pinned ONNX (scripts/onnx.sh) defines. PyTorch's dynamo
// exporter targets 18 and later (20 by default), the legacy one 13-17;
// older models (from opset 7, where ONNX broadcasting became NumPy's) import
// too. Forms that changed between versions are translated (Softmax before
// 13, Slice before 10, Pad before 11 and its axes since 18, Reduce axes as
// inputs since 18, Split's num_outputs since 18); an op form cleave does not
// know is rejected by name.
constexpr int64_t kMinOpset = 7, kMaxOpset = 28;

// Installs the resolver that loads `onnx<"file", "initializer">` tensor
// references found in parsed .cir text.
void installOnnxDataResolver();

} // namespace cleave::frontend
