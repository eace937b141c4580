// Pipeline planning as passes over a module (docs/design/planning-passes.md).
//
// A pipeline module is a training graph and what the planning passes add to
// it: `partition` tags every op with its stage (Op::stage, printed `[s]`),
// `schedule` orders every rank's actions and simulates the step,
// `split-stages` makes one graph per stage, and `plan-memory` lays out each
// stage's frames and checks every rank's peak against the cap. Each pass
// reads only the module, so each runs alone on a module printed after the
// one before it: the stage tags are in the IR text, and a pass that needs
// what an earlier pass makes rebuilds it from them. cleavec runs the four
// in order; cleave-opt runs any of them by name after the graph passes.
#pragma once

#include "ir/Graph.h"
#include "ir/Printer.h"
#include "passes/Partition.h"
#include "passes/Pass.h"
#include "passes/Recompute.h"
#include "passes/schedule/Schedule.h"
#include "passes/schedule/Simulator.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::passes {

// What the planning flags ask for (cleavec and cleave-opt read the same).
struct PlanningOptions {
  int stages = 1;          // ranks (--stages)
  bool stagesGiven = false; // --stages was given (else taken from the tags)
  int chunks = 0; // stages per rank (--chunks); 0: the schedule's default
  int64_t microbatches = 1;
  bool microbatchesGiven = false; // --microbatches was given
  std::string schedule = "1f1b"; // a name or csv:FILE
  std::optional<int64_t> memCap; // bytes per rank
  std::string costModel = "analytic";
  std::string deviceProfile = "cpu";
  std::vector<std::string> splitAt;
  std::optional<unsigned> layerDepth; // unset: found (passes/Layers.h)
  // Bytes the partition keeps free below --mem-cap: set by the pass manager
  // when it plans again because laying out the frames overshot the cap.
  int64_t capMargin = 0;
  // --recompute: none | selective | full for every layer, or auto: the
  // partition weighs all three under --mem-cap (none without a cap).
  std::string recompute = "auto";
  // --offload: none, all (every layer's stash to host memory, passes/
  // Recompute.h), or auto: with --recompute=auto under --mem-cap on a
  // device profile with a host link, the partition weighs it too.
  std::string offload = "auto";
};

// What the planning passes make. Apart from PipelineModule so that the pass
// manager can replace all of it at once with a plan made again.
struct PlanResults {
  // From `recompute` (or `partition` choosing for --recompute=auto): the
  // policy the graph was rewritten with ("" when never rewritten) and what
  // it cloned (passes/Recompute.h).
  std::string recompute;
  StashStats recomputeStats;
  // When partition chose a policy per stage ("per stage"): each stage's,
  // and what each stage weighed (its peak and time under every policy).
  std::vector<std::string> recomputeByStage;
  std::string recomputeTable;
  int recomputeEased = 0; // layers given less than their stage's policy

  // From `partition` (or rebuilt from the tags): the split, and the stages
  // per rank it was made for.
  std::optional<PartitionResult> partition;
  int chunks = 1;
  bool partitionSearched = false; // not --split-at, not the tags
  std::string autoTried; // `auto`'s candidates, one line each, when it tried several
  std::string layerHint; // how to cut finer, when the split is unbalanced

  // From `schedule`.
  std::optional<schedule::Schedule> schedule;
  std::optional<schedule::SimResult> sim;

  // From `split-stages`: one graph per stage with its Send and Recv ops.
  std::vector<std::unique_ptr<ir::Graph>> stageGraphs;

  // From `plan-memory`: each stage's frames as codegen lays them out
  // (passes/MemoryPlan.h) and its peak under the schedule; a warning when a
  // rank stays above --mem-cap after partitioning again.
  struct StageMemory {
    int64_t frameBytes = 0, frameLivePeak = 0, stepFrameBytes = 0;
    int64_t persistentBytes = 0;
    int heldFrames = 0; // microbatch frames live at once under the schedule
    int64_t peakBytes = 0;
    // Offloaded activations: one host frame per held microbatch, in host
    // memory (not part of peakBytes).
    int64_t hostFrameBytes = 0;
  };
  std::vector<StageMemory> memory;
  std::string memoryWarning;
  int memoryRefits = 0; // partitions made again under a tighter cap

  // Set by a pass that asks the pass manager to plan again from `partition`
  // with this capMargin (plan-memory, when the layout's gaps overshoot).
  std::optional<int64_t> replanMargin;
};

struct PipelineModule : PlanResults {
  explicit PipelineModule(ir::Graph &g, PlanningOptions o = {})
      : graph(g), options(std::move(o)) {}

  ir::Graph &graph; // the training graph; its ops carry the stage tags
  PlanningOptions options;

  // Stages in all (ranks x chunks), once partitioned.
  int stageCount() const {
    return partition ? int(partition->stages.size()) : 0;
  }
};

using PlanningPassFn = llvm::Error (*)(PipelineModule &);

using PlanningPassInfo = PassEntry<PlanningPassFn>;

llvm::ArrayRef<PlanningPassInfo> planningPasses();
const PlanningPassInfo *lookupPlanningPass(std::string_view name);

// The passes, in the order cleavec runs them.
llvm::Error recomputePass(PipelineModule &m);
llvm::Error partitionPass(PipelineModule &m);
llvm::Error schedulePass(PipelineModule &m);
llvm::Error splitStagesPass(PipelineModule &m);
llvm::Error planMemoryPass(PipelineModule &m);

// The planning pass manager: runs `passes` in order on `m`; after each, the
// module verifier (unless opts.verifyEach is off) and the dump when
// opts.dumpAfter names the pass. When a pass asks to plan again
// (replanMargin), the passes from `partition` through it run again on a
// fresh module with that margin, at most three times, and the plan made
// last that succeeds replaces the module's (a failure keeps the one before).
// Errors name the pass.
llvm::Error runPlanningPasses(PipelineModule &m,
                              llvm::ArrayRef<PlanningPassInfo> passes,
                              const PipelineOptions &opts);
// The same, by name; unknown names are refused with the list.
llvm::Error runPlanningPasses(PipelineModule &m,
                              llvm::ArrayRef<std::string> names,
                              const PipelineOptions &opts);

// The module's invariants beyond the IR verifier's: every op tagged with a
// stage of the partition (and the one it says), forward values flowing to
// the same or later stages only, one verified graph per stage after
// split-stages, the schedule valid for the partition's costs and cap, and
// one memory row per stage.
llvm::Error verifyModule(const PipelineModule &m);

// The rank of each stage in the module's schedule.
int rankOfStage(const PipelineModule &m, int stage);

// The stage table, the hint, what `auto` tried and the schedule figures:
// what cleavec prints for a plan.
std::string planningSummary(const PipelineModule &m);

// The module as .cir text: before `split-stages`, the training graph with
// its stage tags; after it, the stage graphs. The planning summary comes
// after the graph as `//` comments, so the text parses back.
void printModule(const PipelineModule &m, llvm::raw_ostream &os,
                 const ir::PrintOptions &opts = {});

} // namespace cleave::passes
