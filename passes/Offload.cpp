// Activation offload, the fourth stash policy (passes/Recompute.h): the
// forward values a layer's backward reads go to host memory after their
// last forward reader and come back before the backward reads them.
//
// Only the layer's own backward readers read the fetched copy: another
// layer's backward that reads the value (the next layer's, reading its
// input) keeps the original, which stays on the device as the layer's
// checkpoint does under recomputation; the Fetch then belongs to the
// layer, and so to its stage.
//
// The rewrite is ordinary IR, so the liveness sweep, codegen and the
// executor need one rule each: an Offload's result lives in the host frame
// (passes/MemoryPlan.h), and the device value dies at its Offload. A value
// read in both B and W is fetched twice (`.fetch` in B, `.fetchw` in W), as
// recomputation makes W's operands again in W: between B and the deferred
// W the device holds neither copy. Each Fetch is placed one layer ahead of
// its first reader (before the first op, in that program, of the layer
// whose backward runs just before), which on the GPU lets the copy stream
// bring it while that layer computes.
#include "passes/Recompute.h"

#include "passes/Pass.h"

#include "llvm/ADT/DenseMap.h"

#include <algorithm>
#include <map>

namespace cleave::passes {

using ir::Op;
using ir::Phase;
using ir::Value;

bool hasOffload(const ir::Graph &g) {
  for (const auto &op : g.ops())
    if (op->kind() == ir::OpKind::Offload)
      return true;
  return false;
}

// Whether `v`, made by a forward op, may leave the device between its
// forward and backward: not a value the step sums, the loss or a state
// update's (those live to their program's end), not a graph output.
static bool offloadable(const ir::Graph &g, const Value *v) {
  if (g.isOutput(v))
    return false;
  for (const ir::StateUpdate &u : g.updates())
    if (u.value == v)
      return false;
  for (const ir::Use &u : v->uses())
    if (u.user->phase() == Phase::Opt)
      return false;
  return true;
}

void offloadStash(ir::Graph &g, const StashChoice &policy,
                  const Layering &layers, StashStats &stats) {
  auto layerOf = [&](const Op *op) -> int {
    auto it = layers.layerOfOp.find(op);
    return it == layers.layerOfOp.end() ? -1 : int(it->second);
  };
  std::vector<Op *> makers;
  for (const auto &op : g.ops())
    if (op->phase() == Phase::Fwd && layerOf(op.get()) >= 0 &&
        op->kind() != ir::OpKind::Send && op->kind() != ir::OpKind::Recv &&
        op->kind() != ir::OpKind::Offload &&
        policy(*op) == StashPolicy::Offload)
      makers.push_back(op.get());
  if (makers.empty())
    return;
  // Program positions of the ops as they are now: inserting copies keeps
  // their relative order, so one numbering serves every value. Per phase
  // and layer, the first op of that layer's work in that program (where a
  // Fetch one layer ahead goes).
  std::vector<Op *> order;
  llvm::DenseMap<const Op *, size_t> position;
  std::map<std::pair<Phase, int>, Op *> firstOf;
  for (const auto &op : g.ops()) {
    position[op.get()] = order.size();
    order.push_back(op.get());
    firstOf.try_emplace({op->phase(), layerOf(op.get())}, op.get());
  }
  for (Op *maker : makers)
    for (Value *v : maker->results()) {
      if (!offloadable(g, v))
        continue;
      Op *lastForward = maker;
      std::vector<std::pair<Op *, unsigned>> readers[2]; // B, W
      for (const ir::Use &u : v->uses()) {
        if (u.user->phase() == Phase::Fwd) {
          if (position.lookup(u.user) > position.lookup(lastForward))
            lastForward = u.user;
        } else if (layerOf(u.user) != layerOf(maker)) {
          continue; // the next layer's backward reads its own input
        } else if (u.user->phase() == Phase::B) {
          readers[0].push_back({u.user, u.operandIndex});
        } else if (u.user->phase() == Phase::W) {
          readers[1].push_back({u.user, u.operandIndex});
        }
      }
      if (readers[0].empty() && readers[1].empty())
        continue;
      size_t after = position.lookup(lastForward) + 1;
      Op *next = after < order.size() ? order[after] : nullptr;
      std::string loc = maker->loc();
      auto insert = [&](Op *before, ir::OpKind kind, Value *operand,
                        const std::string &name) {
        if (before)
          return g.insertOpBefore(before, kind, {operand}, {v->type()},
                                  {g.uniqueName(name)}, {}, loc);
        return g.appendOp(kind, {operand}, {v->type()}, {g.uniqueName(name)},
                          {}, loc);
      };
      Op *off = insert(next, ir::OpKind::Offload, v, v->name() + ".off");
      off->setPhase(Phase::Fwd);
      off->setStage(maker->stage());
      ++stats.offloadedValues;
      stats.offloadedBytes += v->type().byteSize();
      for (int k = 0; k < 2; ++k) {
        if (readers[k].empty())
          continue;
        Phase phase = k == 0 ? Phase::B : Phase::W;
        Op *first = readers[k].front().first;
        for (auto [r, idx] : readers[k])
          if (position.lookup(r) < position.lookup(first))
            first = r;
        // One layer ahead: the first op of this program from the layer
        // after the reader's (whose backward runs before it), when it
        // comes before the reader.
        Op *anchor = first;
        if (int ahead = layerOf(first) + 1; ahead > 0)
          if (auto it = firstOf.find({phase, ahead});
              it != firstOf.end() &&
              position.lookup(it->second) < position.lookup(first))
            anchor = it->second;
        Op *fetch = insert(anchor, ir::OpKind::Fetch, off->result(),
                           v->name() + (k == 0 ? ".fetch" : ".fetchw"));
        fetch->setPhase(phase);
        fetch->setStage(maker->stage());
        for (auto [r, idx] : readers[k])
          r->setOperand(idx, fetch->result());
      }
    }
}

int stripOffload(ir::Graph &g) {
  std::vector<Op *> fetches, offloads;
  for (const auto &op : g.ops()) {
    if (op->kind() == ir::OpKind::Fetch)
      fetches.push_back(op.get());
    else if (op->kind() == ir::OpKind::Offload)
      offloads.push_back(op.get());
  }
  if (fetches.empty() && offloads.empty())
    return 0;
  // The stash names the host copies W's Fetches read: it pins them until
  // it is made again without them.
  std::vector<Value *> stash;
  for (Value *v : g.stash())
    if (!v->definingOp() || (v->definingOp()->kind() != ir::OpKind::Offload &&
                             v->definingOp()->kind() != ir::OpKind::Fetch))
      stash.push_back(v);
  g.setStash(std::move(stash));
  for (Op *fetch : fetches) {
    Value *original = fetch->operand(0)->definingOp()->operand(0);
    g.replaceAllUsesWith(fetch->result(), original);
    g.eraseOp(fetch);
  }
  for (Op *off : offloads)
    g.eraseOp(off);
  g.setStash(computeStash(g));
  return int(fetches.size() + offloads.size());
}

} // namespace cleave::passes
