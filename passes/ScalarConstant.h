// The value of a one-element float constant, for the passes that recognize
// spelled-out ops by their constants (recognize-gelu, recognize-rms-norm).
#pragma once

#include "ir/Graph.h"

#include <optional>

namespace cleave::passes {

// A scalar float Const's value, or nothing (not a Const, not one element,
// not a float, or its data cannot be loaded).
inline std::optional<double> scalarConstant(const ir::Value *v) {
  if (v->kind() != ir::ValueKind::Const || v->type().numElements() != 1 ||
      !ir::isFloat(v->type().dtype) || !v->data())
    return std::nullopt;
  if (llvm::Error e = v->data()->load()) {
    llvm::consumeError(std::move(e));
    return std::nullopt;
  }
  return v->data()->getDouble(0);
}

} // namespace cleave::passes
