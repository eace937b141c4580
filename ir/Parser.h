// Parses cleave IR text (.cir) into a Graph. See docs/ir-text-format.md.
//
// Errors carry `<buffer>:<line>:<col>: ` and say what was expected. The
// parser checks structure (names defined before use and unique, literal
// sizes matching types); types and attributes are checked by the verifier,
// which tools run right after parsing.
#pragma once

#include "ir/Graph.h"
#include "support/TrustedPaths.h"

#include "llvm/Support/Error.h"

#include <memory>

namespace cleave::ir {

// The files a `.cir` names (file<...>, onnx<...>) are untrusted names when
// the text comes from a user: with `confine`, each is resolved from
// `baseDir` (the `.cir`'s folder; the current one for standard input) and
// must lie inside it or a trusted folder (support/TrustedPaths.h); the
// origin keeps the resolved real path. The tools confine; cleave's own
// text, printed and parsed again inside a pass, is taken as written.
struct ParseOptions {
  bool confine = false;
  std::string baseDir = ".";
  support::TrustedFolders trusted;
};

llvm::Expected<std::unique_ptr<Graph>>
parseGraph(llvm::StringRef text, llvm::StringRef bufferName,
           const ParseOptions &opts = {});

} // namespace cleave::ir
