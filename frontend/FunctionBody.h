// ONNX defines many ops by a function body: a small graph of other ops
// (opset 23's RotaryEmbedding and Attention, Softplus, HardSwish, ...),
// some of them built for the node at hand ("context-dependent": the body
// depends on the node's attributes and input types, as Attention's does on
// its ranks and mask type). The importer maps the ops it knows to IR ops and
// expands the others through these bodies, with ONNX's own definitions
// (onnx/defs/schema.h), so that the op's semantics are ONNX's and the
// gradients come from the body's ops.
#pragma once

#include "ir/TensorData.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <onnx/onnx_pb.h>

#include <optional>
#include <string>
#include <vector>

namespace cleave::frontend {

struct FunctionBody {
  // The body's nodes, in order, ready to import in place of the call: the
  // call's attributes bound (`ref_attr_name` references resolved, defaults
  // filled in), the body's formal inputs and outputs renamed to the call's
  // actual ones (an omitted optional input to ""), every other value to a
  // fresh name, and each node named "<call>/<what it computes>".
  std::vector<onnx::NodeProto> nodes;
  // The default-domain opset the body's nodes are written for.
  int64_t opset = 0;
};

// The function body of default-domain node `call` at `opset`, or
// std::nullopt when the op has none there (or ONNX does not know it).
// `inputTypes[k]` is the static type of input k (null when absent); a
// context-dependent body is built for them. `freshName(base)` returns a
// name, based on `base`, that no value of the model has.
llvm::Expected<std::optional<FunctionBody>>
expandFunction(const onnx::NodeProto &call, int64_t opset,
               llvm::ArrayRef<const ir::TensorType *> inputTypes,
               llvm::function_ref<std::string(llvm::StringRef)> freshName);

// Nested function bodies (a body's op itself defined by a body) are
// expanded at most this deep.
constexpr int kMaxFunctionDepth = 8;

} // namespace cleave::frontend
