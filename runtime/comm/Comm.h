// Point-to-point communication between pipeline stages.
//
// The executor (runtime/Executor.h) moves activations and gradients between
// stages through a Comm: one per stage ("rank"), all of a pipeline's Comms
// forming one group of `size()` ranks. Messages are matched by
// (source, destination, tag, microbatch); messages with the same key are
// delivered in the order they were sent (FIFO).
//
//  - send() never blocks: it copies the bytes into the peer's mailbox.
//  - recv() blocks until the matching message has arrived and copies it
//    out; a message whose size differs from the receiver's buffer is an
//    error (a plan bug: both ends disagree about the slot).
//  - abort() fails the whole group: every recv blocked now or later, on any
//    rank, returns an error naming the reason, and so do later sends and
//    barriers. The driver calls it when one stage fails so no stage waits
//    forever for a message that will never come.
//  - barrier() waits until every rank has entered it.
//
// Buffers passed to send/recv are host memory (the executor stages through
// host memory where a backend's memory is not host-addressable).
//
// createInProcessComms() makes a group for stages that run as threads of one
// process: one shared mailbox guarded by a mutex and a condition variable.
// Later implementations (MPI, NCCL) implement the same interface.
#pragma once

#include "llvm/Support/Error.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime {

class Comm {
public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Copies `bytes` bytes at `data` to rank `peer`'s mailbox; never blocks.
  virtual llvm::Error send(int peer, int64_t tag, int microbatch,
                           const void *data, size_t bytes) = 0;
  // Waits for the oldest message from `peer` with this tag and microbatch
  // and copies it to `data`, which holds exactly `bytes` bytes.
  virtual llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                           size_t bytes) = 0;
  // Fails the group (see above). The first reason given is the one reported.
  virtual void abort(const std::string &why) = 0;
  virtual bool aborted() const = 0;
  // Returns once every rank of the group has called barrier().
  virtual llvm::Error barrier() = 0;

  // The longest a recv or barrier waits before failing with a timeout error;
  // 0 (the default) waits forever. Meant for tests, which must not hang.
  virtual void setTimeout(double seconds) = 0;
};

// `size` ranks of one in-process group; element r is rank r. `timeoutSeconds`
// is every rank's initial setTimeout value.
std::vector<std::unique_ptr<Comm>> createInProcessComms(int size,
                                                        double timeoutSeconds = 0);

} // namespace cleave::runtime
