// A Comm (runtime/Comm.h) over MPI: one process per pipeline stage, rank =
// stage (the MPI_COMM_WORLD rank with one replica; see split() below). Built only when CMake finds MPI
// (CLEAVE_HAVE_MPI); cleave-run uses it when started by mpirun.
//
// split() makes sub-communicators of the world (MPI_Comm_split): with D
// data-parallel replicas, cleave-run gives each replica its pipeline group
// (ranks = stages) and each stage its data-parallel group (ranks = replicas).
// A sub-communicator has its own pipeline and driver communicators, so its
// messages never match the world's or another group's; rank() and size() are
// within it; it does not finalize MPI, and must be destroyed before the world
// one.
//
//  - send() never blocks: it copies the bytes and posts an MPI_Isend; the
//    copies and requests stay alive in a list, reaped with MPI_Test on later
//    calls, at barrier() and at destruction.
//  - (tag, microbatch) maps to the MPI tag tag * (M + 1) + (microbatch + 1),
//    M the plan's microbatches (setMicrobatches); a tag over MPI_TAG_UB is an
//    error. MPI delivers messages with the same (source, tag) in order, which
//    is the FIFO order the Comm interface promises.
//  - recv() posts an MPI_Irecv and polls it with MPI_Test and a short sleep,
//    so abort() and the timeout can interrupt it; a message whose size is not
//    the buffer's is an error.
//  - abort() cannot wake the other processes: it calls MPI_Abort, which ends
//    every rank. The caller prints its one-line error before.
//
// Pipeline traffic runs on a duplicate of MPI_COMM_WORLD; the driver's
// collectives below (losses, statistics, --save, --profile, checkpoints,
// --trace) run on another, so they never match a pipeline message; they are
// point-to-point messages through rank 0, polled like recv(), so the timeout
// bounds them too and names the rank that did not arrive. Every
// call is made from the thread that called initMpi (MPI_THREAD_FUNNELED).
#pragma once

#include "runtime/comm/Comm.h"
#include "runtime/comm/Driver.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime {

class MpiComm : public Comm, public Driver {
public:
  // Waits for pending sends, frees the communicators, then (the world one
  // only) MPI_Finalize.
  ~MpiComm() override;
  MpiComm(const MpiComm &) = delete;
  MpiComm &operator=(const MpiComm &) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  llvm::Error send(int peer, int64_t tag, int microbatch, const void *data,
                   size_t bytes) override;
  llvm::Error recv(int peer, int64_t tag, int microbatch, void *data,
                   size_t bytes) override;
  // Ends every process of the job (MPI_Abort with error code 1).
  void abort(const std::string &why) override;
  // Whether this rank is the first of the job to fail, and so the one to
  // print its error before abort(): ranks failing at once (the same bad
  // sample on every replica) then give one line. An atomic counter on world
  // rank 0 (MPI one-sided); true where the world comm has none (a sub-comm,
  // or an MPI without MPI_Win_allocate).
  bool firstToFail();
  bool aborted() const override { return aborted_; }
  llvm::Error barrier() override;
  void setTimeout(double seconds) override { timeout_ = seconds; }
  double timeout() const override { return timeout_; }
  // MPI_Iprobe for the message (a tag the mapping refuses polls true, so
  // the recv reports it).
  bool poll(int peer, int64_t tag, int microbatch) override;

  // The plan's microbatch count, which the tag mapping needs; must be set
  // before the first send or recv.
  void setMicrobatches(int m) { microbatches_ = m; }

  // Driver collectives (every rank calls them, in the same order):
  // every rank's `mine` (all the same length) concatenated in rank order,
  // on every rank.
  llvm::Expected<std::vector<double>> allGather(const std::vector<double> &mine);
  // A sub-communicator of this one (MPI_Comm_split): the ranks passing the
  // same `color` form one group, ordered by `key` (then by rank here). A
  // collective: every rank of this group calls it, in the same order. The
  // sub-communicator's microbatch count starts as this one's.
  llvm::Expected<std::unique_ptr<MpiComm>> split(int color, int key);
  // Every rank's bytes, in rank order, on rank 0; empty on the others.
  llvm::Expected<std::vector<std::vector<uint8_t>>>
  gatherToRoot(const std::vector<uint8_t> &mine) override;
  // The first rank to fail prints `e` with the reporter (setReporter), the
  // others print nothing; then abort() ends the job. Never returns.
  llvm::Error failAlone(llvm::Error e) override;
  // How failAlone prints its one line (default: the message on stderr).
  void setReporter(std::function<void(const std::string &)> report) {
    report_ = std::move(report);
  }
  // How the collectives' errors name a rank (default "rank N"; cleave-run:
  // the stage, and the replica where there are several).
  void setRankNames(std::function<std::string(int)> names) {
    rankNames_ = std::move(names);
  }

private:
  friend llvm::Expected<std::unique_ptr<MpiComm>> initMpi(int &argc,
                                                          char **&argv);
  MpiComm();
  llvm::Expected<int> mpiTag(int64_t tag, int microbatch, int peer,
                             const char *verb) const;
  void reapSends(bool wait);
  std::string what(const char *verb, int peer, int64_t tag, int mb) const;
  std::string rankName(int rank) const;
  // Polls the MPI_Requests (`requests` point to them) until all complete;
  // past the timeout, a CommTimeout naming the peers (by request) still
  // open.
  llvm::Error waitAll(std::vector<void *> &requests,
                      const std::vector<int> &peers, const char *what);

  struct Impl; // the MPI handles (MpiComm.cpp), so mpi.h stays private
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
  int microbatches_ = 0;
  int64_t tagUb_ = 0;
  double timeout_ = 0;
  bool aborted_ = false;
  bool world_ = false; // finalizes MPI when destroyed
  std::function<void(const std::string &)> report_;
  std::function<std::string(int)> rankNames_;
};

// MPI_Init_thread (MPI_THREAD_FUNNELED) and the group of MPI_COMM_WORLD.
// The returned object finalizes MPI when destroyed.
llvm::Expected<std::unique_ptr<MpiComm>> initMpi(int &argc, char **&argv);

} // namespace cleave::runtime
