#include "runtime/comm/StageComm.h"

#include "llvm/Support/FormatVariadic.h"

namespace cleave::runtime {

llvm::Error StageComm::noStage(int peer) const {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv("stage {0}: no stage {1} (the plan has {2})", stage_, peer,
                    stageRank_.size()));
}

llvm::Error StageComm::send(int peer, int64_t tag, int microbatch,
                            const void *data, size_t bytes) {
  if (peer < 0 || peer >= size() || peer == stage_)
    return noStage(peer);
  return base_.send(stageRank_[size_t(peer)], wireTag(tag, stage_, peer),
                    microbatch, data, bytes);
}

llvm::Error StageComm::recv(int peer, int64_t tag, int microbatch, void *data,
                            size_t bytes) {
  if (peer < 0 || peer >= size() || peer == stage_)
    return noStage(peer);
  return base_.recv(stageRank_[size_t(peer)], wireTag(tag, peer, stage_),
                    microbatch, data, bytes);
}

bool StageComm::poll(int peer, int64_t tag, int microbatch) {
  if (peer < 0 || peer >= size() || peer == stage_)
    return true; // recv reports it
  return base_.poll(stageRank_[size_t(peer)], wireTag(tag, peer, stage_),
                    microbatch);
}

} // namespace cleave::runtime
