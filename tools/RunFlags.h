// cleave-run's flags and what it reads from them (its --help is the
// truth about them): kept apart from the tool so that cleave-run.cpp is
// the drivers and the printing.
#pragma once

#include "runtime/LrSchedule.h"
#include "runtime/Stages.h"
#include "support/TrustedPaths.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/Error.h"

#include <optional>
#include <string>
#include <vector>

namespace cleave::tools {

// What cleave-run parsed, for either driver (threads or MPI).
struct RunOptions {
  std::string planPath;
  int64_t steps = 10, seed = 0, threads = 0;
  std::optional<float> lr;
  // A learning-rate schedule (--warmup-steps, --lr-decay, --min-lr,
  // --decay-steps): peak NaN until --lr or the compiled lr fills it,
  // decaySteps 0 until the run's total steps do.
  std::optional<runtime::LrSchedule> lrSchedule;
  // Validation: --eval-every (0: after the last step only), --eval-batches
  // (0: enough to read the held-out set once).
  int64_t evalEvery = 0, evalBatches = 0;
  bool shuffle = false; // --data-order shuffle (token files)
  bool skipNonFinite = false; // --on-nan=skip-step
  runtime::StageOptions stage;
  int64_t checkpointEvery = 0;
  bool overlapSteps = false; // --overlap-steps
  support::TrustedFolders trusted; // --trust-dir
  // A usage error every MPI rank found: printed once, after MPI starts.
  std::optional<std::string> usageError;
};

std::vector<Flags::Spec> runFlagSpecs();

// Fills `opt` from parsed flags (not planPath); a usage error (exit 2) is
// one line naming the flag.
llvm::Error readRunOptions(const Flags &flags, RunOptions &opt);

// The flags as given that can change what a run computes or writes, one
// "name=value" line each (all but --threads, --quiet and --comm-timeout):
// what MPI ranks compare (runtime::checkRanksAgree).
std::string resultFlagsText(const Flags &flags);

} // namespace cleave::tools
