// A Comm over channels that match messages by order alone, as NCCL's
// point-to-point calls do (docs/design/nccl.md).
//
// The executor's messages are keyed (source, destination, tag,
// microbatch), and the two ends of a stage pair issue them in different
// orders. A ChannelTransport carries one FIFO per ordered stage pair and
// knows nothing of keys; ChannelComm bridges the two with the plan: the
// sending stage's order of its messages to each peer over one step is
// fixed by the plan (runtime/comm/MessageOrder.h), so the receiving end
// takes the channel's messages in that order, and one it needs later waits
// in a staging buffer. Messages the plan's programs do not make (the
// executor's non-finite vote and clipping norm) and everything but
// send/recv/poll (barriers, abort, timeouts, the collectives) go through a
// control Comm, the in-process or MPI one the run would use anyway.
//
// Two transports: the NCCL one (runtime/cuda/Nccl.h, for GPUs), and one
// over a host Comm with one key per channel, which behaves as NCCL's
// matching does and so tests the bridge on any machine (`cleave-run
// --comm=ordered`: same bits as the default comm).
#pragma once

#include "runtime/Plan.h"
#include "runtime/comm/Comm.h"

#include "llvm/Support/Error.h"

#include <memory>
#include <string>

namespace cleave::runtime {

// FIFO byte messages per ordered stage pair, matched by order alone: the
// k-th recv from a peer takes the k-th send to this stage, and its size
// must be the sent size.
class ChannelTransport {
public:
  virtual ~ChannelTransport() = default;
  virtual llvm::Error send(int to, const void *data, size_t bytes) = 0;
  virtual llvm::Error recv(int from, void *data, size_t bytes) = 0;
  // Whether recv(from) of the channel's next message, of `bytes` bytes,
  // would return without waiting.
  virtual bool ready(int from, size_t bytes) = 0;
  // Fails every wait of the run's channels, now and later.
  virtual void abort(const std::string &why) = 0;
  // The longest a recv waits (0: forever).
  virtual void setTimeout(double seconds) = 0;

  // Messages straight from a backend's memory (Comm::bindBackend and
  // Comm::direct, whose ordering promises these keep): after bindBackend,
  // direct(peer) says whether send and recv with `peer` take the
  // backend's memory. hold receives the channel's next message from
  // `from` into memory of the transport's own, for one the receiver needs
  // later, and take writes a held message into the backend's memory and
  // frees it. The defaults carry nothing directly.
  virtual void bindBackend(Backend &) {}
  virtual bool direct(int peer) const {
    (void)peer;
    return false;
  }
  virtual llvm::Expected<uint64_t> hold(int from, size_t bytes);
  virtual llvm::Error take(uint64_t held, void *data, size_t bytes);
};

// The host transport over `fifo` (its rank the stage): each channel is one
// key of the host comm (one tag, microbatch 0), whose mailbox is FIFO per
// key. Bound to a backend it is direct with every peer, so the executor
// hands it the backend's memory as it would NCCL's: with `oneProcess`
// (every stage a thread of this process) and a backend that has parcels,
// messages go device to device as parcels whose descriptors take the FIFO
// (Backend::pack, runtime/comm/ParcelComm.h); otherwise it stages a device
// backend's messages through host memory itself (copyToHost and
// copyToDevice, which finish before they return).
std::unique_ptr<ChannelTransport>
createHostChannelTransport(std::unique_ptr<Comm> fifo,
                           bool oneProcess = false);

// Stage `stage`'s Comm over `transport`, with `control` for the rest.
std::unique_ptr<Comm> createChannelComm(const Plan &plan, int stage,
                                        std::unique_ptr<ChannelTransport> transport,
                                        std::unique_ptr<Comm> control);

} // namespace cleave::runtime
