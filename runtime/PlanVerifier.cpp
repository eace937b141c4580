// verifyPlan: the checks a Plan must pass before it is written, and again
// when it is read back (runtime/PlanFile.h). They are what the executor
// relies on without checking: indices in range, sizes that agree, frame
// offsets inside their frames, kernels with the operands and attributes
// their ops declare. Errors say "invalid plan: ..." and name the stage, slot
// or instruction.
#include "runtime/PlanFile.h"
#include "runtime/PlanTypes.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

namespace cleave::runtime {

namespace {

bool validDType(ir::DType t) { return size_t(t) <= size_t(ir::DType::Bool); }

std::string instrWhere(const StagePlan &s, int phase, size_t i,
                       const Instr &in) {
  std::string w = llvm::formatv("stage {0} {1} instr {2}", s.index,
                                phaseName(Phase(phase)), i)
                      .str();
  if (!in.loc.empty())
    w += " (" + in.loc + ")";
  return w;
}

// Attributes an op declares must have the declared kind, and required ones
// must be present; kernels read only declared attributes, so others are
// carried along unchecked.
llvm::Error checkDeclaredAttributes(const ir::OpInfo &info,
                                    const ir::AttrMap &attrs) {
  for (const ir::AttrSpec &spec : info.attrs) {
    auto it = attrs.find(spec.name);
    if (it == attrs.end()) {
      if (spec.required())
        return fail("missing required attribute '" + spec.name + "'");
      continue;
    }
    if (it->second.kind() != spec.kind)
      return fail(llvm::formatv("attribute '{0}' must be of kind {1}, not {2}",
                                spec.name, ir::attrKindName(spec.kind),
                                ir::attrKindName(it->second.kind()))
                      .str());
  }
  for (const auto &[name, a] : attrs)
    if (a.kind() == ir::AttrKind::Tensor && !a.getTensor())
      return fail("attribute '" + name + "' has no tensor");
  return llvm::Error::success();
}

llvm::Error verifyInstr(const Plan &plan, const StagePlan &s, int phase,
                        size_t i, const Instr &in) {
  int nslots = int(s.slots.size());
  auto where = [&] { return instrWhere(s, phase, i, in); };
  auto checkSlots = [&](const std::vector<int> &v,
                        const char *what) -> llvm::Error {
    for (int x : v)
      if (x < 0 || x >= nslots)
        return invalidPlan(llvm::formatv("{0}: {1} slot {2} out of range (the "
                                         "stage has {3} slots)",
                                         where(), what, x, nslots));
    return llvm::Error::success();
  };
  if (llvm::Error e = checkSlots(in.inputs, "input"))
    return e;
  if (llvm::Error e = checkSlots(in.outputs, "output"))
    return e;
  auto checkPeer = [&]() -> llvm::Error {
    if (in.peer < 0 || in.peer >= int(plan.stages.size()) || in.peer == s.index)
      return invalidPlan(
          llvm::formatv("{0}: bad peer stage {1}", where(), in.peer));
    return llvm::Error::success();
  };
  switch (in.kind) {
  case InstrKind::Kernel: {
    if (size_t(in.op) >= ir::allOps().size())
      return invalidPlan(where() + ": unknown op");
    const ir::OpInfo &info = ir::opInfo(in.op);
    int n = int(in.inputs.size()), r = int(in.outputs.size());
    if (n < info.minOperands || (info.maxOperands >= 0 && n > info.maxOperands))
      return invalidPlan(
          llvm::formatv("{0}: {1} has {2} inputs", where(), info.name, n));
    if (r < info.minResults || (info.maxResults >= 0 && r > info.maxResults))
      return invalidPlan(
          llvm::formatv("{0}: {1} has {2} outputs", where(), info.name, r));
    if (llvm::Error e = checkDeclaredAttributes(info, in.attrs))
      return invalidPlan(where() + ": " + std::string(info.name) + ": " +
                         llvm::toString(std::move(e)));
    // Host slots: an Offload writes one, a Fetch reads one, nothing else
    // touches them.
    auto host = [&](int slot) {
      return s.slots[size_t(slot)].kind == SlotKind::HostTemp;
    };
    bool offload = in.op == ir::OpKind::Offload, fetch = in.op == ir::OpKind::Fetch;
    for (int k = 0; k < n; ++k)
      if (host(in.inputs[k]) != fetch)
        return invalidPlan(where() + ": " + std::string(info.name) +
                           (fetch ? " must read a host slot"
                                  : " reads a host slot (only Fetch may)"));
    for (int k = 0; k < r; ++k)
      if (host(in.outputs[k]) != offload)
        return invalidPlan(where() + ": " + std::string(info.name) +
                           (offload
                                ? " must write a host slot"
                                : " writes a host slot (only Offload may)"));
    return llvm::Error::success();
  }
  case InstrKind::Send:
    if (in.inputs.size() != 1 || !in.outputs.empty())
      return invalidPlan(where() + ": a send takes one input and no outputs");
    return checkPeer();
  case InstrKind::Recv:
    if (!in.inputs.empty() || in.outputs.size() != 1)
      return invalidPlan(where() + ": a recv takes no inputs and one output");
    return checkPeer();
  }
  return invalidPlan(where() + ": unknown instruction kind");
}

llvm::Error verifyUpdates(const StagePlan &s, const char *what,
                          const std::vector<StateUpdate> &updates) {
  int nslots = int(s.slots.size());
  for (const StateUpdate &u : updates) {
    if (u.state < 0 || u.state >= nslots || u.value < 0 || u.value >= nslots)
      return invalidPlan(
          llvm::formatv("stage {0}: {1} update {2} <- {3} out of "
                        "range",
                        s.index, what, u.state, u.value));
    const Slot &st = s.slots[u.state], &v = s.slots[u.value];
    if (st.kind != SlotKind::State)
      return invalidPlan(llvm::formatv("stage {0}: {1} update of slot '{2}', "
                                       "which is not state",
                                       s.index, what, st.name));
    if (st.bytes != v.bytes)
      return invalidPlan(llvm::formatv("stage {0}: {1} update of slot '{2}' "
                                       "({3} bytes) from '{4}' ({5} bytes)",
                                       s.index, what, st.name, st.bytes, v.name,
                                       v.bytes));
  }
  return llvm::Error::success();
}


// What the executor allocates is bounded by the file: state and constants
// come from blobs (whose sizes the file bounds), accumulators are the size
// of the slot they sum, and a frame is no larger than its slots need
// (codegen packs them), so no header field alone can ask for memory.
llvm::Error verifyMemory(const StagePlan &s) {
  int64_t frameExtent = 0, stepExtent = 0; // where the slots end
  // Updates written into their state's bytes need no room in the step
  // frame (Plan.h's stepUpdatesInPlace): their offsets are not checked
  // against it. Plans from before 2026-12-05 still lay them out in it, so
  // they count towards what the frame may hold.
  const std::vector<int> inPlace = stepUpdatesInPlace(s);
  for (int i = 0; i < int(s.slots.size()); ++i) {
    const Slot &sl = s.slots[size_t(i)];
    if (sl.kind == SlotKind::StepTemp && inPlace[size_t(i)] >= 0) {
      if (sl.offset >= 0)
        stepExtent =
            std::max(stepExtent, sl.offset + (sl.bytes + 63) / 64 * 64);
      continue;
    }
    auto bad = [&](const llvm::Twine &msg) {
      return invalidPlan(
          llvm::formatv("stage {0} slot {1} '{2}': ", s.index, i, sl.name) +
          msg);
    };
    if (sl.kind == SlotKind::MicroTemp || sl.kind == SlotKind::StepTemp ||
        sl.kind == SlotKind::Input) {
      bool step = sl.kind == SlotKind::StepTemp;
      int64_t frame = step ? s.stepFrameBytes : s.frameBytes;
      if (sl.offset < 0 || sl.offset > frame - sl.bytes)
        return bad(llvm::formatv("offset {0} + {1} bytes is outside its "
                                 "frame ({2} bytes)",
                                 sl.offset, sl.bytes, frame));
      int64_t &extent = step ? stepExtent : frameExtent;
      extent = std::max(extent, sl.offset + (sl.bytes + 63) / 64 * 64);
    }
    if ((sl.kind == SlotKind::State || sl.kind == SlotKind::Const) &&
        sl.blob == -1)
      return bad("a state or constant slot without its blob");
    if (sl.kind == SlotKind::Accum &&
        std::none_of(s.slots.begin(), s.slots.end(),
                     [&](const Slot &o) { return o.accum == i; }))
      return bad("an accumulator no slot sums into");
  }
  if (s.frameBytes > frameExtent || s.stepFrameBytes > stepExtent)
    return invalidPlan(llvm::formatv("stage {0}: frames of {1} and {2} bytes "
                                     "where its slots need {3} and {4}",
                                     s.index, s.frameBytes, s.stepFrameBytes,
                                     frameExtent, stepExtent));
  return llvm::Error::success();
}

// The schedule must complete: every stage's actions, run in order with
// sends that never block, receives that wait for their message and the
// STEP action's vote, which waits for every stage's STEP, end on every
// stage with every message taken. Simulated over the messages alone, keyed
// as Comm keys them (source, destination, tag, microbatch; FIFO per key),
// with the sizes of both ends compared. A stage that can never go on is a
// plan that would hang: refused before the first step.
struct Message {
  int from, to;
  int64_t tag;
  int microbatch;
  bool operator<(const Message &o) const {
    return std::tie(from, to, tag, microbatch) <
           std::tie(o.from, o.to, o.tag, o.microbatch);
  }
};

struct SimOp {
  enum Kind { Send, Recv, Vote } kind;
  Message msg{};
  int64_t bytes = 0;
  size_t action = 0;
};

std::vector<SimOp> simOps(const StagePlan &s) {
  std::vector<SimOp> ops;
  for (size_t i = 0; i < s.actions.size(); ++i) {
    const Action &a = s.actions[i];
    std::vector<Phase> phases;
    switch (a.kind) {
    case ActionKind::F: phases = {Phase::F}; break;
    case ActionKind::B: phases = {Phase::B}; break;
    case ActionKind::W: phases = {Phase::W}; break;
    case ActionKind::BW: phases = {Phase::B, Phase::W}; break;
    case ActionKind::Step:
      ops.push_back({SimOp::Vote, {}, 0, i});
      phases = {Phase::Step};
      break;
    }
    for (Phase p : phases)
      for (const Instr &in : s.programs[int(p)]) {
        if (in.kind == InstrKind::Send)
          ops.push_back({SimOp::Send,
                         {s.index, in.peer, in.tag, a.microbatch},
                         s.slots[size_t(in.inputs[0])].bytes, i});
        else if (in.kind == InstrKind::Recv)
          ops.push_back({SimOp::Recv,
                         {in.peer, s.index, in.tag, a.microbatch},
                         s.slots[size_t(in.outputs[0])].bytes, i});
      }
  }
  return ops;
}

std::string actionText(const StagePlan &s, size_t i) {
  const Action &a = s.actions[i];
  if (a.kind == ActionKind::Step)
    return llvm::formatv("action {0} (STEP)", i).str();
  return llvm::formatv("action {0} ({1} of microbatch {2})", i,
                       actionKindName(a.kind), a.microbatch)
      .str();
}

// Several stages per rank: every stage on a rank, every rank with a stage,
// and each rank's program naming its own stages, each as often as it has
// actions before its STEP.
llvm::Error verifyPlacement(const Plan &plan) {
  int n = int(plan.stages.size());
  if (plan.stageRank.empty()) {
    if (!plan.rankPrograms.empty())
      return invalidPlan("the plan has rank programs but places no stages");
    return llvm::Error::success();
  }
  if (int(plan.stageRank.size()) != n)
    return invalidPlan(llvm::formatv("the plan places {0} stages on ranks, but "
                                     "has {1}",
                                     plan.stageRank.size(), n));
  for (int st = 0; st < n; ++st)
    if (plan.stageRank[size_t(st)] < 0 || plan.stageRank[size_t(st)] >= n)
      return invalidPlan(llvm::formatv("stage {0} is placed on rank {1}", st,
                                       plan.stageRank[size_t(st)]));
  int ranks = rankCount(plan);
  for (int r = 0; r < ranks; ++r)
    if (stagesOfRank(plan, r).empty())
      return invalidPlan(llvm::formatv("rank {0} runs no stage", r));
  if (int(plan.rankPrograms.size()) != ranks)
    return invalidPlan(llvm::formatv("the plan has {0} rank programs for {1} "
                                     "ranks",
                                     plan.rankPrograms.size(), ranks));
  std::vector<size_t> count(size_t(n), 0);
  for (int r = 0; r < ranks; ++r)
    for (int st : plan.rankPrograms[size_t(r)]) {
      if (st < 0 || st >= n || plan.stageRank[size_t(st)] != r)
        return invalidPlan(llvm::formatv("rank {0}'s program names stage {1}, "
                                         "which it does not run",
                                         r, st));
      ++count[size_t(st)];
    }
  for (int st = 0; st < n; ++st) {
    size_t work = 0;
    for (const Action &a : plan.stages[size_t(st)].actions)
      work += a.kind != ActionKind::Step;
    if (count[size_t(st)] != work)
      return invalidPlan(llvm::formatv("rank {0}'s program runs {1} actions of "
                                       "stage {2}, which has {3}",
                                       plan.stageRank[size_t(st)],
                                       count[size_t(st)], st, work));
  }
  return llvm::Error::success();
}

llvm::Error verifySchedule(const Plan &plan) {
  int n = int(plan.stages.size());
  std::vector<std::vector<SimOp>> ops;
  for (const StagePlan &s : plan.stages) {
    int steps = 0;
    for (const Action &a : s.actions)
      steps += a.kind == ActionKind::Step;
    if (steps != 1)
      return invalidPlan(llvm::formatv("stage {0} has {1} STEP actions; every "
                                       "stage has one",
                                       s.index, steps));
    ops.push_back(simOps(s));
  }
  std::map<Message, std::deque<int64_t>> inFlight; // sizes, in send order
  std::vector<size_t> at(size_t(n), 0);
  std::vector<bool> voted(size_t(n), false);
  // Each rank runs its program (one stage's actions, or several stages'
  // interleaved) in order; once it is through, each of its stages' updates
  // goes on by itself (the runtime runs them in turn, none waiting for
  // another).
  int ranks = rankCount(plan);
  std::vector<std::vector<int>> programs(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    if (size_t(r) < plan.rankPrograms.size()) {
      programs[size_t(r)] = plan.rankPrograms[size_t(r)];
      continue;
    }
    for (const Action &a : plan.stages[size_t(r)].actions)
      if (a.kind != ActionKind::Step)
        programs[size_t(r)].push_back(r);
  }
  std::vector<size_t> pos(size_t(ranks), 0);   // by rank: program entry
  std::vector<size_t> action(size_t(n), 0);    // by stage: its next action
  // Runs stage st's ops while they belong to action `upTo` (SIZE_MAX: any);
  // false when it blocks on a message or the vote.
  auto runOps = [&](int st, size_t upTo, bool &moved) -> llvm::Expected<bool> {
    const std::vector<SimOp> &list = ops[size_t(st)];
    size_t &i = at[size_t(st)];
    for (; i < list.size(); ++i) {
      const SimOp &op = list[i];
      if (upTo != SIZE_MAX && op.action != upTo)
        return true;
      if (op.kind == SimOp::Send) {
        inFlight[op.msg].push_back(op.bytes);
      } else if (op.kind == SimOp::Recv) {
        auto it = inFlight.find(op.msg);
        if (it == inFlight.end() || it->second.empty())
          return false;
        if (it->second.front() != op.bytes)
          return invalidPlan(llvm::formatv(
              "stage {0} {1} receives {2} bytes from stage {3} (tag {4}) "
              "but that stage sends {5}",
              st, actionText(plan.stages[size_t(st)], op.action), op.bytes,
              op.msg.from, op.msg.tag, it->second.front()));
        it->second.pop_front();
      } else {
        // The vote: every stage at its STEP (or past it) before any goes on.
        bool all = true;
        for (int o = 0; o < n && all; ++o) {
          size_t k = at[size_t(o)];
          const std::vector<SimOp> &other = ops[size_t(o)];
          all = voted[size_t(o)] ||
                (k < other.size() && other[k].kind == SimOp::Vote);
        }
        if (!all)
          return false;
        voted[size_t(st)] = true;
      }
      moved = true;
    }
    return true;
  };
  for (;;) {
    bool moved = false;
    for (int r = 0; r < ranks; ++r) {
      const std::vector<int> &prog = programs[size_t(r)];
      bool blocked = false;
      while (pos[size_t(r)] < prog.size() && !blocked) {
        int st = prog[pos[size_t(r)]];
        auto through = runOps(st, action[size_t(st)], moved);
        if (!through)
          return through.takeError();
        if (!*through) {
          blocked = true;
          break;
        }
        ++action[size_t(st)];
        ++pos[size_t(r)];
        moved = true;
      }
      if (blocked || pos[size_t(r)] < prog.size())
        continue;
      for (int st : stagesOfRank(plan, r)) {
        auto through = runOps(st, SIZE_MAX, moved);
        if (!through)
          return through.takeError();
      }
    }
    bool done = true;
    for (int st = 0; st < n; ++st)
      done = done && at[size_t(st)] == ops[size_t(st)].size();
    if (done)
      break;
    if (moved)
      continue;
    // Stuck: name a receive whose message its sender never sends (the
    // cause), else the first stage waiting (on a stage that waits too).
    std::optional<std::string> first;
    for (int st = 0; st < n; ++st) {
      const std::vector<SimOp> &list = ops[size_t(st)];
      if (at[size_t(st)] == list.size())
        continue;
      const SimOp &op = list[at[size_t(st)]];
      if (op.kind != SimOp::Recv)
        continue;
      const std::vector<SimOp> &sender = ops[size_t(op.msg.from)];
      bool sentLater = std::any_of(
          sender.begin() + long(at[size_t(op.msg.from)]), sender.end(),
          [&](const SimOp &x) {
            return x.kind == SimOp::Send && !(x.msg < op.msg) &&
                   !(op.msg < x.msg);
          });
      std::string text = llvm::formatv(
          "the schedule cannot complete: stage {0} {1} waits for a message "
          "from stage {2} (tag {3}, {4}) {5}",
          st, actionText(plan.stages[size_t(st)], op.action), op.msg.from,
          op.msg.tag,
          op.msg.microbatch < 0
              ? std::string("for the step")
              : "microbatch " + std::to_string(op.msg.microbatch),
          sentLater ? "that stage cannot get to" : "that is never sent");
      if (!sentLater)
        return invalidPlan(text);
      if (!first)
        first = text;
    }
    if (first)
      return invalidPlan(*first);
    return invalidPlan("the schedule cannot complete: the stages wait for each "
                       "other at STEP");
  }
  for (const auto &[msg, sizes] : inFlight)
    if (!sizes.empty())
      return invalidPlan(llvm::formatv(
          "stage {0} sends stage {1} a message (tag {2}, microbatch {3}) that "
          "no receive takes",
          msg.from, msg.to, msg.tag, msg.microbatch));
  return llvm::Error::success();
}

} // namespace

llvm::Error verifyPlan(const Plan &plan, llvm::ArrayRef<uint64_t> blobSizes) {
  if (plan.microbatches < 1)
    return invalidPlan(llvm::formatv("{0} microbatches", plan.microbatches));
  if (plan.dataParallel < 1)
    return invalidPlan(
        llvm::formatv("{0} data-parallel replicas", plan.dataParallel));
  for (const PlanInput &in : plan.inputs)
    if (!validDType(in.dtype) || !denseBytes(in.dtype, in.shape))
      return invalidPlan("input '" + in.name + "' has a bad type");
  int nstages = int(plan.stages.size());
  for (int si = 0; si < nstages; ++si) {
    const StagePlan &s = plan.stages[si];
    if (s.index != si)
      return invalidPlan(
          llvm::formatv("stage {0} says it is stage {1}", si, s.index));
    if (s.frameBytes < 0 || s.stepFrameBytes < 0 || s.hostFrameBytes < 0)
      return invalidPlan(llvm::formatv("stage {0}: negative frame size", si));
    int nslots = int(s.slots.size());
    const std::vector<int> inPlace = stepUpdatesInPlace(s);
    for (int i = 0; i < nslots; ++i) {
      const Slot &sl = s.slots[i];
      auto bad = [&](const llvm::Twine &msg) {
        return invalidPlan(
            llvm::formatv("stage {0} slot {1} '{2}': ", si, i, sl.name) + msg);
      };
      if (!validDType(sl.dtype) ||
          uint8_t(sl.kind) > uint8_t(SlotKind::HostTemp))
        return bad("bad dtype or kind");
      std::optional<int64_t> bytes = denseBytes(sl.dtype, sl.shape);
      if (!bytes || *bytes != sl.bytes)
        return bad(llvm::formatv("{0} bytes for {1}", sl.bytes,
                                 typeText(sl.dtype, sl.shape)));
      if ((sl.kind == SlotKind::MicroTemp || sl.kind == SlotKind::StepTemp ||
           sl.kind == SlotKind::HostTemp) &&
          !(sl.kind == SlotKind::StepTemp && inPlace[size_t(i)] >= 0)) {
        int64_t frame = sl.kind == SlotKind::MicroTemp ? s.frameBytes
                        : sl.kind == SlotKind::HostTemp ? s.hostFrameBytes
                                                        : s.stepFrameBytes;
        if (sl.offset < 0 || sl.offset > frame - sl.bytes)
          return bad(llvm::formatv("offset {0} + {1} bytes is outside its "
                                   "frame ({2} bytes)",
                                   sl.offset, sl.bytes, frame));
      }
      if (sl.blob != -1) {
        if (sl.kind != SlotKind::State && sl.kind != SlotKind::Const)
          return bad("only state and const slots have blobs");
        if (sl.blob < 0 || size_t(sl.blob) >= blobSizes.size())
          return bad(llvm::formatv("blob {0} out of range ({1} blobs)", sl.blob,
                                   blobSizes.size()));
        if (blobSizes[sl.blob] != uint64_t(sl.bytes))
          return bad(llvm::formatv("its blob {0} has {1} bytes, not {2}",
                                   sl.blob, blobSizes[sl.blob], sl.bytes));
      }
      if (sl.accum != -1) {
        if (sl.kind != SlotKind::MicroTemp)
          return bad("only micro slots have accumulators");
        if (sl.accum < 0 || sl.accum >= nslots ||
            s.slots[sl.accum].kind != SlotKind::Accum ||
            s.slots[sl.accum].bytes != sl.bytes)
          return bad(llvm::formatv("bad accumulator slot {0}", sl.accum));
      }
    }
    for (int p = 0; p < kNumPhases; ++p)
      for (size_t i = 0; i < s.programs[p].size(); ++i)
        if (llvm::Error e = verifyInstr(plan, s, p, i, s.programs[p][i]))
          return e;
    if (llvm::Error e = verifyUpdates(s, "forward", s.fwdUpdates))
      return e;
    if (llvm::Error e = verifyUpdates(s, "step", s.stepUpdates))
      return e;
    for (const Action &a : s.actions) {
      if (uint8_t(a.kind) > uint8_t(ActionKind::Step))
        return invalidPlan(llvm::formatv("stage {0}: bad action kind", si));
      bool ok = a.kind == ActionKind::Step
                    ? a.microbatch == -1
                    : a.microbatch >= 0 && a.microbatch < plan.microbatches;
      if (!ok)
        return invalidPlan(
            llvm::formatv("stage {0}: action {1} of microbatch {2}", si,
                          actionKindName(a.kind), a.microbatch));
    }
    if (s.lossSlot < -1 || s.lossSlot >= nslots)
      return invalidPlan(llvm::formatv("stage {0}: loss slot {1} out of range",
                                       si, s.lossSlot));
    if (s.accuracyScoresSlot != -1 || s.accuracyLabelsSlot != -1) {
      // The executor reads them after F: in range, in the microbatch
      // frame, float scores [N, C, d...] and integer labels [N, d...].
      int sc = s.accuracyScoresSlot, lb = s.accuracyLabelsSlot;
      bool ok = sc >= 0 && sc < nslots && lb >= 0 && lb < nslots &&
                s.lossSlot >= 0;
      if (ok) {
        const Slot &a = s.slots[size_t(sc)], &b = s.slots[size_t(lb)];
        ok = (a.dtype == ir::DType::F32 || a.dtype == ir::DType::F64) &&
             (b.dtype == ir::DType::I64 || b.dtype == ir::DType::I32) &&
             a.shape.size() >= 2 && b.shape.size() + 1 == a.shape.size() &&
             b.shape[0] == a.shape[0] && a.shape[1] > 0;
        for (size_t d = 2; ok && d < a.shape.size(); ++d)
          ok = b.shape[d - 1] == a.shape[d];
      }
      if (!ok)
        return invalidPlan(llvm::formatv(
            "stage {0}: accuracy slots {1} and {2} are not class scores "
            "[N, C, ...] and labels [N, ...]",
            si, sc, lb));
    }
    // W batching: what planWBatch decides for this stage, or nothing. The
    // executor trusts the record, so a file's must be exactly that.
    if (s.wBatch || !s.wBatchProduct.empty() || !s.wBatchSummed.empty() ||
        s.wBatchScratchBytes != 0) {
      StagePlan expected = s;
      planWBatch(expected);
      if (!s.wBatch || !expected.wBatch ||
          expected.wBatchProduct != s.wBatchProduct ||
          expected.wBatchSummed != s.wBatchSummed ||
          expected.wBatchScratchBytes != s.wBatchScratchBytes)
        return invalidPlan(
            llvm::formatv("stage {0}: the W batching record is not "
                          "what its W program and actions give",
                          si));
    }
    for (size_t i = 0; i + 1 < s.actions.size(); ++i)
      if (s.actions[i].kind == ActionKind::Step)
        return invalidPlan(
            llvm::formatv("stage {0}: STEP is action {1} of {2}; "
                          "it must be the last",
                          si, i, s.actions.size()));
  }
  return verifyPlacement(plan);
}

llvm::Error verifyRunnable(const Plan &plan) {
  for (const StagePlan &s : plan.stages)
    if (auto e = verifyMemory(s))
      return e;
  return verifySchedule(plan);
}

llvm::Error verifyPlan(const Plan &plan) {
  std::vector<uint64_t> sizes;
  for (const Blob &b : plan.blobs)
    sizes.push_back(b.byteSize());
  return verifyPlan(plan, sizes);
}

} // namespace cleave::runtime
