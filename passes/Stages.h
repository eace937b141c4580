// Materialising pipeline stages: one graph per stage, with the messages
// between them as explicit Send and Recv ops (docs/design/partition.md,
// "Stage graphs").
//
// From a training graph and the stage of every op (the partition):
//  - each stage graph holds its ops in program order, with their tags;
//  - a value made on stage a and read on stage b != a is sent straight from
//    a to b (never relayed): a `Send {peer = b, tag = T}` right after the op
//    that makes it, a `Recv {peer = a, tag = T}` right before its first
//    reader on b, tagged with the earliest phase that reads it there. A value
//    only the step reads on b (opt) is sent once per step, as its sum over
//    the step's microbatches (the Send and Recv are tagged opt);
//  - graph inputs, parameters, buffers and constants are copied into every
//    stage that reads them: a parameter read on several stages (a tied
//    embedding) has one replica per stage. Its gradient contributions are
//    summed where its optimizer op runs, and the replicas receive the
//    updated value after the step (an opt Recv and an `update` line);
//  - gradient sums: the Add ops that sum a parameter's gradient
//    contributions run in the step (tagged opt), over the microbatch sums of
//    the contributions, on every partition including the one-stage one, so
//    the order of additions does not depend on the number of stages.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <vector>

namespace cleave::passes {

// The Add ops that sum the gradient contributions of a parameter (the
// operand the optimizer op reads, and Adds feeding only it), which split
// stages tags opt.
std::vector<const ir::Op *> gradientSums(const ir::Graph &g);

// One graph per stage, named <graph>.stage<s>. `stageOf` gives the stage
// of every op of `g` (0 <= stage < numStages). Every stage graph verifies.
llvm::Expected<std::vector<std::unique_ptr<ir::Graph>>>
splitStages(const ir::Graph &g,
            const llvm::DenseMap<const ir::Op *, int> &stageOf,
            int numStages);

} // namespace cleave::passes
