// cleave-run --profile: measured per-op times in the format
// `cleavec --cost-model profile:FILE` reads.
#pragma once

#include "runtime/Executor.h"
#include "runtime/Plan.h"

#include "llvm/Support/JSON.h"

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cleave::runtime {

// --profile's figures for one executor: each instruction's time per step,
// kept for every profiled step (all but the first, which warms caches and
// pages in the frames; one step alone can be off by a third), and their
// mean. The mean keeps the delays a shared core adds to the kernels (a
// neighbour's time slices land in a few steps of each op): a median drops
// them all (summed over a step's hundreds of ops, per-op medians came out
// 5-10% below the measured step) and a mean with the slowest tenth of
// steps left out most of them (beside one busy process, pipelined steps
// measured 1.18 to 1.33x the simulation fed such a profile, 1.04 to 1.18x
// fed the mean; quiet, 1.06 to 1.10x and 1.03 to 1.06x:
// tests/bench/pipeline_speedup.py, docs/benchmarks.md).
class ProfileSteps {
public:
  // Takes the executor's figures of the step just run and clears them.
  void take(StageExecutor &ex);
  ProfileMap mean() const;
  // Per action kind (F, B, W, BW, STEP): the seconds an action took beyond
  // its kernels and waits, mean over the steps (0 where none ran).
  std::array<double, 5> actionOverhead() const;
  // Of each, the mean wait for a core (StageExecutor::actionCoreWait).
  std::array<double, 5> actionCoreWait() const;
  // Per phase (F, B, W): the share of its kernels' time that was a wait for
  // a core (StageExecutor::kernelCoreWait over the kernels' summed time).
  std::array<double, 3> kernelCoreWaitShare() const;
  // The delays of the receives of the profiled steps that waited for their
  // message (Comm::takeMessageDelays, summed; none where the comm cannot
  // time them). With several stages on a rank the comm's figures are the
  // rank's, and the first of its stages to take them holds them.
  const MessageDelays &messageDelays() const { return delays_; }

private:
  std::map<std::pair<std::string, Phase>, std::vector<double>> seconds_;
  std::array<std::vector<double>, 5> overhead_; // per step: mean per action
  std::array<std::vector<double>, 5> coreWait_; // of that, waiting for a core
  std::array<double, 3> kernelSeconds_{}, kernelWait_{}; // by phase, summed
  MessageDelays delays_;
};

// One stage's action overheads as entries of the same array
// ({"stage", "action", "overhead"}); profileJson files them apart.
// With `coreWait`, each entry also has "core_wait": the part of the
// overhead its thread waited for a core.
void appendActionOverheads(int stage, const std::array<double, 5> &overhead,
                           llvm::json::Array &ops,
                           const std::array<double, 5> *coreWait = nullptr);

// One stage's message delays as an entry of the same array ({"stage",
// "latency": the mean delay of the receives that waited, "waited",
// "received", "core_wait": of the latency, the mean wait for a core after
// the message came}, the form of the file's "messages"); nothing when none
// waited. profileJson files them apart.
void appendMessageDelays(int stage, const MessageDelays &delays,
                         llvm::json::Array &ops);

// One stage's measured instructions as --profile entries, appended to
// `ops`: per-microbatch seconds, except the optimizer step's. With
// `coreWaitShare` (ProfileSteps::kernelCoreWaitShare), each F, B and W
// entry also has "core_wait": that share of its time.
void appendProfileOps(const Plan &plan, const ProfileMap &profile,
                      llvm::json::Array &ops,
                      const std::array<double, 3> *coreWaitShare = nullptr);

// One stage's rank's wait for a core a step (StageFigures::coreWaitSeconds)
// as an entry of the same array ({"stage", "step_core_wait"}); profileJson
// files it under "cores".
void appendCoreWait(int stage, double seconds, llvm::json::Array &ops);

// The --profile file's text from its entries: "ops" (per-op times),
// "actions" (each stage's per-action overhead, which cleavec
// --cost-model profile: adds to every action's time), "messages", and
// "cores": how much of the machine the run had ({"cores": usable,
// "other_cores": busy with other processes on average, where known,
// "other_runnable": what they wanted, their threads running or waiting for
// a core on average, where known
// (TrainSummary::otherRunnable), "core_wait": [{"stage", "seconds"}]}),
// which cleavec reports, so that a plan made from a profile of a shared
// machine says so.
std::string profileJson(llvm::json::Array ops, int cores = 0,
                        std::optional<double> otherCores = std::nullopt,
                        std::optional<double> otherRunnable = std::nullopt);

} // namespace cleave::runtime
