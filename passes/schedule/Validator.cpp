#include "passes/schedule/Validator.h"

#include "passes/schedule/Simulator.h"

#include <set>

namespace cleave::passes::schedule {

namespace {

// Where a broken rule is: the stage and the action's index and name.
llvm::Error ruleBroken(int stage, size_t index, const Action &a,
                       const std::string &rule) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "stage " + std::to_string(stage) + ", action " + std::to_string(index) +
          " (" + actionName(a) + "): " + rule);
}

llvm::Error stageError(int stage, const std::string &rule) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "stage " + std::to_string(stage) + ": " +
                                     rule);
}

std::string mbText(const Action &a) {
  return "microbatch " + std::to_string(a.microbatch);
}

// Rule 1.
llvm::Error checkWellFormed(const Schedule &s, int stage) {
  const auto &list = s.actions[stage];
  for (size_t i = 0; i < list.size(); ++i) {
    const Action &a = list[i];
    if (a.kind == ActionKind::Step) {
      if (i + 1 != list.size())
        return ruleBroken(stage, i, a, "STEP must be the stage's last action");
      continue;
    }
    if (a.microbatch < 0 || a.microbatch >= s.microbatches)
      return ruleBroken(stage, i, a,
                        "microbatch " + std::to_string(a.microbatch) +
                            " is out of range (the step has " +
                            std::to_string(s.microbatches) + ")");
    if (!isComm(a.kind))
      continue;
    int peer = messagePeer(stage, a.kind);
    if (peer < 0 || peer >= s.stages)
      return ruleBroken(stage, i, a,
                        std::string(kindName(a.kind)) + " on the " +
                            (peer < 0 ? "first" : "last") +
                            " stage has no stage to talk to");
    if (a.peer != peer)
      return ruleBroken(stage, i, a,
                        std::string(kindName(a.kind)) + " names stage " +
                            std::to_string(a.peer) + ", but must go to stage " +
                            std::to_string(peer));
  }
  return llvm::Error::success();
}

// Rule 2: F before B before W (BW counts as B and W), each once.
llvm::Error checkMicrobatchOrder(const Schedule &s, int stage) {
  std::vector<bool> hasF(s.microbatches), hasB(s.microbatches),
      hasW(s.microbatches);
  const auto &list = s.actions[stage];
  for (size_t i = 0; i < list.size(); ++i) {
    const Action &a = list[i];
    if (isComm(a.kind) || a.kind == ActionKind::Step)
      continue;
    int mb = a.microbatch;
    auto kind = [&] { return std::string(kindName(a.kind)); };
    bool again = a.kind == ActionKind::F   ? hasF[mb]
                 : a.kind == ActionKind::B ? hasB[mb]
                 : a.kind == ActionKind::W ? hasW[mb]
                                           : hasB[mb] || hasW[mb];
    if (again)
      return ruleBroken(stage, i, a,
                        kind() + " of " + mbText(a) +
                            " again (each microbatch has one F, then one B "
                            "and one W or one BW)");
    if (a.kind != ActionKind::F && !hasF[mb])
      return ruleBroken(stage, i, a,
                        kind() + " of " + mbText(a) + " before its F");
    if (a.kind == ActionKind::W && !hasB[mb])
      return ruleBroken(stage, i, a, "W of " + mbText(a) + " before its B");
    hasF[mb] = hasF[mb] || a.kind == ActionKind::F;
    hasB[mb] = hasB[mb] || a.kind == ActionKind::B || a.kind == ActionKind::BW;
    hasW[mb] = hasW[mb] || a.kind == ActionKind::W || a.kind == ActionKind::BW;
  }
  // The backwards and the weight gradients in microbatch order: a stage
  // sums its gradients over the microbatches in that order, so that every
  // schedule gives the same bits (cleave-run refuses any other order).
  int nextB = 0, nextW = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action &a = list[i];
    bool b = a.kind == ActionKind::B || a.kind == ActionKind::BW;
    bool w = a.kind == ActionKind::W || a.kind == ActionKind::BW;
    if ((b && a.microbatch != nextB) || (w && a.microbatch != nextW))
      return ruleBroken(stage, i, a,
                        std::string(kindName(a.kind)) + " of " + mbText(a) +
                            " out of microbatch order (microbatch " +
                            std::to_string(b && a.microbatch != nextB ? nextB
                                                                      : nextW) +
                            " is next; gradients are summed in microbatch "
                            "order)");
    nextB += b;
    nextW += w;
  }
  for (int mb = 0; mb < s.microbatches; ++mb) {
    const char *missing = !hasF[mb] ? "F" : !hasB[mb] ? "B" : !hasW[mb] ? "W" : nullptr;
    if (missing)
      return stageError(stage, "microbatch " + std::to_string(mb) + " has no " +
                                   missing);
  }
  return llvm::Error::success();
}

// Where each message of a stage's list first and last appears, by kind
// and microbatch: rule 3 asks "is there one before (after) index i" once
// per action, in constant time (a scan per action made validation
// quadratic in the microbatches). Rule 1 has checked the microbatches.
class MessageIndex {
public:
  MessageIndex(const std::vector<Action> &list, int microbatches) {
    for (auto &v : first_)
      v.assign(size_t(microbatches), kNone);
    for (auto &v : last_)
      v.assign(size_t(microbatches), kNone);
    for (size_t i = 0; i < list.size(); ++i) {
      int k = slot(list[i].kind);
      if (k < 0)
        continue;
      size_t mb = size_t(list[i].microbatch);
      if (first_[k][mb] == kNone)
        first_[k][mb] = i;
      last_[k][mb] = i;
    }
  }
  // True if the list has `kind` of `mb` before (or after) index i.
  bool has(size_t i, ActionKind kind, int mb, bool before) const {
    int k = slot(kind);
    size_t f = first_[k][size_t(mb)], l = last_[k][size_t(mb)];
    if (f == kNone)
      return false;
    return before ? f < i : l > i;
  }

private:
  static constexpr size_t kNone = ~size_t(0);
  static int slot(ActionKind kind) {
    switch (kind) {
    case ActionKind::RecvF: return 0;
    case ActionKind::SendF: return 1;
    case ActionKind::RecvB: return 2;
    case ActionKind::SendB: return 3;
    default: return -1;
    }
  }
  std::vector<size_t> first_[4], last_[4];
};

// Rule 3: each F and backward has its messages on the right side of it.
llvm::Error checkMessagesAround(const Schedule &s, int stage) {
  const auto &list = s.actions[stage];
  MessageIndex messages(list, s.microbatches);
  bool first = stage == 0, last = stage == s.stages - 1;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action &a = list[i];
    bool fwd = a.kind == ActionKind::F;
    bool bwd = a.kind == ActionKind::B || a.kind == ActionKind::BW;
    if (!fwd && !bwd)
      continue;
    struct Need {
      bool applies;
      ActionKind kind;
      bool before;
    };
    Need needs[] = {{fwd && !first, ActionKind::RecvF, true},
                    {fwd && !last, ActionKind::SendF, false},
                    {bwd && !last, ActionKind::RecvB, true},
                    {bwd && !first, ActionKind::SendB, false}};
    for (const Need &n : needs)
      if (n.applies && !messages.has(i, n.kind, a.microbatch, n.before))
        return ruleBroken(
            stage, i, a,
            std::string(kindName(a.kind)) + " of " + mbText(a) + " has no " +
                kindName(n.kind) + " " + (n.before ? "from" : "to") +
                " stage " + std::to_string(messagePeer(stage, n.kind)) +
                (n.before ? " before it" : " after it"));
  }
  return llvm::Error::success();
}

// Rule 4. Rules 2 and 3 already demand both ends of every message each F
// and backward needs, so SENDs and RECVs pair up one to one as long as
// none is repeated.
llvm::Error checkMessagesOnce(const Schedule &s, int stage) {
  // By kind and microbatch (rule 1 has checked the microbatches).
  std::vector<bool> seen[4];
  for (auto &v : seen)
    v.assign(size_t(s.microbatches), false);
  const auto &list = s.actions[stage];
  for (size_t i = 0; i < list.size(); ++i) {
    ActionKind k = list[i].kind;
    if (!isComm(k))
      continue;
    int slot = k == ActionKind::RecvF   ? 0
               : k == ActionKind::SendF ? 1
               : k == ActionKind::RecvB ? 2
                                        : 3;
    size_t mb = size_t(list[i].microbatch);
    if (seen[slot][mb])
      return ruleBroken(stage, i, list[i],
                        actionName(list[i]) + " appears twice");
    seen[slot][mb] = true;
  }
  return llvm::Error::success();
}

// Rule 6.
llvm::Error checkMemory(const Schedule &s, int stage, int cap) {
  int held = 0;
  const auto &list = s.actions[stage];
  for (size_t i = 0; i < list.size(); ++i) {
    const Action &a = list[i];
    held += a.kind == ActionKind::F;
    held -= a.kind == ActionKind::W || a.kind == ActionKind::BW;
    if (held > cap)
      return ruleBroken(stage, i, a,
                        std::to_string(held) +
                            " microbatches of activations held, above the "
                            "memory cap of " +
                            std::to_string(cap));
  }
  return llvm::Error::success();
}

// A rank runs its stages' STEPs after all their other actions (the
// runtime updates a rank's stages together, after its last backward).
llvm::Error checkStepsLast(const Schedule &s) {
  if (s.order.empty())
    return llvm::Error::success();
  auto programs = rankPrograms(s);
  for (size_t r = 0; r < programs.size(); ++r) {
    bool stepped = false;
    for (const RankAction &ra : programs[r]) {
      const Action &a = s.actions[ra.stage][ra.index];
      if (a.kind == ActionKind::Step)
        stepped = true;
      else if (stepped)
        return ruleBroken(ra.stage, ra.index, a,
                          "rank " + std::to_string(r) +
                              " runs it after a STEP; a rank's STEPs come "
                              "after all its other actions");
    }
  }
  return llvm::Error::success();
}

} // namespace

llvm::Error validateSchedule(const Schedule &s, const PipelineCosts &costs,
                             std::optional<int> memCap) {
  if (!memCap)
    return validateSchedule(s, costs, HeldCap());
  return validateSchedule(s, costs, HeldCap(size_t(std::max(s.stages, 0)), *memCap));
}

llvm::Error validateSchedule(const Schedule &s, const PipelineCosts &costs,
                             const HeldCap &heldCap) {
  if (s.stages < 1 || s.microbatches < 1 || int(s.actions.size()) != s.stages)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        "a schedule needs at least 1 stage and 1 microbatch and one action "
        "list per stage");
  if (auto e = checkPlacement(s))
    return e;
  if (auto e = checkStepsLast(s))
    return e;
  for (int st = 0; st < s.stages; ++st) {
    if (auto e = checkWellFormed(s, st))
      return e;
    if (auto e = checkMicrobatchOrder(s, st))
      return e;
    if (auto e = checkMessagesAround(s, st))
      return e;
    if (auto e = checkMessagesOnce(s, st))
      return e;
  }
  auto sim = simulate(s, costs);
  if (!sim)
    return sim.takeError();
  for (int st = 0; st < s.stages && size_t(st) < heldCap.size(); ++st)
    if (auto e = checkMemory(s, st, heldCap[size_t(st)]))
      return e;
  return llvm::Error::success();
}

} // namespace cleave::passes::schedule
