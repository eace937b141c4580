// Recomputation: forward values a layer's backward reads, made again in the
// backward instead of held from the forward (docs/design/recompute-offload.md).
//
// Per layer (passes/Layers.h) a policy: none (every value kept), selective
// (values made by cheap ops, everything but the products, are made again
// from what the products made and from the layer's input; the products'
// results are kept), full (only the layer's input is kept; its forward ops
// run again). A recomputed op is a clone of the forward op, in the program
// of its first reader (B, or W when only W work reads it), right before that
// reader, its results named `<name>.rc`, with the attribute
// `recompute_of = "<first result of the original>"`: codegen seeds a
// Dropout's clone from the original's name, so the masks are the same bits.
// Backward readers in the same layer read the clones; readers in another
// layer (the next layer's backward reading this layer's output, its
// checkpoint) keep the original. The forward value then dies at its last
// forward reader, and the liveness sweep (passes/MemoryPlan.h) counts the
// rest.
#pragma once

#include "ir/Graph.h"
#include "passes/Layers.h"

#include "llvm/Support/Error.h"

#include <functional>
#include <string>
#include <string_view>

namespace cleave::passes {

enum class RecomputePolicy { None, Selective, Full };

std::string_view recomputePolicyName(RecomputePolicy p);
// "none", "selective", "full"; "auto" is the planner's and not a policy.
std::optional<RecomputePolicy> parseRecomputePolicy(std::string_view s);

struct RecomputeStats {
  int clonedOps = 0;
  int64_t clonedBytes = 0; // bytes of the clones' results, per microbatch
};

// Applies `policy` to every layer of the tagged training graph `g` (after
// split-backward; stage tags, when set, carry over to the clones). The
// stash is recomputed. Idempotent only after stripRecomputation.
RecomputeStats applyRecomputation(ir::Graph &g, RecomputePolicy policy,
                                  const Layering &layers);
// The same with a policy per forward op (what its layer or stage gets).
using RecomputeChoice = std::function<RecomputePolicy(const ir::Op &)>;
RecomputeStats applyRecomputation(ir::Graph &g, const RecomputeChoice &policy,
                                  const Layering &layers);

// Undoes applyRecomputation: every reader of a clone reads the original
// again and the clones are erased. Returns the ops erased.
int stripRecomputation(ir::Graph &g);

// True when `g` has recomputed ops.
bool hasRecomputation(const ir::Graph &g);

} // namespace cleave::passes
