// What the partitioner hands the schedule generators and the simulator: the
// predicted cost of each pipeline stage per microbatch, and the link
// between stages. With `--cost-model uniform` every stage's F, B and W take
// one unit and sends are free; otherwise the cost model fills these in from
// the graph (docs/design/partition.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::passes {

struct StageCost {
  double f = 1, b = 1, w = 1;     // forward, input-gradient, weight-gradient
                                  // time of one microbatch on this stage
  int64_t activationBytes = 0;    // kept per microbatch from F until its W
  int64_t sendBytes = 0;          // sent downstream per microbatch (F)
  int64_t recvBytes = 0;          // received from upstream per microbatch
  int64_t staticBytes = 0;        // parameters, gradients, optimizer state
  // The stage's update (its STEP action): the optimizer's ops, once per
  // step after the stage's last backward action; 0 in the uniform model.
  double step = 0;
  // What a message to this stage takes beyond the link (latency and
  // bytes) before the stage runs with it: measured by a profile (how long
  // a waiting stage took to run again after its message was sent; on a
  // shared core, the wait for the core), else 0.
  double recvLatency = 0;
};

struct PipelineCosts {
  std::vector<StageCost> stages;
  double linkLatency = 0;         // per message, in timeUnit
  double linkBytesPerUnit = 0;    // bandwidth; 0 means sends are free
  std::string timeUnit = "unit";  // "unit" (uniform model) or "s"
  // When a BW action's input gradient leaves for the stage upstream. true:
  // when its B part ends, as in cleave's runtime, which runs a BW as the
  // stage's B program (its sends go out as soon as their values exist) and
  // then its W program; the analytic and profile cost models set it. false:
  // at the end of the whole BW, as when each layer's backward makes its
  // input and weight gradients together: the textbook 1F1B and GPipe,
  // whose bubble formulas the uniform model keeps.
  bool bwSendsAfterB = false;
  // The cores the ranks share, where they share fewer cores than there are
  // ranks: the machine's less what other processes kept busy while the
  // profile was measured (OpProfile::Sharing). 0: each rank has its own.
  // Shared, k ranks computing at once each run at min(1, sharedCores / k)
  // of their speed (the simulator's processor sharing).
  double sharedCores = 0;

  // Uniform model: P stages, F = B = W = 1, free communication.
  static PipelineCosts uniform(int stages) {
    PipelineCosts c;
    c.stages.assign(stages, StageCost{});
    return c;
  }
};

} // namespace cleave::passes
