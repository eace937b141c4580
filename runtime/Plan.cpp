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

} // namespace cleave::runtime
