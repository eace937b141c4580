// A Comm over order-matched channels (runtime/comm/ChannelComm.h).
#include "runtime/comm/ChannelComm.h"

#include "runtime/Kernel.h"
#include "runtime/comm/MessageOrder.h"
#include "runtime/comm/ParcelComm.h"
#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <vector>

namespace cleave::runtime {
namespace {

class HostChannelTransport final : public ChannelTransport {
public:
  HostChannelTransport(std::unique_ptr<Comm> fifo, bool oneProcess)
      : fifo_(std::move(fifo)), oneProcess_(oneProcess) {}
  llvm::Error send(int to, const void *data, size_t bytes) override {
    if (parcels_) // device to device; the descriptor on the FIFO
      return sendParcel(*device_, *fifo_, to, kTag, 0, data, bytes);
    if (device_) { // the backend's memory: through a host buffer
      staging_.resize(bytes);
      device_->copyToHost(staging_.data(), data, bytes);
      data = staging_.data();
    }
    return fifo_->send(to, kTag, 0, data, bytes);
  }
  llvm::Error recv(int from, void *data, size_t bytes) override {
    if (!device_)
      return fifo_->recv(from, kTag, 0, data, bytes);
    if (parcels_) {
      Backend::Parcel p;
      if (auto e = fifo_->recv(from, kTag, 0, &p, sizeof p))
        return e;
      return unpack(data, bytes, p);
    }
    staging_.resize(bytes);
    if (auto e = fifo_->recv(from, kTag, 0, staging_.data(), bytes))
      return e;
    device_->copyToDevice(data, staging_.data(), bytes);
    return llvm::Error::success();
  }
  bool ready(int from, size_t) override { return fifo_->poll(from, kTag, 0); }
  void abort(const std::string &why) override { fifo_->abort(why); }
  void setTimeout(double seconds) override { fifo_->setTimeout(seconds); }

  void bindBackend(Backend &b) override {
    bound_ = true;
    device_ = hostMemory(b) ? nullptr : &b;
    parcels_ = device_ && oneProcess_ && b.parcels() && parcelsEnabled();
  }
  bool direct(int) const override { return bound_; }
  llvm::Expected<uint64_t> hold(int from, size_t bytes) override {
    // A parcel's descriptor, or the bytes.
    std::vector<uint8_t> held(parcels_ ? sizeof(Backend::Parcel) : bytes);
    if (auto e = fifo_->recv(from, kTag, 0, held.data(), held.size()))
      return std::move(e);
    held_.emplace(++lastHeld_, std::move(held));
    return lastHeld_;
  }
  llvm::Error take(uint64_t id, void *data, size_t bytes) override {
    auto it = held_.find(id);
    if (it == held_.end())
      return fail("no such held message"); // a ChannelComm bug
    std::vector<uint8_t> held = std::move(it->second);
    held_.erase(it);
    if (parcels_) {
      Backend::Parcel p;
      std::memcpy(&p, held.data(), sizeof p);
      return unpack(data, bytes, p);
    }
    if (held.size() != bytes)
      return fail("a held message of another size"); // a ChannelComm bug
    if (device_)
      device_->copyToDevice(data, held.data(), bytes);
    else if (bytes)
      std::memcpy(data, held.data(), bytes);
    return llvm::Error::success();
  }

private:
  llvm::Error unpack(void *data, size_t bytes, const Backend::Parcel &p) {
    return unpackParcel(*device_, p, data, bytes, [&](size_t sent) {
      return llvm::formatv("a {0}-byte message taken as {1} bytes", sent,
                           bytes)
          .str();
    });
  }

  static constexpr int64_t kTag = 0;
  std::unique_ptr<Comm> fifo_;
  bool oneProcess_; // both ends of every channel in this process
  bool bound_ = false;
  Backend *device_ = nullptr; // bound to a backend whose memory is not the host's
  bool parcels_ = false;      // ... and whose parcels this process shares
  std::vector<uint8_t> staging_;
  std::map<uint64_t, std::vector<uint8_t>> held_;
  uint64_t lastHeld_ = 0;
};

struct Key {
  int64_t tag;
  int microbatch;
  bool operator<(const Key &o) const {
    return std::tie(tag, microbatch) < std::tie(o.tag, o.microbatch);
  }
  bool operator==(const Key &o) const {
    return tag == o.tag && microbatch == o.microbatch;
  }
};

// A message taken off a channel before the receiver asks for it: its
// bytes in host memory, or, on a direct channel, the transport's hold.
struct Held {
  std::vector<uint8_t> bytes;
  uint64_t hold = 0;
  size_t size = 0;
};

// What one peer sends this stage in one step, in order, and where the
// receiving end stands in it.
struct Inbound {
  std::vector<PairMessage> order;
  std::set<int64_t> tags;
  size_t next = 0; // the position of the next message on the channel
  std::map<Key, std::deque<Held>> staged;
};

// The control comm is the forwarded one: everything but the plan's
// messages on channels goes there.
class ChannelComm final : public ForwardingComm {
public:
  ChannelComm(const Plan &plan, int stage,
              std::unique_ptr<ChannelTransport> transport,
              std::unique_ptr<Comm> control)
      : ForwardingComm(std::move(control)), stage_(stage),
        transport_(std::move(transport)) {
    RankPairOrder o = rankPairOrder(plan, Channel::StagePair, false);
    int n = o.ranks;
    for (int from = 0; from < n; ++from) {
      const auto &sends = o.sends[size_t(from) * n + stage];
      if (sends.empty())
        continue;
      Inbound &in = inbound_[from];
      in.order = sends;
      for (const PairMessage &m : sends)
        in.tags.insert(m.tag);
    }
    for (int to = 0; to < n; ++to)
      for (const PairMessage &m : o.sends[size_t(stage) * n + to])
        outboundTags_[to].insert(m.tag);
  }

  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override {
    auto it = outboundTags_.find(peer);
    if (it == outboundTags_.end() || !it->second.count(tag))
      return inner_->send(peer, tag, microbatch, data, bytes);
    return transport_->send(peer, data, bytes);
  }

  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override {
    Inbound *in = channel(peer, tag);
    if (!in)
      return inner_->recv(peer, tag, microbatch, data, bytes);
    Key want{tag, microbatch};
    for (;;) {
      auto st = in->staged.find(want);
      if (st != in->staged.end() && !st->second.empty()) {
        Held held = std::move(st->second.front());
        st->second.pop_front();
        if (held.size != bytes)
          return fail(sizeMismatch(peer, tag, microbatch, held.size, bytes));
        if (transport_->direct(peer))
          return transport_->take(held.hold, data, bytes);
        if (bytes)
          std::memcpy(data, held.bytes.data(), bytes);
        return llvm::Error::success();
      }
      const PairMessage &m = in->order[in->next];
      Key next{m.tag, m.microbatch};
      if (next == want) {
        if (size_t(m.bytes) != bytes)
          return fail(sizeMismatch(peer, tag, microbatch, size_t(m.bytes),
                                   bytes));
        if (auto e = transport_->recv(peer, data, bytes))
          return e;
        advance(*in);
        return llvm::Error::success();
      }
      if (auto e = holdNext(*in, peer))
        return e;
    }
  }

  bool poll(int peer, int64_t tag, int microbatch) override {
    Inbound *in = channel(peer, tag);
    if (!in)
      return inner_->poll(peer, tag, microbatch);
    Key want{tag, microbatch};
    for (;;) {
      auto st = in->staged.find(want);
      if (st != in->staged.end() && !st->second.empty())
        return true;
      if (inner_->aborted())
        return true; // recv fails at once
      const PairMessage &m = in->order[in->next];
      if (!transport_->ready(peer, size_t(m.bytes)))
        return false;
      if (Key{m.tag, m.microbatch} == want)
        return true;
      if (auto e = holdNext(*in, peer)) {
        llvm::consumeError(std::move(e));
        return true; // recv will fail and say why
      }
    }
  }

  void abort(const std::string &why) override {
    inner_->abort(why);
    transport_->abort(why);
  }
  void setTimeout(double seconds) override {
    inner_->setTimeout(seconds);
    transport_->setTimeout(seconds);
  }
  void bindBackend(Backend &b) override { transport_->bindBackend(b); }
  bool direct(int peer, int64_t tag, bool send) const override {
    if (send) {
      auto it = outboundTags_.find(peer);
      if (it == outboundTags_.end() || !it->second.count(tag))
        return false;
    } else {
      auto it = inbound_.find(peer);
      if (it == inbound_.end() || !it->second.tags.count(tag))
        return false;
    }
    return transport_->direct(peer);
  }

private:
  // The channel from `peer` when the plan sends `tag` over it.
  Inbound *channel(int peer, int64_t tag) {
    auto it = inbound_.find(peer);
    if (it == inbound_.end() || !it->second.tags.count(tag))
      return nullptr;
    return &it->second;
  }
  // Takes the channel's next message, an earlier one of the sender's order
  // than the one asked for, into a staging buffer until it is asked for.
  llvm::Error holdNext(Inbound &in, int peer) {
    const PairMessage &m = in.order[in.next];
    Held held;
    held.size = size_t(m.bytes);
    if (transport_->direct(peer)) {
      auto h = transport_->hold(peer, held.size);
      if (!h)
        return h.takeError();
      held.hold = *h;
    } else {
      held.bytes.resize(held.size);
      if (auto e = transport_->recv(peer, held.bytes.data(), held.size))
        return e;
    }
    in.staged[Key{m.tag, m.microbatch}].push_back(std::move(held));
    advance(in);
    return llvm::Error::success();
  }
  // One step's order repeats every step.
  static void advance(Inbound &in) { in.next = (in.next + 1) % in.order.size(); }

  std::string sizeMismatch(int peer, int64_t tag, int mb, size_t sent,
                           size_t asked) const {
    return llvm::formatv("stage {0} receives {1} bytes from stage {2} (tag "
                         "{3}, microbatch {4}), which the plan sends as {5}",
                         stage_, asked, peer, tag, mb, sent)
        .str();
  }

  int stage_;
  std::unique_ptr<ChannelTransport> transport_;
  std::map<int, Inbound> inbound_;
  std::map<int, std::set<int64_t>> outboundTags_;
};

} // namespace

llvm::Expected<uint64_t> ChannelTransport::hold(int, size_t) {
  return fail("this channel transport carries no message directly");
}

llvm::Error ChannelTransport::take(uint64_t, void *, size_t) {
  return fail("this channel transport carries no message directly");
}

std::unique_ptr<ChannelTransport>
createHostChannelTransport(std::unique_ptr<Comm> fifo, bool oneProcess) {
  return std::make_unique<HostChannelTransport>(std::move(fifo), oneProcess);
}

std::unique_ptr<Comm> createChannelComm(const Plan &plan, int stage,
                                        std::unique_ptr<ChannelTransport> transport,
                                        std::unique_ptr<Comm> control) {
  return std::make_unique<ChannelComm>(plan, stage, std::move(transport),
                                       std::move(control));
}

} // namespace cleave::runtime
