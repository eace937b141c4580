// A human-readable summary of a graph: inputs, outputs, parameter count and
// bytes, and a histogram of op kinds (`cleavec --emit=summary`, in full
// with --verbose).
#pragma once

#include "ir/Graph.h"

#include <string>

namespace cleave::ir {

// Full lists every output and every op kind's count. Short (cleavec's
// default) lists the inputs and the outputs that are neither a parameter's
// gradient (grad.*) nor updated state (.next), counts those, and gives the
// op histogram on one line, its most frequent kinds first.
enum class SummaryDetail { Short, Full };
std::string summarizeGraph(const Graph &g,
                           SummaryDetail detail = SummaryDetail::Full);
// "1.50 MiB" style byte counts.
std::string formatBytes(int64_t bytes);

} // namespace cleave::ir
