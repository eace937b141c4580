#include "runtime/Plan.h"

#include "support/Checksum.h"

#include <algorithm>

namespace cleave::runtime {

const char *slotKindName(SlotKind k) {
  switch (k) {
  case SlotKind::Input: return "input";
  case SlotKind::State: return "state";
  case SlotKind::Const: return "const";
  case SlotKind::MicroTemp: return "micro";
  case SlotKind::StepTemp: return "step";
  case SlotKind::Accum: return "accum";
  case SlotKind::HostTemp: return "host";
  }
  return "?";
}

const char *phaseName(Phase p) {
  switch (p) {
  case Phase::F: return "F";
  case Phase::B: return "B";
  case Phase::W: return "W";
  case Phase::Step: return "STEP";
  }
  return "?";
}

const char *actionKindName(ActionKind k) {
  switch (k) {
  case ActionKind::F: return "F";
  case ActionKind::B: return "B";
  case ActionKind::W: return "W";
  case ActionKind::BW: return "BW";
  case ActionKind::Step: return "STEP";
  }
  return "?";
}

int rankCount(const Plan &plan) {
  if (plan.stageRank.empty())
    return int(plan.stages.size());
  int n = 0;
  for (int r : plan.stageRank)
    n = std::max(n, r + 1);
  return n;
}

int rankOfStage(const Plan &plan, int stage) {
  return plan.stageRank.empty() ? stage : plan.stageRank[size_t(stage)];
}

std::vector<int> stagesOfRank(const Plan &plan, int rank) {
  std::vector<int> out;
  for (int s = 0; s < int(plan.stages.size()); ++s)
    if (rankOfStage(plan, s) == rank)
      out.push_back(s);
  return out;
}

uint64_t fnv1a64(const void *data, size_t bytes) {
  return support::fnv1a64(data, bytes, support::kFnv1a64Basis);
}

std::vector<int> stepUpdatesInPlace(const StagePlan &sp) {
  int n = int(sp.slots.size());
  std::vector<int> alias(size_t(n), -1);
  const auto &prog = sp.programs[int(Phase::Step)];
  std::vector<int> writer(size_t(n), -1), writes(size_t(n), 0),
      lastRead(size_t(n), -1);
  auto valid = [&](int s) { return s >= 0 && s < n; };
  for (size_t i = 0; i < prog.size(); ++i) {
    for (int s : prog[i].inputs)
      if (valid(s))
        lastRead[size_t(s)] = int(i);
    for (int s : prog[i].outputs)
      if (valid(s)) {
        writer[size_t(s)] = int(i);
        ++writes[size_t(s)];
      }
  }
  for (const StateUpdate &u : sp.stepUpdates) {
    if (!valid(u.value) || !valid(u.state))
      continue;
    int w = writer[size_t(u.value)];
    if (w < 0 || writes[size_t(u.value)] != 1 || writes[size_t(u.state)] != 0)
      continue;
    const Instr &in = prog[size_t(w)];
    if (in.kind != InstrKind::Kernel ||
        (in.op != ir::OpKind::SGD && in.op != ir::OpKind::AdamW))
      continue;
    const Slot &value = sp.slots[size_t(u.value)],
               &state = sp.slots[size_t(u.state)];
    if (lastRead[size_t(u.state)] > w || value.kind != SlotKind::StepTemp ||
        value.dtype != state.dtype || value.bytes != state.bytes)
      continue;
    alias[size_t(u.value)] = u.state;
  }
  return alias;
}

} // namespace cleave::runtime
