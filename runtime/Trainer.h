// The training loop: steps over the stages this process runs, the same loop
// for the threaded run (every stage in one process) and under mpirun (one
// stage per process), over a Driver (runtime/comm/Driver.h) for what the
// processes must agree on.
//
// Each step runs every local stage's action list (threads, one per stage,
// where there are several), then learns the step's loss (the mean over the
// microbatches of every replica, summed in executor order replica * P +
// stage, so both runs give the same bits), the slowest stage's time, and
// whether the step's update was skipped for a non-finite value (--on-nan).
// After the steps: the summary figures, the --profile entries, the trace
// tracks and the trained model tensors, each gathered on rank 0.
//
// Errors: a failed step is the failing process's alone (Driver::failAlone);
// everything else every process learns together (runtime::agree), so a
// ReportedElsewhere means another process has the message to print.
#pragma once

#include "ir/TensorData.h"
#include "runtime/LrSchedule.h"
#include "runtime/Plan.h"
#include "runtime/Stages.h"
#include "runtime/comm/Driver.h"
#include "runtime/trace/ChromeTrace.h"
#include "runtime/trace/Profile.h"
#include "support/CpuShare.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Error.h"

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cleave::runtime {

// The feed of step `step` for the executors of replica `replica`.
using StepData = std::function<DataFn(int64_t step, int replica)>;

struct TrainOptions {
  int64_t steps = 10; // in all: a resumed run ends where an unbroken one would
  // With the executors' SkipStep policy a non-finite step is reported and
  // skipped; otherwise it stops the run before the update.
  bool skipNonFinite = false;
  bool profile = false; // keep per-op times for profileJson()
  std::optional<std::string> checkpointDir;
  int64_t checkpointEvery = 0; // 0: a checkpoint only after the last step
  // Each rank starts the next step as soon as its own update is done,
  // instead of every stage finishing a step before any starts the next
  // (threaded runs; the same bits). Steps still meet where a checkpoint is
  // due. Under Stop the verdict on a step comes with the next one's update
  // (nothing waits); under SkipStep each update waits for the vote.
  bool overlapSteps = false;
  // The learning rate of each step (runtime/LrSchedule.h), written into
  // every local stage's optimizer.lr before the step; without one the
  // slot keeps what it holds (the compiled or --lr value, or a resumed
  // checkpoint's). Checkpoints store it; resume() takes a checkpoint's
  // when none is set here.
  std::optional<LrSchedule> lrSchedule;
  // Validation (setEvaluation): after every evalEvery-th step and the
  // last, evalBatches batches of held-out data, forward only.
  int64_t evalEvery = 0, evalBatches = 0;
};

struct StepReport {
  int64_t step = 0;          // 0-based
  double loss = 0;           // mean over the step's microbatches, replicas
  double stepSeconds = 0;    // the slowest stage's
  double elapsedSeconds = 0; // since run() began
  std::optional<double> lr;       // with a schedule: the step's (as float)
  // After an evaluation: the mean loss over its batches (each the mean
  // over its microbatches and replicas).
  std::optional<double> evalLoss;
  std::optional<double> evalAccuracy; // where the plan records one
  // With --clip-grad-norm: the global norm of the step's gradient (before
  // clipping), the same bits on every stage.
  std::optional<double> gradNorm;
  // The update was skipped: what was found, where ("stage 1: ..."); on
  // rank 0 only.
  std::optional<std::string> skipped;
  // The checkpoint file written after this step, if one was.
  std::optional<std::string> checkpoint;
};

struct StageFigures {
  double busySeconds = 0; // computing in the last step (not waiting)
  double stepSeconds = 0; // the last step
  int64_t peakBytes = 0;
  int64_t hostPeakBytes = 0; // offloaded activations in host memory
  // --cuda-graphs: graphs recorded and launched since the start.
  int64_t graphsRecorded = 0, graphLaunches = 0;
  // Gemm + Gelu pairs run as one call (Backend::fusesGemmGelu).
  int64_t fusedEpilogues = 0;
  // Its rank's thread ready without a core, per step: the mean over the
  // steps meanStepSeconds counts (StageStats::coreWaitSeconds).
  double coreWaitSeconds = 0;
};

struct TrainSummary {
  double firstLoss = NAN, lastLoss = NAN;
  double seconds = 0;         // run() from start to end
  double meanStepSeconds = 0; // over the steps after the first
  // The cores other processes kept busy during run(), on average
  // (support::otherCoresBusy), of `cores` this process may run on; unset
  // in a run of several processes (each one's CPU is the others') and
  // where the kernel does not tell.
  std::optional<double> otherCores;
  // Other processes' threads running or ready to run, on average over the
  // same steps (support::otherCoresWanted: what they kept busy plus their
  // threads' waits for a core), what they wanted of the cores where
  // otherCores is what they got; unset in a run of several processes and
  // where the kernel does not tell (no other process visible in /proc).
  std::optional<double> otherRunnable;
  int cores = 0;
  std::vector<StageFigures> stages; // replica 0's, by stage
};

class Trainer {
public:
  // `stages` are this process's, in executor order (replica * P + stage).
  Trainer(const Plan &plan, std::vector<LocalStage *> stages, Driver &driver,
          StepData data, TrainOptions options);

  // Overrides the compiled learning rate (the slot optimizer.lr).
  llvm::Error setLearningRate(float lr);
  // Held-out data for validation: batch b of replica r is `data(b, r)`,
  // `batches` of them each time (TrainOptions::evalEvery says when).
  void setEvaluation(StepData data, int64_t batches) {
    evalData_ = std::move(data);
    options_.evalBatches = batches;
  }
  // One evaluation now: the mean loss over options.evalBatches batches
  // (every process calls it).
  // The mean validation loss, and the accuracy where the plan records one
  // (StagePlan::accuracyScoresSlot): predictions equal to their labels over
  // the labels counted, over every batch and replica.
  struct Evaluation {
    double loss = 0;
    std::optional<double> accuracy;
  };
  llvm::Expected<Evaluation> evaluate();

  // The compiled learning rate (optimizer.lr as the plan starts it), the
  // same on every process.
  llvm::Expected<double> compiledLearningRate();
  // Sets the schedule (before resume(), which then keeps it).
  void setLrSchedule(const LrSchedule &s) { options_.lrSchedule = s; }
  // The schedule in force (options' or, after resume(), a checkpoint's).
  const std::optional<LrSchedule> &lrSchedule() const {
    return options_.lrSchedule;
  }
  // resume() took the schedule from the checkpoint.
  bool scheduleResumed() const { return scheduleResumed_; }
  // Loads DIR/checkpoint.bin into every local stage; run() then starts
  // after the steps it had done. Returns that count.
  llvm::Expected<int64_t> resume(const std::string &dir);
  int64_t firstStep() const { return firstStep_; }

  // Runs the steps from firstStep() to options.steps, calling `onStep` on
  // every process after each.
  llvm::Error run(llvm::function_ref<void(const StepReport &)> onStep);

  // After run(); collectives, every process calls them.
  llvm::Expected<TrainSummary> summary();
  // The --profile file's text (rank 0; empty elsewhere).
  llvm::Expected<std::string> profileJson();
  // Every stage's spans of the last step, one track per executor (rank 0).
  llvm::Expected<std::vector<TraceTrack>> traceTracks();
  // The current bytes of each named tensor replica 0 holds, from its lowest
  // stage holding it (rank 0; names no stage holds are left out).
  llvm::Expected<std::map<std::string, std::vector<uint8_t>>>
  tensors(const std::vector<std::string> &names);
  // The plan's model tensors (Plan::modelTensors) as trained, with their
  // types, for --save (rank 0; an error when the plan records none).
  llvm::Expected<std::map<std::string, std::shared_ptr<ir::TensorData>>>
  modelTensors();

private:
  // What a step left on each local stage, for its report.
  struct StageResult {
    bool skipped = false;
    std::string nonFinite;
    bool hasLoss = false;
    double loss = 0, stepSeconds = 0;
    double gradNorm = NAN; // NaN: no clipping
  };
  using StepResult = std::vector<StageResult>; // by local stage
  StepResult snapshot(const std::vector<size_t> &which) const;
  // The step's report from its results (the loss, the stop on a
  // non-finite value); `period`, when given, is its measured time. False
  // never: an error ends the run.
  llvm::Expected<bool> reportStep(int64_t step, const StepResult &result,
                                  std::optional<double> period,
                                  StepReport &report);
  llvm::Error runOverlapped(
      int64_t first, int64_t end,
      llvm::function_ref<llvm::Error(int64_t, StepReport &)> finishStep);
  llvm::Error runLocal(int64_t step);
  // This process's stages by (replica, rank), as indices into stages_.
  std::map<std::pair<int, int>, std::vector<size_t>> localRanks() const;
  // Rank `rank`'s share of step `step`: those stages, their data, the
  // rank's program.
  RankWork rankWork(int rank, const std::vector<size_t> &locals, int64_t step);
  llvm::Error writeCheckpoint(int64_t stepsDone);
  // Writes the schedule's lr of `step` into the optimizer.lr slot of the
  // local stages `which` (none without a schedule).
  llvm::Error applyLr(const std::vector<size_t> &which, int64_t step);
  // "stage S", or "replica R stage S" with several replicas.
  std::string where(const LocalStage &st) const;

  const Plan &plan_;
  std::vector<LocalStage *> stages_;
  Driver &driver_;
  StepData data_, evalData_;
  TrainOptions options_;
  int64_t firstStep_ = 0;
  bool scheduleResumed_ = false;
  std::vector<ProfileSteps> profiles_; // by local stage
  TrainSummary summary_;
  std::chrono::steady_clock::time_point start_;
  double stepSum_ = 0;
  std::vector<double> coreWaitSum_; // by local stage, over the counted steps
  // The steps the summary's means count: all but the run's first.
  int64_t countedSteps() const {
    return std::max<int64_t>(options_.steps - firstStep_ - 1, 1);
  }
};

} // namespace cleave::runtime
