// Checks any schedule, generated or read from a CSV, before it is simulated
// or run. The rules, in the order they are checked:
//   1. every action is well formed: microbatch in [0, M), a SEND/RECV's peer
//      the neighbour its direction implies, at most one STEP, last;
//   2. on each stage, each microbatch has one F, then one B and one W, or
//      one BW (B + W) — F before B before W; the B (and BW) actions come in
//      microbatch order, and so do the W (and BW) actions (gradients are
//      summed over the microbatches in that order);
//   3. cross-stage order through messages: an F after the first stage is
//      preceded by its RECV_F, an F before the last stage followed by its
//      SEND_F, and the same for each B/BW's gradient the other way; so F of
//      stage s+1 follows F of stage s, and B of s follows B of s+1;
//   4. every SEND has its RECV on the peer, and the other way round (rules
//      2 and 3 demand both ends, so no message may appear twice);
//   5. no deadlock under blocking point-to-point (found by simulating);
//   6. at most `memCap` microbatches of activations held on any stage, or
//      with a cap per stage (HeldCap), at most stage s's own.
// The first broken rule is reported as one line naming the stage, the
// action's index and name, and the rule, e.g.
//   stage 2, action 7 (W3): W of microbatch 3 before its B
#pragma once

#include "passes/PipelineCosts.h"
#include "passes/schedule/Schedule.h"

#include "llvm/Support/Error.h"

#include <optional>

namespace cleave::passes::schedule {

llvm::Error validateSchedule(const Schedule &s, const PipelineCosts &costs,
                             std::optional<int> memCap = {});
llvm::Error validateSchedule(const Schedule &s, const PipelineCosts &costs,
                             const HeldCap &heldCap);

} // namespace cleave::passes::schedule
