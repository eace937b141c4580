// The MPI Comm (runtime/MpiComm.h): non-blocking sends of private copies,
// receives by polling a matched probe (MPI_Improbe) so a wrong-sized message
// is reported with both sizes and a timeout can interrupt the wait, and the
// few collectives cleave-run needs to report one pipeline from rank 0.
#include "runtime/comm/MpiComm.h"

#include "support/Errors.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

// The C API only (no MPI C++ bindings, which need another library).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <list>
#include <thread>

namespace cleave::runtime {
namespace {

std::string mpiError(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, size_t(len));
}

// Large transfers (--save) go in pieces that fit MPI's int counts.
constexpr size_t kChunk = size_t(1) << 30;

} // namespace

struct MpiComm::Impl {
  struct PendingSend {
    std::vector<uint8_t> bytes;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  MPI_Comm pipe = MPI_COMM_NULL;   // pipeline messages
  MPI_Comm driver = MPI_COMM_NULL; // driver collectives
  MPI_Win failures = MPI_WIN_NULL;   // world only: firstToFail's counter
  int *failureCount = nullptr;       // its memory (rank 0's counts)
  std::list<PendingSend> pending;
};

MpiComm::MpiComm() : impl_(std::make_unique<Impl>()) {}

MpiComm::~MpiComm() {
  reapSends(/*wait=*/true);
  if (impl_->failures != MPI_WIN_NULL)
    MPI_Win_free(&impl_->failures); // a collective, as the frees below
  if (impl_->pipe != MPI_COMM_NULL)
    MPI_Comm_free(&impl_->pipe);
  if (impl_->driver != MPI_COMM_NULL)
    MPI_Comm_free(&impl_->driver);
  if (world_)
    MPI_Finalize();
}

void MpiComm::reapSends(bool wait) {
  for (auto it = impl_->pending.begin(); it != impl_->pending.end();) {
    int done = 1;
    if (wait)
      MPI_Wait(&it->request, MPI_STATUS_IGNORE);
    else
      MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? impl_->pending.erase(it) : std::next(it);
  }
}

std::string MpiComm::what(const char *verb, int peer, int64_t tag,
                          int mb) const {
  return llvm::formatv("{0} rank {1} on rank {2} (tag {3}, microbatch {4})",
                       verb, peer, rank_, tag, mb)
      .str();
}

llvm::Expected<int> MpiComm::mpiTag(int64_t tag, int microbatch, int peer,
                                    const char *verb) const {
  // A process may message itself: two stages it runs (StageComm.h).
  if (peer < 0 || peer >= size_)
    return fail(llvm::formatv("{0} rank {1} on rank {2}: no such peer (group "
                              "of {3})",
                              verb, peer, rank_, size_));
  if (microbatch < -1 || microbatch >= microbatches_)
    return fail(what(verb, peer, tag, microbatch) +
                llvm::formatv(": the microbatch is outside -1..{0}",
                              microbatches_ - 1)
                    .str());
  int64_t m = int64_t(microbatches_) + 1;
  if (tag < 0 || tag > (tagUb_ - microbatch - 1) / m)
    return fail(what(verb, peer, tag, microbatch) +
                llvm::formatv(": the MPI tag would exceed MPI_TAG_UB ({0})",
                              tagUb_)
                    .str());
  return int(tag * m + microbatch + 1);
}

llvm::Error MpiComm::send(int peer, int64_t tag, int microbatch,
                          const void *data, size_t bytes) {
  if (aborted_)
    return fail(what("send to", peer, tag, microbatch) + ": aborted");
  auto t = mpiTag(tag, microbatch, peer, "send to");
  if (!t)
    return t.takeError();
  if (bytes > size_t(INT_MAX))
    return fail(what("send to", peer, tag, microbatch) +
                llvm::formatv(": {0} bytes is over MPI's limit of {1} per "
                              "message",
                              bytes, INT_MAX)
                    .str());
  reapSends(/*wait=*/false);
  impl_->pending.emplace_back();
  Impl::PendingSend &p = impl_->pending.back();
  p.bytes.resize(bytes);
  if (bytes)
    std::memcpy(p.bytes.data(), data, bytes);
  int rc = MPI_Isend(p.bytes.data(), int(bytes), MPI_BYTE, peer, *t,
                     impl_->pipe, &p.request);
  if (rc != MPI_SUCCESS) {
    impl_->pending.pop_back();
    return fail(what("send to", peer, tag, microbatch) + ": " + mpiError(rc));
  }
  return llvm::Error::success();
}

bool MpiComm::poll(int peer, int64_t tag, int microbatch) {
  if (aborted_)
    return true;
  auto t = mpiTag(tag, microbatch, peer, "recv from");
  if (!t) {
    llvm::consumeError(t.takeError());
    return true;
  }
  reapSends(/*wait=*/false);
  int found = 0;
  MPI_Status status;
  if (MPI_Iprobe(peer, *t, impl_->pipe, &found, &status) != MPI_SUCCESS)
    return true;
  return found != 0;
}

llvm::Error MpiComm::recv(int peer, int64_t tag, int microbatch, void *data,
                          size_t bytes) {
  if (aborted_)
    return fail(what("recv from", peer, tag, microbatch) + ": aborted");
  auto t = mpiTag(tag, microbatch, peer, "recv from");
  if (!t)
    return t.takeError();
  auto start = std::chrono::steady_clock::now();
  MPI_Message msg = MPI_MESSAGE_NULL;
  MPI_Status status;
  for (int polls = 0;; ++polls) {
    int found = 0;
    int rc = MPI_Improbe(peer, *t, impl_->pipe, &found, &msg, &status);
    if (rc != MPI_SUCCESS)
      return fail(what("recv from", peer, tag, microbatch) + ": " +
                  mpiError(rc));
    if (found)
      break;
    reapSends(/*wait=*/false);
    if (aborted_)
      return fail(what("recv from", peer, tag, microbatch) + ": aborted");
    if (timeout_ > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                .count() > timeout_)
      return llvm::make_error<CommTimeout>(
          llvm::formatv("rank {0}: no message from rank {1} (tag {2}, "
                        "microbatch {3}) {4}",
                        rank_, peer, tag, microbatch, withinTimeout(timeout_))
              .str(),
          timeout_);
    // Spin briefly (the peer is usually close behind), then sleep a little.
    if (polls > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  if (size_t(count) != bytes) {
    std::vector<uint8_t> scratch(size_t(std::max(count, 0)));
    MPI_Mrecv(scratch.data(), count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
    return fail(what("recv from", peer, tag, microbatch) +
                llvm::formatv(": the message has {0} bytes, the buffer {1}",
                              count, bytes)
                    .str());
  }
  int rc = MPI_Mrecv(data, count, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS)
    return fail(what("recv from", peer, tag, microbatch) + ": " +
                mpiError(rc));
  return llvm::Error::success();
}

void MpiComm::abort(const std::string &) {
  aborted_ = true;
  MPI_Abort(MPI_COMM_WORLD, 1);
}

bool MpiComm::firstToFail() {
  if (impl_->failures == MPI_WIN_NULL)
    return true;
  int one = 1, before = 0;
  if (MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, impl_->failures) != MPI_SUCCESS)
    return true;
  int rc = MPI_Fetch_and_op(&one, &before, MPI_INT, 0, 0, MPI_SUM,
                            impl_->failures);
  MPI_Win_unlock(0, impl_->failures);
  return rc != MPI_SUCCESS || before == 0;
}

llvm::Error MpiComm::barrier() {
  if (aborted_)
    return fail(llvm::formatv("barrier on rank {0}: aborted", rank_));
  MPI_Request req;
  int rc = MPI_Ibarrier(impl_->pipe, &req);
  if (rc != MPI_SUCCESS)
    return fail(llvm::formatv("barrier on rank {0}: {1}", rank_, mpiError(rc)));
  auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done)
      break;
    reapSends(/*wait=*/false);
    if (timeout_ > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                .count() > timeout_)
      // A barrier cannot be cancelled: the caller is expected to abort.
      return llvm::make_error<CommTimeout>(
          llvm::formatv("barrier on rank {0}: not all {1} ranks arrived {2}",
                        rank_, size_, withinTimeout(timeout_))
              .str(),
          timeout_);
    if (polls > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  reapSends(/*wait=*/false);
  return llvm::Error::success();
}

// The driver's collectives are point-to-point messages through rank 0,
// posted non-blocking and polled, so that a rank that never arrives (stopped,
// stuck in a kernel) ends the wait after the timeout, and rank 0 can say
// which one it was. Tags on the driver communicator: one per direction; the
// ranks call the collectives in the same order, and MPI keeps each (source,
// tag) in order, so a message always meets its own collective.
namespace {
constexpr int kGatherTag = 1, kScatterTag = 2;
} // namespace

std::string MpiComm::rankName(int rank) const {
  return rankNames_ ? rankNames_(rank) : "rank " + std::to_string(rank);
}

llvm::Error MpiComm::waitAll(std::vector<void *> &requests,
                             const std::vector<int> &peers,
                             const char *what) {
  auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    size_t open = 0;
    for (void *&r : requests) {
      MPI_Request *req = static_cast<MPI_Request *>(r);
      if (*req == MPI_REQUEST_NULL)
        continue;
      int done = 0;
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS)
        return fail(llvm::formatv("{0}: {1}: {2}", rankName(rank_), what,
                                  mpiError(rc)));
      open += !done;
    }
    if (!open)
      return llvm::Error::success();
    if (timeout_ > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                .count() > timeout_) {
      std::string missing;
      for (size_t i = 0; i < requests.size(); ++i) {
        MPI_Request *req = static_cast<MPI_Request *>(requests[i]);
        if (*req == MPI_REQUEST_NULL)
          continue;
        if (missing.find(rankName(peers[i])) == std::string::npos)
          missing += (missing.empty() ? "" : ", ") + rankName(peers[i]);
        // The buffers go when the caller returns: nothing may land there.
        MPI_Cancel(req);
        MPI_Request_free(req);
      }
      return llvm::make_error<CommTimeout>(
          llvm::formatv("{0}: no message from {1} ({2}, a collective of the "
                        "run's processes) {3}",
                        rankName(rank_), missing, what,
                        withinTimeout(timeout_))
              .str(),
          timeout_);
    }
    if (polls > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

llvm::Expected<std::vector<double>>
MpiComm::allGather(const std::vector<double> &mine) {
  size_t n = mine.size();
  std::vector<double> all(n * size_t(size_));
  std::copy(mine.begin(), mine.end(), all.begin() + long(n * size_t(rank_)));
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  auto post = [&](bool send, void *buf, size_t count, int peer, int tag) {
    reqs.push_back(MPI_REQUEST_NULL);
    peers.push_back(peer);
    return send ? MPI_Isend(buf, int(count), MPI_DOUBLE, peer, tag,
                            impl_->driver, &reqs.back())
                : MPI_Irecv(buf, int(count), MPI_DOUBLE, peer, tag,
                            impl_->driver, &reqs.back());
  };
  auto wait = [&]() -> llvm::Error {
    std::vector<void *> raw;
    for (MPI_Request &r : reqs)
      raw.push_back(&r);
    llvm::Error e = waitAll(raw, peers, "gathering every rank's figures");
    reqs.clear();
    peers.clear();
    return e;
  };
  int rc = MPI_SUCCESS;
  if (rank_ == 0) {
    for (int r = 1; r < size_ && rc == MPI_SUCCESS; ++r)
      rc = post(false, all.data() + n * size_t(r), n, r, kGatherTag);
    if (rc == MPI_SUCCESS)
      if (auto e = wait())
        return std::move(e);
    for (int r = 1; r < size_ && rc == MPI_SUCCESS; ++r)
      rc = post(true, all.data(), all.size(), r, kScatterTag);
  } else {
    rc = post(true, const_cast<double *>(mine.data()), n, 0, kGatherTag);
    if (rc == MPI_SUCCESS)
      rc = post(false, all.data(), all.size(), 0, kScatterTag);
  }
  if (rc != MPI_SUCCESS)
    return fail(llvm::formatv("{0}: gathering every rank's figures: {1}",
                              rankName(rank_), mpiError(rc)));
  if (auto e = wait())
    return std::move(e);
  return all;
}

llvm::Expected<std::vector<std::vector<uint8_t>>>
MpiComm::gatherToRoot(const std::vector<uint8_t> &mine) {
  const char *what = "gathering every rank's bytes on rank 0";
  std::vector<MPI_Request> reqs;
  std::vector<int> peers;
  auto wait = [&]() -> llvm::Error {
    std::vector<void *> raw;
    for (MPI_Request &r : reqs)
      raw.push_back(&r);
    llvm::Error e = waitAll(raw, peers, what);
    reqs.clear();
    peers.clear();
    return e;
  };
  auto check = [&](int rc) -> llvm::Error {
    if (rc == MPI_SUCCESS)
      return llvm::Error::success();
    return fail(llvm::formatv("{0}: {1}: {2}", rankName(rank_), what,
                              mpiError(rc)));
  };
  std::vector<std::vector<uint8_t>> out;
  if (rank_ != 0) {
    uint64_t n = mine.size();
    reqs.push_back(MPI_REQUEST_NULL);
    peers.push_back(0);
    if (auto e = check(MPI_Isend(&n, 1, MPI_UINT64_T, 0, kGatherTag,
                                 impl_->driver, &reqs.back())))
      return std::move(e);
    // Large transfers (--save) in pieces that fit MPI's int counts, each
    // piece waited for on its own, so the timeout bounds a piece.
    if (auto e = wait())
      return std::move(e);
    for (size_t off = 0; off < mine.size(); off += kChunk) {
      size_t len = std::min(kChunk, mine.size() - off);
      reqs.push_back(MPI_REQUEST_NULL);
      peers.push_back(0);
      if (auto e = check(MPI_Isend(const_cast<uint8_t *>(mine.data()) + off,
                                   int(len), MPI_BYTE, 0, kGatherTag,
                                   impl_->driver, &reqs.back())))
        return std::move(e);
      if (auto e = wait())
        return std::move(e);
    }
    return out;
  }
  std::vector<uint64_t> sizes(size_t(size_), 0);
  for (int r = 1; r < size_; ++r) {
    reqs.push_back(MPI_REQUEST_NULL);
    peers.push_back(r);
    if (auto e = check(MPI_Irecv(&sizes[size_t(r)], 1, MPI_UINT64_T, r,
                                 kGatherTag, impl_->driver, &reqs.back())))
      return std::move(e);
  }
  if (auto e = wait())
    return std::move(e);
  out.resize(size_t(size_));
  out[0] = mine;
  for (int r = 1; r < size_; ++r) {
    out[size_t(r)].resize(sizes[size_t(r)]);
    for (size_t off = 0; off < out[size_t(r)].size(); off += kChunk) {
      size_t len = std::min(kChunk, out[size_t(r)].size() - off);
      reqs.push_back(MPI_REQUEST_NULL);
      peers.push_back(r);
      if (auto e = check(MPI_Irecv(out[size_t(r)].data() + off, int(len),
                                   MPI_BYTE, r, kGatherTag, impl_->driver,
                                   &reqs.back())))
        return std::move(e);
      if (auto e = wait())
        return std::move(e);
    }
  }
  return out;
}

llvm::Expected<std::unique_ptr<MpiComm>> MpiComm::split(int color, int key) {
  std::unique_ptr<MpiComm> c(new MpiComm());
  // The split runs on the driver communicator, where the driver's
  // collectives run in the same order on every rank.
  MPI_Comm sub = MPI_COMM_NULL;
  int rc = MPI_Comm_split(impl_->driver, color, key, &sub);
  if (rc != MPI_SUCCESS)
    return fail(llvm::formatv("rank {0}: MPI_Comm_split: {1}", rank_,
                              mpiError(rc)));
  // The split communicator carries the pipeline messages, a duplicate of it
  // the collectives.
  c->impl_->pipe = sub;
  rc = MPI_Comm_dup(sub, &c->impl_->driver);
  if (rc != MPI_SUCCESS)
    return fail(llvm::formatv("rank {0}: MPI_Comm_dup: {1}", rank_,
                              mpiError(rc)));
  MPI_Comm_set_errhandler(c->impl_->pipe, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(c->impl_->driver, MPI_ERRORS_RETURN);
  MPI_Comm_rank(sub, &c->rank_);
  MPI_Comm_size(sub, &c->size_);
  c->tagUb_ = tagUb_;
  c->microbatches_ = microbatches_;
  c->timeout_ = timeout_;
  c->rankNames_ = nullptr; // the world's names are not the group's
  return std::move(c);
}

llvm::Expected<std::unique_ptr<MpiComm>> initMpi(int &argc, char **&argv) {
  int provided = 0;
  int rc = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS)
    return fail("MPI_Init_thread failed: " + mpiError(rc));
  std::unique_ptr<MpiComm> c(new MpiComm());
  c->world_ = true;
  if (provided < MPI_THREAD_FUNNELED)
    return fail("this MPI does not support MPI_THREAD_FUNNELED");
  MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &c->size_);
  int *ub = nullptr, flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  c->tagUb_ = flag && ub ? *ub : 32767; // the standard's guaranteed minimum
  MPI_Comm_dup(MPI_COMM_WORLD, &c->impl_->pipe);
  MPI_Comm_dup(MPI_COMM_WORLD, &c->impl_->driver);
  // Errors come back as return codes, reported as one line each.
  MPI_Comm_set_errhandler(c->impl_->pipe, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(c->impl_->driver, MPI_ERRORS_RETURN);
  // firstToFail's counter: one int on rank 0, none elsewhere.
  MPI_Aint bytes = c->rank_ == 0 ? MPI_Aint(sizeof(int)) : 0;
  if (MPI_Win_allocate(bytes, sizeof(int), MPI_INFO_NULL, c->impl_->driver,
                       &c->impl_->failureCount,
                       &c->impl_->failures) == MPI_SUCCESS) {
    MPI_Win_set_errhandler(c->impl_->failures, MPI_ERRORS_RETURN);
    if (c->rank_ == 0) {
      MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, c->impl_->failures);
      *c->impl_->failureCount = 0;
      MPI_Win_unlock(0, c->impl_->failures);
    }
    MPI_Barrier(c->impl_->driver); // the counter is 0 before anyone fails
  } else {
    c->impl_->failures = MPI_WIN_NULL;
  }
  return std::move(c);
}

// Where several ranks fail at once (the same bad sample on every replica),
// the first prints and ends the job; the others wait for that, printing
// nothing.
llvm::Error MpiComm::failAlone(llvm::Error e) {
  std::string msg = llvm::toString(std::move(e));
  llvm::outs().flush();
  // firstToFail and MPI_Abort talk to other processes; should one of them
  // be stopped (SIGSTOP) or gone, this process still ends, with its line.
  // MPI is not called from this thread (MPI_THREAD_FUNNELED): it exits
  // without finalizing, which makes mpirun end the job.
  static std::atomic<bool> printed{false};
  std::thread([msg, report = report_] {
    std::this_thread::sleep_for(std::chrono::seconds(15));
    if (!printed.exchange(true)) {
      if (report)
        report(msg);
      else
        llvm::errs() << msg << "\n";
      llvm::errs().flush();
    }
    std::_Exit(1);
  }).detach();
  if (!firstToFail()) {
    printed = true;
    // Aborts anyway should the first one never get there.
    std::this_thread::sleep_for(std::chrono::seconds(10));
  } else if (!printed.exchange(true)) {
    if (report_)
      report_(msg);
    else
      llvm::errs() << msg << "\n";
  }
  llvm::errs().flush();
  abort(msg);
  std::abort(); // not reached: MPI_Abort ends the process
}

} // namespace cleave::runtime
