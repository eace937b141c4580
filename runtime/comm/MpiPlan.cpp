#include "runtime/comm/MpiPlan.h"

#include "runtime/PlanFile.h"

#include "llvm/Support/FormatVariadic.h"

namespace cleave::runtime {

static llvm::Error fail(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

llvm::Expected<RankPlan> loadPlanForRank(const std::string &path,
                                         MpiComm &world) {
  int rank = world.rank(), size = world.size();
  // The process count decides first: a rank past the plan's last stage fails
  // to load (it may be a later replica's, loaded again below), but a
  // mismatch is the error to report.
  auto planOr = readPlanFile(path, rank);
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
  int p = 0, d = 1;
  for (int r = 0; r < size; ++r) {
    double s = (*loaded)[size_t(3 * r)], reps = (*loaded)[size_t(3 * r + 1)],
           rk = (*loaded)[size_t(3 * r + 2)];
    if (s <= 0)
      continue;
    if (rk != s) { // several stages per rank: the threaded run only
      if (r != rank)
        return llvm::make_error<ReportedElsewhere>();
      return fail(llvm::formatv(
                      "the plan runs {0} stages on {1} rank(s) (cleavec "
                      "--chunks); under mpirun each process runs one stage: "
                      "run it without mpirun (one thread per rank), or "
                      "compile it without --chunks",
                      int64_t(s), int64_t(rk))
                      .str());
    }
    if (s * reps != size) { // the first rank that loaded says so
      if (r != rank)
        return llvm::make_error<ReportedElsewhere>();
      std::string procs = llvm::formatv("mpirun started {0} {1}", size,
                                        size == 1 ? "process" : "processes");
      return fail(reps > 1
                      ? llvm::formatv("the plan has {0} stages x {1} replicas "
                                      "but {2}: use mpirun -np {3}",
                                      int64_t(s), int64_t(reps), procs,
                                      int64_t(s * reps))
                            .str()
                      : llvm::formatv("the plan has {0} stages but {1}: use "
                                      "mpirun -np {0}",
                                      int64_t(s), procs)
                            .str());
    }
    p = int(s);
    d = int(reps);
    break;
  }
  RankPlan out;
  out.replica = p > 0 ? rank / p : 0;
  out.stage = p > 0 ? rank % p : rank;
  // A later replica's rank loads its own stage now.
  if (p > 0 && rank >= p) {
    planOr = readPlanFile(path, out.stage);
    loadError.reset();
    if (!planOr)
      loadError = llvm::toString(planOr.takeError());
  }
  if (auto e = agree(world, loadError ? fail(*loadError)
                                      : llvm::Error::success()))
    return std::move(e);
  out.plan = std::move(*planOr);
  if (int(out.plan.stages.size()) != p || out.plan.dataParallel != d)
    return world.failAlone(fail(path + ": the plan changed while loading"));
  world.setMicrobatches(out.plan.microbatches);
  auto pipe = world.split(out.replica, out.stage);
  if (!pipe)
    return world.failAlone(pipe.takeError());
  out.pipe = std::move(*pipe);
  if (d > 1) {
    auto group = world.split(out.stage, out.replica);
    if (!group)
      return world.failAlone(group.takeError());
    out.group = std::move(*group);
  }
  return out;
}

} // namespace cleave::runtime
