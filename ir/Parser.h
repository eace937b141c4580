// Parses cleave IR text (.cir) into a Graph. See docs/ir-text-format.md.
//
// Errors carry `<buffer>:<line>:<col>: ` and say what was expected. The
// parser checks structure (names defined before use and unique, literal
// sizes matching types); types and attributes are checked by the verifier,
// which tools run right after parsing.
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/Error.h"

#include <memory>

namespace cleave::ir {

llvm::Expected<std::unique_ptr<Graph>> parseGraph(llvm::StringRef text,
                                                  llvm::StringRef bufferName);

} // namespace cleave::ir
