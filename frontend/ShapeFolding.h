// Folds the shape arithmetic that exporters write (Shape, Gather and Slice on
// shapes, Unsqueeze, Concat, ConstantOfShape, Range, Cast, integer math,
// Equal/Where, Expand, Reshape) into constants, so that every value in the
// imported graph has a static shape and ops such as Reshape get their target
// shape as an attribute.
//
// The folder only runs on nodes whose inputs are all compile-time constants
// (Constant nodes, integer initializers and earlier folded results) — never
// on trainable parameters — and keeps results small.
#pragma once

#include "ir/TensorData.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <optional>
#include <vector>

namespace onnx {
class NodeProto;
}

namespace cleave::frontend {

struct FoldInput {
  const ir::TensorType *type = nullptr;     // null: input absent
  std::shared_ptr<ir::TensorData> constant; // null: not a constant
};

using FoldResult = std::optional<std::vector<std::shared_ptr<ir::TensorData>>>;

// Returns the node's outputs when it can be folded, std::nullopt when it is
// not a folding op or its inputs are not constant, or an error when the
// inputs are constant but invalid (such as an index out of range).
llvm::Expected<FoldResult> foldNode(const onnx::NodeProto &node,
                                    llvm::ArrayRef<FoldInput> inputs);

// ConstantOfShape's fill value: its `value` attribute's one element as a
// tensor of shape [1] (float 0 when the attribute is absent).
llvm::Expected<std::shared_ptr<ir::TensorData>>
constantOfShapeValue(const onnx::NodeProto &node);

// Largest tensor (in elements) the folder will produce.
constexpr int64_t kMaxFoldElements = int64_t(1) << 20;

} // namespace cleave::frontend
