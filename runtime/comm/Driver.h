// The processes of one training run, as its training loop (runtime/Trainer.h)
// sees them: the few collectives it needs to agree on losses, failures and
// outputs. The threaded run is one process holding every stage
// (createSingleProcessDriver); under mpirun each process holds one stage and
// the world MpiComm is the driver (runtime/comm/MpiComm.h).
//
// Every process calls the collectives in the same order. An error that every
// process learns together goes through agree(): the lowest failing rank gets
// its own error back, the others a ReportedElsewhere, so a run prints it once
// and every process exits with it. A failure on one process that the others
// may be blocked on (a step that failed mid-pipeline) goes through
// failAlone() instead.
#pragma once

#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cleave::runtime {

class Driver {
public:
  virtual ~Driver() = default;

  virtual int rank() const = 0; // this process
  virtual int size() const = 0; // the processes of the run

  // Every process's `mine` (all the same length) concatenated in rank
  // order, on every process.
  virtual llvm::Expected<std::vector<double>>
  allGather(const std::vector<double> &mine) = 0;
  // Every process's bytes, in rank order, on rank 0; empty on the others.
  virtual llvm::Expected<std::vector<std::vector<uint8_t>>>
  gatherToRoot(const std::vector<uint8_t> &mine) = 0;
  // A failure of this process alone while the others may wait for it. One
  // process returns `e`; an MPI run prints it (the first rank to fail only)
  // and ends the job, never returning.
  virtual llvm::Error failAlone(llvm::Error e) = 0;
};

// What agree() gives the processes that do not print the error.
class ReportedElsewhere : public llvm::ErrorInfo<ReportedElsewhere> {
public:
  static char ID;
  void log(llvm::raw_ostream &os) const override;
  std::error_code convertToErrorCode() const override;
};

// Every process calls it with its own outcome: success when all succeeded;
// otherwise the lowest failing rank gets `mine` back and every other process
// a ReportedElsewhere.
llvm::Error agree(Driver &driver, llvm::Error mine);

std::unique_ptr<Driver> createSingleProcessDriver();

// Whether an MPI launcher (Open MPI's mpirun, MPICH, any PMIx launcher)
// started this process.
bool launchedByMpirun();

// (name, bytes) records in one byte string, for gatherToRoot.
void putRecord(std::vector<uint8_t> &out, const void *data, uint64_t n);
// putRecord's byte strings, in order (a truncated tail is dropped).
std::vector<std::vector<uint8_t>> splitRecords(const std::vector<uint8_t> &in);

} // namespace cleave::runtime
