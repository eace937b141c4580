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

#include "llvm/Support/Error.h"

#include <array>
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

} // namespace cleave::runtime::cuda
