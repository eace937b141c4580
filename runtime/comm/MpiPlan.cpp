#include "runtime/comm/MpiPlan.h"

#include "runtime/PlanFile.h"
#include "support/Checksum.h"
#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::runtime {

llvm::Expected<RankPlan>
loadPlanForRank(const std::string &path, MpiComm &world,
                const support::TrustedFolders &trusted) {
  int rank = world.rank(), size = world.size();
  // The process count decides first: a rank past the plan's last rank fails
  // to load (it may be a later replica's, loaded again below), but a
  // mismatch is the error to report.
  auto planOr = readPlanFileForRank(path, rank, trusted);
  double stages = 0, replicas = 0, ranks = 0;
  std::optional<std::string> loadError;
  if (planOr) {
    stages = double(planOr->stages.size());
    replicas = double(planOr->dataParallel);
    ranks = double(rankCount(*planOr));
  } else {
    loadError = llvm::toString(planOr.takeError());
  }
  auto loaded = world.allGather({stages, replicas, ranks});
  if (!loaded)
    return world.failAlone(loaded.takeError());
  int p = 0, d = 1, s = 0;
  for (int r = 0; r < size; ++r) {
    double st = (*loaded)[size_t(3 * r)], reps = (*loaded)[size_t(3 * r + 1)],
           rk = (*loaded)[size_t(3 * r + 2)];
    if (st <= 0)
      continue;
    if (rk * reps != size) { // the first rank that loaded says so
      if (r != rank)
        return llvm::make_error<ReportedElsewhere>();
      std::string procs = llvm::formatv("mpirun started {0} {1}", size,
                                        size == 1 ? "process" : "processes");
      std::string layout =
          rk != st ? llvm::formatv("{0} stages on {1} ranks", int64_t(st),
                                   int64_t(rk))
                         .str()
                   : llvm::formatv("{0} stages", int64_t(st)).str();
      return fail(reps > 1
                      ? llvm::formatv("the plan has {0} x {1} replicas but "
                                      "{2}: use mpirun -np {3}",
                                      layout, int64_t(reps), procs,
                                      int64_t(rk * reps))
                            .str()
                      : llvm::formatv("the plan has {0} but {1}: use mpirun "
                                      "-np {2}",
                                      layout, procs, int64_t(rk))
                            .str());
    }
    p = int(rk);
    d = int(reps);
    s = int(st);
    break;
  }
  RankPlan out;
  out.replica = p > 0 ? rank / p : 0;
  out.rank = p > 0 ? rank % p : rank;
  // A later replica's rank loads its own stages now.
  if (p > 0 && rank >= p) {
    planOr = readPlanFileForRank(path, out.rank, trusted);
    loadError.reset();
    if (!planOr)
      loadError = llvm::toString(planOr.takeError());
  }
  if (auto e = agree(world, loadError ? fail(*loadError)
                                      : llvm::Error::success()))
    return std::move(e);
  out.plan = std::move(*planOr);
  if (int(out.plan.stages.size()) != s || rankCount(out.plan) != p ||
      out.plan.dataParallel != d)
    return world.failAlone(fail(path + ": the plan changed while loading"));
  out.stages = stagesOfRank(out.plan, out.rank);
  out.stage = out.stages.front();
  world.setMicrobatches(out.plan.microbatches);
  auto pipe = world.split(out.replica, out.rank);
  if (!pipe)
    return world.failAlone(pipe.takeError());
  out.pipe = std::move(*pipe);
  if (d > 1) {
    // One data-parallel group per stage: every process splits as often as
    // the rank with the most stages has, a stage it lacks in a group of
    // its own.
    size_t most = 0;
    for (int r = 0; r < p; ++r)
      most = std::max(most, stagesOfRank(out.plan, r).size());
    for (size_t k = 0; k < most; ++k) {
      int color = k < out.stages.size() ? out.stages[k] : s + rank;
      auto group = world.split(color, out.replica);
      if (!group)
        return world.failAlone(group.takeError());
      if (k < out.stages.size())
        out.groups.push_back(std::move(*group));
    }
  }
  return out;
}

llvm::Error checkRanksAgree(MpiComm &world, const std::string &planPath,
                            const std::string &runFlags) {
  auto planDigest = planHeaderDigest(planPath);
  uint64_t p = planDigest ? *planDigest : 0; // it loaded a moment ago
  if (!planDigest)
    llvm::consumeError(planDigest.takeError());
  uint64_t f = support::fnv1a64(runFlags.data(), runFlags.size(),
                                support::kFnv1a64Basis);
  // Halves: a double holds 32 bits exactly.
  auto all = world.allGather({double(p >> 32), double(p & 0xffffffffu),
                              double(f >> 32), double(f & 0xffffffffu)});
  if (!all)
    return world.failAlone(all.takeError());
  std::string msg;
  if (world.rank() == 0)
    for (int r = 1; r < world.size() && msg.empty(); ++r) {
      const double *mine = all->data(), *theirs = all->data() + 4 * r;
      if (theirs[0] != mine[0] || theirs[1] != mine[1])
        msg = llvm::formatv("rank {0} was given another plan than rank 0 "
                            "('{1}'): every rank must run the same plan file",
                            r, planPath)
                  .str();
      else if (theirs[2] != mine[2] || theirs[3] != mine[3])
        msg = llvm::formatv("rank {0} was given other flags than rank 0: "
                            "every rank must run with the same flags "
                            "(--threads, --quiet and --comm-timeout may "
                            "differ)",
                            r)
                  .str();
    }
  return agree(world, msg.empty() ? llvm::Error::success() : fail(msg));
}

} // namespace cleave::runtime
