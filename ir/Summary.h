// A short human-readable summary of a graph: inputs, outputs, parameter
// count and bytes, and a histogram of op kinds (`cleavec --emit=summary`).
#pragma once

#include "ir/Graph.h"

#include <string>

namespace cleave::ir {

std::string summarizeGraph(const Graph &g);
// "1.50 MiB" style byte counts.
std::string formatBytes(int64_t bytes);

} // namespace cleave::ir
