// The Plan: everything the runtime needs to train a compiled model, and
// nothing of ONNX or the IR graph. codegen/ makes one from a partitioned,
// scheduled training graph; runtime/PlanFile.h writes and reads it
// (docs/design/plan.md); runtime/Executor.h runs it.
//
// One training step runs M microbatches. Each stage owns
//  - slots: every tensor it touches (inputs, state, constants, per-microbatch
//    temporaries, per-step temporaries, per-step accumulators);
//  - four programs, one per phase: F, B and W run once per microbatch, Step
//    once per step; each is a list of kernel calls and point-to-point
//    messages over slots;
//  - its action list from the schedule (F/B/W/BW of a microbatch, STEP).
//
// Memory (an offloading plan also has a host frame per microbatch, for its
// HostTemp slots; see Instr::waitCopies): MicroTemp slots live in a per-microbatch frame at a fixed byte
// offset (frameBytes in all, planned from liveness over F, B and W, so a
// stashed activation keeps its bytes until its B and W have run); a frame is
// taken at the microbatch's F and given back after its last backward action.
// StepTemp slots live in one step frame. State, Const and Accum slots are
// allocated once.
//
// Messages: a Send copies its slot to the peer stage, tagged with `tag` and
// the microbatch (-1 in Step programs); the matching Recv on the peer has the
// same tag. Sends never block; a Recv waits for its message.
//
// Accumulators: a per-microbatch value that a Step instruction reads is
// summed over the step's microbatches, in microbatch order (the first
// copied, then Add), into an Accum slot, right after the action that
// computes it for that microbatch; Step instructions read the Accum slot.
#pragma once

#include "ir/Attribute.h"
#include "ir/DType.h"
#include "ir/OpInfo.h"

#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::runtime {

inline constexpr int kPlanVersion = 3;

enum class SlotKind : uint8_t {
  Input,     // a graph input, loaded per microbatch from the data
  State,     // a parameter or buffer: persistent, replaced by StateUpdates
  Const,     // a read-only declared tensor
  MicroTemp, // computed per microbatch, in the microbatch frame
  StepTemp,  // computed by the Step program, in the step frame
  Accum,     // the microbatch sum of a MicroTemp, read by Step
  HostTemp,  // an offloaded copy, in the microbatch's host frame
};
const char *slotKindName(SlotKind k);

struct Slot {
  std::string name; // the value's name in the training graph
  SlotKind kind = SlotKind::MicroTemp;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;   // element size x element count
  int64_t offset = -1; // MicroTemp, StepTemp, HostTemp: offset in its frame
  int blob = -1;       // State, Const: index into Plan::blobs (initial data)
  int accum = -1;      // MicroTemp: the Accum slot that sums it, or -1
  bool trainable = false; // State: a parameter the optimizer updates
};

enum class InstrKind : uint8_t { Kernel, Send, Recv };

struct Instr {
  InstrKind kind = InstrKind::Kernel;
  ir::OpKind op = ir::OpKind::Identity; // Kernel
  ir::AttrMap attrs;                    // Kernel
  std::vector<int> inputs;  // slot indices; Send: the one slot it sends
  std::vector<int> outputs; // slot indices; Recv: the one slot it fills
  int peer = -1;            // Send, Recv: the other stage
  int64_t tag = 0;          // Send, Recv: same on both ends
  uint64_t seedSalt = 0;    // Kernel: mixed with step and microbatch (Dropout)
  std::string loc;          // the ONNX node name, for errors and profiles
  // Activation offload: before this instruction the compute work waits
  // for the copies started so far (Backend::waitForCopies): it is the first
  // to write bytes an Offload still copies from, or the first reader of a
  // Fetch's result. Nothing to do where copies are synchronous.
  bool waitCopies = false;
};

enum class Phase : uint8_t { F, B, W, Step };
inline constexpr int kNumPhases = 4;
const char *phaseName(Phase p); // "F", "B", "W", "STEP"

enum class ActionKind : uint8_t { F, B, W, BW, Step };
struct Action {
  ActionKind kind = ActionKind::F;
  int microbatch = -1; // -1 for Step
};
const char *actionKindName(ActionKind k); // "F", "B", "W", "BW", "STEP"

// The program phases an action runs, in order (BW: B, then W).
inline llvm::SmallVector<Phase, 2> phasesOf(ActionKind k) {
  switch (k) {
  case ActionKind::F: return {Phase::F};
  case ActionKind::B: return {Phase::B};
  case ActionKind::W: return {Phase::W};
  case ActionKind::BW: return {Phase::B, Phase::W};
  case ActionKind::Step: return {Phase::Step};
  }
  return {};
}

// After each F of a microbatch (BatchNorm running statistics) or after the
// Step program (parameters, optimizer state), `state` takes `value`'s bytes.
struct StateUpdate {
  int state = -1;
  int value = -1;
};

struct StagePlan {
  int index = 0;
  std::vector<Slot> slots;
  std::vector<Instr> programs[kNumPhases];
  std::vector<StateUpdate> fwdUpdates, stepUpdates;
  std::vector<Action> actions;
  int64_t frameBytes = 0;     // one microbatch frame
  int64_t stepFrameBytes = 0; // the step frame
  // The host frame of a microbatch (activation offload): HostTemp slots,
  // taken and given back with the microbatch frame; 0 when nothing is
  // offloaded. Host memory, not part of predictedPeakBytes.
  int64_t hostFrameBytes = 0;
  int lossSlot = -1;          // MicroTemp holding the loss, on one stage
  // Accuracy for validation (cleave-run --eval-data), on the loss's stage
  // when the loss is one cross-entropy: its class scores [N, C, d...] and
  // labels [N, d...], both alive at the end of F (its gradient reads them
  // in B); a prediction is the first largest score along axis 1, a label
  // equal to ignoreIndex (when hasIgnoreIndex) is not counted. -1: none.
  int accuracyScoresSlot = -1, accuracyLabelsSlot = -1;
  bool hasIgnoreIndex = false;
  int64_t ignoreIndex = 0;
  // The compiler's predictions for this stage.
  double predictedF = 0, predictedB = 0, predictedW = 0; // per microbatch
  int64_t predictedPeakBytes = 0;
  // W batching (cleavec --batch-w, planWBatch): a run of W actions of
  // consecutive microbatches runs each weight-gradient product once, over
  // the run's operands side by side. wBatchProduct has one entry per W
  // instruction: the index of the product it belongs to (its own for a
  // product, the product's for the layout ops that follow it), -1 for one
  // that runs per microbatch. wBatchSummed are the slots a batched chain
  // fills with the whole run's sum at once; wBatchScratchBytes the
  // operands of the longest run laid side by side, part of the peak.
  bool wBatch = false;
  std::vector<int> wBatchProduct;
  std::vector<int> wBatchSummed;
  int64_t wBatchScratchBytes = 0;
};

// Decides W batching for a stage (sets the wBatch fields): a weight-
// gradient product whose operands concatenate along their first dim into
// the same product (MatMulGradB with a 2-D result and equal-rank operands,
// GemmGradB without transA, ConvGradFilter), followed by a chain of
// single-use layout ops and casts ending in a slot that is only summed over
// the microbatches, batches: the sum of the chain's results is the chain
// applied to the product of the concatenated operands. A W program with
// messages does not batch (wBatch stays false). Codegen calls it for
// cleavec --batch-w; cleave-run --batch-w for a plan compiled without.
void planWBatch(StagePlan &stage);

// The step's state updates that write the new value into the state's own
// bytes: for each slot, the state slot whose bytes it takes, or -1. An
// update qualifies when its value is a StepTemp slot of the state's type
// and size, written once in the step program, by an SGD or AdamW kernel
// (each reads element i of every operand before it writes element i of
// any result, on every backend), and no step instruction writes the state
// or reads it after that kernel.
// Such a value takes no room in the step frame (passes/MemoryPlan.cpp
// plans it out; codegen checks the two agree), and the update copies
// nothing.
std::vector<int> stepUpdatesInPlace(const StagePlan &stage);

// A parameter's or constant's initial value, in one of three forms: the
// plan holds its bytes (`bytes`: written into the .cplan); it refers to
// `size` bytes at `offset` of weightFiles[file] (cleavec
// --weights=reference: a model's external data stays where it is, and each
// rank reads only its own); or `size` bytes of one repeated element
// (`fill`: optimizer state starts as zeros, however large).
struct Blob {
  std::vector<uint8_t> bytes;
  int file = -1;        // index into Plan::weightFiles; -1: not referenced
  uint64_t offset = 0;  // referenced: where the bytes start in the file
  uint64_t size = 0;    // referenced or filled: how many bytes
  std::vector<uint8_t> fill; // filled: the element (1, 2, 4 or 8 bytes)
  uint64_t checksum = 0; // support::blockChecksum of the bytes (held, referenced)

  bool referenced() const { return file >= 0; }
  bool filled() const { return !fill.empty(); }
  uint64_t byteSize() const {
    return referenced() || filled() ? size : bytes.size();
  }
};

// A file whose bytes referenced blobs name, as it was when the plan was
// compiled; a file of another size is refused before anything runs, and
// each blob's checksum is checked as its bytes are loaded.
struct WeightFile {
  std::string path; // absolute
  uint64_t size = 0;
};

struct PlanInput {
  std::string name;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape; // one microbatch; shape[0] is its sample count
  // Integer inputs used as indices (Gather) or class labels: values must
  // be below this (synthetic data stays in range); 0 when unknown.
  int64_t indexLimit = 0;
  // How the model uses an integer input (codegen::analyzeInputs on the
  // whole graph), which is how window data (--data tokens:, text:) fills
  // it. `indexes`: it, or a reshape of it, indexes a table (an embedding's
  // token ids). `labels`: it reaches a loss's class labels; `labelShift`:
  // the positions the model drops from the front of their sequence axis
  // on the way (1 for a model that shifts its labels itself, as HF's
  // labels= does), -1 when the path does something else to that axis.
  bool indexes = false;
  bool labels = false;
  int64_t labelShift = 0;
};

// A parameter or buffer of the source model, as --save writes it back.
struct PlanTensor {
  std::string name;
  ir::DType dtype = ir::DType::F32;
  std::vector<int64_t> shape;
};

struct Plan {
  int version = kPlanVersion;
  std::string modelName;
  // The .onnx the plan was compiled from (--save): in the file, a path
  // relative to the plan's folder (absolute when the model lies outside
  // it); readers resolve it under support/TrustedPaths.h's rule. Its size
  // and the SHA-256 of its bytes (hex) as compiled: --save refuses another
  // file. An empty digest: a plan from a cleavec that recorded none.
  std::string sourceModel;
  uint64_t sourceModelSize = 0;
  std::string sourceModelSha256;
  // The source model's parameters and buffers (declaration order): what
  // --save writes into a copy of sourceModel, without importing it again.
  std::vector<PlanTensor> modelTensors;
  std::string schedule;    // the schedule's name
  int microbatches = 1;  // per replica and step
  int dataParallel = 1;  // replicas of the pipeline (gradients summed)
  std::vector<PlanInput> inputs;
  std::string optimizer; // "sgd" or "adamw"
  double lr = 0;         // the default learning rate (slot optimizer.lr)
  std::string precision = "f32"; // "bf16": products in bf16 (--precision)
  std::vector<StagePlan> stages;
  // Several stages per rank (cleavec --chunks): stageRank[s] is the rank
  // (device, process) running stage s, and rankPrograms[r] the order rank r
  // runs its stages' actions in: entry k names the stage whose next F, B,
  // W or BW it runs k-th. A rank runs its stages' STEPs after all of them,
  // in increasing stage order. Both empty: stage s alone on rank s.
  std::vector<int> stageRank;
  std::vector<std::vector<int>> rankPrograms;
  std::vector<Blob> blobs;
  std::vector<WeightFile> weightFiles; // what referenced blobs read
  double predictedStepTime = 0; // seconds (0: not predicted): one isolated step
  // Seconds between steps that overlap (cleave-run --overlap-steps): each
  // rank starts the next step as soon as its own update is done (0: not
  // predicted).
  double predictedPeriod = 0;
};

// The ranks of a plan's pipeline, and the rank running `stage`.
int rankCount(const Plan &plan);
int rankOfStage(const Plan &plan, int stage);
// The stages rank `rank` runs, in increasing order.
std::vector<int> stagesOfRank(const Plan &plan, int rank);

uint64_t fnv1a64(const void *data, size_t bytes);

} // namespace cleave::runtime
