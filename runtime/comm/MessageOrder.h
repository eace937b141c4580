// The order of a plan's messages between each pair of ranks, and whether
// a transport that matches messages by order alone can carry them.
//
// cleave's Comm matches a receive to a send by (source, destination, tag,
// microbatch), so a rank may receive in another order than its peer sent.
// NCCL's point-to-point calls match by order alone: the k-th ncclRecv from
// a peer takes the k-th ncclSend to it. A plan runs over NCCL when, for
// every ordered pair of ranks (a, b), the messages a sends to b, in the
// order rank a's program issues them, are the ones b receives from a, in
// the order b's program issues its receives (runtime/comm/NcclComm.h).
// Messages between stages on one rank never leave it and are not counted.
#pragma once

#include "runtime/Plan.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <vector>

namespace cleave::runtime {

struct PairMessage {
  int fromStage = -1, toStage = -1;
  int64_t tag = 0;
  int microbatch = -1; // -1: a Step program's message
  int64_t bytes = 0;
  bool operator==(const PairMessage &o) const {
    return fromStage == o.fromStage && toStage == o.toStage && tag == o.tag &&
           microbatch == o.microbatch && bytes == o.bytes;
  }
};

// Per ordered rank pair, index from * ranks + to: the messages `from`
// sends to `to` in the order its program issues them (sends), or the order
// `to`'s program receives them (recvs). A rank runs its program entries in
// order (plan.rankPrograms, or its one stage's actions), then its stages'
// Step programs in increasing stage order, as the executor does. Within
// one action (or Step program) the messages to or from a peer are taken
// in tag order: a stage receives a value before its first reader and
// sends it after its maker, so within an action the two ends' instruction
// orders differ (stage 1 of a 1F1B GPT receives tag 1 before tag 0); an
// order-matching transport posts an action's receives from a peer
// together, and its sends, in tag order.
//
// Channels: by rank pair (one channel between two ranks carries every
// message between their stages), or by stage pair (one channel per pair
// of stages on different ranks; with one stage per rank the same thing).
enum class Channel { RankPair, StagePair };
struct RankPairOrder {
  int ranks = 0; // by StagePair: the stage count
  std::vector<std::vector<PairMessage>> sends, recvs;
};
// `tagOrder` false: each end's own instruction order, unsorted (what a
// transport that sends in program order puts on a channel).
RankPairOrder rankPairOrder(const Plan &plan,
                            Channel channel = Channel::RankPair,
                            bool tagOrder = true);

// Fails, naming the first pair and message where the orders differ, when
// a transport that matches by order on each channel would pair the wrong
// messages.
llvm::Error checkMessagesInOrder(const Plan &plan,
                                 Channel channel = Channel::RankPair);

} // namespace cleave::runtime
