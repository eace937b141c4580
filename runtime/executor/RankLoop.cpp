// The executor's rank loop (runtime/Executor.h): a rank's stages driven
// through a step, and one thread per rank in one process.
#include "runtime/ExecutorSupport.h"
#include "support/CpuShare.h"

#include <condition_variable>
#include <functional>
#include <memory>

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

namespace {

// The threads that run ranks 1, 2, ... of runRankThreads, kept from step
// to step. Made anew for every step, a rank's thread started 30 us after
// it was asked for, or, one time in ten on a 2-core AMD EPYC, only when
// the thread that made it next gave up its core (the new thread placed
// beside it: 2 ms), and the ranks' threads, new every step, kept landing
// on one core while the other idled: gpt-tiny's 2 x 2 stages under
// interleaved-1F1B-2BP received messages 300 to 900 us after they were
// sent, and steps took 8.4 or 10 ms by turns (8.2 kept; measured /
// simulated 1.07 to 1.01). Giving each rank's thread a core of its own
// did no better on a quiet machine and far worse beside a busy process
// (1.26 to 1.68 of simulated): the threads stay free to move.
class RankThreads {
public:
  // Never destroyed: a process that exits while a step runs (a fatal
  // error on another thread) must not wait at exit to join its workers.
  static RankThreads &get() {
    static RankThreads *threads = new RankThreads;
    return *threads;
  }

  // job(i) for every i in [0, n): i = 0 on the calling thread, the others
  // on kept threads; returns when every job is done. A call while another
  // runs (pipelines driven from two threads at once) makes threads of its
  // own for the while.
  void run(size_t n, const std::function<void(size_t)> &job) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) {
      std::vector<std::thread> threads;
      for (size_t i = 1; i < n; ++i)
        threads.emplace_back(job, i);
      job(0);
      for (std::thread &t : threads)
        t.join();
      return;
    }
    while (workers_.size() + 1 < n)
      workers_.push_back(std::make_unique<Worker>(workers_.size() + 1));
    for (size_t i = 1; i < n; ++i)
      workers_[i - 1]->start(&job);
    job(0);
    for (size_t i = 1; i < n; ++i)
      workers_[i - 1]->wait();
  }

private:
  struct Worker {
    explicit Worker(size_t index) : index(index), thread([this] { loop(); }) {
      thread.detach(); // lives as long as the process (get())
    }
    void start(const std::function<void(size_t)> *j) {
      {
        std::lock_guard<std::mutex> lock(mu);
        job = j;
        done = false;
      }
      wake.notify_one();
    }
    void wait() {
      std::unique_lock<std::mutex> lock(mu);
      finished.wait(lock, [&] { return done; });
    }
    void loop() {
      for (;;) {
        const std::function<void(size_t)> *j;
        {
          std::unique_lock<std::mutex> lock(mu);
          wake.wait(lock, [&] { return job != nullptr; });
          j = job;
        }
        (*j)(index);
        {
          std::lock_guard<std::mutex> lock(mu);
          job = nullptr;
          done = true;
        }
        finished.notify_one();
      }
    }

    const size_t index;
    std::mutex mu;
    std::condition_variable wake, finished;
    const std::function<void(size_t)> *job = nullptr; // guarded by mu
    bool done = true;                                  // guarded by mu
    std::thread thread; // last: starts once the rest is made
  };
  std::mutex busy_; // held by the run() using the workers
  std::vector<std::unique_ptr<Worker>> workers_;
};

} // namespace

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
  // a millisecond or more at the start of every step. The others run on
  // kept threads (RankThreads).
  if (!ranks.empty())
    RankThreads::get().run(ranks.size(), run);
  if (first)
    return fail(*first);
  return llvm::Error::success();
}

} // namespace cleave::runtime
