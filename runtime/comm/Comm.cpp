// The in-process Comm group (runtime/Comm.h): one mailbox shared by all
// ranks, keyed by (source, destination, tag, microbatch), each key a FIFO
// queue of byte copies stamped with their send's time (a receive that
// waits counts the time from the send to its return: takeMessageDelays).
// One mutex guards the mailbox, the abort flag and the barrier; one
// condition variable wakes waiters on any change (the groups are small, a
// pipeline's stages, so waking everyone is cheap).
#include "runtime/comm/Comm.h"

#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

namespace cleave::runtime {

char CommTimeout::ID = 0;

void CommTimeout::log(llvm::raw_ostream &os) const { os << message; }

std::error_code CommTimeout::convertToErrorCode() const {
  return llvm::inconvertibleErrorCode();
}

llvm::Error allReduceOrderedOver(DeviceLink &link, int rank, int size,
                                 void *data, size_t bytes,
                                 const DeviceAccess &access) {
  if (size <= 1)
    return llvm::Error::success();
  auto named = [&](llvm::Error e, int peer) {
    return access.nameWait ? access.nameWait(std::move(e), peer)
                           : std::move(e);
  };
  auto settle = [&] {
    if (access.settle)
      access.settle();
  };
  if (rank == 0) {
    for (int r = 1; r < size; ++r) {
      settle(); // the scratch's last addition is done
      if (auto e = named(link.recv(r, access.scratch, bytes), r))
        return e;
      if (auto e = access.addInto(data, access.scratch))
        return e;
    }
    settle();
    for (int r = 1; r < size; ++r)
      if (auto e = link.send(r, data, bytes))
        return e;
    return llvm::Error::success();
  }
  settle();
  if (auto e = link.send(0, data, bytes))
    return e;
  return named(link.recv(0, data, bytes), 0);
}

namespace {

// Host staging over a comm's send/recv under one tag. The sum rank 0 sends
// to every rank is copied to the host once.
class StagingLink final : public DeviceLink {
public:
  StagingLink(Comm &comm, int64_t tag, const DeviceAccess &access,
              size_t bytes)
      : comm_(comm), tag_(tag), access_(access), host_(bytes) {}
  llvm::Error send(int peer, const void *data, size_t bytes) override {
    if (data != staged_) {
      access_.toHost(host_.data(), data, bytes);
      staged_ = data;
    }
    return comm_.send(peer, tag_, -1, host_.data(), bytes);
  }
  llvm::Error recv(int peer, void *data, size_t bytes) override {
    staged_ = nullptr;
    if (auto e = comm_.recv(peer, tag_, -1, host_.data(), bytes))
      return e;
    access_.toDevice(data, host_.data(), bytes);
    return llvm::Error::success();
  }

private:
  Comm &comm_;
  int64_t tag_;
  const DeviceAccess &access_;
  std::vector<uint8_t> host_;
  const void *staged_ = nullptr; // what host_ holds a copy of
};

} // namespace

llvm::Error Comm::allReduceOrdered(void *data, size_t bytes, int64_t tag,
                                   const DeviceAccess &access) {
  if (size() <= 1)
    return llvm::Error::success();
  StagingLink link(*this, tag, access, bytes);
  return allReduceOrderedOver(link, rank(), size(), data, bytes, access);
}

llvm::Expected<bool> Comm::anyTrue(bool mine, int64_t tag) {
  int n = size();
  int32_t any = mine ? 1 : 0;
  if (n <= 1)
    return mine;
  if (rank() == 0) {
    for (int r = 1; r < n; ++r) {
      int32_t other = 0;
      if (auto e = recv(r, tag, -1, &other, sizeof other))
        return std::move(e);
      any |= other;
    }
    for (int r = 1; r < n; ++r)
      if (auto e = send(r, tag, -1, &any, sizeof any))
        return std::move(e);
    return any != 0;
  }
  if (auto e = send(0, tag, -1, &any, sizeof any))
    return std::move(e);
  if (auto e = recv(0, tag, -1, &any, sizeof any))
    return std::move(e);
  return any != 0;
}

std::string withinTimeout(double seconds) {
  std::ostringstream os; // 3, 0.5, 600: no trailing zeros
  os << seconds;
  return "within " + os.str() + " s (--comm-timeout)";
}

namespace {

struct Group {
  explicit Group(int size) : size(size) {}
  using Key = std::tuple<int, int, int64_t, int>; // src, dst, tag, microbatch

  const int size;
  std::mutex mu;
  std::condition_variable cv;
  // Each message's bytes and when its send put it here.
  struct Message {
    std::vector<uint8_t> bytes;
    std::chrono::steady_clock::time_point sent;
  };
  std::map<Key, std::deque<Message>> mailbox;
  std::vector<MessageDelays> delays = std::vector<MessageDelays>(size_t(size));
  bool aborted = false;
  std::string why;
  int barrierArrived = 0;
  uint64_t barrierGeneration = 0;
};

class InProcessComm : public Comm {
public:
  InProcessComm(std::shared_ptr<Group> g, int rank, double timeout)
      : g_(std::move(g)), rank_(rank), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override {
    if (peer < 0 || peer >= g_->size || peer == rank_)
      return fail(llvm::formatv("send from rank {0} to rank {1}: no such peer "
                                "(group of {2})",
                                rank_, peer, g_->size));
    std::vector<uint8_t> copy(bytes);
    if (bytes)
      std::memcpy(copy.data(), data, bytes);
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      if (g_->aborted)
        return fail(what("send to", peer, tag, microbatch) +
                    ": aborted: " + g_->why);
      g_->mailbox[{rank_, peer, tag, microbatch}].push_back(
          {std::move(copy), std::chrono::steady_clock::now()});
    }
    g_->cv.notify_all();
    return llvm::Error::success();
  }

  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override {
    if (peer < 0 || peer >= g_->size || peer == rank_)
      return fail(llvm::formatv("recv on rank {0} from rank {1}: no such peer "
                                "(group of {2})",
                                rank_, peer, g_->size));
    Group::Key key{peer, rank_, tag, microbatch};
    std::vector<uint8_t> msg;
    {
      std::unique_lock<std::mutex> lock(g_->mu);
      auto ready = [&] {
        if (g_->aborted)
          return true;
        auto it = g_->mailbox.find(key);
        return it != g_->mailbox.end() && !it->second.empty();
      };
      const bool waited = !ready();
      if (!waitFor(lock, ready))
        return llvm::make_error<CommTimeout>(
            llvm::formatv("rank {0}: no message from rank {1} (tag {2}, "
                          "microbatch {3}) {4}",
                          rank_, peer, tag, microbatch,
                          withinTimeout(timeout_))
                .str(),
            timeout_);
      if (g_->aborted)
        return fail(what("recv from", peer, tag, microbatch) +
                    ": aborted: " + g_->why);
      auto it = g_->mailbox.find(key);
      MessageDelays &d = g_->delays[size_t(rank_)];
      ++d.received;
      if (waited) {
        ++d.waited;
        d.seconds += std::chrono::duration<double>(
                         std::chrono::steady_clock::now() -
                         it->second.front().sent)
                         .count();
      }
      msg = std::move(it->second.front().bytes);
      it->second.pop_front();
      if (it->second.empty())
        g_->mailbox.erase(it);
    }
    if (msg.size() != bytes)
      return fail(what("recv from", peer, tag, microbatch) +
                  llvm::formatv(": the message has {0} bytes, the buffer {1}",
                                msg.size(), bytes)
                      .str());
    if (bytes)
      std::memcpy(data, msg.data(), bytes);
    return llvm::Error::success();
  }

  void abort(const std::string &why) override {
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      if (g_->aborted)
        return;
      g_->aborted = true;
      g_->why = why;
    }
    g_->cv.notify_all();
  }

  bool aborted() const override {
    std::lock_guard<std::mutex> lock(g_->mu);
    return g_->aborted;
  }

  llvm::Error barrier() override {
    std::unique_lock<std::mutex> lock(g_->mu);
    if (g_->aborted)
      return fail(llvm::formatv("barrier on rank {0}: aborted: {1}", rank_,
                                g_->why));
    uint64_t gen = g_->barrierGeneration;
    if (++g_->barrierArrived == g_->size) {
      g_->barrierArrived = 0;
      ++g_->barrierGeneration;
      lock.unlock();
      g_->cv.notify_all();
      return llvm::Error::success();
    }
    bool ok = waitFor(lock, [&] {
      return g_->aborted || g_->barrierGeneration != gen;
    });
    if (g_->barrierGeneration != gen)
      return llvm::Error::success();
    --g_->barrierArrived; // leaving without the others
    if (!ok)
      return llvm::make_error<CommTimeout>(
          llvm::formatv("barrier on rank {0}: not all {1} ranks arrived {2}",
                        rank_, g_->size, withinTimeout(timeout_))
              .str(),
          timeout_);
    return fail(llvm::formatv("barrier on rank {0}: aborted: {1}", rank_,
                              g_->why));
  }

  void setTimeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }

  MessageDelays takeMessageDelays() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    return std::exchange(g_->delays[size_t(rank_)], MessageDelays{});
  }

  bool poll(int peer, int64_t tag, int microbatch) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->aborted)
      return true;
    auto it = g_->mailbox.find({peer, rank_, tag, microbatch});
    return it != g_->mailbox.end() && !it->second.empty();
  }

private:
  // Waits until `pred` holds; false if the timeout ran out first.
  template <typename Pred>
  bool waitFor(std::unique_lock<std::mutex> &lock, Pred pred) {
    if (timeout_ <= 0) {
      g_->cv.wait(lock, pred);
      return true;
    }
    auto deadline = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::duration<double>(timeout_));
    return g_->cv.wait_until(lock, deadline, pred);
  }

  std::string what(const char *verb, int peer, int64_t tag, int mb) const {
    return llvm::formatv("{0} rank {1} on rank {2} (tag {3}, microbatch {4})",
                         verb, peer, rank_, tag, mb)
        .str();
  }

  std::shared_ptr<Group> g_;
  int rank_;
  double timeout_;
};

} // namespace

std::vector<std::unique_ptr<Comm>> createInProcessComms(int size,
                                                        double timeoutSeconds) {
  auto g = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Comm>> out;
  for (int r = 0; r < size; ++r)
    out.push_back(std::make_unique<InProcessComm>(g, r, timeoutSeconds));
  return out;
}

} // namespace cleave::runtime
