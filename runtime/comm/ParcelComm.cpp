// Parcels between stages of one process (runtime/comm/ParcelComm.h).
#include "runtime/comm/ParcelComm.h"

#include "runtime/Kernel.h"

#include "llvm/Support/FormatVariadic.h"

#include <map>
#include <set>

namespace cleave::runtime {
namespace {

class ParcelComm final : public Comm {
public:
  ParcelComm(const Plan &plan, int stage, std::unique_ptr<Comm> inner)
      : stage_(stage), inner_(std::move(inner)) {
    for (const auto &program : plan.stages.at(size_t(stage)).programs)
      for (const Instr &in : program) {
        if (in.kind == InstrKind::Send)
          sendTags_[in.peer].insert(in.tag);
        else if (in.kind == InstrKind::Recv)
          recvTags_[in.peer].insert(in.tag);
      }
  }
  ~ParcelComm() override {
    // A run that failed may leave parcels unsent or untaken: they stay
    // their owners', freed with them.
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  void bindBackend(Backend &b) override {
    if (b.parcels())
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
    auto parcel = backend_->pack(data, bytes);
    if (!parcel)
      return parcel.takeError();
    Backend::Parcel p = *parcel;
    return inner_->send(peer, tag, microbatch, &p, sizeof p);
  }
  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override {
    if (!direct(peer, tag, false))
      return inner_->recv(peer, tag, microbatch, data, bytes);
    Backend::Parcel p;
    if (auto e = inner_->recv(peer, tag, microbatch, &p, sizeof p))
      return e;
    if (p.bytes != bytes) {
      p.owner->takeBack(p.token, nullptr);
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("stage {0} receives {1} bytes from stage {2} (tag "
                        "{3}, microbatch {4}), which it sent as {5}",
                        stage_, bytes, peer, tag, microbatch, p.bytes));
    }
    return backend_->unpack(data, p);
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

private:
  int stage_;
  std::unique_ptr<Comm> inner_;
  Backend *backend_ = nullptr;
  std::map<int, std::set<int64_t>> sendTags_, recvTags_; // by peer
};

} // namespace

std::unique_ptr<Comm> createParcelComm(const Plan &plan, int stage,
                                       std::unique_ptr<Comm> inner) {
  return std::make_unique<ParcelComm>(plan, stage, std::move(inner));
}

} // namespace cleave::runtime
