// Under mpirun, each process loads only its own stage of a plan: world rank
// w runs stage w % P of replica w / P. loadPlanForRank checks that the
// process count is the plan's P x D, loads the rank's stage, and makes its
// groups: the replica's pipeline (ranks = stages) and, with replicas, the
// stage's data-parallel group (ranks = replicas).
#pragma once

#include "runtime/Plan.h"
#include "runtime/comm/MpiComm.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <string>

namespace cleave::runtime {

struct RankPlan {
  Plan plan; // with this rank's stage loaded
  int replica = 0, stage = 0;
  // Sub-communicators of the world: destroyed before it (declared after).
  std::unique_ptr<MpiComm> pipe, group; // group: null with one replica
};

// A collective of the world. Errors follow runtime::agree: one process gets
// the message (the first rank that could read the plan, for a process count
// that does not fit it), the others a ReportedElsewhere.
llvm::Expected<RankPlan> loadPlanForRank(const std::string &path,
                                         MpiComm &world);

} // namespace cleave::runtime
