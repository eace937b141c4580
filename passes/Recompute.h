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
//
// A fourth policy moves the stash instead of making it again: offload
// (passes/Offload.cpp). Each forward value of the layer that a backward op
// reads gets an Offload right after its last forward reader (its device
// bytes are free from there) and a Fetch in each backward program that
// reads it (`<name>.fetch` in B, `.fetchw` in W), one layer ahead of its
// first reader there, so the copy can run while the later layer's backward
// computes. Only backends with a host memory of their own run it (the CUDA
// backend and its emulation); the partition weighs it only on device
// profiles with a host link.
#pragma once

#include "ir/Graph.h"
#include "passes/Layers.h"

#include "llvm/Support/Error.h"

#include <functional>
#include <string>
#include <string_view>

namespace cleave::passes {

enum class StashPolicy { None, Selective, Full, Offload };

std::string_view stashPolicyName(StashPolicy p);
// "none", "selective", "full", "offload"; "auto" is the planner's and not
// a policy.
std::optional<StashPolicy> parseStashPolicy(std::string_view s);

struct StashStats {
  int clonedOps = 0;
  int64_t clonedBytes = 0; // bytes of the clones' results, per microbatch
  int offloadedValues = 0;
  int64_t offloadedBytes = 0; // bytes copied to the host, per microbatch
};

// Applies `policy` to every layer of the tagged training graph `g` (after
// split-backward; stage tags, when set, carry over to the clones). The
// stash is recomputed. Idempotent only after stripStashPolicy.
StashStats applyStashPolicy(ir::Graph &g, StashPolicy policy,
                                  const Layering &layers);
// The same with a policy per forward op (what its layer or stage gets).
using StashChoice = std::function<StashPolicy(const ir::Op &)>;
StashStats applyStashPolicy(ir::Graph &g, const StashChoice &policy,
                                  const Layering &layers);

// Undoes applyStashPolicy: every reader of a clone or a Fetch reads the
// original again, and the clones, Offloads and Fetches are erased. Returns
// the ops erased.
int stripStashPolicy(ir::Graph &g);

// True when `g` has recomputed ops.
bool hasRecomputation(const ir::Graph &g);
// True when `g` has Offload ops.
bool hasOffload(const ir::Graph &g);

// The offload half of applyStashPolicy: Offload and Fetch ops for the
// stash of every layer `policy` gives StashPolicy::Offload.
void offloadStash(ir::Graph &g, const StashChoice &policy,
                  const Layering &layers, StashStats &stats);
// Erases every Offload and Fetch, the Fetches' readers reading the
// offloaded values again. Returns the ops erased.
int stripOffload(ir::Graph &g);

} // namespace cleave::passes
