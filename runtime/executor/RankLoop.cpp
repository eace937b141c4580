// The executor's rank loop (runtime/Executor.h): a rank's stages driven
// through a step, and one thread per rank in one process.
#include "runtime/ExecutorSupport.h"
#include "support/CpuShare.h"

namespace cleave::runtime {

using namespace detail;

llvm::Error runPipelineThreads(std::vector<StageExecutor *> stages,
                               int64_t step, const DataFn &data) {
  std::vector<DataFn> each(stages.size(), data);
  return runPipelineThreads(std::move(stages), step, each);
}

llvm::Error runPipelineThreads(std::vector<StageExecutor *> stages,
                               int64_t step, const std::vector<DataFn> &data) {
  std::vector<RankWork> ranks;
  for (size_t i = 0; i < stages.size(); ++i)
    ranks.push_back({{stages[i]}, {data[i]}, {}});
  return runRankThreads(ranks, step);
}

namespace {

llvm::Error stageFailed(const StageExecutor &ex, llvm::Error e) {
  return fail(llvm::formatv("stage {0}: {1}", ex.stage(),
                            llvm::toString(std::move(e))));
}

// One step of the rank's stages on this thread.
llvm::Error runRankStepOn(const RankWork &work, int64_t step) {
  const auto &stages = work.stages;
  if (stages.size() == 1) {
    if (auto e = stages[0]->runStep(step, work.data[0]))
      return stageFailed(*stages[0], std::move(e));
    return llvm::Error::success();
  }
  std::map<int, size_t> local; // stage -> index in `stages`
  for (size_t i = 0; i < stages.size(); ++i) {
    local[stages[i]->stage()] = i;
    stages[i]->beginStep(step, work.data[i]);
  }
  std::vector<size_t> cursor(stages.size(), 0);
  for (size_t k = 0; k < work.program.size();) {
    auto it = local.find(work.program[k]);
    if (it == local.end()) // verifyPlan rules it out
      return fail(llvm::formatv("the rank's program names stage {0}, which "
                                "it does not run",
                                work.program[k]));
    size_t run = 1;
    while (k + run < work.program.size() && work.program[k + run] == it->first)
      ++run;
    StageExecutor &ex = *stages[it->second];
    if (auto e = ex.runActions(cursor[it->second], run))
      return stageFailed(ex, std::move(e));
    cursor[it->second] += run;
    k += run;
  }
  // The updates: every stage sends what it owes first, then they run as
  // far as each can, in turn, until all are done.
  for (StageExecutor *ex : stages)
    if (ex->hasStepAction())
      if (auto e = ex->beginUpdate())
        return stageFailed(*ex, std::move(e));
  std::vector<StageExecutor *> pending;
  for (StageExecutor *ex : stages)
    if (ex->hasStepAction())
      pending.push_back(ex);
  double timeout = 0;
  for (StageExecutor *ex : stages)
    timeout = std::max(timeout, ex->comm().timeout());
  auto idleSince = Clock::now();
  for (int polls = 0; !pending.empty();) {
    bool moved = false;
    for (size_t i = 0; i < pending.size();) {
      auto done = pending[i]->continueUpdate(/*wait=*/false);
      if (!done)
        return stageFailed(*pending[i], done.takeError());
      if (*done) {
        pending.erase(pending.begin() + long(i));
        moved = true;
      } else {
        ++i;
      }
    }
    if (moved || pending.empty()) {
      polls = 0;
      idleSince = Clock::now();
      continue;
    }
    // Every stage left waits for another rank. Past the timeout, wait in
    // the first one's recv, which reports the timeout as a recv does.
    if (timeout > 0 && secondsSince(idleSince) > timeout) {
      auto done = pending[0]->continueUpdate(/*wait=*/true);
      if (!done)
        return stageFailed(*pending[0], done.takeError());
      pending.erase(pending.begin());
      continue;
    }
    if (++polls > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return llvm::Error::success();
}

} // namespace

llvm::Error runRankStep(const RankWork &work, int64_t step) {
  // The thread's wait for a core over the step, kept on the rank's first
  // stage: what a shared machine adds to the planned step.
  std::optional<double> waitedBefore = support::threadCoreWaitSeconds();
  llvm::Error e = runRankStepOn(work, step);
  if (!e && waitedBefore && !work.stages.empty())
    if (std::optional<double> waited = support::threadCoreWaitSeconds())
      work.stages[0]->setCoreWait(std::max(0.0, *waited - *waitedBefore));
  return e;
}

llvm::Error runRankThreads(const std::vector<RankWork> &ranks, int64_t step) {
  std::mutex mu;
  std::optional<std::string> first;
  auto run = [&](size_t i) {
    llvm::Error e = runRankStep(ranks[i], step);
    if (!e)
      return;
    std::string msg = llvm::toString(std::move(e));
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!first)
        first = msg;
    }
    // Wake every stage blocked on a message that will not come.
    for (const RankWork &r : ranks)
      for (StageExecutor *other : r.stages) {
        other->comm().abort(msg);
        if (other->dataParallel())
          other->dataParallel()->abort(msg);
      }
  };
  // The first rank runs on the calling thread, which holds a core already:
  // a new thread has to be given one, and beside a busy process that took
  // a millisecond or more at the start of every step.
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (size_t i = 1; i < ranks.size(); ++i)
    threads.emplace_back(run, i);
  if (!ranks.empty())
    run(0);
  for (std::thread &t : threads)
    t.join();
  if (first)
    return fail(*first);
  return llvm::Error::success();
}

} // namespace cleave::runtime
