// Under mpirun, each process loads only its own stages of a plan: world
// rank w is pipeline rank w % P of replica w / P (P ranks, each running one
// stage, or several with cleavec --chunks). loadPlanForRank checks that the
// process count is the plan's P x D, loads the rank's stages, and makes its
// groups: the replica's pipeline (ranks = pipeline ranks) and, with
// replicas, each stage's data-parallel group (ranks = replicas).
#pragma once

#include "runtime/Plan.h"
#include "runtime/comm/MpiComm.h"
#include "support/TrustedPaths.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime {

struct RankPlan {
  Plan plan; // with this rank's stages loaded
  int replica = 0, rank = 0;
  std::vector<int> stages; // this rank's (several with cleavec --chunks)
  int stage = 0;           // the first of them
  // Sub-communicators of the world: destroyed before it (declared after).
  // pipe: the replica's pipeline, ranks = pipeline ranks; groups[k]:
  // stages[k]'s data-parallel group (none with one replica).
  std::unique_ptr<MpiComm> pipe;
  std::vector<std::unique_ptr<MpiComm>> groups;
};

// A collective of the world. Errors follow runtime::agree: one process gets
// the message (the first rank that could read the plan, for a process count
// that does not fit it), the others a ReportedElsewhere.
llvm::Expected<RankPlan>
loadPlanForRank(const std::string &path, MpiComm &world,
                const support::TrustedFolders &trusted = {});

// Under mpirun each process reads the plan and flags it was given; a rank
// with another plan (another split, other hyperparameters, bf16) or other
// run flags would train something else without a word. A collective:
// every rank's digests of its plan file's header and of `runFlags` (the
// flags that change results, as text) meet on rank 0 before the first
// step, and any difference is one line naming the first rank that differs.
llvm::Error checkRanksAgree(MpiComm &world, const std::string &planPath,
                            const std::string &runFlags);

} // namespace cleave::runtime
