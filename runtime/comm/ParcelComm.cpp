// Parcels between stages of one process (runtime/comm/ParcelComm.h).
#include "runtime/comm/ParcelComm.h"

#include "runtime/Kernel.h"

#include "llvm/Support/FormatVariadic.h"

#include <cstdlib>
#include <map>
#include <set>

namespace cleave::runtime {
namespace {

class ParcelComm final : public ForwardingComm {
public:
  ParcelComm(const Plan &plan, int stage, std::unique_ptr<Comm> inner)
      : ForwardingComm(std::move(inner)), stage_(stage) {
    for (const auto &program : plan.stages.at(size_t(stage)).programs)
      for (const Instr &in : program) {
        if (in.kind == InstrKind::Send)
          sendTags_[in.peer].insert(in.tag);
        else if (in.kind == InstrKind::Recv)
          recvTags_[in.peer].insert(in.tag);
      }
  }
  // A run that failed may leave parcels unsent or untaken: they stay their
  // owners', freed with them.

  void bindBackend(Backend &b) override {
    if (b.parcels() && parcelsEnabled())
      backend_ = &b;
  }
  bool direct(int peer, int64_t tag, bool send) const override {
    if (!backend_)
      return false;
    const auto &tags = send ? sendTags_ : recvTags_;
    auto it = tags.find(peer);
    return it != tags.end() && it->second.count(tag);
  }

  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override {
    if (!direct(peer, tag, true))
      return inner_->send(peer, tag, microbatch, data, bytes);
    return sendParcel(*backend_, *inner_, peer, tag, microbatch, data, bytes);
  }
  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override {
    if (!direct(peer, tag, false))
      return inner_->recv(peer, tag, microbatch, data, bytes);
    Backend::Parcel p;
    if (auto e = inner_->recv(peer, tag, microbatch, &p, sizeof p))
      return e;
    return unpackParcel(*backend_, p, data, bytes, [&](size_t sent) {
      return llvm::formatv("stage {0} receives {1} bytes from stage {2} (tag "
                           "{3}, microbatch {4}), which it sent as {5}",
                           stage_, bytes, peer, tag, microbatch, sent)
          .str();
    });
  }

private:
  int stage_;
  Backend *backend_ = nullptr;
  std::map<int, std::set<int64_t>> sendTags_, recvTags_; // by peer
};

} // namespace

llvm::Error sendParcel(Backend &sender, Comm &comm, int peer, int64_t tag,
                       int microbatch, const void *data, size_t bytes) {
  auto parcel = sender.pack(data, bytes);
  if (!parcel)
    return parcel.takeError();
  Backend::Parcel p = *parcel;
  return comm.send(peer, tag, microbatch, &p, sizeof p);
}

llvm::Error unpackParcel(Backend &receiver, const Backend::Parcel &parcel,
                         void *data, size_t bytes,
                         llvm::function_ref<std::string(size_t)> mismatch) {
  if (parcel.bytes != bytes) {
    parcel.owner->takeBack(parcel.token, nullptr);
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   mismatch(parcel.bytes));
  }
  return receiver.unpack(data, parcel);
}

bool parcelsEnabled() {
  static const bool on = [] {
    const char *v = std::getenv("CLEAVE_PARCELS");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

std::unique_ptr<Comm> createParcelComm(const Plan &plan, int stage,
                                       std::unique_ptr<Comm> inner) {
  return std::make_unique<ParcelComm>(plan, stage, std::move(inner));
}

} // namespace cleave::runtime
