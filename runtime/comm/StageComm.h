// A stage's view of its process's comm, for a process that runs several
// stages (cleavec --chunks under mpirun): rank() is the stage and size()
// the stage count, and a message to stage t goes to the process running t.
// The tag a message travels with carries its source and destination stage
// too, (tag x S + from) x S + to, so two stages of one process never take
// each other's messages. Everything else goes to the process's comm, which
// must outlive the view.
#pragma once

#include "runtime/comm/Comm.h"

#include <vector>

namespace cleave::runtime {

class StageComm : public Comm {
public:
  // `stageRank[t]`: the rank of `base` running stage t.
  StageComm(Comm &base, int stage, std::vector<int> stageRank)
      : base_(base), stage_(stage), stageRank_(std::move(stageRank)) {}

  int rank() const override { return stage_; }
  int size() const override { return int(stageRank_.size()); }
  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override;
  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override;
  bool poll(int peer, int64_t tag, int microbatch) override;
  void abort(const std::string &why) override { base_.abort(why); }
  bool aborted() const override { return base_.aborted(); }
  // A barrier of the processes (each of them once, not each stage).
  llvm::Error barrier() override { return base_.barrier(); }
  void setTimeout(double seconds) override { base_.setTimeout(seconds); }
  double timeout() const override { return base_.timeout(); }

private:
  llvm::Error noStage(int peer) const;
  int64_t wireTag(int64_t tag, int from, int to) const {
    int64_t s = int64_t(stageRank_.size());
    return (tag * s + from) * s + to;
  }

  Comm &base_;
  int stage_;
  std::vector<int> stageRank_;
};

} // namespace cleave::runtime
