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
//  - setTimeout() bounds every wait (recv, barrier; MpiComm's collectives):
//    one that runs out returns a CommTimeout, so a peer that never sends (a
//    plan whose tags do not pair, a process stopped with SIGSTOP) ends the
//    run with one line instead of hanging it. cleave-run --comm-timeout
//    sets it (600 s by default, as PyTorch's NCCL watchdog).
//
// Buffers passed to send/recv are host memory (the executor stages through
// host memory where a backend's memory is not host-addressable), except
// for the messages a comm says it carries straight from the backend's
// memory (bindBackend, direct: NCCL's channels).
//
// Collectives (allReduceOrdered, anyTrue) are part of the interface: the
// defaults here build them from send/recv in a fixed order, which the
// in-process and MPI comms use; a comm with its own collectives (NCCL)
// overrides them, keeping the order that makes the bits independent of
// timing. Their buffers may be device memory: a DeviceAccess says how to
// reach it.
//
// createInProcessComms() makes a group for stages that run as threads of one
// process: one shared mailbox guarded by a mutex and a condition variable.
// Later implementations (MPI, NCCL) implement the same interface.
#pragma once

#include "llvm/Support/Error.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime {

class Backend;

// How a collective reaches a buffer in a backend's memory: copies to and
// from host memory, an addition done where the data lives (the backend's
// own kernel, so a sum's bits are the backend's), and a scratch buffer of
// the caller's, in the same memory, at least as large as the data.
struct DeviceAccess {
  std::function<void(void *host, const void *device, size_t)> toHost;
  std::function<void(void *device, const void *host, size_t)> toDevice;
  // acc += other, both in the backend's memory.
  std::function<llvm::Error(void *acc, const void *other)> addInto;
  void *scratch = nullptr;
  // Rewords a failed wait for rank `peer`'s part (a CommTimeout) in the
  // caller's terms; empty: as the comm says it.
  std::function<llvm::Error(llvm::Error, int peer)> nameWait;
  // Waits for the backend's work issued so far (Backend::synchronize): a
  // link that reads or writes the memory by other means than the backend
  // (NCCL on its own stream) starts after it. Empty: nothing to wait for.
  std::function<void()> settle;
};

// Moves bytes between the memories of a group's ranks, each end in its
// backend's memory: host staging over a Comm's send/recv by default, or
// straight from device memory (NCCL). recv returns once the bytes are in.
class DeviceLink {
public:
  virtual ~DeviceLink() = default;
  virtual llvm::Error send(int peer, const void *data, size_t bytes) = 0;
  virtual llvm::Error recv(int peer, void *data, size_t bytes) = 0;
};

// The ordered sum of Comm::allReduceOrdered over `link`, this being rank
// `rank` of `size`: rank 0 takes rank 1's part, then rank 2's, ..., into
// access.scratch and adds each (access.addInto) onto its own, then sends
// the sum to every rank, which takes it in place. The operations and their
// order are the same whatever carries the bytes, so every link gives the
// same bits. Failed waits are reworded by access.nameWait.
llvm::Error allReduceOrderedOver(DeviceLink &link, int rank, int size,
                                 void *data, size_t bytes,
                                 const DeviceAccess &access);

// How long this rank's receives waited for messages that were not there
// yet, from the send to the receiver running again: the delay a stage that
// waits for its peer sees beyond the peer's work (a hand-off; beside a busy
// process, the wait for a core after the wake-up). `seconds` sums the
// delays of the `waited` receives among `received`.
struct MessageDelays {
  double seconds = 0;
  int64_t waited = 0, received = 0;
  // Of `seconds`, the receiving thread's wait for a core after its message
  // came (StageExecutor::recvCoreWait; filled by ProfileSteps, not Comm).
  double coreWait = 0;
};

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
  // Whether recv(peer, tag, microbatch) would return without waiting: its
  // message has arrived, or the group failed (recv then fails at once). A
  // rank running several stages in one thread polls before it receives
  // where another of its stages may have to run first (the update).
  virtual bool poll(int peer, int64_t tag, int microbatch) = 0;
  // Fails the group (see above). The first reason given is the one reported.
  virtual void abort(const std::string &why) = 0;
  virtual bool aborted() const = 0;
  // Returns once every rank of the group has called barrier().
  virtual llvm::Error barrier() = 0;

  // The longest a recv or barrier waits before failing with a CommTimeout;
  // 0 (the default) waits forever.
  virtual void setTimeout(double seconds) = 0;
  virtual double timeout() const = 0;

  // Sums `bytes` at `data` (in the memory `access` reaches) over the group
  // in rank order, rank 0's + rank 1's + ..., and leaves the sum on every
  // rank: the same bits whatever the timing. The default is
  // allReduceOrderedOver a link that stages through host memory and this
  // comm's send/recv under `tag`.
  virtual llvm::Error allReduceOrdered(void *data, size_t bytes, int64_t tag,
                                       const DeviceAccess &access);
  // True on every rank when `mine` is true on any; blocks until every
  // rank's answer is in. The default gathers to rank 0 and sends back.
  virtual llvm::Expected<bool> anyTrue(bool mine, int64_t tag);

  // Messages straight from a backend's memory. The stage's executor binds
  // its backend once, before any message, where that memory is not host
  // memory; afterwards direct(peer, tag, send) says whether send (true) or
  // recv of that message takes the backend's memory itself instead of a
  // host buffer. Such a send reads the bytes after the backend's work
  // issued so far and never makes later work wait for the peer; such a
  // recv leaves the bytes ready for the backend's work issued after it
  // and writes them only after the work issued before it. The default
  // carries nothing directly.
  virtual void bindBackend(Backend &) {}
  virtual bool direct(int peer, int64_t tag, bool send) const {
    (void)peer, (void)tag, (void)send;
    return false;
  }

  // The delays of this rank's receives since the last call (--profile);
  // nothing where the comm cannot time them (the in-process comm does: its
  // ranks share one clock and one mailbox).
  virtual MessageDelays takeMessageDelays() { return {}; }
};

// A Comm that passes everything to `inner`: the base of the comms that
// change how some messages travel (ChannelComm, ParcelComm), which
// override what they change.
class ForwardingComm : public Comm {
public:
  explicit ForwardingComm(std::unique_ptr<Comm> inner)
      : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override {
    return inner_->send(peer, tag, microbatch, data, bytes);
  }
  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override {
    return inner_->recv(peer, tag, microbatch, data, bytes);
  }
  bool poll(int peer, int64_t tag, int microbatch) override {
    return inner_->poll(peer, tag, microbatch);
  }
  void abort(const std::string &why) override { inner_->abort(why); }
  bool aborted() const override { return inner_->aborted(); }
  llvm::Error barrier() override { return inner_->barrier(); }
  void setTimeout(double seconds) override { inner_->setTimeout(seconds); }
  double timeout() const override { return inner_->timeout(); }
  llvm::Error allReduceOrdered(void *data, size_t bytes, int64_t tag,
                               const DeviceAccess &access) override {
    return inner_->allReduceOrdered(data, bytes, tag, access);
  }
  llvm::Expected<bool> anyTrue(bool mine, int64_t tag) override {
    return inner_->anyTrue(mine, tag);
  }
  void bindBackend(Backend &b) override { inner_->bindBackend(b); }
  bool direct(int peer, int64_t tag, bool send) const override {
    return inner_->direct(peer, tag, send);
  }
  MessageDelays takeMessageDelays() override {
    return inner_->takeMessageDelays();
  }

protected:
  std::unique_ptr<Comm> inner_;
};

// A wait that ran past the timeout. Its message is complete as it stands
// ("no message from rank 0 (tag 7, microbatch 3) within 3 s
// (--comm-timeout)"): the executor replaces it with one naming the stage,
// the peer and what the message was, and code that prefixes context to
// errors passes it through unchanged, so the line stays short.
class CommTimeout : public llvm::ErrorInfo<CommTimeout> {
public:
  static char ID;
  CommTimeout(std::string message, double seconds)
      : message(std::move(message)), seconds(seconds) {}
  void log(llvm::raw_ostream &os) const override;
  std::error_code convertToErrorCode() const override;
  std::string message;
  double seconds;
};

// "within 3 s (--comm-timeout)": how every timeout message ends.
std::string withinTimeout(double seconds);

// `size` ranks of one in-process group; element r is rank r. `timeoutSeconds`
// is every rank's initial setTimeout value.
std::vector<std::unique_ptr<Comm>> createInProcessComms(int size,
                                                        double timeoutSeconds = 0);

} // namespace cleave::runtime
