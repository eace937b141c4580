// The schedule generators. Each makes per-stage action lists (with their
// SEND/RECV messages and a final STEP) for P stages and M microbatches:
//
//   gpipe      all forwards, then all full backwards (BW)
//   1f1b       PipeDream-flush: P-s-1 warm-up forwards on stage s, then one
//              forward and one full backward in turn
//   gpipe-2bp  gpipe's order with B in place of BW; every W deferred into
//   1f1b-2bp   1f1b's  idle time, the rest at the end (the 2BP paper)
//   zb-h1      zero bubble H1 (Qi et al.): 1f1b's F/B order with B in place
//              of BW and W in idle time, but a stage runs a W before an F
//              that would hold more than min(P, M) microbatches: the peak
//              of 1F1B (its first stage), which later stages reach too
//   zb-h2      zero bubble H2: a ready B first, else an F while fewer than
//              min(2P-1, M) are held (extra warm-up forwards), else a W
//   auto       the lowest simulated step time whose peak fits the memory cap
//
// and, with v stages per rank (P ranks x v stages; `chunks` = v):
//
//   interleaved-1f1b      Megatron-LM's interleaved 1F1B, stages placed
//   interleaved-1f1b-2bp  round-robin (stage c P + r on rank r); the 2bp
//                         form runs B in place of BW and fills idle time
//                         with W. M must be a multiple of P.
//   looped-bfs            breadth-first: all microbatches through one of a
//   looped-bfs-2bp        rank's stages before the next (round-robin)
//   zb-v                  zero bubble V (Qi et al.): 2 stages per rank in a
//                         V (rank r runs r and 2P-1-r), B first, then F
//                         while fewer than 2P microbatches of a half-size
//                         stage are held on the rank (1F1B's memory),
//                         then W
//   v-half                the same V under half of that, plus one
//                         microbatch (P + 2)
//   v-min                 the V's memory-minimal building block (Qi et
//                         al., controllable memory): every action as soon
//                         after the one it needs as the rank has a free
//                         slot, repeated every microbatch; about 1/3 of
//                         1F1B's activations ((P+4)/3 microbatches)
//   dualpipe-v            DeepSeek's DualPipeV on the same V: a fixed
//                         program in eight phases whose steady state pairs
//                         one chunk's F with the other's full backward
//                         (F&B, one after the other here); M >= 2P
//
// Where W goes depends on when each stage would idle, so the 2BP and zero
// bubble generators place it by timing the stages with the real per-stage
// costs (the same cost model as Simulator.h); the simulator then gives the
// figures of the finished schedule.
#pragma once

#include "passes/PipelineCosts.h"
#include "passes/schedule/Schedule.h"

#include "llvm/Support/Error.h"

#include <optional>
#include <string>

namespace cleave::passes::schedule {

// The names of the one-stage-per-rank schedules, `auto` last.
const std::vector<std::string> &scheduleNames();
// The names of the schedules with several stages per rank.
const std::vector<std::string> &chunkedScheduleNames();
bool isChunkedSchedule(const std::string &name);
// The stages per rank a schedule runs with unless told: 2 for the chunked
// ones, 1 for the rest.
int defaultChunks(const std::string &name);
// Fails (one line) unless schedule `name` can run `stages` stages, `chunks`
// per rank, with `microbatches`.
llvm::Error checkChunks(const std::string &name, int stages, int microbatches,
                        int chunks);

// Fails, listing the known names, unless `name` is one of them.
llvm::Error checkScheduleName(const std::string &name);

// Makes the named schedule; `memCap` (peak activation microbatches on any
// stage) matters only to `auto`. Errors: unknown name, P or M below 1, costs
// not for P stages or with F or B not positive.
llvm::Expected<Schedule> makeSchedule(const std::string &name, int stages,
                                      int microbatches,
                                      const PipelineCosts &costs,
                                      std::optional<int> memCap = {});
// The same with a cap per stage (empty: none).
llvm::Expected<Schedule> makeSchedule(const std::string &name, int stages,
                                      int microbatches,
                                      const PipelineCosts &costs,
                                      const HeldCap &heldCap);
// `stages` in all, `chunks` per rank (stages / chunks ranks); the costs
// are per stage.
llvm::Expected<Schedule> makeSchedule(const std::string &name, int stages,
                                      int microbatches,
                                      const PipelineCosts &costs,
                                      const HeldCap &heldCap, int chunks);

// What a memory cap of `capBytes` per stage leaves each stage for
// activations, in microbatches: (capBytes - staticBytes) / activationBytes,
// the partitioner's own count (a stage without activations: no limit).
HeldCap heldCapFor(const PipelineCosts &costs, int64_t capBytes);

} // namespace cleave::passes::schedule
