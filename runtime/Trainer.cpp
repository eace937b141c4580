#include "runtime/Trainer.h"

#include "runtime/Checkpoint.h"
#include "support/CpuShare.h"
#include "support/Errors.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

namespace cleave::runtime {

// Whether --profile and the summary's measured step time count this step:
// every step but the run's first (warm-up), unless that is the only one.
static bool warmStep(int64_t step, int64_t firstStep, int64_t steps) {
  return step > firstStep || steps - firstStep == 1;
}

// Whether an evaluation is due after step `step` (0-based) of `steps`.
static bool evalDue(int64_t step, int64_t steps, int64_t every) {
  return every > 0 && ((step + 1) % every == 0 || step + 1 == steps);
}

// Whether a checkpoint is due after step `step` (0-based) of `steps`.
static bool checkpointDue(int64_t step, int64_t steps, int64_t every) {
  return (every && (step + 1) % every == 0) || step + 1 == steps;
}

static std::string stepText(int64_t step) {
  return "step " + std::to_string(step + 1) + ": ";
}

Trainer::Trainer(const Plan &plan, std::vector<LocalStage *> stages,
                 Driver &driver, StepData data, TrainOptions options)
    : plan_(plan), stages_(std::move(stages)), driver_(driver),
      data_(std::move(data)), options_(std::move(options)),
      profiles_(stages_.size()), coreWaitSum_(stages_.size(), 0) {}

std::string Trainer::where(const LocalStage &st) const {
  return (plan_.dataParallel > 1
              ? "replica " + std::to_string(st.replica) + " "
              : std::string()) +
         "stage " + std::to_string(st.stage);
}

llvm::Error Trainer::setLearningRate(float lr) {
  std::vector<uint8_t> bytes(sizeof(float));
  std::memcpy(bytes.data(), &lr, sizeof(float));
  llvm::Error err = llvm::Error::success();
  for (LocalStage *st : stages_)
    if (st->executor->findSlot("optimizer.lr") >= 0)
      if (auto e = st->executor->writeSlot("optimizer.lr", bytes)) {
        err = std::move(e);
        break;
      }
  return agree(driver_, std::move(err));
}

llvm::Expected<double> Trainer::compiledLearningRate() {
  // Each process reads its stages' slot (before any step wrote it); every
  // stage with an optimizer op holds the same compiled value.
  std::vector<double> mine{0, 0};
  llvm::Error err = llvm::Error::success();
  for (LocalStage *st : stages_)
    if (st->executor->findSlot("optimizer.lr") >= 0) {
      auto bytes = st->executor->readSlot("optimizer.lr");
      if (!bytes) {
        err = bytes.takeError();
        break;
      }
      float lr = 0;
      if (bytes->size() == sizeof lr)
        std::memcpy(&lr, bytes->data(), sizeof lr);
      mine = {1, double(lr)};
      break;
    }
  if (auto e = agree(driver_, std::move(err)))
    return std::move(e);
  auto all = driver_.allGather(mine);
  if (!all)
    return driver_.failAlone(all.takeError());
  for (size_t i = 0; i + 1 < all->size(); i += 2)
    if ((*all)[i] != 0)
      return (*all)[i + 1];
  return agree(driver_, fail("the plan has no optimizer.lr (no trained "
                             "parameters?); a learning-rate schedule "
                             "needs one"));
}

llvm::Error Trainer::applyLr(const std::vector<size_t> &which, int64_t step) {
  if (!options_.lrSchedule)
    return llvm::Error::success();
  float lr = options_.lrSchedule->lrAt(step);
  std::vector<uint8_t> bytes(sizeof lr);
  std::memcpy(bytes.data(), &lr, sizeof lr);
  for (size_t i : which)
    if (stages_[i]->executor->findSlot("optimizer.lr") >= 0)
      if (auto e = stages_[i]->executor->writeSlot("optimizer.lr", bytes))
        return e;
  return llvm::Error::success();
}

llvm::Expected<int64_t> Trainer::resume(const std::string &dir) {
  auto holds = [&](uint32_t stage) {
    return llvm::any_of(stages_, [&](LocalStage *st) {
      return uint32_t(st->stage) == stage;
    });
  };
  // The file is checked whole against the plan before any slot is written.
  std::string schedule;
  auto done = readCheckpointFile(
      dir, plan_, holds,
      [&](uint32_t stage, const std::string &name,
          const std::vector<uint8_t> &bytes) -> std::optional<std::string> {
        // Every data-parallel replica of the stage gets the saved values.
        for (LocalStage *st : stages_)
          if (uint32_t(st->stage) == stage)
            if (auto e = st->executor->writeSlot(name, bytes))
              return llvm::toString(std::move(e));
        return std::nullopt;
      },
      &schedule);
  llvm::Error err = llvm::Error::success();
  if (!done)
    err = done.takeError();
  else if (!schedule.empty() && !options_.lrSchedule) {
    // The run goes on with the schedule it was started with.
    auto s = LrSchedule::parse(schedule);
    if (s) {
      options_.lrSchedule = *s;
      scheduleResumed_ = true;
    } else {
      err = fail(dir + "/checkpoint.bin: " + llvm::toString(s.takeError()));
    }
  }
  if (!err && *done > options_.steps)
    err = fail(dir + "/checkpoint.bin: the checkpoint is after step " +
               std::to_string(*done) + " but this run has " +
               std::to_string(options_.steps) +
               " steps in all (--steps counts from the start)");
  else if (!err)
    firstStep_ = *done;
  if (auto e = agree(driver_, std::move(err)))
    return std::move(e);
  return firstStep_;
}

std::map<std::pair<int, int>, std::vector<size_t>> Trainer::localRanks() const {
  std::map<std::pair<int, int>, std::vector<size_t>> out;
  for (size_t i = 0; i < stages_.size(); ++i)
    out[{stages_[i]->replica, rankOfStage(plan_, stages_[i]->stage)}]
        .push_back(i);
  return out;
}

RankWork Trainer::rankWork(int rank, const std::vector<size_t> &locals,
                           int64_t step) {
  RankWork w;
  for (size_t i : locals) {
    w.stages.push_back(stages_[i]->executor.get());
    w.data.push_back(data_(step, stages_[i]->replica));
  }
  if (size_t(rank) < plan_.rankPrograms.size())
    w.program = plan_.rankPrograms[size_t(rank)];
  return w;
}

llvm::Error Trainer::runLocal(int64_t step) {
  // One thread per rank of each replica, running that rank's stages in its
  // program's order; a process with one rank runs it on this thread (MPI
  // calls come from it).
  std::vector<RankWork> work;
  for (const auto &[key, locals] : localRanks()) {
    if (auto e = applyLr(locals, step))
      return e;
    work.push_back(rankWork(key.second, locals, step));
  }
  if (work.size() == 1) {
    if (auto e = runRankStep(work[0], step)) {
      // runRankStep names the stage; add the replica where there are several.
      if (plan_.dataParallel > 1)
        return fail("replica " + std::to_string(stages_[0]->replica) + " " +
                    llvm::toString(std::move(e)));
      return e;
    }
    return llvm::Error::success();
  }
  return runRankThreads(work, step);
}

Trainer::StepResult Trainer::snapshot(const std::vector<size_t> &which) const {
  StepResult out(stages_.size());
  for (size_t i : which) {
    const StageExecutor &ex = *stages_[i]->executor;
    out[i] = {ex.stepSkipped(), ex.nonFiniteReport(), ex.hasLoss(),
              ex.hasLoss() ? ex.lastLoss() : 0.0, ex.stats().stepSeconds,
              ex.lastGradNorm()};
  }
  return out;
}

llvm::Expected<bool> Trainer::reportStep(int64_t step, const StepResult &result,
                                         std::optional<double> period,
                                         StepReport &report) {
  int d = plan_.dataParallel;
  report.step = step;
  // Every stage skipped the update or none did; the first (in executor
  // order) that found a non-finite value says what.
  bool skipped = result[0].skipped;
  if (skipped) {
    std::string found;
    for (size_t i = 0; i < stages_.size(); ++i)
      if (found.empty() && !result[i].nonFinite.empty())
        found = where(*stages_[i]) + ": " + result[i].nonFinite;
    if (!options_.skipNonFinite) {
      llvm::Error err = llvm::Error::success();
      if (!found.empty())
        err = fail(stepText(step) + found +
                   "; stopping before the update (--on-nan=skip-step "
                   "skips such steps)");
      if (auto e = agree(driver_, std::move(err)))
        return std::move(e);
    }
    auto all = driver_.gatherToRoot(
        std::vector<uint8_t>(found.begin(), found.end()));
    if (!all)
      return driver_.failAlone(all.takeError());
    for (const std::vector<uint8_t> &r : *all)
      if (!r.empty() && !report.skipped)
        report.skipped = std::string(r.begin(), r.end());
  }

  std::vector<double> mine;
  for (const StageResult &r : result)
    mine.insert(mine.end(),
                {r.hasLoss ? 1.0 : 0.0, r.loss, r.stepSeconds, r.gradNorm});
  auto all = driver_.allGather(mine);
  if (!all)
    return driver_.failAlone(all.takeError());
  for (size_t i = 0; i + 3 < all->size(); i += 4) {
    if ((*all)[i] != 0)
      report.loss += (*all)[i + 1] / d;
    report.stepSeconds = std::max(report.stepSeconds, (*all)[i + 2]);
    // Every stage that clips computed the same norm; a stage without
    // trained parameters has none (NaN).
    if (!report.gradNorm && !std::isnan((*all)[i + 3]))
      report.gradNorm = (*all)[i + 3];
  }
  if (options_.lrSchedule)
    report.lr = double(options_.lrSchedule->lrAt(step));
  if (period)
    report.stepSeconds = *period;
  if (step == firstStep_)
    summary_.firstLoss = report.loss;
  summary_.lastLoss = report.loss;
  if (!skipped && !std::isfinite(report.loss)) {
    llvm::Error err = llvm::Error::success();
    if (driver_.rank() == 0)
      err = fail(stepText(step) + "the loss is not finite (" +
                 std::to_string(report.loss) + "); try a smaller --lr");
    return agree(driver_, std::move(err));
  }
  return true;
}

llvm::Error Trainer::run(llvm::function_ref<void(const StepReport &)> onStep) {
  start_ = std::chrono::steady_clock::now();
  // The cores other processes kept busy and wanted over the steps the
  // summary counts (after the warm-up step, whose first touches of memory
  // keep every rank busy), or over the whole run where those took under
  // 0.2 s; in a run of one process (under MPI the other ranks are the
  // other processes).
  const bool readOthers = driver_.size() == 1;
  std::optional<support::CpuUse> useAtStart =
      readOthers ? support::cpuUseNow(true) : std::nullopt;
  std::optional<support::CpuUse> useAfterWarmUp;
  stepSum_ = 0;
  std::fill(coreWaitSum_.begin(), coreWaitSum_.end(), 0);
  int64_t steps = options_.steps;
  std::vector<size_t> everyStage(stages_.size());
  for (size_t i = 0; i < everyStage.size(); ++i)
    everyStage[i] = i;
  auto finishStep = [&](int64_t step, StepReport &report) -> llvm::Error {
    if (warmStep(step, firstStep_, steps))
      stepSum_ += report.stepSeconds;
    else if (step == firstStep_ && readOthers)
      useAfterWarmUp = support::cpuUseNow(true);
    if (options_.checkpointDir &&
        checkpointDue(step, steps, options_.checkpointEvery)) {
      if (auto e = writeCheckpoint(step + 1))
        return e;
      report.checkpoint = *options_.checkpointDir + "/checkpoint.bin";
    }
    if (evalData_ && evalDue(step, steps, options_.evalEvery)) {
      auto eval = evaluate();
      if (!eval)
        return eval.takeError();
      report.evalLoss = eval->loss;
      report.evalAccuracy = eval->accuracy;
    }
    report.elapsedSeconds = std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - start_)
                                .count();
    onStep(report);
    return llvm::Error::success();
  };
  if (options_.overlapSteps) {
    // Blocks of overlapping steps, each ending where a checkpoint is due.
    for (int64_t first = firstStep_; first < steps;) {
      int64_t last = first;
      // ... or an evaluation: both see the state after that step.
      while (last + 1 < steps &&
             !(options_.checkpointDir &&
               checkpointDue(last, steps, options_.checkpointEvery)) &&
             !(evalData_ && evalDue(last, steps, options_.evalEvery)))
        ++last;
      if (auto e = runOverlapped(first, last + 1, finishStep))
        return e;
      first = last + 1;
    }
  } else {
    for (int64_t step = firstStep_; step < steps; ++step) {
      for (LocalStage *st : stages_)
        st->executor->setProfiling(options_.profile &&
                                   warmStep(step, firstStep_, steps));
      if (auto e = runLocal(step))
        return driver_.failAlone(
            fail(stepText(step) + llvm::toString(std::move(e))));
      if (options_.profile)
        for (size_t i = 0; i < stages_.size(); ++i)
          profiles_[i].take(*stages_[i]->executor);
      if (warmStep(step, firstStep_, steps))
        for (size_t i = 0; i < stages_.size(); ++i)
          coreWaitSum_[i] += stages_[i]->executor->stats().coreWaitSeconds;
      StepReport report;
      auto ok = reportStep(step, snapshot(everyStage), std::nullopt, report);
      if (!ok)
        return ok.takeError();
      if (auto e = finishStep(step, report))
        return e;
    }
  }
  summary_.seconds = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start_)
                         .count();
  summary_.meanStepSeconds =
      stepSum_ / double(std::max<int64_t>(steps - firstStep_ - 1, 1));
  summary_.cores = support::usableCores();
  if (useAtStart)
    if (std::optional<support::CpuUse> now = support::cpuUseNow(true)) {
      const support::CpuUse &from =
          useAfterWarmUp && support::otherCoresBusy(*useAfterWarmUp, *now)
              ? *useAfterWarmUp
              : *useAtStart;
      summary_.otherCores = support::otherCoresBusy(from, *now);
      summary_.otherRunnable = support::otherCoresWanted(from, *now);
    }
  return llvm::Error::success();
}

// Steps [first, end) with each rank going on to the next step as soon as
// its own part of this one is done: one thread per rank runs them all,
// and this thread reports each step once every rank is through it, from
// the figures each rank left for it. The measured step is the time
// between two steps' ends.
llvm::Error Trainer::runOverlapped(
    int64_t first, int64_t end,
    llvm::function_ref<llvm::Error(int64_t, StepReport &)> finishStep) {
  auto byRank = localRanks();
  size_t ranks = byRank.size();
  size_t n = size_t(end - first);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<StepResult> results(n, StepResult(stages_.size()));
  std::vector<size_t> done(n, 0);
  std::vector<std::chrono::steady_clock::time_point> ended(n);
  std::optional<std::string> failure;
  int64_t failedStep = -1;
  bool stop = false; // the reporter wants the ranks to stop
  auto abortAll = [&](const std::string &why) {
    for (LocalStage *st : stages_) {
      st->executor->comm().abort(why);
      if (st->executor->dataParallel())
        st->executor->dataParallel()->abort(why);
    }
  };
  // Under Stop no update waits for the others' findings: each stage sends
  // its own to all and takes theirs at its next update, so the verdict on
  // a step (and that step's report) comes one step later, and a run that
  // stops has computed one step more than it reports, in memory only.
  using Policy = StageExecutor::NonFinitePolicy;
  std::vector<Policy> policies;
  bool deferred = false;
  for (LocalStage *st : stages_) {
    policies.push_back(st->executor->nonFinitePolicy());
    if (policies.back() == Policy::Stop) {
      st->executor->setNonFinitePolicy(Policy::StopAfter);
      deferred = true;
    }
  }
  // Step k's figures from `locals` are in: count the rank done with it.
  // The step ended when the last rank's part of it did (`at`), which under
  // a deferred verdict is before the figures come in.
  auto record = [&](int64_t step, const std::vector<size_t> &locals,
                    const StepResult &mine,
                    std::chrono::steady_clock::time_point at) {
    std::lock_guard<std::mutex> lock(mu);
    size_t k = size_t(step - first);
    for (size_t i : locals)
      results[k][i] = mine[i];
    ended[k] = std::max(ended[k], at);
    ++done[k];
  };
  // The verdict each local stage has on step `step`, into `held`.
  auto judged = [&](int64_t step, const std::vector<size_t> &locals,
                    StepResult &held) {
    bool bad = false;
    for (size_t i : locals) {
      const StageExecutor::Verdict &v = stages_[i]->executor->verdict();
      held[i].skipped = v.step == step && v.bad;
      bad = bad || held[i].skipped;
    }
    return bad;
  };
  std::vector<std::thread> threads;
  for (auto &[key, locals] : byRank)
    threads.emplace_back([&, key = key, locals = locals] {
      int rank = key.second;
      StepResult held; // deferred: the previous step's, awaiting its verdict
      std::chrono::steady_clock::time_point heldEnd;
      auto failed = [&](int64_t step, llvm::Error e) {
        std::string msg = llvm::toString(std::move(e));
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!failure) {
            failure = msg;
            failedStep = step;
          }
        }
        abortAll(msg);
        cv.notify_all();
      };
      for (int64_t step = first; step < end; ++step) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (stop || failure)
            return;
        }
        for (size_t i : locals)
          stages_[i]->executor->setProfiling(
              options_.profile && warmStep(step, firstStep_, options_.steps));
        llvm::Error e = applyLr(locals, step);
        if (!e)
          e = runRankStep(rankWork(rank, locals, step), step);
        if (e)
          return failed(step, std::move(e));
        if (options_.profile)
          for (size_t i : locals)
            profiles_[i].take(*stages_[i]->executor);
        // Each rank thread adds to its own stages' sums only.
        if (warmStep(step, firstStep_, options_.steps))
          for (size_t i : locals)
            coreWaitSum_[i] += stages_[i]->executor->stats().coreWaitSeconds;
        StepResult mine = snapshot(locals);
        auto now = std::chrono::steady_clock::now();
        if (deferred) {
          // This step's update took the votes on the previous one.
          if (step > first) {
            bool bad = judged(step - 1, locals, held);
            record(step - 1, locals, held, heldEnd);
            cv.notify_all();
            if (bad)
              return;
          }
          held = std::move(mine);
          heldEnd = now;
          if (step + 1 == end) {
            for (size_t i : locals)
              if (auto e = stages_[i]->executor->collectVotes())
                return failed(step, std::move(e));
            judged(step, locals, held);
            record(step, locals, held, heldEnd);
            cv.notify_all();
          }
          continue;
        }
        bool skipped = stages_[locals[0]]->executor->stepSkipped();
        record(step, locals, mine, now);
        cv.notify_all();
        // A step stopped for a non-finite value ends the run; every rank
        // learnt it in the vote.
        if (skipped && !options_.skipNonFinite)
          return;
      }
    });
  llvm::Error err = llvm::Error::success();
  auto previous = std::chrono::steady_clock::time_point();
  for (int64_t step = first; step < end; ++step) {
    size_t k = size_t(step - first);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done[k] == ranks || failure; });
    if (done[k] != ranks) {
      err = fail(stepText(failedStep) + *failure);
      break;
    }
    StepResult result = results[k];
    auto endedAt = ended[k];
    lock.unlock();
    std::optional<double> period;
    if (step > first)
      period = std::chrono::duration<double>(endedAt - previous).count();
    previous = endedAt;
    StepReport report;
    auto ok = reportStep(step, result, period, report);
    if (!ok) {
      err = ok.takeError();
      break;
    }
    if (auto e = finishStep(step, report)) {
      err = std::move(e);
      break;
    }
  }
  if (err) {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    abortAll("the run stopped");
  }
  for (std::thread &t : threads)
    t.join();
  for (size_t i = 0; i < stages_.size(); ++i)
    stages_[i]->executor->setNonFinitePolicy(policies[i]);
  return err;
}

llvm::Expected<Trainer::Evaluation> Trainer::evaluate() {
  double total = 0, correct = 0, counted = 0;
  int d = plan_.dataParallel;
  for (int64_t b = 0; b < options_.evalBatches; ++b) {
    std::vector<std::vector<double>> losses(stages_.size());
    // Each rank runs its stages' forwards in stage order (a stage only
    // waits for lower stages), the ranks at once.
    std::mutex mu;
    std::optional<std::string> failure;
    auto runRank = [&](const std::vector<size_t> &locals) {
      for (size_t i : locals) {
        LocalStage &st = *stages_[i];
        auto l = st.executor->runForward(-1 - b, evalData_(b, st.replica));
        if (l) {
          losses[i] = std::move(*l);
          continue;
        }
        std::string msg = where(st) + ": " + llvm::toString(l.takeError());
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!failure)
            failure = msg;
        }
        for (LocalStage *other : stages_)
          other->executor->comm().abort(msg);
        return;
      }
    };
    auto byRank = localRanks();
    if (byRank.size() == 1) {
      runRank(byRank.begin()->second);
    } else {
      std::vector<std::thread> threads;
      for (const auto &[key, locals] : byRank)
        threads.emplace_back([&, locals = locals] { runRank(locals); });
      for (std::thread &t : threads)
        t.join();
    }
    if (failure)
      return driver_.failAlone(fail("evaluation: " + *failure));
    // Per local stage (every process sends as many as reportStep does):
    // whether it has the loss, and its mean over the microbatches.
    // With the accuracy counts (exact in a double below 2^53).
    std::vector<double> mine;
    for (size_t i = 0; i < losses.size(); ++i) {
      const std::vector<double> &l = losses[i];
      double sum = 0;
      for (double v : l)
        sum += v;
      auto [hits, count] = stages_[i]->executor->lastAccuracy();
      mine.insert(mine.end(), {l.empty() ? 0.0 : 1.0,
                               l.empty() ? 0.0 : sum / double(l.size()),
                               double(hits), double(count)});
    }
    auto all = driver_.allGather(mine);
    if (!all)
      return driver_.failAlone(all.takeError());
    double batch = 0;
    for (size_t i = 0; i + 3 < all->size(); i += 4) {
      if ((*all)[i] != 0)
        batch += (*all)[i + 1] / d;
      correct += (*all)[i + 2];
      counted += (*all)[i + 3];
    }
    total += batch;
  }
  Evaluation out;
  out.loss = total / double(std::max<int64_t>(options_.evalBatches, 1));
  if (counted > 0)
    out.accuracy = correct / counted;
  return out;
}

llvm::Error Trainer::writeCheckpoint(int64_t stepsDone) {
  // Rank 0 streams replica 0's stages into the file in stage order, one
  // stage at a time: its own from their executors, slot by slot; another
  // process's as one record (the stage's entries) gathered for that stage
  // alone. No process holds more than one stage's state besides its own.
  std::unique_ptr<CheckpointWriter> writer;
  llvm::Error opened = llvm::Error::success();
  if (driver_.rank() == 0) {
    auto w = CheckpointWriter::open(
        *options_.checkpointDir, plan_, stepsDone,
        options_.lrSchedule ? options_.lrSchedule->str() : std::string());
    if (w)
      writer = std::move(*w);
    else
      opened = w.takeError();
  }
  if (auto e = agree(driver_, std::move(opened)))
    return e;
  for (const StagePlan &sp : plan_.stages) {
    LocalStage *local = nullptr;
    for (LocalStage *st : stages_)
      if (st->replica == 0 && st->stage == sp.index)
        local = st;
    llvm::Error err = llvm::Error::success();
    std::vector<uint8_t> mine; // this stage's entries for rank 0
    if (local && writer) {
      err = writer->appendStage(sp, *local->executor);
    } else if (local) {
      std::string body;
      auto n = appendCheckpointEntries(body, sp, *local->executor);
      if (n) {
        uint64_t count = *n;
        mine.resize(sizeof count + body.size());
        std::memcpy(mine.data(), &count, sizeof count);
        std::memcpy(mine.data() + sizeof count, body.data(), body.size());
      } else {
        err = n.takeError();
      }
    }
    if (driver_.size() > 1) { // every process takes part in each gather
      if (auto e = agree(driver_, std::move(err)))
        return e;
      auto all = driver_.gatherToRoot(mine);
      if (!all)
        return driver_.failAlone(all.takeError());
      mine.clear();
      if (writer)
        for (const std::vector<uint8_t> &r : *all) {
          if (r.size() < sizeof(uint64_t) || err)
            continue;
          uint64_t count = 0;
          std::memcpy(&count, r.data(), sizeof count);
          err = writer->appendEntries(
              llvm::StringRef(reinterpret_cast<const char *>(r.data()) +
                                  sizeof count,
                              r.size() - sizeof count),
              count);
        }
    }
    if (auto e = agree(driver_, std::move(err)))
      return e;
  }
  return agree(driver_, writer ? writer->commit() : llvm::Error::success());
}

llvm::Expected<TrainSummary> Trainer::summary() {
  // Every process sends the same number of values: its stages' (the
  // most any rank runs; absent ones marked), each tagged with its replica
  // and stage, so the figures land by stage however they were spread.
  size_t most = 0;
  for (int r = 0; r < rankCount(plan_); ++r)
    most = std::max(most, stagesOfRank(plan_, r).size());
  most = std::max(most, stages_.size());
  std::vector<double> mine;
  for (size_t i = 0; i < stages_.size(); ++i) {
    const LocalStage *st = stages_[i];
    const StageStats &s = st->executor->stats();
    double busy = -s.recvWaitSeconds;
    for (double b : s.busySeconds)
      busy += b;
    mine.insert(mine.end(), {double(st->replica), double(st->stage), busy,
                             double(s.peakBytes), s.stepSeconds,
                             double(s.hostPeakBytes),
                             double(st->executor->graphsRecorded()),
                             double(st->executor->graphLaunches()),
                             double(st->executor->fusedEpilogues()),
                             coreWaitSum_[i] / double(countedSteps())});
  }
  constexpr size_t kFigures = 10;
  mine.resize(kFigures * most, -1);
  auto all = driver_.allGather(mine);
  if (!all)
    return driver_.failAlone(all.takeError());
  TrainSummary out = summary_;
  out.stages.assign(plan_.stages.size(), StageFigures{});
  for (size_t i = 0; i + kFigures - 1 < all->size(); i += kFigures) {
    if ((*all)[i] != 0) // replica 0's only; -1: no stage
      continue;
    size_t s = size_t((*all)[i + 1]);
    if (s < out.stages.size())
      out.stages[s] = StageFigures{(*all)[i + 2],          (*all)[i + 4],
                                   int64_t((*all)[i + 3]), int64_t((*all)[i + 5]),
                                   int64_t((*all)[i + 6]), int64_t((*all)[i + 7]),
                                   int64_t((*all)[i + 8]), (*all)[i + 9]};
  }
  return out;
}

llvm::Expected<std::string> Trainer::profileJson() {
  llvm::json::Array ops;
  for (size_t i = 0; i < stages_.size(); ++i) // replica 0: one entry per op
    if (stages_[i]->replica == 0) {
      std::array<double, 3> kernelWait = profiles_[i].kernelCoreWaitShare();
      appendProfileOps(plan_, profiles_[i].mean(), ops, &kernelWait);
      std::array<double, 5> coreWait = profiles_[i].actionCoreWait();
      appendActionOverheads(stages_[i]->stage, profiles_[i].actionOverhead(),
                            ops, &coreWait);
      appendMessageDelays(stages_[i]->stage, profiles_[i].messageDelays(),
                          ops);
      appendCoreWait(stages_[i]->stage,
                     coreWaitSum_[i] / double(countedSteps()), ops);
    }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(ops));
  os.flush();
  auto all = driver_.gatherToRoot(std::vector<uint8_t>(text.begin(), text.end()));
  if (!all)
    return driver_.failAlone(all.takeError());
  llvm::Error err = llvm::Error::success();
  std::string out;
  if (driver_.rank() == 0) {
    llvm::json::Array merged;
    for (const std::vector<uint8_t> &b : *all) {
      auto v = llvm::json::parse(llvm::StringRef(
          reinterpret_cast<const char *>(b.data()), b.size()));
      if (!v) {
        err = fail("--profile: " + llvm::toString(v.takeError()));
        break;
      }
      if (llvm::json::Array *a = v->getAsArray())
        for (llvm::json::Value &op : *a)
          merged.push_back(std::move(op));
    }
    out = runtime::profileJson(std::move(merged), summary_.cores,
                               summary_.otherCores, summary_.otherRunnable);
  }
  if (auto e = agree(driver_, std::move(err)))
    return std::move(e);
  return out;
}

// Spans travel as records: the track name, then per span its name and
// (microbatch, start, end) as three doubles. The spans are steady_clock
// seconds, which on Linux is CLOCK_MONOTONIC, one clock for every process of
// a host: the ranks' spans line up when they run on one machine (across
// hosts their offsets are meaningless).
llvm::Expected<std::vector<TraceTrack>> Trainer::traceTracks() {
  std::vector<uint8_t> mine;
  for (LocalStage *st : stages_) {
    std::vector<uint8_t> track;
    std::string name =
        traceTrackName(st->stage, st->replica, plan_.dataParallel);
    putRecord(track, name.data(), name.size());
    for (const StageStats::Span &span : st->executor->stats().spans) {
      putRecord(track, span.name.data(), span.name.size());
      double fixed[3] = {double(span.microbatch), span.start, span.end};
      putRecord(track, fixed, sizeof(fixed));
    }
    putRecord(mine, track.data(), track.size());
  }
  auto all = driver_.gatherToRoot(mine);
  if (!all)
    return driver_.failAlone(all.takeError());
  std::vector<TraceTrack> tracks;
  // Each process sent its stages in increasing order: the (replica, stage)
  // of every track, to put them in executor order.
  std::vector<std::pair<int, int>> keys;
  int ranks = rankCount(plan_);
  for (size_t w = 0; w < all->size(); ++w)
    if (driver_.size() == 1)
      for (LocalStage *st : stages_)
        keys.push_back({st->replica, st->stage});
    else
      for (int st : stagesOfRank(plan_, int(w) % ranks))
        keys.push_back({int(w) / ranks, st});
  for (const std::vector<uint8_t> &process : *all)
    for (const std::vector<uint8_t> &b : splitRecords(process)) {
      std::vector<std::vector<uint8_t>> parts = splitRecords(b);
      TraceTrack t;
      if (!parts.empty())
        t.name.assign(parts[0].begin(), parts[0].end());
      for (size_t i = 1; i + 1 < parts.size(); i += 2) {
        StageStats::Span span;
        span.name.assign(parts[i].begin(), parts[i].end());
        double fixed[3] = {-1, 0, 0};
        if (parts[i + 1].size() == sizeof(fixed))
          std::memcpy(fixed, parts[i + 1].data(), sizeof(fixed));
        span.microbatch = int(fixed[0]);
        span.start = fixed[1];
        span.end = fixed[2];
        t.spans.push_back(std::move(span));
      }
      tracks.push_back(std::move(t));
    }
  if (keys.size() == tracks.size()) {
    std::vector<size_t> order(tracks.size());
    for (size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return keys[a] < keys[b]; });
    std::vector<TraceTrack> sorted;
    for (size_t i : order)
      sorted.push_back(std::move(tracks[i]));
    tracks = std::move(sorted);
  }
  return tracks;
}

llvm::Expected<std::map<std::string, std::vector<uint8_t>>>
Trainer::tensors(const std::vector<std::string> &names) {
  // (name, bytes) records of replica 0's stages, the lowest stage first.
  std::vector<uint8_t> mine;
  llvm::Error err = llvm::Error::success();
  for (const std::string &name : names) {
    for (LocalStage *st : stages_) {
      if (st->replica != 0 || st->executor->findSlot(name) < 0)
        continue;
      auto bytes = st->executor->readSlot(name);
      if (!bytes) {
        err = bytes.takeError();
        break;
      }
      putRecord(mine, name.data(), name.size());
      putRecord(mine, bytes->data(), bytes->size());
      break;
    }
    if (err)
      break;
  }
  if (auto e = agree(driver_, std::move(err)))
    return std::move(e);
  auto all = driver_.gatherToRoot(mine);
  if (!all)
    return driver_.failAlone(all.takeError());
  std::map<std::string, std::vector<uint8_t>> out;
  for (const std::vector<uint8_t> &process : *all) { // rank = stage order
    std::vector<std::vector<uint8_t>> parts = splitRecords(process);
    for (size_t i = 0; i + 1 < parts.size(); i += 2)
      out.emplace(std::string(parts[i].begin(), parts[i].end()),
                  std::move(parts[i + 1]));
  }
  return out;
}

llvm::Expected<std::map<std::string, std::shared_ptr<ir::TensorData>>>
Trainer::modelTensors() {
  if (plan_.modelTensors.empty())
    return agree(driver_,
                 driver_.rank() == 0
                     ? fail("the plan records no model tensors (an older "
                            "cleavec made it); compile it again")
                     : llvm::Error::success());
  std::vector<std::string> names;
  for (const PlanTensor &t : plan_.modelTensors)
    names.push_back(t.name);
  auto values = tensors(names);
  if (!values)
    return values.takeError();
  std::map<std::string, std::shared_ptr<ir::TensorData>> out;
  for (const PlanTensor &t : plan_.modelTensors) {
    auto it = values->find(t.name);
    if (it == values->end())
      continue;
    ir::TensorType type(t.dtype, ir::Shape(t.shape.begin(), t.shape.end()));
    if (uint64_t(type.byteSize()) != it->second.size())
      return driver_.failAlone(
          fail("model tensor '" + t.name + "' is " + type.str() +
               " in the plan but its stage holds " +
               std::to_string(it->second.size()) + " bytes"));
    out[t.name] = std::make_shared<ir::TensorData>(type, it->second);
  }
  return out;
}

} // namespace cleave::runtime
