// Predicts one training step of a schedule: the single source of the step
// time, bubble and memory figures cleave prints, so the runtime can later be
// compared against it.
//
// Semantics: each rank runs its program (Schedule.h; one stage's list where
// it has one stage) in order, one action at a time. F, B, W
// and BW take the stage's cost (BW = B + W); STEP takes the stage's update
// time (PipelineCosts.h: 0 in the uniform model). A SEND is
// eager: the stage posts it and goes on, and the data arrives at its peer
// after linkLatency + bytes / linkBytesPerUnit. A RECV blocks its stage
// until the matching SEND (same direction, microbatch and pair of stages)
// has arrived; between two stages of one rank a message takes no time. A
// rank that waits on a RECV whose SEND can never be posted is a deadlock,
// reported with the chain of waiting stages.
//
// Memory: an F adds one microbatch of activations to its stage; its W (or
// BW) releases it, so under 2BP a microbatch stays held from F until W.
#pragma once

#include "passes/PipelineCosts.h"
#include "passes/schedule/Schedule.h"

#include "llvm/Support/Error.h"

namespace cleave::passes::schedule {

struct Span {
  double start = 0, end = 0; // for a SEND: posted .. arrived at the peer
};

struct StageStats {
  double start = 0;  // start of the stage's first compute action
  double finish = 0; // end of its last compute action
  double busy = 0;   // time spent computing
  double bubble = 0; // its rank's idle time / step time
  int peakActivationMicrobatches = 0;
  int64_t peakBytes = 0; // activationBytes x peak held + staticBytes
};

// A rank's figures; the same as its stage's where it runs one.
struct RankStats {
  double start = 0, finish = 0, busy = 0, bubble = 0;
  // The most microbatches its stages hold at once, summed over them.
  int peakActivationMicrobatches = 0;
  // The most activation bytes its stages hold at once, plus their static
  // bytes: what the device needs.
  int64_t peakBytes = 0;
};

struct SimResult {
  // The step time: the longest any rank spends from its first compute to
  // its last. Steps repeat back to back, and a stage starts the next step as
  // soon as it finished this one (no global barrier before the optimizer,
  // as the zero-bubble paper's post-validation allows), so this is the
  // period of training in steady state. On shared cores
  // (PipelineCosts::sharedCores), what two more steps add to one, each rank
  // going on as soon as its own part is done: overlapping steps keep more
  // ranks computing at once, each slower (ZB-H2 beside a busy process:
  // 1.06 of the one-step figure measured, 1.02 of this).
  double stepTime = 0;
  // One isolated step with every stage starting at time 0.
  double makespan = 0;
  std::vector<StageStats> stages;
  std::vector<RankStats> ranks;
  std::vector<std::vector<Span>> spans; // [stage][action index]
};

// The cost of one compute action on `stage` (0 for SEND/RECV; STEP: the
// stage's update).
double computeCost(const PipelineCosts &costs, int stage, ActionKind kind);
// How long a message from a SEND on stage `from` takes to reach stage `to`
// on another rank (on the same rank it takes no time): the link's latency
// and bytes, and the receiving stage's recvLatency.
double transferTime(const PipelineCosts &costs, int from, int to,
                    ActionKind send);

// Fails (one line) on a deadlock or a RECV whose SEND never comes; the
// costs must have one entry per stage.
llvm::Expected<SimResult> simulate(const Schedule &s,
                                   const PipelineCosts &costs);

} // namespace cleave::passes::schedule
