// Layers: the units the partitioner cuts between.
//
// A layer is a contiguous run of forward ops, in program order, together
// with the backward and optimizer ops that belong to them. Layers come from
// the module paths in op locations (the legacy exporter's node names, or
// the path the frontend builds from the dynamo exporter's name scopes):
// `/blocks.3/attn/MatMul` is in scope `blocks.3` at depth 1 and
// `blocks.3.attn` at depth 2 (a container such as nn.Sequential's
// `/layers/layers.0/...` is looked through). Unless a depth is given, the
// depth is found: the shallowest one at which a family of repeated blocks
// appears (`m.transformer.h.0`, `m.transformer.h.1`, ...), looking through
// any number of wrapper modules. Ops outside any
// scope (`/Add`, the loss) join the layer before them. A graph whose ops
// carry no scopes, or depth 0, falls back to cut points: places in the
// forward program where a single value separates what came before from what
// comes after (at most 256 layers: on a long chain of unnamed ops, a cut
// point ends a layer only once it holds 1/256 of the forward ops). Backward
// ops join the layer of the forward op they came from
// (the same `loc`); optimizer ops (`optimizer/<param>`) and declared tensors
// join the layer that first uses the parameter.
//
// Layers are always in dependency order: when a layer reads a value made by
// a later one (scopes that interleave), the layers in between are merged.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>
#include <vector>

namespace cleave::passes {

struct Layer {
  std::string name;
  std::vector<const ir::Op *> ops; // every phase, in program order
};

struct Layering {
  std::vector<Layer> layers;
  llvm::DenseMap<const ir::Op *, unsigned> layerOfOp;
  // Graph inputs, parameters, buffers and constants: the first layer that
  // reads them (through a forward op when one does).
  llvm::DenseMap<const ir::Value *, unsigned> layerOfDeclared;

  // The scope depth the layers were made at (0: cut points).
  unsigned depth = 0;

  std::optional<unsigned> find(llvm::StringRef name) const;
  // The layer that makes `v` (for inputs: the first that reads it).
  std::optional<unsigned> layerOf(const ir::Value *v) const;
};

struct LayerOptions {
  // Scope components per layer name; 0: cut points; unset: the shallowest
  // depth with repeated blocks (autoLayerDepth).
  std::optional<unsigned> depth;
};

// The shallowest scope depth (up to 12) at which two scopes are the same
// path but for a trailing block index (`h.0` and `h.1`); failing that, the
// shallowest that gives more than one layer; 0 (cut points) when names give
// no scopes.
unsigned autoLayerDepth(const ir::Graph &g);

// Groups the ops of `g` into layers. Fails only for a graph without
// forward ops.
llvm::Expected<Layering> groupLayers(const ir::Graph &g,
                                     const LayerOptions &opts);

// The scope of an op location at `depth` ("blocks.3" for
// "/blocks.3/attn/MatMul" at depth 1, "blocks.3.attn" at depth 2), or ""
// when the op is in no scope.
std::string scopeOf(llvm::StringRef loc, unsigned depth);

} // namespace cleave::passes
