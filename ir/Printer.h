// Prints a Graph as cleave IR text (.cir). See docs/ir-text-format.md.
//
// The printed form is canonical: parsing it and printing again gives the same
// text byte for byte. Small tensors are spelled out inline; large ones are
// printed as a reference to where their bytes live (an initializer in an ONNX
// file, or a byte range of a raw file) so a dump of a big model stays short.
#pragma once

#include "ir/Graph.h"
#include "support/TextFormat.h"

#include "llvm/Support/raw_ostream.h"

#include <string>

namespace cleave::ir {

struct PrintOptions {
  // Tensors with at most this many elements are printed inline.
  int64_t inlineLimit = 16;
};

void printGraph(const Graph &g, llvm::raw_ostream &os,
                const PrintOptions &opts = {});
std::string printGraph(const Graph &g, const PrintOptions &opts = {});

// Pieces shared with the parser's tests and error messages.
using support::quoteString; // support/TextFormat.h
// `%name`, quoting names that are not plain identifiers.
std::string valueRef(llvm::StringRef name);
// Shortest decimal text that reads back as exactly `v` (support/TextFormat.h).
using support::formatDouble;
using support::formatFloat;

} // namespace cleave::ir
