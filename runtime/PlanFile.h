// The .cplan file: a Plan written to disk and read back, and its text form.
//
// A .cplan is self-contained: a short preamble (magic, format version, header
// length), a protobuf header (runtime/plan.proto) holding everything in the
// Plan but the parameter bytes, then the blobs back to back, each 64-byte
// aligned and checksummed. Blobs live outside protobuf, so a plan has no
// 2 GiB limit, and a rank can read just its own stage's blobs. The layout is
// in docs/design/plan.md.
//
// Reading never trusts the file: a wrong magic or version, a truncated file,
// a corrupt header or blob each give one clear error line naming the file
// (and the slot, for a blob), never a crash.
#pragma once

#include "runtime/Plan.h"
#include "support/Errors.h"
#include "support/TrustedPaths.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <string>

namespace cleave::runtime {

// "invalid plan: <msg>", the one prefix of every error the loader and the
// verifier find in a plan's contents.
inline llvm::Error invalidPlan(const llvm::Twine &msg) {
  return fail("invalid plan: " + msg);
}

// The format version this build writes and reads (the preamble's u32).
inline constexpr uint32_t kPlanFileVersion = 3;

// Checks a Plan's internal consistency: indices in range, op names and
// attributes valid for their ops, slot sizes matching dtype and shape, frame
// offsets inside their frames, blob sizes matching their slots. The error
// says "invalid plan: ..." and names the stage, slot or instruction
// (PlanVerifier.cpp).
llvm::Error verifyPlan(const Plan &plan);
// What a plan that passed verifyPlan must also hold to run (cleave-run
// checks it before the first step, cleavec after codegen): memory bounded
// by the file (every state and constant from a blob, frames no larger
// than their slots need) and a schedule that completes (one STEP per
// stage; every receive's message sent, sizes equal, no stage waiting
// forever; every message taken). The kernels' attributes and slot types
// are checked against the op table by codegen::checkPlanKernels.
llvm::Error verifyRunnable(const Plan &plan);
// The same, with blob sizes given separately (the reader checks a header
// before, or without, loading the blobs): blobSizes[i] stands for
// plan.blobs[i].bytes.size().
llvm::Error verifyPlan(const Plan &plan, llvm::ArrayRef<uint64_t> blobSizes);

// Writes `plan` to `path` atomically: to `path.tmp-<pid>` first, then a
// rename. On failure no file is left at either name. Blob checksums are
// computed from the bytes (Blob::checksum is not trusted).
llvm::Error writePlanFile(const Plan &plan, const std::string &path);

// Reads a plan. With `onlyStage`, loads only the blobs that stage's slots
// use; the other blobs keep their checksum and have no bytes.
// Weight files the loaded blobs read are resolved from the plan's folder
// and must lie inside it or in a folder of `trusted`
// (support/TrustedPaths.h); their paths in the result are the resolved ones.
llvm::Expected<Plan>
readPlanFile(const std::string &path,
             std::optional<int> onlyStage = std::nullopt,
             const support::TrustedFolders &trusted = {});
// The same loading the blobs of every stage rank `rank` runs
// (Plan::stageRank; stage `rank` where the plan places none).
llvm::Expected<Plan>
readPlanFileForRank(const std::string &path, int rank,
                    const support::TrustedFolders &trusted = {});
llvm::Expected<Plan> readPlanFile(const std::string &path,
                                  std::optional<int> only, bool byRank,
                                  const support::TrustedFolders &trusted);

// A digest of the plan file's preamble and header: everything the plan
// says, blobs included through their checksums. Ranks under mpirun compare
// theirs before the first step.
llvm::Expected<uint64_t> planHeaderDigest(const std::string &path);

// For --save: resolves plan.sourceModel (read from the plan at `planPath`)
// under the same rule and checks that the file there is the one compiled
// (size and SHA-256). On success plan.sourceModel is the resolved path.
llvm::Error resolveSourceModel(Plan &plan, const std::string &planPath,
                               const support::TrustedFolders &trusted);

// A readable, deterministic text form (cleave-run --print-plan);
// PlanPrinter.cpp.
void printPlan(const Plan &plan, llvm::raw_ostream &os);

} // namespace cleave::runtime
