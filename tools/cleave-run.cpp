// cleave-run: trains a compiled Plan (runtime/Plan.h) on the CPU, one
// thread per pipeline stage in one process, or, started by mpirun, one
// process per stage of each data-parallel replica. The work is the
// runtime's: data (runtime/data/DataSource.h), stages on their backends
// (runtime/Stages.h), the training loop with its checkpoints, profile and
// trace (runtime/Trainer.h), over one process or MPI (runtime/comm/). This
// file parses flags, sets the stages up and prints.
#include "codegen/PlanCheck.h"
#include "frontend/TrainedModel.h"
#include "runtime/PlanFile.h"
#include "runtime/Trainer.h"
#include "runtime/data/DataSource.h"
#include "support/FileIO.h"
#include "runtime/trace/Metrics.h"
#ifdef CLEAVE_HAVE_MPI
#include "runtime/comm/MpiPlan.h"
#include "runtime/comm/StageComm.h"
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"
#include "runtime/cuda/Nccl.h"
#endif
#endif
#include "support/TextFormat.h"
#include "tools/MeasuredTimeline.h"
#include "tools/RunFlags.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdlib>

using namespace cleave;
using tools::fail;

static const char kTool[] = "cleave-run";

static const char kHelp[] = R"(usage: cleave-run PLAN.cplan [options]

Trains the model a plan describes (cleavec MODEL.onnx ... -o PLAN.cplan): on
the CPU, one thread per pipeline stage, each stage running its schedule's
actions. Every step runs the plan's M microbatches and one optimizer update;
the loss printed is the mean over the step's microbatches.

data:
  --data=DIR|FILE.npz|text:FILE|tokens:FILE
                         one array per model input, named after it (DIR/NAME.npy
                         or the archive member NAME.npy), samples along the
                         first axis; each step takes microbatch-size x M
                         samples in order, wrapping around. Without --data:
                         deterministic synthetic data (floats in [-1, 1],
                         integer inputs in the range the model indexes).
                         tokens:FILE or tokens32:FILE: a pre-tokenized
                         corpus, a flat little-endian uint16 (tokens:) or
                         uint32 (tokens32:) stream of token ids,
                         memory-mapped (nanoGPT's and Megatron's format;
                         examples/tokenize.py writes it), read in windows
                         of T tokens for a model whose inputs are integer
                         [B, T]. Each input gets what the model does with
                         it: the input that indexes the embedding gets the
                         window; one that reaches the loss's labels gets
                         the window one token later, or the window itself
                         when the model shifts its labels (HF's labels=);
                         any other (an attention mask) gets ones. The run
                         prints which. Checked first: a size that is not a
                         whole number of tokens, or an id the model cannot
                         index, is one line.
                         text:FILE: the same with the bytes of a text file
                         as the tokens (byte-level language modelling)
  --data-order=sequential|shuffle
                         token files: windows in order (default), or in a
                         permutation of all windows per epoch seeded by
                         --seed and the epoch, so a resumed run reads what
                         an unbroken one reads
  --seed=N               seed of the synthetic data, of dropout and of
                         --data-order shuffle (default 0)

training:
  --steps=N              training steps (default 10; at most 2^40)
  --lr=X                 learning rate (default: the one compiled in); with
                         a schedule, its peak
  --warmup-steps=W       learning-rate schedule: a linear warm-up from 0,
  --lr-decay=cosine|linear|none
  --min-lr=M             then a decay to M (default 0) that ends at step
  --decay-steps=D        D (default: --steps). For step s (from 0) with
                         peak L: s < W: L*s/W; then p = min(1, (s-W) /
                         max(1, D-W)), cosine: M + (L-M)*(1+cos(pi*p))/2,
                         linear: M + (L-M)*(1-p), none: L (HF's
                         get_cosine_with_min_lr_schedule_with_warmup and
                         get_linear/constant_schedule_with_warmup); in
                         double, rounded to float once, the same on every
                         stage. Checkpoints store it; --resume without
                         these flags goes on with the stored one
  --eval-data=SOURCE     held-out data (any --data source, tokens: files
                         included; always in order) for a validation loss
                         after every --eval-every steps and after the last:
                         the plan's forward program only (no update, no
                         BatchNorm statistics, Dropout as in training), the
                         mean loss over --eval-batches batches of M
                         microbatches (default: the held-out samples once),
                         and, where the loss is a cross-entropy, the
                         accuracy (the largest class score against the
                         label, ignore_index not counted), printed as an
                         "eval" line; training's bits do not change
  --eval-every=K         steps between validations (default: the last only)
  --eval-batches=N       batches per validation
  --clip-grad-norm=X     scale the step's averaged gradient by
                         min(1, X / (norm + 1e-6)), the norm over every
                         trained parameter of every stage (tied weights
                         once), as torch.nn.utils.clip_grad_norm_ does; the
                         same bits for any stages, schedule, threads or
                         ranks. Each update waits for the norm. Printed
                         with the loss
  --on-nan=stop|skip-step|off
                         when a loss or a gradient is NaN or infinite, stop
                         before the update, naming the value, the op that
                         made it and the stage (default), or skip that
                         step's update on every stage and go on; off: no
                         check (a NaN trains on)
  --overlap-steps        each rank starts the next step as soon as its own
                         update is done (the threaded run; the same bits):
                         the schedule's steady state, not one isolated step
                         after another. Under --on-nan=stop the verdict on
                         a step comes with the next one's update; under
                         skip-step each update waits for every stage
  --comm-timeout=SECONDS wait at most this long for any message from another
                         stage or process (every receive and collective,
                         threads and MPI; default 600, 0: forever). On
                         expiry the run ends with one line naming the stage,
                         the peer and the message it waited for: a plan whose
                         sends and receives do not pair, a stopped process
  --comm=keyed|ordered|nccl
                         how the stages exchange messages, threaded or
                         under mpirun: keyed (default) matches each by tag
                         and microbatch; ordered carries each pair of
                         stages' messages on one channel matched by order
                         alone, as NCCL matches them (the receiving end
                         holds one it needs later), to check that path on
                         any machine, with the same bits; nccl (--device
                         cuda) carries them over NCCL between stages on
                         different GPUs (under mpirun the channels' ids go
                         over MPI), through host staging for now; the
                         data-parallel sums too, from device memory, where
                         a stage's replicas are on distinct GPUs (in rank
                         order: the bits of the host path; compiled, not
                         yet run on two GPUs; docs/design/nccl.md)
  --threads=N            kernel threads per stage (default: cores / stages,
                         at least 1; at most 4 x the cores, see
                         --allow-large)
  --batch-w              run adjacent W actions of consecutive microbatches
                         as one: each weight-gradient product over their
                         operands concatenated (fewer, larger GEMMs; the
                         same sums up to rounding)
  --device=cpu|cuda|cuda-emulated
                         where the kernels run (default cpu). cuda: stage s
                         on GPU s mod the GPUs visible; a plan with an op the
                         CUDA backend lacks (integer products, divisions,
                         powers and reductions) stops before training,
                         naming the op.
                         cuda-emulated: the CUDA backend's kernels run one
                         element at a time on the host, for checking them
                         without a GPU; slow (docs/design/cuda.md)
  --cuda-graphs          with --device cuda: each run of kernels between
                         messages in an F, B or W program (no offload copy
                         or random draw among them) is recorded as a CUDA
                         Graph the second time it runs with the same
                         tensors and launched as one after (fewer launches);
                         a run CUDA cannot record runs as usual (and every
                         run while --profile times each kernel). The same
                         kernels in the same order: the same bits. Off by
                         default: not yet run on a GPU

output:
  --checkpoint-dir=DIR   write DIR/checkpoint.bin (every parameter, buffer and
                         optimizer state, atomically) every --checkpoint-every
                         steps (default: only after the last step); each
                         write is said on one line
  --checkpoint-every=K   steps between checkpoints
  --resume=DIR           continue from DIR/checkpoint.bin: --steps counts the
                         steps in all, so a resumed run ends where an
                         uninterrupted one would, with the same bits (a
                         checkpoint already there: nothing to do, exit 0)
  --save=FILE.onnx       the source model with the trained parameters
  --log=FILE.jsonl       one JSON object per step: step, loss, eval_loss,
                         lr, grad_norm (where the run has them), step_ms,
                         samples_per_s; written whole at each checkpoint and
                         after the run. A resumed run keeps the lines of the
                         steps up to its checkpoint from the log it finds,
                         so the log and --loss-curve cover the whole run
  --loss-curve=FILE.svg  the training and validation losses against the
                         step, the learning rate beneath (for a browser)
  --trace=FILE.json      a Chrome trace (chrome://tracing, Perfetto) of the
                         last step: one track per stage, its F, B, W and STEP
                         actions and its waits for messages (RECV)
  --timeline=FILE.svg    the last step as a Gantt chart (replica 0's
                         stages; waits for messages are idle) under the
                         plan's prediction (its schedule simulated on the
                         predicted stage times), at one time scale, in ms
  --profile=FILE.json    measured per-op times (kernels only, not waits): each
                         op's mean over the steps after the first (the
                         delays of a shared core included), in the format
                         `cleavec --cost-model profile:FILE` reads, with
                         how much of the machine the run had (a step
                         more than 20% off the plan's prediction says so
                         after the summary, and suggests this; on cores
                         other processes kept busy, a "cores shared" line
                         says how much, and each rank's wait for a core)
  --trust-dir=DIR        also read the files the plan names (its weight
                         files; its source model, for --save) inside DIR
                         (repeatable). Without it they must lie inside the
                         plan's folder, as cleavec records them when the
                         model is there; docs/reliability.md, "Trust"
  --print-plan           print the plan as text and exit
  --quiet                no per-step lines, only checkpoint writes and the
                         summary
  --allow-large          allow --threads above 4 x the cores (up to 2^16)
                         and --steps above 2^40 (up to 2^62)
  --help                 show this help

MPI: `mpirun -np P cleave-run PLAN.cplan ...` runs one stage per process (P
must be the plan's stage count), each loading only its own stage; rank 0
prints the same lines as the threaded run and writes --save and --profile.
A plan compiled with `--data-parallel D` needs `mpirun -np P*D`: rank w runs
stage w % P of replica w / P, with the threaded run's data, gradients and
results; --save, --profile and --checkpoint-dir come from replica 0 (ranks
0..P-1). Checkpoints are the threaded run's file: either run resumes the
other's (every rank reads it and loads its own stage). --trace has every
rank's track (its times line up when the ranks share one host).

exit status: 0 success, 1 bad input (plan, data) or a failed step, 2 bad usage.
)";

namespace {

// `e` with its message after `prefix` (success stays success).
llvm::Error prefixed(const std::string &prefix, llvm::Error e) {
  if (!e)
    return e;
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 prefix + llvm::toString(std::move(e)));
}

// Prints `e` as the tool's one error line unless another process of the run
// has (runtime::ReportedElsewhere); returns `code`, or kOk for no error.
int report(llvm::Error e, int code) {
  if (!e)
    return tools::kOk;
  llvm::outs().flush();
  llvm::handleAllErrors(
      std::move(e), [](const runtime::ReportedElsewhere &) {},
      [&](const llvm::ErrorInfoBase &info) {
        fail(kTool, info.message(), code);
      });
  return code;
}

std::string formatSeconds(double s) {
  int64_t t = int64_t(std::lround(s));
  return llvm::formatv("{0}:{1:2}", t / 60, t % 60).str();
}

// "training gpt-tiny: 2 stage(s), schedule zb-h1, 4 microbatches of 8
// samples per step, 300 step(s), data: ..."; a bf16 plan says so after the
// schedule, a run under mpirun at the end with its process count.
void printTrainingHeader(const runtime::Plan &plan, int64_t mbRows,
                         int64_t steps, const runtime::DataSource &data,
                         const tools::Flags &flags, int mpiRanks) {
  int d = plan.dataParallel;
  llvm::outs() << llvm::formatv(
      "training {0}: {1} stage(s){9}{7}, schedule {2}{8}, {3} microbatches "
      "of {4} samples per step, {5} step(s), data: {6}{10}\n",
      plan.modelName, plan.stages.size(), plan.schedule,
      d > 1 ? std::to_string(plan.microbatches) + " x " + std::to_string(d)
            : std::to_string(plan.microbatches),
      mbRows, steps,
      data.synthetic() ? std::string("synthetic")
                       : *flags.get("data") + " (" +
                             std::to_string(data.samples()) + " samples)",
      d > 1 ? " x " + std::to_string(d) + " data-parallel replicas"
            : std::string(),
      plan.precision == "f32" ? std::string()
                              : ", precision " + plan.precision,
      plan.stageRank.empty()
          ? std::string()
          : " on " + std::to_string(runtime::rankCount(plan)) + " ranks",
      mpiRanks ? ", under MPI with " + std::to_string(mpiRanks) + " ranks"
               : std::string());
  // Window data: what each input gets, as read from how the model uses it.
  if (auto spec = flags.get("data"))
    if (llvm::StringRef(*spec).startswith("tokens") ||
        llvm::StringRef(*spec).startswith("text:")) {
      if (auto fill = runtime::windowFills(plan, "tokens:FILE"))
        llvm::outs() << "inputs: " << runtime::describeWindowFills(plan, *fill)
                     << "\n";
      else
        llvm::consumeError(fill.takeError());
    }
  llvm::outs().flush();
}

// Per-stage figures: busy time of the last step, the mean step time.
// With overlapping steps the measured step is the time between two steps'
// ends, and the prediction the schedule's steady state.
// Offloaded activations wait in host memory, apart from the device peak.
void printHostPeaks(const runtime::TrainSummary &sum) {
  std::string host;
  for (size_t s = 0; s < sum.stages.size(); ++s)
    if (int64_t b = sum.stages[s].hostPeakBytes; b > 0)
      host += llvm::formatv("{0}stage {1} {2} B", host.empty() ? "" : ", ", s,
                            b)
                  .str();
  if (!host.empty())
    llvm::outs() << "offloaded activations in host memory, at most: " << host
                 << "\n";
  llvm::outs().flush();
}

// --cuda-graphs: how many runs of kernels became graphs, and launches;
// on a device backend, the Gemm + Gelu pairs run as one call.
void printGraphs(const runtime::TrainSummary &sum) {
  std::string line;
  for (size_t s = 0; s < sum.stages.size(); ++s)
    if (const auto &f = sum.stages[s]; f.graphsRecorded || f.graphLaunches)
      line += llvm::formatv("{0}stage {1} {2} recorded, {3} launched",
                            line.empty() ? "" : "; ", s, f.graphsRecorded,
                            f.graphLaunches)
                  .str();
  if (!line.empty())
    llvm::outs() << "graphs: " << line << "\n";
  std::string fused;
  for (size_t s = 0; s < sum.stages.size(); ++s)
    if (int64_t n = sum.stages[s].fusedEpilogues)
      fused += llvm::formatv("{0}stage {1} {2}", fused.empty() ? "" : ", ", s, n)
                   .str();
  if (!fused.empty())
    llvm::outs() << "Gemm + Gelu as one call: " << fused << "\n";
  llvm::outs().flush();
}

// The longest a rank waited for a core a step.
double worstCoreWait(const runtime::TrainSummary &sum) {
  double waited = 0;
  for (const runtime::StageFigures &f : sum.stages)
    waited = std::max(waited, f.coreWaitSeconds);
  return waited;
}

// Whether other work on the machine slowed the run: other processes kept a
// quarter of a core or more busy, or a rank waited for a core for 5% of
// the step and 0.1 ms or more (on a quiet machine a woken rank waits a few
// microseconds a message: 9 to 18 us a 0.45 ms step for the corpus's tiny
// GPT-2 on 2 stages).
bool coresShared(const runtime::TrainSummary &sum) {
  double waited = worstCoreWait(sum);
  return sum.otherCores.value_or(0) >= 0.25 ||
         sum.otherRunnable.value_or(0) >= 0.25 ||
         (sum.meanStepSeconds > 0 && waited >= 1e-4 &&
          waited >= 0.05 * sum.meanStepSeconds);
}

// One line when the cores were shared: what other processes used, and how
// long each rank waited for a core a step (support/CpuShare.h).
void printCoreSharing(const runtime::TrainSummary &sum) {
  if (!coresShared(sum))
    return;
  std::string line = "cores shared: ";
  if (sum.otherCores)
    line += llvm::formatv("other processes kept {0:F2} of the {1} core(s) "
                          "busy{2}; ",
                          *sum.otherCores, sum.cores,
                          sum.otherRunnable
                              ? llvm::formatv(" and wanted {0:F2} (their "
                                              "threads running or waiting "
                                              "for a core)",
                                              *sum.otherRunnable)
                                    .str()
                              : std::string())
                .str();
  std::string waits;
  for (size_t s = 0; s < sum.stages.size(); ++s)
    if (double w = sum.stages[s].coreWaitSeconds; w > 0)
      waits += llvm::formatv("{0}stage {1} {2:F3} ms", waits.empty() ? "" : ", ",
                             s, 1e3 * w)
                   .str();
  line += waits.empty() ? std::string("no wait for a core measured")
                        : "waits for a core a step: " + waits;
  llvm::outs() << line << "\n";
}

void printSummary(const runtime::Plan &plan, const runtime::TrainSummary &sum,
                  int64_t stepsRun, bool overlapped) {
  llvm::outs() << llvm::formatv(
      "done: {0} step(s) in {1:F2} s, loss {2:F4} -> {3:F4}{4}\n", stepsRun,
      sum.seconds, sum.firstLoss, sum.lastLoss,
      overlapped ? "; steps overlapped (step ms: the period, predicted: the "
                   "steady state)"
                 : "");
  double predicted = overlapped && plan.predictedPeriod > 0
                         ? plan.predictedPeriod
                         : plan.predictedStepTime;
  if (!plan.stageRank.empty() && sum.stages.size() == plan.stages.size()) {
    // Several stages per rank: a rank's figures are its stages' together.
    llvm::outs() << "rank  stages  busy %  bubble %  peak bytes (measured / "
                    "planned)  step ms (measured / predicted)\n";
    for (int r = 0; r < runtime::rankCount(plan); ++r) {
      std::string list;
      double busy = 0, step = 0;
      int64_t peak = 0, planned = 0;
      for (int s : runtime::stagesOfRank(plan, r)) {
        const runtime::StageFigures &f = sum.stages[size_t(s)];
        list += (list.empty() ? "" : ",") + std::to_string(s);
        busy += f.busySeconds;
        step = std::max(step, f.stepSeconds);
        peak += f.peakBytes;
        planned += plan.stages[size_t(s)].predictedPeakBytes;
      }
      double busyPct = step > 0 ? std::min(100.0, 100 * busy / step) : 0;
      llvm::outs() << llvm::formatv(
          "{0,-4}  {1,-6}  {2,6:F1}  {3,8:F1}  {4,14} / {5,-14}  {6,8:F3} / "
          "{7:F3}\n",
          r, list, busyPct, 100 - busyPct, peak, planned,
          1e3 * sum.meanStepSeconds, 1e3 * predicted);
    }
    printHostPeaks(sum);
    printGraphs(sum);
    printCoreSharing(sum);
    return;
  }
  llvm::outs() << "stage  busy %  bubble %  peak bytes (measured / planned)  "
                  "step ms (measured / predicted)\n";
  for (size_t s = 0; s < sum.stages.size(); ++s) {
    const runtime::StageFigures &f = sum.stages[s];
    double busyPct = f.stepSeconds > 0 ? 100 * f.busySeconds / f.stepSeconds : 0;
    llvm::outs() << llvm::formatv(
        "{0,-5}  {1,6:F1}  {2,8:F1}  {3,14} / {4,-14}  {5,8:F3} / {6:F3}\n", s,
        busyPct, 100 - busyPct, f.peakBytes, plan.stages[s].predictedPeakBytes,
        1e3 * sum.meanStepSeconds, 1e3 * predicted);
  }
  printHostPeaks(sum);
  printGraphs(sum);
  printCoreSharing(sum);
}

// What a resume that has no step left to run says after "resumed from DIR
// after step N": that --steps counts from the start, and which outputs of
// a step are not written.
std::string nothingToDo(const tools::Flags &flags, int64_t steps) {
  std::string unwritten;
  for (const char *f : {"trace", "timeline", "profile"})
    if (flags.has(f))
      unwritten += (unwritten.empty() ? "--" : ", --") + std::string(f);
  return ": nothing to do (--steps " + std::to_string(steps) +
         " counts the steps from the start; give more to train on" +
         (unwritten.empty() ? std::string()
                            : "; no step ran, so " + unwritten +
                                  " not written") +
         ")";
}

// When the measured step is more than 20% off the plan's prediction, one
// line on how to plan from this machine's own op times instead.
void printProfileHint(const runtime::Plan &plan,
                      const runtime::TrainSummary &sum, bool overlapped,
                      const tools::Flags &flags) {
  double predicted = overlapped && plan.predictedPeriod > 0
                         ? plan.predictedPeriod
                         : plan.predictedStepTime;
  double measured = sum.meanStepSeconds;
  if (predicted <= 0 || measured <= 0 ||
      std::abs(measured / predicted - 1) <= 0.2)
    return;
  auto profile = flags.get("profile");
  llvm::outs() << llvm::formatv(
      "the step took {0:F3} ms, {1:F1}x the {2:F3} ms predicted: {3}\n",
      1e3 * measured, measured / predicted, 1e3 * predicted,
      profile ? "compile again with cleavec --cost-model profile:" + *profile +
                    " (the op times just measured) for a plan that fits "
                    "this machine"
              : std::string("measure the ops with cleave-run --profile "
                            "FILE.json and compile again with cleavec "
                            "--cost-model profile:FILE.json for a plan that "
                            "fits this machine"));
  // Other work held the cores: how much of the difference that was.
  if (measured > predicted && coresShared(sum))
    llvm::outs() << llvm::formatv(
        "the cores were shared (above): a rank waited up to {0:F3} ms of the "
        "step for a core; the prediction is for cores the run has to itself\n",
        1e3 * worstCoreWait(sum));
}

// Writes `text` to `path` on rank 0; every process learns the outcome.
llvm::Error writeOnRoot(runtime::Driver &driver, const std::string &path,
                        const std::string &text) {
  return runtime::agree(driver, driver.rank() == 0
                                    ? tools::writeOutput(path, text)
                                    : llvm::Error::success());
}

// --save: the source model with replica 0's trained parameters and buffers.
llvm::Error saveModel(const runtime::Plan &plan, runtime::Trainer &trainer,
                      runtime::Driver &driver, const std::string &out) {
  auto trained = trainer.modelTensors();
  if (!trained)
    return trained.takeError();
  if (auto e = runtime::agree(
          driver, driver.rank() == 0 ? frontend::writeTrainedOnnx(
                                           plan.sourceModel, *trained, out)
                                     : llvm::Error::success()))
    return e;
  if (driver.rank() == 0)
    llvm::outs() << "wrote " << out << " (" << trained->size()
                 << " trained tensors)\n";
  return llvm::Error::success();
}

// The run itself, the same for both drivers: `stages` are this process's.
int train(const tools::RunOptions &opt, const tools::Flags &flags,
          const runtime::Plan &plan, std::vector<runtime::LocalStage *> stages,
          runtime::Driver &driver, const runtime::DataSource &data,
          bool live, bool underMpi) {
  bool root = driver.rank() == 0;
  // Rank 0 writes the files; every rank may write checkpoints.
  if (auto e = runtime::agree(
          driver, root ? tools::checkOutputs(
                             flags,
                             {"save", "trace", "timeline", "profile", "log",
                              "loss-curve"},
                             {"checkpoint-dir"})
                       : llvm::Error::success()))
    return report(std::move(e), tools::kBadInput);
  runtime::TrainOptions topt;
  topt.steps = opt.steps;
  topt.skipNonFinite = opt.skipNonFinite;
  topt.profile = flags.has("profile");
  topt.checkpointDir = flags.get("checkpoint-dir");
  topt.checkpointEvery = opt.checkpointEvery;
  topt.overlapSteps = opt.overlapSteps;
  topt.evalEvery = opt.evalEvery ? opt.evalEvery : opt.steps;
  runtime::Trainer trainer(
      plan, std::move(stages), driver,
      [&](int64_t step, int replica) { return data.forStep(step, replica); },
      topt);
  if (opt.lr)
    if (auto e = trainer.setLearningRate(*opt.lr))
      return report(std::move(e), tools::kBadInput);
  if (opt.lrSchedule) {
    runtime::LrSchedule s = *opt.lrSchedule;
    if (std::isnan(s.peak)) {
      auto lr = trainer.compiledLearningRate();
      if (!lr)
        return report(lr.takeError(), tools::kBadInput);
      s.peak = *lr;
      if (s.minLr > s.peak)
        return report(runtime::agree(
                          driver, root ? llvm::createStringError(
                                             llvm::inconvertibleErrorCode(),
                                             "--min-lr (" +
                                                 *flags.get("min-lr") +
                                                 ") is above the compiled "
                                                 "learning rate (" +
                                                 support::formatFloat(
                                                     float(s.peak)) +
                                                 "); pass --lr")
                                       : llvm::Error::success()),
                      tools::kUsage);
    }
    if (s.decaySteps == 0)
      s.decaySteps = opt.steps;
    trainer.setLrSchedule(s);
  }
  int64_t mbRows = plan.inputs.empty() || plan.inputs[0].shape.empty()
                       ? 1
                       : plan.inputs[0].shape[0];
  if (root)
    printTrainingHeader(plan, mbRows, opt.steps, data, flags,
                        underMpi ? driver.size() : 0);
  if (auto dir = flags.get("resume")) {
    auto done = trainer.resume(*dir);
    if (!done)
      return report(done.takeError(), tools::kBadInput);
    if (root)
      llvm::outs() << "resumed from " << *dir << " after step " << *done
                   << (*done < opt.steps ? "" : nothingToDo(flags, opt.steps))
                   << "\n";
    if (*done >= opt.steps) {
      if (auto out = flags.get("save"))
        if (auto e = saveModel(plan, trainer, driver, *out))
          return report(std::move(e), tools::kBadInput);
      llvm::outs().flush();
      return tools::kOk;
    }
  }
  if (root && trainer.lrSchedule())
    llvm::outs() << "learning rate: " << trainer.lrSchedule()->describe()
                 << (trainer.scheduleResumed() ? " (the checkpoint's)" : "")
                 << "\n";
  int64_t samplesPerStep = mbRows * plan.microbatches * plan.dataParallel;
  // Validation on held-out data: every process loads it, as --data.
  runtime::DataSource evalSource(plan, uint64_t(opt.seed));
  int64_t evalBatches = opt.evalBatches;
  if (auto spec = flags.get("eval-data")) {
    if (auto e = runtime::agree(driver, prefixed("--eval-data: ",
                                                 evalSource.load(*spec))))
      return report(std::move(e), tools::kBadInput);
    if (evalBatches == 0)
      evalBatches = std::max<int64_t>(
          1, (evalSource.samples() + samplesPerStep - 1) / samplesPerStep);
    trainer.setEvaluation(
        [&](int64_t batch, int replica) {
          return evalSource.forStep(batch, replica);
        },
        evalBatches);
    if (root)
      llvm::outs() << llvm::formatv(
          "validation: {0} batch(es) of {1} samples from {2} after every "
          "{3} step(s) and the last\n",
          evalBatches, samplesPerStep, *spec,
          opt.evalEvery ? opt.evalEvery : opt.steps);
  }
  bool quiet = flags.has("quiet");
  bool lineOpen = false; // a live step line waits for its newline
  std::vector<runtime::StepMetrics> metrics; // --log, --loss-curve
  // A resumed run continues the log it finds: the lines of the steps up to
  // the checkpoint's are kept, so the log and the curve cover the whole run.
  if (auto path = flags.get("log");
      path && root && trainer.firstStep() > 0 &&
      llvm::sys::fs::exists(*path)) {
    auto earlier = support::readFile(*path, "log", support::kMaxTextBytes);
    auto parsed = earlier ? runtime::parseMetricsJsonl((*earlier)->getBuffer())
                          : llvm::Expected<std::vector<runtime::StepMetrics>>(
                                earlier.takeError());
    if (parsed) {
      for (const runtime::StepMetrics &m : *parsed)
        if (m.step <= trainer.firstStep())
          metrics.push_back(m);
      llvm::outs() << "continuing " << *path << " (" << metrics.size()
                   << " earlier step(s))\n";
    } else {
      llvm::errs() << kTool << ": warning: " << *path << ": "
                   << llvm::toString(parsed.takeError())
                   << "; it is replaced by this run's steps\n";
    }
  }
  std::string curveTitle = "cleave-run " + plan.modelName + ": " +
                           std::to_string(opt.steps) + " steps";
  // Rank 0's files of metrics, written whole (atomically) at each
  // checkpoint and at the end, so an interrupted run leaves the log its
  // resume continues.
  auto writeMetrics = [&]() -> llvm::Error {
    if (!root)
      return llvm::Error::success();
    if (auto path = flags.get("log"))
      if (auto e = tools::writeOutput(*path, runtime::metricsJsonl(metrics)))
        return e;
    if (auto path = flags.get("loss-curve"))
      if (auto e = tools::writeOutput(
              *path, runtime::lossCurveSvg(metrics, curveTitle)))
        return e;
    return llvm::Error::success();
  };
  auto onStep = [&](const runtime::StepReport &r) {
    if (!root)
      return;
    metrics.push_back({r.step + 1, r.loss, r.evalLoss, r.evalAccuracy, r.lr,
                       r.gradNorm, r.stepSeconds,
                       r.stepSeconds > 0 ? double(samplesPerStep) / r.stepSeconds
                                         : 0.0});
    if (r.checkpoint)
      if (auto e = writeMetrics())
        llvm::errs() << kTool << ": warning: "
                     << llvm::toString(std::move(e)) << "\n";
    // After the step's own line: one line per checkpoint written.
    auto announceCheckpoint = [&] {
      if (!r.checkpoint)
        return;
      llvm::outs() << (lineOpen ? "\n" : "") << "wrote checkpoint "
                   << *r.checkpoint << " after step " << r.step + 1 << "\n";
      llvm::outs().flush();
      lineOpen = false;
    };
    if (r.skipped) {
      llvm::outs().flush();
      llvm::errs() << std::string(kTool) + ": warning: step " +
                          std::to_string(r.step + 1) + ": " +
                          tools::escapeControls(*r.skipped) +
                          "; the step's update was skipped\n";
    }
    if (quiet)
      return announceCheckpoint();
    int64_t done = r.step + 1 - trainer.firstStep();
    double rate = double(samplesPerStep * done) / r.elapsedSeconds;
    double eta = r.elapsedSeconds / double(done) * double(opt.steps - r.step - 1);
    // On a terminal one live line, rewritten each step; else one line per
    // step (logs, pipes).
    std::string extra;
    if (r.lr)
      extra += llvm::formatv("  lr {0:E3}", *r.lr).str();
    if (r.gradNorm)
      extra += llvm::formatv("  grad norm {0:F4}", *r.gradNorm).str();
    llvm::outs() << llvm::formatv(
        "{5}step {0,5}/{1}  loss {2:F4}{8}  {3:F0} samples/s  {7:F1} ms  ETA "
        "{4}{6}",
        r.step + 1, opt.steps, r.loss, rate, formatSeconds(eta),
        live ? "\r" : "", live ? "" : "\n", 1e3 * r.stepSeconds, extra);
    if (r.evalLoss)
      llvm::outs() << llvm::formatv(
          "{0}eval  step {1,5}/{2}  loss {3:F4}{4}\n", live ? "\n" : "",
          r.step + 1, opt.steps, *r.evalLoss,
          r.evalAccuracy
              ? llvm::formatv("  accuracy {0:F2}%", 100 * *r.evalAccuracy)
                    .str()
              : std::string());
    llvm::outs().flush();
    lineOpen = live;
    announceCheckpoint();
  };
  if (auto e = trainer.run(onStep))
    return report(std::move(e), tools::kBadInput);
  if (lineOpen)
    llvm::outs() << "\n";
  auto sum = trainer.summary();
  if (!sum)
    return report(sum.takeError(), tools::kBadInput);
  if (root) {
    printSummary(plan, *sum, opt.steps - trainer.firstStep(), opt.overlapSteps);
    printProfileHint(plan, *sum, opt.overlapSteps, flags);
  }

  if (auto path = flags.get("profile")) {
    auto text = trainer.profileJson();
    if (!text)
      return report(text.takeError(), tools::kBadInput);
    if (auto e = writeOnRoot(driver, *path, *text))
      return report(std::move(e), tools::kBadInput);
  }
  if (flags.has("trace") || flags.has("timeline")) {
    auto tracks = trainer.traceTracks();
    if (!tracks)
      return report(tracks.takeError(), tools::kBadInput);
    if (auto path = flags.get("trace"))
      if (auto e = writeOnRoot(driver, *path, runtime::chromeTraceJson(*tracks)))
        return report(std::move(e), tools::kBadInput);
    if (auto path = flags.get("timeline"))
      if (auto e = writeOnRoot(
              driver, *path,
              tools::timelineWithPrediction(plan, *tracks)))
        return report(std::move(e), tools::kBadInput);
  }
  if (auto e = runtime::agree(driver, writeMetrics()))
    return report(std::move(e), tools::kBadInput);
  if (auto out = flags.get("save"))
    if (auto e = saveModel(plan, trainer, driver, *out))
      return report(std::move(e), tools::kBadInput);
  llvm::outs().flush();
  return tools::kOk;
}

// Every stage as a thread of this process.
int runThreaded(tools::RunOptions opt, const tools::Flags &flags) {
  auto planOr = runtime::readPlanFile(opt.planPath, std::nullopt, opt.trusted);
  if (!planOr)
    return fail(kTool, llvm::toString(planOr.takeError()), tools::kBadInput);
  runtime::Plan &plan = *planOr;
  if (flags.has("print-plan")) {
    runtime::printPlan(plan, llvm::outs());
    return tools::kOk;
  }
  if (flags.has("save"))
    if (auto e = runtime::resolveSourceModel(plan, opt.planPath, opt.trusted))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  if (auto e = prefixed(opt.planPath + ": ",
                               codegen::checkRunnable(plan)))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  runtime::DataSource data(plan, uint64_t(opt.seed));
  data.setShuffle(opt.shuffle);
  if (auto d = flags.get("data"))
    if (auto e = data.load(*d))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  // The ranks run at once; a rank's stages take turns on its threads.
  opt.stage.threads = runtime::threadsPerStage(
      opt.threads, runtime::rankCount(plan) * plan.dataParallel);
  auto run = runtime::createThreadedPipeline(plan, opt.stage);
  if (!run)
    return fail(kTool, llvm::toString(run.takeError()), tools::kBadInput);
  auto driver = runtime::createSingleProcessDriver();
  return train(opt, flags, plan, (*run)->locals(), *driver, data,
               llvm::sys::Process::StandardOutIsDisplayed(),
               /*underMpi=*/false);
}

#ifdef CLEAVE_HAVE_MPI
// Under mpirun: world rank w runs stage w % P of replica w / P on this
// thread (with one replica, rank w runs stage w), loading only that stage;
// rank 0 prints what the threaded run prints. Pipeline messages go over the
// replica's group (ranks = stages), the gradient all-reduce over the stage's
// group (ranks = replicas), the trainer's collectives over the world.
int runUnderMpi(tools::RunOptions opt, const tools::Flags &flags, int &argc,
                char **&argv) {
  auto commOr = runtime::initMpi(argc, argv);
  if (!commOr)
    return fail(kTool, llvm::toString(commOr.takeError()), tools::kBadInput);
  std::unique_ptr<runtime::MpiComm> world = std::move(*commOr);
  world->setReporter(
      [](const std::string &msg) { fail(kTool, msg, tools::kBadInput); });
  // The sub-communicators made from the world take its timeout.
  world->setTimeout(opt.stage.commTimeoutSeconds);
  runtime::Driver &driver = *world;
  auto agreed = [&](llvm::Error e) {
    return report(runtime::agree(driver, std::move(e)), tools::kBadInput);
  };
  if (opt.usageError) {
    if (world->rank() == 0)
      fail(kTool, *opt.usageError, tools::kUsage);
    return tools::kUsage;
  }
  if (flags.has("print-plan")) {
    llvm::Error err = llvm::Error::success();
    if (world->rank() == 0) {
      auto plan =
          runtime::readPlanFile(opt.planPath, std::nullopt, opt.trusted);
      if (plan)
        runtime::printPlan(*plan, llvm::outs());
      else
        err = plan.takeError();
    }
    return agreed(std::move(err));
  }
  auto planOr = runtime::loadPlanForRank(opt.planPath, *world, opt.trusted);
  if (!planOr)
    return report(planOr.takeError(), tools::kBadInput);
  runtime::RankPlan &rp = *planOr;
  runtime::Plan &plan = rp.plan;
  if (int rc = report(runtime::checkRanksAgree(*world, opt.planPath,
                                               tools::resultFlagsText(flags)),
                      tools::kBadInput))
    return rc;
  if (flags.has("save"))
    if (int rc = agreed(world->rank() == 0
                            ? runtime::resolveSourceModel(plan, opt.planPath,
                                                          opt.trusted)
                            : llvm::Error::success()))
      return rc;
  if (int rc = agreed(prefixed(opt.planPath + ": ",
                                codegen::checkRunnable(plan))))
    return rc;
  int p = runtime::rankCount(plan), d = plan.dataParallel;
  bool shared = !plan.stageRank.empty();
  world->setRankNames([p, d, shared](int w) {
    return (d > 1 ? "replica " + std::to_string(w / p) + " " : std::string()) +
           (shared ? "rank " : "stage ") + std::to_string(w % p);
  });
  runtime::DataSource data(plan, uint64_t(opt.seed));
  data.setShuffle(opt.shuffle);
  if (auto d = flags.get("data"))
    if (int rc = agreed(data.load(*d)))
      return rc;
  opt.stage.threads = runtime::threadsPerStage(opt.threads, world->size());
  // Several stages in this process: each sees the pipeline through a view
  // in which it is its own rank (runtime/comm/StageComm.h).
  std::vector<std::unique_ptr<runtime::StageComm>> views;
  // --comm ordered or nccl: the plan's messages over channels whose host
  // FIFOs are a second group of the replica's processes.
  std::unique_ptr<runtime::MpiComm> fifo;
  std::vector<std::unique_ptr<runtime::Comm>> channelPipes;
  if (opt.stage.comm != "keyed") {
    auto group = world->split(rp.replica, rp.rank);
    if (!group)
      return report(world->failAlone(group.takeError()), tools::kBadInput);
    fifo = std::move(*group);
    fifo->setTimeout(opt.stage.commTimeoutSeconds);
    auto pipes = runtime::createRankPipes(plan, rp.replica, rp.stages,
                                          *rp.pipe, *fifo, opt.stage);
    if (int rc = agreed(pipes ? llvm::Error::success() : pipes.takeError()))
      return rc;
    channelPipes = std::move(*pipes);
  }
  // --comm nccl: each stage's replica group sums over NCCL where its
  // processes' GPUs differ (a collective of the group, stage by stage).
  std::vector<std::unique_ptr<runtime::Comm>> ncclGroups(rp.groups.size());
#ifdef CLEAVE_HAVE_CUDA
  if (opt.stage.comm == "nccl") {
    llvm::Error err = llvm::Error::success();
    auto devices = runtime::ncclStageGpus(plan, rp.replica, rp.stages,
                                          opt.stage);
    if (!devices)
      err = devices.takeError();
    for (size_t k = 0; k < rp.groups.size() && !err; ++k) {
      if (!rp.groups[k])
        continue;
      auto g = runtime::cuda::createNcclGroupComm(*rp.groups[k],
                                                  (*devices)[k]);
      if (g)
        ncclGroups[k] = std::move(*g);
      else
        err = prefixed("--comm=nccl: ", g.takeError());
    }
    if (int rc = agreed(std::move(err)))
      return rc;
  }
#endif
  std::vector<runtime::LocalStage> locals;
  llvm::Error made = llvm::Error::success();
  for (size_t k = 0; k < rp.stages.size() && !made; ++k) {
    runtime::Comm *pipe = rp.pipe.get();
    if (!channelPipes.empty()) {
      pipe = channelPipes[k].get();
    } else if (shared) {
      views.push_back(std::make_unique<runtime::StageComm>(
          *rp.pipe, rp.stages[k], plan.stageRank));
      pipe = views.back().get();
    }
    runtime::Comm *group =
        k < ncclGroups.size() && ncclGroups[k] ? ncclGroups[k].get()
        : k < rp.groups.size()                 ? rp.groups[k].get()
                                               : nullptr;
    auto st = runtime::createLocalStage(plan, rp.replica, rp.stages[k],
                                        opt.stage, *pipe, group);
    if (st)
      locals.push_back(std::move(*st));
    else
      made = st.takeError();
  }
  if (int rc = agreed(std::move(made)))
    return rc;
  std::vector<runtime::LocalStage *> ptrs;
  for (runtime::LocalStage &st : locals)
    ptrs.push_back(&st);
  return train(opt, flags, plan, ptrs, driver, data, /*live=*/false,
               /*underMpi=*/true);
}
#endif

} // namespace

static int toolMain(int argc, char **argv) {
  tools::Flags flags(tools::runFlagSpecs());
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help"))
    return tools::printHelp(kTool, flags, kHelp);
  if (flags.positional().size() != 1)
    return fail(kTool,
                flags.positional().empty()
                    ? "no plan given (usage: cleave-run PLAN.cplan [options]; "
                      "see --help)"
                    : "expected one plan, got " +
                          std::to_string(flags.positional().size()),
                tools::kUsage);
  tools::RunOptions opt;
  opt.planPath = flags.positional()[0];
  if (auto e = tools::readRunOptions(flags, opt)) {
    if (!runtime::launchedByMpirun())
      return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
    opt.usageError = llvm::toString(std::move(e)); // said once, by MPI rank 0
  }
  if (runtime::launchedByMpirun()) {
    if (opt.overlapSteps && !opt.usageError)
      opt.usageError = "--overlap-steps runs threaded (one process, a thread "
                       "per rank); under mpirun each step's figures meet on "
                       "rank 0 every step";
#ifdef CLEAVE_HAVE_MPI
    return runUnderMpi(opt, flags, argc, argv);
#else
    return fail(kTool,
                "this cleave-run was built without MPI (install "
                "libopenmpi-dev and rebuild); run it without mpirun to train "
                "with one thread per stage",
                tools::kUsage);
#endif
  }
  return runThreaded(opt, flags);
}

int main(int argc, char **argv) {
  return tools::guardedMain(kTool, argc, argv, toolMain);
}
