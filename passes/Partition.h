// Partitioning a training graph into pipeline stages.
//
// The layers (Layers.h) form a chain in dependency order; a partition cuts
// the chain into P contiguous stages. The predicted step time of a 1F1B-like
// pipeline with M microbatches is
//     sum over stages of T_s + (M - 1) · max over stages of T_s
// (Alpa's objective: the first microbatch crosses every stage once, the
// slowest stage paces the other M - 1), where T_s is the stage's F + B + W
// time per microbatch plus the time to receive its input activations and
// its output gradients over the link. Stage s must fit the memory cap with
// its static bytes (parameters, gradients, optimizer state, buffers) plus
// `held(s)` microbatches of activations: min(P - s, M) under 1F1B, or what a
// schedule with longer lifetimes passes in.
//
// The search is exact: for each candidate bottleneck t (every stage time
// that can occur, in increasing order from the smallest feasible one found
// by binary search) a dynamic program over the cut points minimises the
// sum of stage times with every stage at most t and within the cap; the
// candidates stop once (M - 1) · t alone rules out beating the best found.
#pragma once

#include "ir/Graph.h"
#include "passes/Cost.h"
#include "passes/Layers.h"
#include "passes/PipelineCosts.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cleave::passes {

// ---- The chain the solver sees -------------------------------------------

// Per-microbatch time and static memory of one layer.
struct LayerCost {
  double f = 0, b = 0, w = 0;
  double step = 0; // the update, once per step (the optimizer's ops)
  int64_t paramBytes = 0;  // parameters alone (the report's param_bytes)
  int64_t staticBytes = 0; // parameters, gradients, optimizer state, buffers
};

// A value that may cross stages: made by layer `producer` (-1 for a graph
// input, which every stage loads itself and never receives), read by the
// forward ops of `readers` and kept for the backward ops of `holders`.
// `gradBytes` come back for it during the backward pass (0 for integer and
// boolean values).
struct ChainValue {
  int producer = -1;
  std::vector<int> readers; // sorted, distinct
  std::vector<int> holders; // sorted, distinct
  int64_t bytes = 0;
  int64_t gradBytes = 0;
};

// A parameter or buffer that layers other than its owner (the layer whose
// static bytes count it) read: a stage with such a reader but without the
// owner holds a replica of `bytes` (a tied embedding on the last stage).
struct SharedState {
  int owner = 0;
  std::vector<int> readers; // sorted, distinct, without the owner
  int64_t bytes = 0;
};

struct LayerChain {
  std::vector<std::string> names;
  std::vector<LayerCost> layers;
  std::vector<ChainValue> values;
  std::vector<SharedState> shared;
  // For every candidate stage [first, end) (index first * n + end - 1),
  // from a liveness sweep over its ops as codegen orders them: the peak
  // bytes of one microbatch's frame, and of the step's frame
  // (docs/design/memory-count.md). Empty for a chain made by hand: the
  // stash (the values' holders) is the frame then, and no step frame.
  std::vector<int64_t> frameBytes, stepFrameBytes;
};

// The link between two stages: each message costs latency + bytes/bandwidth.
struct LinkModel {
  double latency = 0;
  double bytesPerSecond = 0; // 0: communication is free
  // What the sending stage spends per message (DeviceProfile::
  // sendOverhead): its F pays it per activation it sends on, its B per
  // gradient it sends back.
  double sendSeconds = 0;
  double messageTime(int64_t bytes) const {
    return bytesPerSecond > 0 ? latency + double(bytes) / bytesPerSecond : 0;
  }
};

// Costs of every candidate stage, a contiguous range [first, end) of
// layers, precomputed so the search reads each in constant time.
class StageCostTable {
public:
  StageCostTable(const LayerChain &chain, const LinkModel &link);

  int numLayers() const { return n_; }
  double f(int first, int end) const { return sum(fSum_, first, end); }
  double b(int first, int end) const { return sum(bSum_, first, end); }
  double w(int first, int end) const { return sum(wSum_, first, end); }
  double step(int first, int end) const { return sum(stepSum_, first, end); }
  // F + B + W + receiving activations and gradients and the sender's
  // time of each message it sends, per microbatch.
  double time(int first, int end) const;
  double commTime(int first, int end) const { return comm_[at(first, end)]; }
  int64_t paramBytes(int first, int end) const;
  int64_t staticBytes(int first, int end) const;
  // Per held microbatch: the stage's frame (the stashed activations with
  // everything else a microbatch keeps while it runs).
  int64_t activationBytes(int first, int end) const {
    return frame_.empty() ? held_[at(first, end)] : frame_[at(first, end)];
  }
  // Forward bytes received from earlier stages / sent to later ones.
  int64_t recvBytes(int first, int end) const { return recv_[at(first, end)]; }
  int64_t sendBytes(int first, int end) const { return send_[at(first, end)]; }
  // Messages sent per microbatch: activations on from F, gradients back
  // from B.
  int64_t fSends(int first, int end) const { return fSends_[at(first, end)]; }
  int64_t bSends(int first, int end) const { return bSends_[at(first, end)]; }
  int64_t peakBytes(int first, int end, int64_t heldMicrobatches) const {
    return staticBytes(first, end) +
           heldMicrobatches * activationBytes(first, end);
  }

private:
  size_t at(int first, int end) const { return size_t(first) * n_ + end - 1; }
  static double sum(const std::vector<double> &prefix, int first, int end) {
    return prefix[end] - prefix[first];
  }
  void fillActivationAndTraffic(const LayerChain &chain,
                                const LinkModel &link);

  int n_;
  std::vector<double> fSum_, bSum_, wSum_, stepSum_; // prefix sums
  std::vector<int64_t> paramSum_, staticSum_;       // prefix sums
  std::vector<double> comm_;                        // n x n tables
  std::vector<int64_t> held_, recv_, send_, replica_, fSends_, bSends_;
  std::vector<int64_t> frame_, stepFrame_; // LayerChain's, when it has them
};

struct SolverOptions {
  int stages = 1;
  int64_t microbatches = 1;
  std::optional<int64_t> memCap; // bytes per stage
  // Microbatches of activations stage s holds; empty: 1F1B's min(P - s, M).
  std::vector<int64_t> heldMicrobatches;
};

int64_t heldMicrobatches(const SolverOptions &opts, int stage);

// A split: the first layer of each stage (starts[0] == 0), increasing.
struct ChainSplit {
  std::vector<int> starts;
  double stepTime = 0;
};

// Sum of stage times + (M - 1) · slowest stage, for any split.
double predictedStepTime(const StageCostTable &table,
                         llvm::ArrayRef<int> starts, int64_t microbatches);

// The best split into opts.stages stages. Errors: more stages than layers;
// no split within the cap (the message gives the smallest cap that fits).
llvm::Expected<ChainSplit> solveChain(const StageCostTable &table,
                                      const SolverOptions &opts);

// The smallest per-stage cap under which some split into opts.stages
// stages fits (opts.memCap is ignored).
int64_t smallestFittingCap(const StageCostTable &table,
                           const SolverOptions &opts);

// ---- Partitioning a graph --------------------------------------------------

struct PartitionOptions {
  int stages = 0; // 0: one more than --split-at names, or 1
  int64_t microbatches = 1;
  std::optional<int64_t> memCap;
  std::vector<int64_t> heldMicrobatches; // see SolverOptions
  std::vector<std::string> splitAt;      // first layers of stages 1..P-1
  // Take the split from the ops' stage tags (Op::stage, which the
  // `partition` pass sets) instead of searching: each layer's ops on one
  // stage, the stages in layer order.
  bool followStageTags = false;
  CostModelSpec costModel;
  std::string deviceProfile = "cpu";
  LayerOptions layers;
};

// One row of the stage table.
struct StageReport {
  int index = 0;
  int firstLayer = 0, lastLayer = 0; // inclusive layer indices
  int64_t paramBytes = 0, staticBytes = 0, activationBytes = 0;
  int64_t heldMicrobatches = 0, peakBytes = 0;
  double f = 0, b = 0, w = 0, comm = 0;
  double step = 0; // the update, once per step (not in time())
  int64_t sendBytes = 0, recvBytes = 0;
  double time() const { return f + b + w + comm; }
};

// Refers to the ops of the graph it was made from.
struct PartitionResult {
  Layering layering;
  std::vector<int> stageOfLayer;
  llvm::DenseMap<const ir::Op *, int> stageOfOp;
  std::vector<StageReport> stages;
  PipelineCosts costs;       // for the schedule generators
  double stepTime = 0;       // predicted, in costs.timeUnit
  double imbalance = 1;      // slowest stage time / mean stage time
  std::optional<int64_t> memCap;
  int64_t microbatches = 1;
  // The cost model's time of each located op of the whole graph, summed by
  // (location, phase), as --profile keys them: seconds a microbatch (a step
  // for the optimizer's). Empty in the uniform model. cleavec
  // --emit=op-times writes them in the --profile format.
  std::map<std::pair<std::string, ir::Phase>, double> opTimes;
};

// Assigns every op of the training graph `g` to a stage.
llvm::Expected<PartitionResult> partition(const ir::Graph &g,
                                          const PartitionOptions &opts);

// The solver's view of `g`: per-layer costs (times from `opTimes`, one per
// op in program order; every layer F = B = W = 1 when empty, the uniform
// model) and the values that can cross layers. `overlapCopies`: offload
// copies run beside the compute (a device with its own host link), so a
// layer's phase takes the longer of its compute and its copies rather
// than their sum.
LayerChain buildLayerChain(const ir::Graph &g, const Layering &layering,
                           llvm::ArrayRef<double> opTimes,
                           bool overlapCopies = false);

// The stage table as text, and as the JSON report
// {"stages": [...], "imbalance", "time_unit", ...}.
void printStageTable(const PartitionResult &r, llvm::raw_ostream &os);
void writeStageReportJson(const PartitionResult &r, llvm::raw_ostream &os);

// "2GiB", "512MiB", "1.5GB", "1000000" (bytes) -> bytes.
llvm::Expected<int64_t> parseByteSize(llvm::StringRef text);
// 2147483648 -> "2.00 GiB".
std::string formatBytes(int64_t bytes);

} // namespace cleave::passes
