// Recomputation of forward values in the backward (passes/Recompute.h).
#include "passes/Recompute.h"

#include "passes/Pass.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <functional>

namespace cleave::passes {

using ir::Op;
using ir::Phase;
using ir::Value;

static constexpr std::string_view kRecomputeOf = ir::kRecomputeOfAttr;

std::string_view stashPolicyName(StashPolicy p) {
  switch (p) {
  case StashPolicy::None:
    return "none";
  case StashPolicy::Selective:
    return "selective";
  case StashPolicy::Full:
    return "full";
  case StashPolicy::Offload:
    return "offload";
  }
  return "none";
}

std::optional<StashPolicy> parseStashPolicy(std::string_view s) {
  for (StashPolicy p : {StashPolicy::None, StashPolicy::Selective,
                        StashPolicy::Full, StashPolicy::Offload})
    if (stashPolicyName(p) == s)
      return p;
  return std::nullopt;
}

bool hasRecomputation(const ir::Graph &g) {
  for (const auto &op : g.ops())
    if (op->attrs().count(kRecomputeOf))
      return true;
  return false;
}

// Whether the policy makes `op`'s results again rather than keeping them.
static bool recomputable(const Op &op, const StashChoice &choice) {
  if (op.phase() != Phase::Fwd || op.attrs().count(kRecomputeOf))
    return false;
  switch (op.kind()) {
  case ir::OpKind::Send:
  case ir::OpKind::Recv:
    return false;
  default:
    break;
  }
  StashPolicy policy = choice(op);
  if (policy == StashPolicy::Full)
    return true;
  return policy == StashPolicy::Selective &&
         op.info().cost != ir::CostClass::Product;
}

// Clones, in `phase`'s program, what the readers of that phase read from
// their own layer and the policy makes again; each clone right before the
// first reader (or reader's clone) of that phase, in program order.
static void cloneForPhase(ir::Graph &g, const StashChoice &policy,
                          const Layering &layers, Phase phase,
                          StashStats &stats) {
  llvm::DenseMap<const Op *, size_t> position;
  for (size_t i = 0; i < g.ops().size(); ++i)
    position[g.ops()[i].get()] = i;
  auto layerOf = [&](const Op *op) -> int {
    auto it = layers.layerOfOp.find(op);
    return it == layers.layerOfOp.end() ? -1 : int(it->second);
  };
  auto wanted = [&](const Value *v, int layer) -> const Op * {
    const Op *d = v->definingOp();
    if (!d || layer < 0 || !recomputable(*d, policy) || layerOf(d) != layer)
      return nullptr;
    return d;
  };
  // The ops to make again and the first reader each must precede.
  llvm::DenseMap<const Op *, const Op *> anchorOf;
  std::vector<const Op *> made;
  std::vector<std::pair<Op *, unsigned>> rewired;
  std::function<void(const Op *, const Op *)> need = [&](const Op *d,
                                                         const Op *reader) {
    auto [it, fresh] = anchorOf.try_emplace(d, reader);
    if (!fresh && position[reader] >= position[it->second])
      return;
    it->second = reader;
    if (fresh)
      made.push_back(d);
    for (const Value *v : d->operands())
      if (const Op *p = wanted(v, layerOf(d)))
        need(p, reader);
  };
  for (const auto &op : g.ops()) {
    if (op->phase() != phase || op->attrs().count(kRecomputeOf))
      continue;
    for (unsigned i = 0; i < op->operands().size(); ++i)
      if (const Op *d = wanted(op->operands()[i], layerOf(op.get()))) {
        need(d, op.get());
        rewired.push_back({op.get(), i});
      }
  }
  // Operands before the ops that read them: the originals' program order
  // is a topological order of the clones too, and a clone's operand
  // clones share its anchor or precede it.
  std::sort(made.begin(), made.end(), [&](const Op *a, const Op *b) {
    return position[a] < position[b];
  });
  const char *suffix = phase == Phase::B ? ".rc" : ".rcw";
  llvm::DenseMap<const Value *, Value *> cloneOf;
  for (const Op *d : made) {
    std::vector<Value *> operands;
    // The clones of operands made again for this op (need() recursed into
    // exactly those); an operand from another layer stays the original even
    // where its own layer's readers have a clone of it.
    for (Value *v : d->operands()) {
      auto it = cloneOf.find(v);
      bool own = it != cloneOf.end() && wanted(v, layerOf(d));
      operands.push_back(own ? it->second : v);
    }
    std::vector<ir::TensorType> types;
    std::vector<std::string> names;
    for (const Value *r : d->results()) {
      types.push_back(r->type());
      names.push_back(g.uniqueName(r->name() + suffix));
    }
    ir::AttrMap attrs = d->attrs();
    attrs.insert_or_assign(std::string(kRecomputeOf),
                           ir::Attribute(d->results().empty()
                                             ? std::string()
                                             : d->results()[0]->name()));
    Op *clone = g.insertOpBefore(const_cast<Op *>(anchorOf[d]), d->kind(),
                                 operands, types, names, std::move(attrs),
                                 d->loc());
    clone->setPhase(phase);
    clone->setStage(d->stage());
    for (size_t i = 0; i < d->results().size(); ++i) {
      cloneOf[d->results()[i]] = clone->results()[i];
      stats.clonedBytes += clone->results()[i]->type().byteSize();
    }
    ++stats.clonedOps;
  }
  for (auto [reader, i] : rewired)
    reader->setOperand(i, cloneOf.lookup(reader->operands()[i]));
}

StashStats applyStashPolicy(ir::Graph &g, StashPolicy policy,
                                  const Layering &layers) {
  if (policy == StashPolicy::None)
    return {};
  return applyStashPolicy(
      g, [policy](const Op &) { return policy; }, layers);
}

StashStats applyStashPolicy(ir::Graph &g, const StashChoice &policy,
                                  const Layering &layers) {
  StashStats stats;
  // W work is deferred past other microbatches' B in the 2BP schedules:
  // what W reads is made again in W rather than held from B's clones, so
  // between B and W a layer holds its input and its output gradients.
  cloneForPhase(g, policy, layers, Phase::B, stats);
  cloneForPhase(g, policy, layers, Phase::W, stats);
  offloadStash(g, policy, layers, stats);
  if (stats.clonedOps || stats.offloadedValues)
    g.setStash(computeStash(g));
  return stats;
}

int stripStashPolicy(ir::Graph &g) {
  int offloads = stripOffload(g);
  std::vector<Op *> clones;
  for (const auto &op : g.ops())
    if (op->attrs().count(kRecomputeOf))
      clones.push_back(op.get());
  for (Op *clone : clones) {
    const Value *first = g.lookup(clone->getString(kRecomputeOf));
    Op *original = first ? first->definingOp() : nullptr;
    if (!original)
      continue;
    for (size_t i = 0; i < clone->results().size(); ++i)
      g.replaceAllUsesWith(clone->results()[i], original->results()[i]);
  }
  for (auto it = clones.rbegin(); it != clones.rend(); ++it)
    g.eraseOp(*it);
  if (!clones.empty() || offloads)
    g.setStash(computeStash(g));
  return int(clones.size()) + offloads;
}

} // namespace cleave::passes
