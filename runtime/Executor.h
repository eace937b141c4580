// The Plan executor: runs one pipeline stage of a Plan (runtime/Plan.h) on
// any Backend (runtime/Kernel.h), talking to the other stages through a Comm
// (runtime/Comm.h). It knows nothing of ONNX or the IR graph.
//
// StageExecutor::create allocates the stage's memory and checks the plan:
//  - State and Const slots get their own buffers, filled from their blob
//    (whose FNV-1a checksum must match); Accum slots get their own buffers;
//  - one step frame of stepFrameBytes holds the StepTemp slots;
//  - microbatch frames of frameBytes hold the MicroTemp and Input slots at
//    their `offset`. Frames are allocated lazily and recycled: a microbatch
//    takes one at its F and gives it back after its last action on this
//    stage (its W or BW; its B when it has no W; its F when the stage has
//    no backward action for it), so a 1F1B order needs fewer than GPipe's;
//  - every kernel must be supported by the backend for the element type of
//    its first input, every slot index and byte range must be in bounds, and
//    the action list must take each microbatch's F before its B/W and
//    accumulate in increasing microbatch order.
//
// runStep(step, data) walks the stage's action list once:
//   F  fills the Input slots from `data`, runs programs[F], applies the
//      fwdUpdates (state takes value's bytes) and records the loss;
//   B, W run programs[B] / programs[W]; BW runs programs[B] then [W];
//   STEP runs programs[Step] (microbatch -1), then the stepUpdates.
// After the action in which a MicroTemp slot with `accum >= 0` is written
// for microbatch i, it is summed into its Accum slot: i = 0 copies, later
// microbatches run the backend's Add kernel (acc = acc + value), so the sum
// has one fixed order whatever the schedule. Kernel instructions get seed
// kernelSeed(step, microbatch, seedSalt). Send/Recv go through the Comm with
// the instruction's tag and the microbatch (-1 in the Step program).
//
// runPipelineThreads() runs every stage of a pipeline on its own thread (the
// in-process Comm group) and, when one stage fails, aborts the group so the
// others stop instead of waiting forever.
#pragma once

#include "runtime/comm/Comm.h"
#include "runtime/Kernel.h"
#include "runtime/Plan.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/Error.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cleave::runtime {

// Fills graph input `inputName` of `microbatch`: writes exactly `bytes`
// bytes (the Input slot's size) to `dst`, which is host memory.
using DataFn = std::function<llvm::Error(int microbatch,
                                         const std::string &inputName,
                                         void *dst, size_t bytes)>;

// The seed a kernel instruction gets (Dropout): a hash of the step, the
// microbatch (-1 in the Step program) and the instruction's seedSalt.
uint64_t kernelSeed(int64_t step, int microbatch, uint64_t seedSalt);

struct StageStats {
  int64_t persistentBytes = 0; // State + Const + Accum buffers
  int64_t frameBytes = 0;      // one microbatch frame
  int64_t stepFrameBytes = 0;
  int maxFramesInFlight = 0;   // the most frames held at once, over all steps
  int framesAllocated = 0;     // frames ever allocated (<= maxFramesInFlight)
  // persistentBytes + maxFramesInFlight * frameBytes + stepFrameBytes.
  int64_t peakBytes = 0;
  // Host memory of offloaded activations: maxFramesInFlight * the host
  // frame (StagePlan::hostFrameBytes); not part of peakBytes.
  int64_t hostPeakBytes = 0;
  // Wall seconds spent in each ActionKind during the last runStep (indexed
  // by the ActionKind's value), including time blocked in Recv.
  std::array<double, 5> busySeconds{};
  double recvWaitSeconds = 0; // of those, blocked in Comm::recv
  double stepSeconds = 0;     // the whole last runStep
  // In the last step, the time the thread running this stage's rank was
  // ready but had no core (support/CpuShare.h; 0 on the rank's other
  // stages, and where the kernel does not keep the figure). Kernel pool
  // threads' waits are not in it.
  double coreWaitSeconds = 0;
  // What ran in the last runStep, in seconds of the steady clock (comparable
  // across stages of one process): each action, and each wait in a recv
  // longer than a microsecond (name "RECV", microbatch of the message).
  struct Span {
    std::string name; // F, B, W, BW, STEP or RECV
    int microbatch = -1;
    double start = 0, end = 0;
  };
  std::vector<Span> spans;
};

// Per-instruction time with profiling on, summed over calls.
struct InstrProfile {
  double seconds = 0;
  int64_t calls = 0;
};
// (loc, phase) -> time. Instructions without a loc are keyed by a made-up
// one: "send <slot>", "recv <slot>" or "<Op> <first output slot>".
using ProfileMap = std::map<std::pair<std::string, Phase>, InstrProfile>;

class StageExecutor {
public:
  // The executor copies what it needs of `plan`; `backend` and `comm` must
  // outlive it. comm.rank() must equal `stage`.
  static llvm::Expected<std::unique_ptr<StageExecutor>>
  create(const Plan &plan, int stage, Backend &backend, Comm &comm);
  ~StageExecutor();
  StageExecutor(const StageExecutor &) = delete;
  StageExecutor &operator=(const StageExecutor &) = delete;

  // Runs the stage's action list once (one training step). Errors name the
  // action and instruction ("F of microbatch 2, instr 3 (Relu 'fc1'): ...")
  // but not the stage: runPipelineThreads adds "stage N: ".
  llvm::Error runStep(int64_t step, const DataFn &data);

  // Evaluation: the forward program of each of the plan's microbatches, in
  // order, on `data`, between steps: no state updates (BatchNorm running
  // statistics stay), no gradient sums, no backward, so the training that
  // follows has the bits it would have had. Returns the loss of each
  // microbatch (empty off the loss stage). Kernel seeds take `seedStep`.
  llvm::Expected<std::vector<double>> runForward(int64_t seedStep,
                                                 const DataFn &data);

  // The same step in pieces, for a rank that runs several stages in one
  // thread (runRankStep): beginStep; runActions over the action list, in
  // the order the rank interleaves its stages; then the update (the STEP
  // action: data-parallel sums, the vote on non-finite values, the step
  // program). beginUpdate sends what the stage owes the others;
  // continueUpdate runs as far as it can without waiting for a message
  // (wait: block instead) and returns true when the update is done, false
  // when a message it needs has not come yet, so the rank can run its
  // other stages' updates first (a tied weight's gradient goes between
  // two stages of one rank).
  void beginStep(int64_t step, const DataFn &data);
  // Actions [first, first + count) of the list, the STEP excluded.
  llvm::Error runActions(size_t first, size_t count);
  llvm::Error beginUpdate();
  llvm::Expected<bool> continueUpdate(bool wait);
  // The index of the STEP action (the action list's last), and whether the
  // list has one (a plan that passed verifyPlan always does).
  size_t stepAction() const;
  bool hasStepAction() const { return stepAction() < stage_.actions.size(); }

  int stage() const { return stage_.index; }
  Comm &comm() { return comm_; }
  Backend &backend() { return backend_; }

  // The loss, when this stage computes it (StagePlan::lossSlot): the mean of
  // the last step's per-microbatch values, and those values in the order
  // their F ran.
  bool hasLoss() const { return stage_.lossSlot >= 0; }
  double lastLoss() const;
  // The last runForward's accuracy counts on the loss's stage (predictions
  // equal to their label, labels counted), {0, 0} elsewhere.
  std::pair<int64_t, int64_t> lastAccuracy() const { return accuracy_; }
  const std::vector<double> &lastLosses() const { return losses_; }

  const StageStats &stats() const { return stats_; }
  // runRankStep's reading of its thread's core wait over the step.
  void setCoreWait(double seconds) { stats_.coreWaitSeconds = seconds; }

  // Per-kernel timing (off by default; on, every kernel call is timed;
  // sends and recvs are not, their time is mostly waiting for the other
  // stage). profile() accumulates until clearProfile().
  void setProfiling(bool on) { profiling_ = on; }
  bool profiling() const { return profiling_; }
  const ProfileMap &profile() const { return profile_; }
  // Per action kind (F, B, W, BW; W batches not counted), what the actions
  // took beyond their kernels and their waits in recv, summed, and how many
  // ran, while profiling; STEP: the update's own passes (the non-finite
  // check, the state copies), without its kernels and votes.
  const std::array<InstrProfile, 5> &actionOverhead() const {
    return actionOverhead_;
  }
  // Of those overheads, summed per kind, the time the thread was ready
  // without a core (support/CpuShare.h: on a shared machine, mostly after
  // it woke the stage it sent to); and the same wait inside its receives,
  // after their message came. A simulation of shared cores makes these
  // waits itself (docs/design/runtime.md, "Sharing the cores").
  const std::array<double, 5> &actionCoreWait() const {
    return actionCoreWait_;
  }
  double recvCoreWait() const { return recvCoreWait_; }
  // The wait for a core inside the kernels of each phase (F, B, W), summed:
  // a long kernel loses its core to a time slice elsewhere (the phase's
  // program's wait less its receives' and sends').
  double kernelCoreWait(Phase p) const {
    return p == Phase::Step ? 0 : kernelCoreWait_[size_t(p)];
  }
  void clearProfile() {
    profile_.clear();
    actionOverhead_ = {};
    actionCoreWait_ = {};
    recvCoreWait_ = sendCoreWait_ = 0;
    kernelCoreWait_ = {};
  }

  // A State, Const or Accum slot's current bytes (trained parameters,
  // optimizer state) copied to host memory.
  llvm::Expected<std::vector<uint8_t>> readSlot(const std::string &name) const;
  // Replaces a State slot's bytes (--lr on "optimizer.lr", resuming);
  // `bytes` must be the slot's size.
  llvm::Error writeSlot(const std::string &name,
                        const std::vector<uint8_t> &bytes);
  // The slot named `name`, or -1.
  int findSlot(const std::string &name) const;

  // Data parallelism: `group` connects this stage's replicas (its rank is
  // the replica). Before the step program, every Accum slot (the step's
  // gradient sums) is summed over the replicas in replica order (replica 0
  // adds 1, 2, ... and sends the total back), so every replica applies the
  // same update. `group` must outlive the executor; null turns it off.
  void setDataParallel(Comm *group) { dataParallel_ = group; }

  // Non-finite values: with a policy other than Ignore, before the step
  // program every stage checks its gradient sums (after the data-parallel
  // sum) and its losses for NaN and Inf, and the stages of the pipeline
  // vote (messages through the pipeline comm, stage 0 collecting); when any
  // found one, no stage runs its step program, so parameters and optimizer
  // state keep their values. stepSkipped() says so, nonFiniteReport() names
  // what this stage found (the value, the op that made it, the microbatch
  // for a loss). Stop and SkipStep differ only for the driver, which stops
  // or goes on.
  //
  // StopAfter (overlapping steps under Stop): the update goes ahead without
  // waiting; the stage sends its finding to every other stage and takes
  // theirs at its next update (collectVotes at the end of a run of steps),
  // so the verdict on step k is known one step later (verdict()). A run
  // that then stops has gone on past the step it reports, in memory only.
  enum class NonFinitePolicy { Ignore, Stop, SkipStep, StopAfter };
  void setNonFinitePolicy(NonFinitePolicy p) { nonFinitePolicy_ = p; }
  NonFinitePolicy nonFinitePolicy() const { return nonFinitePolicy_; }
  // StopAfter: the latest step whose votes are all in, and whether any
  // stage found a non-finite value in it.
  struct Verdict {
    int64_t step = -1;
    bool bad = false;
  };
  const Verdict &verdict() const { return verdict_; }
  // StopAfter: takes the votes on the last update still out (waiting for
  // them); then verdict() is on that step.
  llvm::Error collectVotes();
  bool stepSkipped() const { return stepSkipped_; }
  const std::string &nonFiniteReport() const { return nonFiniteReport_; }
  Comm *dataParallel() const { return dataParallel_; }

  // Gradient clipping by global norm (--clip-grad-norm; off at 0). Before
  // its first SGD/AdamW instruction, each stage takes the sum of squares of
  // each gradient its optimizer ops read (the averaged gradient: the sum
  // times grad_scale; in double, in blocks of a fixed size added in
  // order), sends them to stage 0, which puts every stage's into the
  // model's parameter order (Plan::modelTensors), adds them in that order
  // and sends the total back. A tied weight is updated on one stage only,
  // from its summed gradient, so it counts once. Every stage then scales
  // its gradients by min(1, maxNorm / (norm + 1e-6)) (as float, in place)
  // before the update, as torch.nn.utils.clip_grad_norm_ does. The same
  // decomposition for every P, schedule, thread count and process layout:
  // the same bits. Refused (one line) for a plan whose step program
  // computes a gradient, or sends what another stage's gradient needs,
  // after its first update.
  llvm::Error setClipGradNorm(double maxNorm);
  double clipGradNorm() const { return clipMax_; }
  // The last update's global gradient norm (before clipping); NaN without
  // clipping or before the first update.
  double lastGradNorm() const { return lastGradNorm_; }

  // W batching (off by default): where the action list has W actions of
  // consecutive microbatches next to each other, they run as one: each
  // weight-gradient product of the W program (MatMulGradB, GemmGradB,
  // ConvGradFilter) whose result only goes, through layout ops and casts,
  // into a gradient sum runs once over the microbatches' operands
  // concatenated along the batch (the same sum, with the products' own
  // summation order), and the rest of the program runs per microbatch.
  // Fewer, larger GEMMs; results equal the unbatched ones up to rounding.
  // The plan decides (cleavec --batch-w, StagePlan::wBatch); on asks for
  // it on a plan compiled without (planWBatch on this stage's copy).
  void setBatchW(bool on);
  // Graphs (cleave-run --cuda-graphs): each run of two or more kernel
  // instructions of an F, B or W program (no message, offload copy or
  // random draw among them) is recorded by the backend as a graph the
  // second time it runs with the same tensors, and launched as one after.
  // Refused (one line) where the backend has no graphs.
  llvm::Error setGraphs(bool on);
  // Graph launches and recordings since the executor was made.
  int64_t graphLaunches() const { return graphLaunches_; }
  // Gemm + Gelu pairs run as one call (Backend::fusesGemmGelu).
  int fusedEpilogues() const { return fusedEpilogues_; }
  int64_t graphsRecorded() const { return graphsRecorded_; }
  // W products that ran batched, and the per-microbatch products they
  // replaced, since the executor was made.
  int64_t batchedProducts() const { return batchedProducts_; }
  int64_t replacedProducts() const { return replacedProducts_; }

private:
  void indexWBatch(); // wSummed_ from the plan's wBatchSummed
  llvm::Error runBatchedW(size_t first, size_t count, int64_t step);
  StageExecutor(const StagePlan &sp, int microbatches, Backend &backend,
                Comm &comm);
  llvm::Error prepare(const Plan &plan);
  // Backend::fusesGemmGelu: the pairs rewritten in this stage's programs.
  void fuseGemmGelu();
  llvm::Error checkActions();

  void *slotData(int slot, void *frame) const;
  llvm::Expected<void *> takeFrame();
  void giveFrame(void *frame);
  llvm::Error runProgram(Phase phase, int64_t step, int microbatch,
                         void *frame);
  llvm::Error runProgramOn(Phase phase, int64_t step, int microbatch,
                           void *frame);
  llvm::Error runInstr(const Instr &in, size_t index, Phase phase,
                       int64_t step, int microbatch, void *frame);
  // A kernel instruction's tensors as it runs now (the first microbatch's
  // value of an accumulated slot nothing else reads goes straight into the
  // accumulator, which this decides and notes); false: nothing to run (a
  // reshape on its operand's bytes).
  bool kernelTensors(const Instr &in, int microbatch, void *frame,
                     llvm::SmallVectorImpl<TensorRef> &ins,
                     llvm::SmallVectorImpl<TensorRef> &outs);
  std::string instrWhere(const Instr &in, size_t index, Phase phase) const;
  bool graphable(const Instr &in) const;
  llvm::Error runGraphed(Phase phase, size_t first, size_t end, int64_t step,
                         int microbatch, void *frame);
  llvm::Error copySlot(int dst, void *dstFrame, int src, void *srcFrame);
  llvm::Error accumulate(Phase phase, int microbatch, void *frame);
  llvm::Error accumulateSlot(int slot, int microbatch, void *frame);
  llvm::Error allReduceAccums();
  void indexClipping(const Plan &plan);
  llvm::Expected<bool> exchangeNorm(bool wait);
  llvm::Error scaleGradient(int slot);
  std::string describeNonFinite();
  llvm::Error stepError(llvm::Error e);
  bool finishUpdate();
  llvm::Error fillInputs(int microbatch, void *frame, const DataFn &data);
  llvm::Error recordLoss(void *frame);
  std::string instrKey(const Instr &in) const;

  StagePlan stage_;
  int microbatches_;
  Backend &backend_;
  Comm &comm_;
  bool hostMemory_; // backend memory is host memory (send/recv in place)

  std::vector<void *> persistent_; // by slot: State/Const/Accum buffers
  void *stepFrame_ = nullptr;
  std::vector<void *> freeFrames_, allFrames_;
  // The host frame that goes with each microbatch frame (offloading plans).
  std::map<void *, void *> hostFrames_;
  std::map<int, void *> live_; // microbatch -> its frame
  // lastAction_[mb]: index into stage_.actions after which mb's frame goes.
  std::vector<int> lastAction_;
  // The Accum-fed slots each phase writes (F, B, W).
  std::vector<int> accumWrites_[3];
  std::vector<int> accumCount_; // by Accum slot: microbatches summed so far
  // By slot: a per-microbatch value the first microbatch's kernel writes
  // straight into its accumulator (nothing else reads it, same type and
  // size), so that summing it is no copy. By Accum slot: it was so written
  // this step.
  std::vector<bool> intoAccum_, accumPreset_;
  // By StepTemp slot: the State slot whose bytes an optimizer writes it
  // into (placeUpdatesInPlace), or -1.
  std::vector<int> stepAlias_;
  void placeUpdatesInPlace();
  std::vector<double> losses_;
  std::pair<int64_t, int64_t> accuracy_{0, 0};
  llvm::Error recordAccuracy(void *frame);
  std::map<std::string, int> byName_;
  std::vector<uint8_t> staging_; // host bounce buffer (non-host backends)

  // The step being run (beginStep) and how far its update got.
  int64_t step_ = 0;
  DataFn data_;
  std::chrono::steady_clock::time_point stepStart_;
  struct Update {
    std::chrono::steady_clock::time_point start;
    bool voting = false;  // the vote is not over
    int32_t bad = 0;      // this stage's finding, then the verdict
    int nextVoter = 1;    // stage 0: the next stage whose vote it takes
    size_t next = 0;      // the next instruction of the step program
    bool normSent = false, normKnown = false; // --clip-grad-norm
    int nextNormFrom = 1; // stage 0: the next stage whose sums it takes
  } update_;
  // Clipping: the maximum norm (0: off), the step program's SGD/AdamW
  // instructions, the index of the first (where the norm must be known),
  // by stage the count of each's optimizer ops, on stage 0 the position
  // of each received sum in the model's parameter order, the scale of the
  // update under way, and why the plan cannot clip (empty: it can).
  double clipMax_ = 0, lastGradNorm_ = NAN, clipScale_ = 1;
  std::vector<size_t> optInstrs_;
  size_t normAt_ = 0;
  std::vector<size_t> normCounts_, normOrder_;
  std::vector<double> normSums_; // stage 0: every stage's, as received
  std::string clipRefusal_;
  int64_t normTag_ = 0;
  void *clipScalar_ = nullptr; // the scale in backend memory
  // StopAfter: the step whose votes are still out (-1: none), those taken
  // so far, and what they said.
  int64_t votesOutFor_ = -1;
  int nextVoteFrom_ = 0;
  int32_t votesBad_ = 0;
  Verdict verdict_;
  llvm::Expected<bool> takeVotes(bool wait);

  StageStats stats_;
  bool profiling_ = false;
  // Graphs: per (phase, first instruction), the tensors of each run seen
  // and its graph's state.
  struct GraphRun {
    std::vector<void *> tensors;
    int seen = 0;       // plain runs with these tensors
    int failed = 0;     // recordings the backend could not keep
    uint64_t id = 0;    // the backend's graph, once recorded (0: none)
  };
  bool graphs_ = false;
  std::map<std::pair<int, size_t>, std::vector<GraphRun>> graphRuns_;
  uint64_t nextGraph_ = 1;
  int64_t graphLaunches_ = 0, graphsRecorded_ = 0;
  int fusedEpilogues_ = 0;
  Comm *dataParallel_ = nullptr;
  NonFinitePolicy nonFinitePolicy_ = NonFinitePolicy::Ignore;
  bool stepSkipped_ = false;
  std::string nonFiniteReport_;
  int64_t voteTag_ = 0; // past every tag of the plan's messages
  std::vector<bool> wSummed_; // by slot: filled by a batched chain
  void *wScratch_ = nullptr; // concatenated W operands, grown, kept
  size_t wScratchBytes_ = 0;
  int64_t batchedProducts_ = 0, replacedProducts_ = 0;
  void *reduceDevice_ = nullptr;      // ... in backend memory
  size_t reduceDeviceBytes_ = 0;
  ProfileMap profile_;
  std::array<InstrProfile, 5> actionOverhead_{};
  std::array<double, 5> actionCoreWait_{};
  double recvCoreWait_ = 0, sendCoreWait_ = 0;
  std::array<double, 3> kernelCoreWait_{}; // by Phase F, B, W
  double actionKernelSeconds_ = 0; // the current action's, while profiling
};

// One rank's share of a step: its stages in increasing order, the data
// each reads, and its program (Plan::rankPrograms: the stage of each next
// F, B, W or BW; empty with one stage).
struct RankWork {
  std::vector<StageExecutor *> stages;
  std::vector<DataFn> data;
  std::vector<int> program;
};
// Runs the rank's stages' actions in the program's order on this thread,
// then their updates (each as far as it can go, in turn). Errors: "stage
// N: <error>".
llvm::Error runRankStep(const RankWork &work, int64_t step);
// runRankStep for every rank at once, one thread each; when one fails it
// aborts every stage's Comm group and the first failure is returned.
llvm::Error runRankThreads(const std::vector<RankWork> &ranks, int64_t step);

// Runs stages[i]->runStep(step, data) for all i at once, one thread each.
// When a stage fails it aborts its Comm group (waking every blocked recv)
// and the first failure is returned as "stage N: <error>". `data` is called
// from every stage's thread.
llvm::Error runPipelineThreads(std::vector<StageExecutor *> stages,
                               int64_t step, const DataFn &data);
// The same with data[i] feeding stages[i] (data-parallel replicas read
// different samples).
llvm::Error runPipelineThreads(std::vector<StageExecutor *> stages,
                               int64_t step, const std::vector<DataFn> &data);

} // namespace cleave::runtime
