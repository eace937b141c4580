// The IR verifier: the invariants every pass may rely on and must keep.
//
// Checks: unique names; every operand defined before use (SSA order) and
// use lists in sync; operand/result counts, attributes (known, required,
// right kind) and result types against each op's type rule; declared tensors
// carry data of their own type; shapes are non-negative and of sane size;
// the graph has outputs. The first violation is returned as an error that
// names the op (with its ONNX node name) or value.
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/Error.h"

namespace cleave::ir {

llvm::Error verifyGraph(const Graph &g);

} // namespace cleave::ir
