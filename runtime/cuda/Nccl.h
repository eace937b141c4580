// NCCL for messages between stages on different GPUs (docs/design/nccl.md):
// the library, opened at run time as cuBLAS is (runtime/cuda/CudaBackend.cpp:
// nothing of it loads unless asked for), the bootstrap and the channels.
//
// A channel is one ordered pair of stages on different ranks that exchange
// messages, carried by a 2-rank NCCL communicator of its own (rank 0 the
// sending stage's GPU, rank 1 the receiving one's) and a stream per end, so
// each channel is one FIFO: NCCL pairs the k-th ncclRecv with the k-th
// ncclSend. The sender's order is fixed by the plan, so the receiving end
// takes the messages in that order and holds one it needs later in a
// staging buffer; runtime/comm/MessageOrder.h says how often that is
// needed: per stage pair, every schedule's plan receives in the sending
// order once an action's messages are taken together (per rank pair it
// does not: the V schedules on four ranks interleave two stage pairs'
// messages differently at the two ends, hence a channel per stage pair).
//
// The bootstrap needs no GPU: ncclGetUniqueId opens a socket. Making a
// communicator does (ncclCommInitRank); without one it fails, and cleave
// says so in one line.
#pragma once

#include "runtime/Plan.h"
#include "runtime/comm/ChannelComm.h"

#include "llvm/Support/Error.h"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime::cuda {

// ncclUniqueId's bytes: what every member of a communicator must be given.
struct NcclId {
  std::array<char, 128> bytes{};
};

// Loads libnccl.so.2 (once; on LD_LIBRARY_PATH, else CUDA's own folder),
// or says why it cannot. "NCCL 2.28.x" when it can.
llvm::Expected<std::string> ncclLibraryVersion();

// A fresh id (ncclGetUniqueId), made by one member and passed to the rest
// (over the host comm: in-process, or MPI).
llvm::Expected<NcclId> newNcclId();

// One member of a communicator of `size` ranks, this thread or process
// being `rank`, on CUDA device `device`. Closing it aborts what is in
// flight (ncclCommAbort): a run that fails ends every member.
class NcclCommunicator {
public:
  ~NcclCommunicator();
  int rank() const { return rank_; }
  int size() const { return size_; }
  void *handle() const { return comm_; }
  // An error NCCL saw while running (a peer gone, a network failure), as
  // one line; success while none.
  llvm::Error asyncError() const;
  // Takes over a communicator NCCL opened (an ncclComm_t).
  static std::unique_ptr<NcclCommunicator> adopt(void *comm, int rank,
                                                 int size);

private:
  friend llvm::Expected<std::unique_ptr<NcclCommunicator>>
  openNcclCommunicator(const NcclId &, int, int, int);
  NcclCommunicator() = default;
  void *comm_ = nullptr;
  int rank_ = 0, size_ = 0;
};

// ncclCommInitRank on `device`; blocks until all `size` members joined.
// Fails in one line: no usable CUDA device, or NCCL's reason.
llvm::Expected<std::unique_ptr<NcclCommunicator>>
openNcclCommunicator(const NcclId &id, int rank, int size, int device);

// The channels of a plan: every ordered pair of stages on different ranks
// with at least one message between them, in (from, to) order, the order
// every member opens its communicators in.
struct NcclChannel {
  int fromStage = -1, toStage = -1;
  int64_t messagesPerStep = 0;
};
std::vector<NcclChannel> ncclChannels(const Plan &plan);

// The NCCL transports of every stage of a plan run as threads of one
// process (runtime/comm/ChannelComm.h), stage s on CUDA device
// deviceOfStage[s]: one 2-rank communicator per channel, both members
// opened from this thread inside one ncclGroupStart/End (as
// ncclCommInitAll does), and a stream per channel end. Element s is stage
// s's transport. Stages on the same GPU (NCCL takes one rank per device
// in a communicator) exchange through the host transport instead.
// Bound to the stage's CUDA backend (ChannelTransport::bindBackend),
// messages come straight from device memory: a send copies the slot into a
// channel buffer on the compute stream and queues ncclSend on the
// channel's stream after that copy, without waiting; a recv queues
// ncclRecv after the compute so far, waits for it on the host, polling
// NCCL's async error and the timeout, and copies it into the slot on the
// compute stream (docs/design/nccl.md, "The data path"). Unbound, messages
// are host buffers. Fails in one line without a GPU.
llvm::Expected<std::vector<std::unique_ptr<ChannelTransport>>>
createNcclTransports(const Plan &plan, const std::vector<int> &deviceOfStage,
                     double timeoutSeconds);

// One end of a plan's channel that a process holds (under mpirun).
struct NcclChannelEnd {
  NcclChannel channel;
  int stage = -1, peer = -1; // this end's stage and the other end's
  int member = 0;            // 0: the sending stage's end; 1: the receiving
  bool overNccl = false;     // false: both stages on one GPU (host FIFO)
  NcclId id;                 // the channel's communicator, when overNccl
};

// Under mpirun: the ends of the plan's channels that this process's
// `stages` hold, agreed with the other processes over `control` (ranks:
// processes; stageRank[s] runs stage s). The sending end's process makes a
// channel's id (`newId`) and sends it with where its stage runs
// (`placeOfStage[k]` for stages[k]: the host and the GPU); the receiving
// end's process answers whether that is its own GPU, in which case the
// channel stays on the host FIFO (NCCL takes one rank per GPU). A channel
// with both stages in this process is decided here. A collective of the
// processes: every one calls it, in any order; no GPU is needed.
llvm::Expected<std::vector<NcclChannelEnd>>
agreeNcclChannels(const Plan &plan, const std::vector<int> &stages,
                  const std::vector<int> &stageRank,
                  const std::vector<std::string> &placeOfStage, Comm &control,
                  const std::function<llvm::Expected<NcclId>()> &newId);

// "host:device", where a stage runs, for agreeNcclChannels.
std::string ncclPlace(int device);

// Under mpirun: the NCCL transports of this process's `stages` (stages[k]
// on CUDA device devices[k]), each channel's end opened on its GPU after
// agreeNcclChannels over `control`, all of them in one ncclGroupStart/End;
// channels between stages on one GPU stay on `host[k]`, the stage's host
// transport. Fails in one line without a GPU, on every process alike.
llvm::Expected<std::vector<std::unique_ptr<ChannelTransport>>>
createNcclRankTransports(const Plan &plan, const std::vector<int> &stages,
                         const std::vector<int> &devices,
                         const std::vector<int> &stageRank, Comm &control,
                         std::vector<std::unique_ptr<ChannelTransport>> host,
                         double timeoutSeconds);

} // namespace cleave::runtime::cuda

namespace cleave::runtime::cuda {

// The data-parallel sums over NCCL: a Comm that is `control` (a replica
// group of the threads or of MPI) in everything but allReduceOrdered, which
// moves each part straight between the replicas' device memories with
// ncclSend/ncclRecv on a stream of its own (allReduceOrderedOver: rank 0
// adds the parts in rank order, the bits of the host path), waiting with
// NCCL's async error, the control comm's abort and its timeout in view.
// The data must be device memory of `device` (--device cuda).

// Every member of one replica group run as threads of this process,
// member r on CUDA device devices[r] over controls[r]: one communicator
// opened from this thread in one ncclGroupStart/End. Null when two members
// share a GPU (NCCL takes one rank per device): the group then stays on
// its control comms. Fails in one line without a GPU.
llvm::Expected<std::vector<std::unique_ptr<Comm>>>
createNcclGroupComms(const std::vector<Comm *> &controls,
                     const std::vector<int> &devices);

// This process's member of a replica group under mpirun, on CUDA device
// `device`: the group's rank 0 gathers every member's ncclPlace over
// `control`, and when all differ makes the id and sends it to each; every
// member then joins the communicator. Null on every member when two share
// a GPU. A collective of the group's processes.
llvm::Expected<std::unique_ptr<Comm>> createNcclGroupComm(Comm &control,
                                                          int device);

} // namespace cleave::runtime::cuda
