// What the passes that recognize spelled-out ops share (recognize-gelu,
// recognize-rms-norm, recognize-attention): a one-element float constant's
// value, and the interior nodes of the trees they replace.
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

// The op making `v` when it is of `kind` and `v` has no other use (and is
// not an output, update or stash entry): an interior node of a tree a
// recognizing pass may replace.
inline ir::Op *interior(const ir::Graph &g, ir::Value *v, ir::OpKind kind) {
  ir::Op *def = v->definingOp();
  if (!def || def->kind() != kind || v->uses().size() != 1 || g.isPinned(v))
    return nullptr;
  return def;
}

} // namespace cleave::passes
