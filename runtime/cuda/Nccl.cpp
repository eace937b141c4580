// NCCL's library, bootstrap and channels (runtime/cuda/Nccl.h).
#include "runtime/cuda/Nccl.h"

#include "runtime/Kernel.h"
#include "runtime/comm/MessageOrder.h"
#include "runtime/cuda/RuntimeLibrary.h"

#include "llvm/Support/FormatVariadic.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include <unistd.h>

namespace cleave::runtime::cuda {
namespace {

// The NCCL entry points cleave uses, from libnccl.so.2.
struct NcclLib {
  decltype(&ncclGetVersion) getVersion = nullptr;
  decltype(&ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&ncclCommInitRank) commInitRank = nullptr;
  decltype(&ncclCommAbort) commAbort = nullptr;
  decltype(&ncclCommDestroy) commDestroy = nullptr;
  decltype(&ncclCommGetAsyncError) commGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) getErrorString = nullptr;
  decltype(&ncclGetLastError) getLastError = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) groupStart = nullptr;
  decltype(&ncclGroupEnd) groupEnd = nullptr;
  std::string error; // why it could not be loaded
};

const NcclLib &nccl() {
  static const NcclLib lib = [] {
    NcclLib l;
    // CUDA 13's toolkit keeps NCCL in lib/, which is not on the loader's
    // path by default.
    RuntimeLibrary r({"libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                      "/usr/local/cuda/lib64/libnccl.so.2"},
                     "NCCL");
    r.bind(l.getVersion, "ncclGetVersion");
    r.bind(l.getUniqueId, "ncclGetUniqueId");
    r.bind(l.commInitRank, "ncclCommInitRank");
    r.bind(l.commAbort, "ncclCommAbort");
    r.bind(l.commDestroy, "ncclCommDestroy");
    r.bind(l.commGetAsyncError, "ncclCommGetAsyncError");
    r.bind(l.getErrorString, "ncclGetErrorString");
    r.bind(l.getLastError, "ncclGetLastError");
    r.bind(l.send, "ncclSend");
    r.bind(l.recv, "ncclRecv");
    r.bind(l.groupStart, "ncclGroupStart");
    r.bind(l.groupEnd, "ncclGroupEnd");
    l.error = r.error;
    return l;
  }();
  return lib;
}

llvm::Error ncclFail(const llvm::Twine &what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), what);
}

// "NCCL <call>: <reason> (<NCCL's last error>)", one line.
llvm::Error ncclCallFail(const char *call, ncclResult_t r, ncclComm_t comm) {
  const NcclLib &l = nccl();
  std::string last = l.getLastError ? l.getLastError(comm) : "";
  while (!last.empty() && (last.back() == '\n' || last.back() == ' '))
    last.pop_back();
  for (char &c : last)
    if (c == '\n')
      c = ' ';
  return ncclFail(llvm::Twine("NCCL ") + call + ": " + l.getErrorString(r) +
                  (last.empty() ? "" : " (" + last + ")"));
}

// One line when no GPU is visible: NCCL runs on GPUs only.
llvm::Expected<int> visibleGpus() {
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    return ncclFail(llvm::Twine("NCCL needs a GPU: no usable CUDA device (") +
                    (e != cudaSuccess ? cudaGetErrorString(e)
                                      : "the CUDA runtime sees no device") +
                    ")");
  return devices;
}

} // namespace

llvm::Expected<std::string> ncclLibraryVersion() {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  int v = 0;
  if (ncclResult_t r = l.getVersion(&v))
    return ncclCallFail("ncclGetVersion", r, nullptr);
  // NCCL 2.9 and later: major * 10000 + minor * 100 + patch.
  return llvm::formatv("NCCL {0}.{1}.{2}", v / 10000, v / 100 % 100, v % 100)
      .str();
}

llvm::Expected<NcclId> newNcclId() {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  ncclUniqueId id;
  if (ncclResult_t r = l.getUniqueId(&id))
    return ncclCallFail("ncclGetUniqueId", r, nullptr);
  NcclId out;
  static_assert(sizeof(id.internal) == sizeof(out.bytes));
  std::memcpy(out.bytes.data(), id.internal, sizeof(id.internal));
  return out;
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::adopt(void *comm,
                                                          int rank, int size) {
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator);
  c->comm_ = comm;
  c->rank_ = rank;
  c->size_ = size;
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_)
    nccl().commAbort(static_cast<ncclComm_t>(comm_));
}

llvm::Error NcclCommunicator::asyncError() const {
  ncclResult_t state = ncclSuccess;
  auto comm = static_cast<ncclComm_t>(comm_);
  if (ncclResult_t r = nccl().commGetAsyncError(comm, &state))
    return ncclCallFail("ncclCommGetAsyncError", r, comm);
  if (state != ncclSuccess && state != ncclInProgress)
    return ncclCallFail("a communicator", state, comm);
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<NcclCommunicator>>
openNcclCommunicator(const NcclId &id, int rank, int size, int device) {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  if (size < 1 || rank < 0 || rank >= size)
    return ncclFail(llvm::formatv("NCCL: rank {0} of a {1}-rank communicator",
                                  rank, size));
  auto devices = visibleGpus();
  if (!devices)
    return devices.takeError();
  if (device < 0 || device >= *devices)
    return ncclFail(llvm::formatv("NCCL: CUDA device {0} does not exist ({1} "
                                  "visible)",
                                  device, *devices));
  if (cudaError_t s = cudaSetDevice(device))
    return ncclFail(llvm::Twine("NCCL: cudaSetDevice: ") +
                    cudaGetErrorString(s));
  ncclUniqueId raw;
  std::memcpy(raw.internal, id.bytes.data(), sizeof(raw.internal));
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = l.commInitRank(&comm, size, raw, rank))
    return ncclCallFail("ncclCommInitRank", r, comm);
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator);
  c->comm_ = comm;
  c->rank_ = rank;
  c->size_ = size;
  return std::move(c);
}

std::vector<NcclChannel> ncclChannels(const Plan &plan) {
  RankPairOrder order = rankPairOrder(plan, Channel::StagePair);
  std::vector<NcclChannel> out;
  int n = order.ranks;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (const auto &s = order.sends[size_t(a) * n + b]; !s.empty())
        out.push_back({a, b, int64_t(s.size())});
  return out;
}

} // namespace cleave::runtime::cuda

// --- the transport -----------------------------------------------------------

namespace cleave::runtime::cuda {
namespace {

// One end of a channel: the communicator (rank 0 sends, rank 1 receives),
// its stream, and the device buffers of sends still in flight.
struct ChannelEnd {
  std::unique_ptr<NcclCommunicator> comm;
  cudaStream_t stream = nullptr;
  // Direct: marks the compute stream's work so far for the channel's
  // stream to wait on.
  cudaEvent_t computeMark = nullptr;
  struct InFlight {
    void *buffer;
    size_t size; // the buffer's, at least the message's
    cudaEvent_t done;
  };
  std::vector<InFlight> sending;
  void *recvBuffer = nullptr;
  size_t recvBytes = 0;
  bool recvPosted = false; // a ncclRecv queued by ready(), not yet taken
  size_t postedBytes = 0;
};

llvm::Error cudaFail(const char *what, cudaError_t e) {
  return ncclFail(llvm::Twine("NCCL: ") + what + ": " + cudaGetErrorString(e));
}

// Stages on different GPUs over NCCL; stages on the same GPU (NCCL takes
// one rank per device in a communicator) over the host transport.
//
// Bound to a CUDA backend (bindBackend: its stream), messages come
// straight from device memory: a send copies the value into a buffer of
// the channel's on the compute stream, in its order, and the channel's
// stream sends it once that copy is done (so the compute never waits for
// the peer to take a message, and the slot may be overwritten at once); a
// receive posts its ncclRecv after the compute so far (the buffer's last
// reader), waits on the host as before (timeouts, NCCL's errors, abort)
// and copies the message into the slot on the compute stream. Without a
// bound stream, messages are host buffers (the executor stages them).
class NcclTransport final : public ChannelTransport {
public:
  NcclTransport(int device, double timeout,
                std::unique_ptr<ChannelTransport> local)
      : device_(device), timeout_(timeout), local_(std::move(local)) {}
  ~NcclTransport() override {
    cudaSetDevice(device_);
    for (auto *ends : {&out_, &in_})
      for (auto &[peer, end] : *ends) {
        for (auto &f : end.sending) {
          cudaEventDestroy(f.done);
          cudaFree(f.buffer);
        }
        if (end.recvBuffer)
          cudaFree(end.recvBuffer);
        end.comm.reset(); // aborts what is in flight
        if (end.computeMark)
          cudaEventDestroy(end.computeMark);
        if (end.stream)
          cudaStreamDestroy(end.stream);
      }
    for (auto &[id, h] : holds_)
      if (!h.local) {
        cudaEventDestroy(h.ready);
        cudaFree(h.buffer);
      }
    for (auto &[size, buffer] : pool_)
      cudaFree(buffer);
  }

  std::map<int, ChannelEnd> out_, in_; // by peer stage

  void bindBackend(Backend &b) override {
    compute_ = static_cast<cudaStream_t>(b.stream());
    local_->bindBackend(b);
  }
  bool direct(int peer) const override {
    if (!out_.count(peer) && !in_.count(peer))
      return local_->direct(peer);
    return compute_ != nullptr;
  }

  llvm::Error send(int to, const void *data, size_t bytes) override {
    auto it = out_.find(to);
    if (it == out_.end())
      return local_->send(to, data, bytes);
    ChannelEnd &end = it->second;
    cudaSetDevice(device_);
    reapSends(end);
    ChannelEnd::InFlight f{nullptr, 0, nullptr};
    if (auto e = buffer(bytes, f.buffer, f.size))
      return e;
    if (cudaError_t c =
            cudaEventCreateWithFlags(&f.done, cudaEventDisableTiming)) {
      pool_.emplace(f.size, f.buffer);
      return cudaFail("an event for a send", c);
    }
    cudaError_t c;
    if (compute_) {
      c = cudaMemcpyAsync(f.buffer, data, bytes, cudaMemcpyDeviceToDevice,
                          compute_);
      if (!c)
        if (auto e = afterCompute(end))
          return e;
    } else {
      c = cudaMemcpyAsync(f.buffer, data, bytes, cudaMemcpyHostToDevice,
                          end.stream);
    }
    if (c)
      return cudaFail("copying a message to send", c);
    auto comm = static_cast<ncclComm_t>(end.comm->handle());
    if (ncclResult_t r = nccl().send(f.buffer, bytes, ncclUint8, 1, comm,
                                     end.stream))
      return ncclCallFail("ncclSend", r, comm);
    cudaEventRecord(f.done, end.stream);
    end.sending.push_back(f);
    return llvm::Error::success();
  }

  llvm::Error recv(int from, void *data, size_t bytes) override {
    auto it = in_.find(from);
    if (it == in_.end())
      return local_->recv(from, data, bytes);
    ChannelEnd &end = it->second;
    cudaSetDevice(device_);
    if (auto e = arrive(end, from, bytes))
      return e;
    cudaError_t c =
        compute_ ? cudaMemcpyAsync(data, end.recvBuffer, bytes,
                                   cudaMemcpyDeviceToDevice, compute_)
                 : cudaMemcpy(data, end.recvBuffer, bytes,
                              cudaMemcpyDeviceToHost);
    if (c)
      return cudaFail("copying a received message", c);
    return llvm::Error::success();
  }

  llvm::Expected<uint64_t> hold(int from, size_t bytes) override {
    auto it = in_.find(from);
    if (it == in_.end()) {
      auto h = local_->hold(from, bytes);
      if (!h)
        return h.takeError();
      holds_[++lastHold_] = Hold{true, *h, nullptr, 0, nullptr};
      return lastHold_;
    }
    ChannelEnd &end = it->second;
    cudaSetDevice(device_);
    if (auto e = arrive(end, from, bytes))
      return std::move(e);
    Hold h{false, 0, nullptr, 0, nullptr};
    if (auto e = buffer(bytes, h.buffer, h.size))
      return std::move(e);
    // The buffer's last reader (a take's copy, on the compute stream) goes
    // first; the channel's next receive comes after this copy.
    if (auto e = afterCompute(end))
      return std::move(e);
    cudaError_t c = cudaMemcpyAsync(h.buffer, end.recvBuffer, bytes,
                                    cudaMemcpyDeviceToDevice, end.stream);
    if (!c)
      c = cudaEventCreateWithFlags(&h.ready, cudaEventDisableTiming);
    if (!c)
      c = cudaEventRecord(h.ready, end.stream);
    if (c) {
      pool_.emplace(h.size, h.buffer);
      return cudaFail("holding a message", c);
    }
    holds_[++lastHold_] = h;
    return lastHold_;
  }

  llvm::Error take(uint64_t id, void *data, size_t bytes) override {
    auto it = holds_.find(id);
    if (it == holds_.end())
      return ncclFail("NCCL: no such held message");
    Hold h = it->second;
    holds_.erase(it);
    if (h.local)
      return local_->take(h.held, data, bytes);
    cudaSetDevice(device_);
    cudaError_t c = cudaStreamWaitEvent(compute_, h.ready, 0);
    if (!c)
      c = cudaMemcpyAsync(data, h.buffer, bytes, cudaMemcpyDeviceToDevice,
                          compute_);
    cudaEventDestroy(h.ready);
    // Its next writer orders itself after the compute stream's work.
    pool_.emplace(h.size, h.buffer);
    if (c)
      return cudaFail("taking a held message", c);
    return llvm::Error::success();
  }

  bool ready(int from, size_t bytes) override {
    if (!in_.count(from))
      return local_->ready(from, bytes);
    auto it = in_.find(from);
    if (aborted_)
      return true; // recv fails at once
    ChannelEnd &end = it->second;
    cudaSetDevice(device_);
    if (!end.recvPosted)
      if (auto e = post(end, bytes)) {
        llvm::consumeError(std::move(e));
        return true;
      }
    return cudaStreamQuery(end.stream) != cudaErrorNotReady;
  }

  void abort(const std::string &why) override {
    if (!aborted_) {
      aborted_ = true;
      why_ = why;
    }
    local_->abort(why);
  }
  void setTimeout(double seconds) override {
    timeout_ = seconds;
    local_->setTimeout(seconds);
  }

private:
  // A message taken off a channel before it is asked for.
  struct Hold {
    bool local; // held by the host transport, as `held`
    uint64_t held;
    void *buffer; // else a device buffer of `size` bytes, ready at `ready`
    size_t size;
    cudaEvent_t ready;
  };

  // Direct: the channel's stream waits for the compute stream's work
  // issued so far.
  llvm::Error afterCompute(ChannelEnd &end) {
    if (!compute_)
      return llvm::Error::success();
    cudaError_t c = cudaSuccess;
    if (!end.computeMark)
      c = cudaEventCreateWithFlags(&end.computeMark, cudaEventDisableTiming);
    if (!c)
      c = cudaEventRecord(end.computeMark, compute_);
    if (!c)
      c = cudaStreamWaitEvent(end.stream, end.computeMark, 0);
    if (c)
      return cudaFail("ordering a message after the compute", c);
    return llvm::Error::success();
  }
  // A device buffer of at least `bytes` bytes from the pool (one no
  // message uses any more), or a new one.
  llvm::Error buffer(size_t bytes, void *&out, size_t &size) {
    auto it = pool_.lower_bound(bytes);
    if (it != pool_.end() && it->first <= 2 * bytes + 4096) {
      out = it->second;
      size = it->first;
      pool_.erase(it);
      return llvm::Error::success();
    }
    size = bytes ? bytes : 1;
    if (cudaMalloc(&out, size) != cudaSuccess)
      return ncclFail(llvm::formatv("NCCL: cannot allocate {0} bytes for a "
                                    "message",
                                    bytes));
    return llvm::Error::success();
  }
  // Posts the channel's next receive if ready() has not, and waits for it
  // on the host, watching NCCL's own errors, the abort and the timeout.
  llvm::Error arrive(ChannelEnd &end, int from, size_t bytes) {
    if (!end.recvPosted)
      if (auto e = post(end, bytes))
        return e;
    if (end.postedBytes != bytes)
      return ncclFail(llvm::formatv("NCCL: a {0}-byte message from stage {1} "
                                    "taken as {2} bytes",
                                    end.postedBytes, from, bytes));
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      cudaError_t q = cudaStreamQuery(end.stream);
      if (q == cudaSuccess)
        break;
      if (q != cudaErrorNotReady)
        return ncclFail(llvm::Twine("NCCL: a receive from stage ") +
                        llvm::Twine(from) + ": " + cudaGetErrorString(q));
      if (auto e = end.comm->asyncError())
        return e;
      if (aborted_)
        return ncclFail("NCCL: aborted: " + why_);
      double waited = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      if (timeout_ > 0 && waited > timeout_)
        return llvm::make_error<CommTimeout>(
            llvm::formatv("no message from stage {0} over NCCL {1}", from,
                          withinTimeout(timeout_))
                .str(),
            timeout_);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    end.recvPosted = false;
    return llvm::Error::success();
  }
  // Queues the channel's next ncclRecv into its staging buffer, after the
  // compute stream's copy of the last message out of it (direct).
  llvm::Error post(ChannelEnd &end, size_t bytes) {
    if (bytes > end.recvBytes) {
      if (end.recvBuffer)
        cudaFree(end.recvBuffer);
      end.recvBuffer = nullptr;
      end.recvBytes = 0;
      if (cudaMalloc(&end.recvBuffer, bytes) != cudaSuccess)
        return ncclFail(llvm::formatv("NCCL: cannot allocate {0} bytes to "
                                      "receive",
                                      bytes));
      end.recvBytes = bytes;
    }
    if (auto e = afterCompute(end))
      return e;
    auto comm = static_cast<ncclComm_t>(end.comm->handle());
    if (ncclResult_t r = nccl().recv(end.recvBuffer, bytes, ncclUint8, 0,
                                     comm, end.stream))
      return ncclCallFail("ncclRecv", r, comm);
    end.recvPosted = true;
    end.postedBytes = bytes;
    return llvm::Error::success();
  }
  // Returns the buffers of sends that are done to the pool.
  void reapSends(ChannelEnd &end) {
    auto keep = end.sending.begin();
    for (auto &f : end.sending) {
      if (cudaEventQuery(f.done) == cudaSuccess) {
        cudaEventDestroy(f.done);
        pool_.emplace(f.size, f.buffer);
      } else {
        *keep++ = f;
      }
    }
    end.sending.erase(keep, end.sending.end());
  }

  int device_;
  double timeout_;
  std::unique_ptr<ChannelTransport> local_;
  bool aborted_ = false;
  std::string why_;
  cudaStream_t compute_ = nullptr; // the bound backend's stream
  std::multimap<size_t, void *> pool_;
  std::map<uint64_t, Hold> holds_;
  uint64_t lastHold_ = 0;
};

} // namespace

namespace {

// Opens the NCCL ends `ends` (ends[i] on CUDA device devices[i]) from this
// thread in one ncclGroupStart/End, as ncclCommInitAll does, so that
// opening many 2-rank communicators cannot wait on each other, and gives
// each with a stream of its own to its stage's transport.
llvm::Error openEnds(const std::vector<NcclChannelEnd> &ends,
                     const std::vector<int> &devices,
                     std::map<int, NcclTransport *> &transportOfStage) {
  const NcclLib &l = nccl();
  std::vector<ncclComm_t> comms(ends.size(), nullptr);
  if (ncclResult_t r = l.groupStart())
    return ncclCallFail("ncclGroupStart", r, nullptr);
  for (size_t i = 0; i < ends.size(); ++i) {
    cudaSetDevice(devices[i]);
    ncclUniqueId raw;
    std::memcpy(raw.internal, ends[i].id.bytes.data(), sizeof(raw.internal));
    if (ncclResult_t r = l.commInitRank(&comms[i], 2, raw, ends[i].member)) {
      l.groupEnd();
      return ncclCallFail("ncclCommInitRank", r, nullptr);
    }
  }
  if (ncclResult_t r = l.groupEnd())
    return ncclCallFail("ncclGroupEnd (opening the channels)", r, nullptr);
  for (size_t i = 0; i < ends.size(); ++i) {
    const NcclChannelEnd &e = ends[i];
    NcclTransport &mine = *transportOfStage.at(e.stage);
    ChannelEnd &end = e.member == 0 ? mine.out_[e.peer] : mine.in_[e.peer];
    end.comm = NcclCommunicator::adopt(comms[i], e.member, 2);
    cudaSetDevice(devices[i]);
    if (cudaError_t s =
            cudaStreamCreateWithFlags(&end.stream, cudaStreamNonBlocking))
      return ncclFail(llvm::Twine("NCCL: cudaStreamCreate: ") +
                      cudaGetErrorString(s));
  }
  return llvm::Error::success();
}

// Member `member` (0: the sending stage's) of channel `c`.
NcclChannelEnd channelEnd(const NcclChannel &c, int member, bool overNccl,
                          const NcclId &id) {
  NcclChannelEnd e;
  e.channel = c;
  e.member = member;
  e.stage = member == 0 ? c.fromStage : c.toStage;
  e.peer = member == 0 ? c.toStage : c.fromStage;
  e.overNccl = overNccl;
  e.id = id;
  return e;
}

// What the sending end of a channel tells the receiving one.
struct Offer {
  std::array<char, 128> id;
  std::array<char, 128> place; // ncclPlace of the sending stage, 0-padded
};

std::array<char, 128> placeBytes(const std::string &place) {
  std::array<char, 128> out{};
  std::memcpy(out.data(), place.data(), std::min(place.size(), out.size() - 1));
  return out;
}

} // namespace

llvm::Expected<std::vector<std::unique_ptr<ChannelTransport>>>
createNcclTransports(const Plan &plan, const std::vector<int> &deviceOfStage,
                     double timeoutSeconds) {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  if (auto devices = visibleGpus(); !devices)
    return devices.takeError();
  int stages = int(plan.stages.size());
  if (int(deviceOfStage.size()) != stages)
    return ncclFail("NCCL: a device for every stage is needed");
  std::vector<std::unique_ptr<NcclTransport>> t;
  std::map<int, NcclTransport *> byStage;
  auto fifo = createInProcessComms(stages, timeoutSeconds);
  for (int s = 0; s < stages; ++s) {
    t.push_back(std::make_unique<NcclTransport>(
        deviceOfStage[size_t(s)], timeoutSeconds,
        createHostChannelTransport(std::move(fifo[size_t(s)]),
                                   /*oneProcess=*/true)));
    byStage[s] = t.back().get();
  }
  // Both members of every channel between GPUs, from this thread.
  std::vector<NcclChannelEnd> ends;
  std::vector<int> devices;
  for (const NcclChannel &c : ncclChannels(plan)) {
    if (deviceOfStage[size_t(c.fromStage)] == deviceOfStage[size_t(c.toStage)])
      continue;
    auto id = newNcclId();
    if (!id)
      return id.takeError();
    for (int member = 0; member < 2; ++member) {
      ends.push_back(channelEnd(c, member, true, *id));
      devices.push_back(deviceOfStage[size_t(ends.back().stage)]);
    }
  }
  if (auto e = openEnds(ends, devices, byStage))
    return std::move(e);
  std::vector<std::unique_ptr<ChannelTransport>> out;
  for (auto &x : t)
    out.push_back(std::move(x));
  return std::move(out);
}

std::string ncclPlace(int device) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0)
    std::strcpy(host, "?");
  return std::string(host) + ":" + std::to_string(device);
}

llvm::Expected<std::vector<NcclChannelEnd>>
agreeNcclChannels(const Plan &plan, const std::vector<int> &stages,
                  const std::vector<int> &stageRank,
                  const std::vector<std::string> &placeOfStage, Comm &control,
                  const std::function<llvm::Expected<NcclId>()> &newId) {
  if (placeOfStage.size() != stages.size())
    return ncclFail("NCCL: a place for every stage of the process is needed");
  auto index = [&](int stage) -> int {
    auto it = std::find(stages.begin(), stages.end(), stage);
    return it == stages.end() ? -1 : int(it - stages.begin());
  };
  auto rankOf = [&](int stage) {
    return size_t(stage) < stageRank.size() ? stageRank[size_t(stage)] : stage;
  };
  std::vector<NcclChannel> channels = ncclChannels(plan);
  // channel index -> this process's ends of it
  std::map<int, std::vector<NcclChannelEnd>> mine;
  auto end = channelEnd;
  // 1. The sending ends make the ids and offer them (sends never block).
  for (size_t c = 0; c < channels.size(); ++c) {
    const NcclChannel &ch = channels[c];
    int from = index(ch.fromStage), to = index(ch.toStage);
    if (from < 0)
      continue;
    if (to >= 0) { // both ends here
      bool over = placeOfStage[size_t(from)] != placeOfStage[size_t(to)];
      NcclId id;
      if (over) {
        auto made = newId();
        if (!made)
          return made.takeError();
        id = *made;
      }
      mine[int(c)] = {end(ch, 0, over, id), end(ch, 1, over, id)};
      continue;
    }
    auto made = newId();
    if (!made)
      return made.takeError();
    Offer offer{made->bytes, placeBytes(placeOfStage[size_t(from)])};
    if (auto e = control.send(rankOf(ch.toStage), int64_t(c), -1, &offer,
                              sizeof offer))
      return std::move(e);
    mine[int(c)] = {end(ch, 0, false, *made)};
  }
  // 2. The receiving ends take the offers and answer.
  for (size_t c = 0; c < channels.size(); ++c) {
    const NcclChannel &ch = channels[c];
    int from = index(ch.fromStage), to = index(ch.toStage);
    if (to < 0 || from >= 0)
      continue;
    Offer offer;
    if (auto e = control.recv(rankOf(ch.fromStage), int64_t(c), -1, &offer,
                              sizeof offer))
      return std::move(e);
    uint8_t over = offer.place != placeBytes(placeOfStage[size_t(to)]) ? 1 : 0;
    if (auto e = control.send(rankOf(ch.fromStage), int64_t(c), -1, &over,
                              sizeof over))
      return std::move(e);
    NcclId id;
    id.bytes = offer.id;
    mine[int(c)] = {end(ch, 1, over != 0, id)};
  }
  // 3. The sending ends hear whether their channels are NCCL's.
  for (size_t c = 0; c < channels.size(); ++c) {
    const NcclChannel &ch = channels[c];
    if (index(ch.fromStage) < 0 || index(ch.toStage) >= 0)
      continue;
    uint8_t over = 0;
    if (auto e = control.recv(rankOf(ch.toStage), int64_t(c), -1, &over,
                              sizeof over))
      return std::move(e);
    mine[int(c)].front().overNccl = over != 0;
  }
  std::vector<NcclChannelEnd> out;
  for (auto &[c, ends] : mine)
    for (NcclChannelEnd &e : ends)
      out.push_back(e);
  return std::move(out);
}

llvm::Expected<std::vector<std::unique_ptr<ChannelTransport>>>
createNcclRankTransports(const Plan &plan, const std::vector<int> &stages,
                         const std::vector<int> &devices,
                         const std::vector<int> &stageRank, Comm &control,
                         std::vector<std::unique_ptr<ChannelTransport>> host,
                         double timeoutSeconds) {
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  if (devices.size() != stages.size() || host.size() != stages.size())
    return ncclFail("NCCL: a device and a host transport for every stage of "
                    "the process are needed");
  std::vector<std::string> places;
  for (int d : devices)
    places.push_back(ncclPlace(d));
  auto ends = agreeNcclChannels(plan, stages, stageRank, places, control,
                                [] { return newNcclId(); });
  if (!ends)
    return ends.takeError();
  std::vector<NcclChannelEnd> open;
  std::vector<int> openDevices;
  for (const NcclChannelEnd &e : *ends)
    if (e.overNccl) {
      open.push_back(e);
      auto k = std::find(stages.begin(), stages.end(), e.stage) - stages.begin();
      openDevices.push_back(devices[size_t(k)]);
    }
  if (!open.empty())
    if (auto n = visibleGpus(); !n)
      return n.takeError();
  std::vector<std::unique_ptr<NcclTransport>> t;
  std::map<int, NcclTransport *> byStage;
  for (size_t k = 0; k < stages.size(); ++k) {
    t.push_back(std::make_unique<NcclTransport>(devices[k], timeoutSeconds,
                                                std::move(host[k])));
    byStage[stages[k]] = t.back().get();
  }
  if (auto e = openEnds(open, openDevices, byStage))
    return std::move(e);
  std::vector<std::unique_ptr<ChannelTransport>> out;
  for (auto &x : t)
    out.push_back(std::move(x));
  return std::move(out);
}

} // namespace cleave::runtime::cuda

namespace cleave::runtime::cuda {
namespace {

// Moves a sum's parts between replicas over their group's communicator,
// on the group's stream, each call waiting until its bytes are moved.
class NcclLink final : public DeviceLink {
public:
  NcclLink(const NcclCommunicator &comm, cudaStream_t stream, int device,
           Comm &control)
      : comm_(comm), stream_(stream), device_(device), control_(control) {}

  llvm::Error send(int peer, const void *data, size_t bytes) override {
    cudaSetDevice(device_);
    auto c = static_cast<ncclComm_t>(comm_.handle());
    if (ncclResult_t r = nccl().send(data, bytes, ncclUint8, peer, c, stream_))
      return ncclCallFail("ncclSend", r, c);
    return wait("a sum's part to replica", peer);
  }
  llvm::Error recv(int peer, void *data, size_t bytes) override {
    cudaSetDevice(device_);
    auto c = static_cast<ncclComm_t>(comm_.handle());
    if (ncclResult_t r = nccl().recv(data, bytes, ncclUint8, peer, c, stream_))
      return ncclCallFail("ncclRecv", r, c);
    return wait("a sum's part from replica", peer);
  }

private:
  // Polls the stream, NCCL's async error, the control comm's abort and
  // its timeout.
  llvm::Error wait(const char *what, int peer) {
    auto start = std::chrono::steady_clock::now();
    double timeout = control_.timeout();
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess)
        return llvm::Error::success();
      if (q != cudaErrorNotReady)
        return ncclFail(llvm::formatv("NCCL: {0} {1}: {2}", what, peer,
                                      cudaGetErrorString(q)));
      if (auto e = comm_.asyncError())
        return e;
      if (control_.aborted())
        return ncclFail(llvm::formatv("NCCL: {0} {1}: the group failed",
                                      what, peer));
      double waited = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      if (timeout > 0 && waited > timeout)
        return llvm::make_error<CommTimeout>(
            llvm::formatv("no {0} {1} over NCCL {2}", what, peer,
                          withinTimeout(timeout))
                .str(),
            timeout);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  const NcclCommunicator &comm_;
  cudaStream_t stream_;
  int device_;
  Comm &control_;
};

class NcclGroupComm final : public Comm {
public:
  NcclGroupComm(Comm &control, std::unique_ptr<NcclCommunicator> comm,
                int device, cudaStream_t stream)
      : control_(control), comm_(std::move(comm)), device_(device),
        stream_(stream) {}
  ~NcclGroupComm() override {
    cudaSetDevice(device_);
    comm_.reset(); // aborts what is in flight
    if (stream_)
      cudaStreamDestroy(stream_);
  }

  int rank() const override { return control_.rank(); }
  int size() const override { return control_.size(); }
  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override {
    return control_.send(peer, tag, microbatch, data, bytes);
  }
  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override {
    return control_.recv(peer, tag, microbatch, data, bytes);
  }
  bool poll(int peer, int64_t tag, int microbatch) override {
    return control_.poll(peer, tag, microbatch);
  }
  void abort(const std::string &why) override { control_.abort(why); }
  bool aborted() const override { return control_.aborted(); }
  llvm::Error barrier() override { return control_.barrier(); }
  void setTimeout(double seconds) override { control_.setTimeout(seconds); }
  double timeout() const override { return control_.timeout(); }
  llvm::Expected<bool> anyTrue(bool mine, int64_t tag) override {
    return control_.anyTrue(mine, tag);
  }

  llvm::Error allReduceOrdered(void *data, size_t bytes, int64_t,
                               const DeviceAccess &access) override {
    NcclLink link(*comm_, stream_, device_, control_);
    return allReduceOrderedOver(link, rank(), size(), data, bytes, access);
  }

private:
  Comm &control_;
  std::unique_ptr<NcclCommunicator> comm_;
  int device_;
  cudaStream_t stream_;
};

llvm::Expected<cudaStream_t> groupStream(int device) {
  cudaSetDevice(device);
  cudaStream_t s = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))
    return ncclFail(llvm::Twine("NCCL: cudaStreamCreate: ") +
                    cudaGetErrorString(e));
  return s;
}

bool allDistinct(std::vector<std::string> places) {
  std::sort(places.begin(), places.end());
  return std::adjacent_find(places.begin(), places.end()) == places.end();
}

} // namespace

llvm::Expected<std::vector<std::unique_ptr<Comm>>>
createNcclGroupComms(const std::vector<Comm *> &controls,
                     const std::vector<int> &devices) {
  std::vector<std::unique_ptr<Comm>> out(controls.size());
  std::vector<std::string> places;
  for (int d : devices)
    places.push_back(std::to_string(d));
  if (controls.size() < 2 || !allDistinct(places))
    return std::move(out); // nulls: the group stays on its control comms
  const NcclLib &l = nccl();
  if (!l.error.empty())
    return ncclFail(l.error);
  if (auto n = visibleGpus(); !n)
    return n.takeError();
  auto id = newNcclId();
  if (!id)
    return id.takeError();
  ncclUniqueId raw;
  std::memcpy(raw.internal, id->bytes.data(), sizeof(raw.internal));
  int n = int(controls.size());
  std::vector<ncclComm_t> comms(controls.size(), nullptr);
  if (ncclResult_t r = l.groupStart())
    return ncclCallFail("ncclGroupStart", r, nullptr);
  for (int i = 0; i < n; ++i) {
    cudaSetDevice(devices[size_t(i)]);
    if (ncclResult_t r = l.commInitRank(&comms[size_t(i)], n, raw, i)) {
      l.groupEnd();
      return ncclCallFail("ncclCommInitRank", r, nullptr);
    }
  }
  if (ncclResult_t r = l.groupEnd())
    return ncclCallFail("ncclGroupEnd (opening a replica group)", r, nullptr);
  for (int i = 0; i < n; ++i) {
    auto comm = NcclCommunicator::adopt(comms[size_t(i)], i, n);
    auto stream = groupStream(devices[size_t(i)]);
    if (!stream)
      return stream.takeError();
    out[size_t(i)] = std::make_unique<NcclGroupComm>(
        *controls[size_t(i)], std::move(comm), devices[size_t(i)], *stream);
  }
  return std::move(out);
}

llvm::Expected<std::unique_ptr<Comm>> createNcclGroupComm(Comm &control,
                                                          int device) {
  // The bootstrap's messages on the control comm, before any training
  // message (MPI's tags are non-negative).
  constexpr int64_t kPlaceTag = 0, kIdTag = 1;
  int n = control.size(), me = control.rank();
  if (n < 2)
    return nullptr;
  // Rank 0 decides: every place distinct, and an id (whose first byte
  // after the verdict says so) for all. A member whose GPU is not there
  // adds why to its place ("host:device|why"), and then no member of
  // distinct places joins a communicator (the others would wait in
  // ncclCommInitRank for it).
  std::array<char, 1 + 128> verdict{};
  std::string placeText = ncclPlace(device);
  if (auto usable = visibleGpus(); !usable)
    placeText += "|" + llvm::toString(usable.takeError());
  else if (device < 0 || device >= *usable)
    placeText += llvm::formatv("|NCCL: CUDA device {0} does not exist ({1} "
                               "visible)",
                               device, *usable)
                     .str();
  std::array<char, 128> place = placeBytes(placeText);
  if (me == 0) {
    std::vector<std::string> places{std::string(place.data())};
    for (int r = 1; r < n; ++r) {
      std::array<char, 128> p{};
      if (auto e = control.recv(r, kPlaceTag, -1, p.data(), p.size()))
        return std::move(e);
      places.push_back(std::string(p.data()));
    }
    std::vector<std::string> where;
    std::string why;
    for (const std::string &p : places) {
      size_t bar = p.find('|');
      where.push_back(p.substr(0, bar));
      if (bar != std::string::npos && why.empty())
        why = p.substr(bar + 1);
    }
    llvm::Expected<NcclId> id = NcclId{};
    if (allDistinct(where) && !why.empty()) {
      verdict[0] = 3; // 3: a member's GPU is not there; why follows
      std::memcpy(verdict.data() + 1, why.data(), std::min<size_t>(why.size(), 127));
    } else if (allDistinct(where)) {
      id = newNcclId();
      verdict[0] = id ? 1 : 2; // 2: rank 0 could not make one
    }
    if (id && verdict[0] == 1)
      std::memcpy(verdict.data() + 1, id->bytes.data(), 128);
    for (int r = 1; r < n; ++r)
      if (auto e = control.send(r, kIdTag, -1, verdict.data(), verdict.size()))
        return std::move(e);
    if (!id)
      return id.takeError();
    if (verdict[0] == 3)
      return ncclFail(std::string(verdict.data() + 1, 127).c_str());
  } else {
    if (auto e = control.send(0, kPlaceTag, -1, place.data(), place.size()))
      return std::move(e);
    if (auto e = control.recv(0, kIdTag, -1, verdict.data(), verdict.size()))
      return std::move(e);
    if (verdict[0] == 2)
      return ncclFail("NCCL: the replica group's rank 0 could not make an id");
    if (verdict[0] == 3)
      return ncclFail(std::string(verdict.data() + 1, 127).c_str());
  }
  if (verdict[0] == 0)
    return nullptr; // two members share a GPU: the sums stay on `control`
  NcclId id;
  std::memcpy(id.bytes.data(), verdict.data() + 1, 128);
  auto comm = openNcclCommunicator(id, me, n, device);
  if (!comm)
    return comm.takeError();
  auto stream = groupStream(device);
  if (!stream)
    return stream.takeError();
  return std::make_unique<NcclGroupComm>(control, std::move(*comm), device,
                                         *stream);
}

} // namespace cleave::runtime::cuda
