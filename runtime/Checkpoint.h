// Checkpoints (cleave-run --checkpoint-dir, --resume): every State slot of
// every stage (parameters, buffers, optimizer state) after a step, in one
// file DIR/checkpoint.bin written atomically (a temp file, then rename),
// streamed stage by stage (CheckpointWriter; rank 0 holds at most one
// stage of another process's state, and one slot of its own, at a time).
//
// A checkpoint proves itself: it names the plan it belongs to, and every
// byte of it is covered by a checksum, so a resume refuses a file that is
// cut short, edited, of another plan or of another optimizer, with one line,
// before any value is loaded. The format (little-endian; str = u32 length,
// then the bytes; FNV-1a 64 is runtime::fnv1a64):
//
//   "CLEAVECKPT3\n"
//   u64 header length H, then the H header bytes:
//     u32 format version (3), u64 plan identity (checkpointPlanIdentity),
//     u32 stage count, u64 entry count, u64 steps done, u64 body length,
//     str model name, str optimizer,
//     str lr schedule (LrSchedule::str(); empty: none)
//   u64 FNV-1a of everything before it (magic, H, header)
//   the body: per entry, in stage order, then in the stage's slot order:
//     u32 stage, str name, str element type (f32, i64, ...), u32 rank,
//     i64 dims[rank], u64 byte count, the bytes,
//     u64 FNV-1a of the entry's bytes before it
//
// The file is exactly that long. Its entries are exactly the plan's State
// slots, each once, in that order, with the plan's type and shape: a missing
// entry would otherwise leave a slot at its initial value.
//
// Resharding: a checkpoint written by another plan of the same model and
// optimizer (another stage count, split, schedule, replicas) is read by
// name instead: its entries' names (a tied weight's replicas and
// optimizer.lr appear once per stage holding them, with one value) must be
// exactly the plan's State slots' names with their types and shapes, and
// every slot of every stage takes its name's bytes. Since every plan of a
// model trains the same bits, the resumed run continues as the new plan
// would have run from the start (with the same microbatches x replicas).
//
// CLEAVECKPT1 files (an older cleave, without identity or full coverage)
// are refused. CLEAVECKPT2 files (format 2: no lr schedule, and every sum
// from FNV-1a's offset basis with its last digit dropped,
// support::kFnv1a64BasisCleave2) are still read.
//
// The sums detect damage (a cut, a flipped byte), not edits: anyone can
// recompute them. So a resume also refuses values no run writes: a NaN or
// an infinity in a parameter or in optimizer state (the moments, the step
// count), which the training guard would otherwise meet only as NaN
// weights after the next update. Model buffers may hold infinities (masks).
//
// The threaded run and the MPI run (whose rank 0 gathers replica 0's stages)
// write and read the same file, so either can resume the other's checkpoint.
#pragma once

#include "runtime/Executor.h"
#include "runtime/Plan.h"
#include "support/Checksum.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>

#include <optional>
#include <string>
#include <vector>

namespace cleave::runtime {

inline constexpr uint32_t kCheckpointVersion = 3;

// FNV-1a 64 of the plan's model name, stage count, optimizer and, per
// stage, each State slot's name, element type and shape: what must match
// for a checkpoint's values to mean the same thing in this plan. The
// schedule, microbatches and data parallelism may differ.
// `basis`: FNV-1a's offset basis (format 2 files used another).
uint64_t checkpointPlanIdentity(const Plan &plan,
                                uint64_t basis = support::kFnv1a64Basis);

// One stage's entries (its State slots, in slot order, read from `ex`)
// appended to `body`; returns how many.
llvm::Expected<uint64_t> appendCheckpointEntries(std::string &body,
                                                 const StagePlan &sp,
                                                 StageExecutor &ex);

// A checkpoint written stage by stage, never whole in memory: the header
// (whose entry count and body length follow from the plan's State slots)
// goes first into a temp file in DIR, then each stage's entries in stage
// order (appendStage, at most one slot's bytes in memory at a time, or a
// stage's entries as appendCheckpointEntries made them), then commit()
// checks that exactly the plan's entries came and renames the file into
// place. Destroyed without commit(), it removes its temp file.
class CheckpointWriter {
public:
  static llvm::Expected<std::unique_ptr<CheckpointWriter>>
  open(const std::string &dir, const Plan &plan, int64_t stepsDone,
       llvm::StringRef lrSchedule = "");
  ~CheckpointWriter();
  // The stage's State slots, read one at a time from `ex`.
  llvm::Error appendStage(const StagePlan &sp, StageExecutor &ex);
  // Entries made elsewhere (appendCheckpointEntries on another process).
  llvm::Error appendEntries(llvm::StringRef entries, uint64_t count);
  llvm::Error commit();

private:
  CheckpointWriter() = default;
  llvm::Error put(llvm::StringRef bytes);
  std::string path_, tmp_;
  std::unique_ptr<llvm::raw_fd_ostream> os_;
  uint64_t wantEntries_ = 0, wantBytes_ = 0, entries_ = 0, bytes_ = 0;
};

// The header for `plan`, then the entries (`body`, `entries` of them),
// written to DIR/checkpoint.bin atomically; creates DIR, and removes the
// temp files of writers killed before their rename.
llvm::Error writeCheckpointFile(const std::string &dir, const Plan &plan,
                                int64_t stepsDone, uint64_t entries,
                                llvm::StringRef body,
                                llvm::StringRef lrSchedule = "");

// Reads DIR/checkpoint.bin and checks all of it against `plan` (see above);
// only then hands each entry of a stage `wanted` says yes to, to `apply`,
// which returns the message of an entry it cannot take (reported prefixed
// with the path). Returns the steps the checkpoint had done; `lrSchedule`,
// when given, gets the stored schedule text (empty: none, or format 2).
llvm::Expected<int64_t> readCheckpointFile(
    const std::string &dir, const Plan &plan,
    llvm::function_ref<bool(uint32_t stage)> wanted,
    llvm::function_ref<std::optional<std::string>(
        uint32_t stage, const std::string &name,
        const std::vector<uint8_t> &bytes)>
        apply,
    std::string *lrSchedule = nullptr);

} // namespace cleave::runtime
