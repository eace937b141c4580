// Checkpoints (cleave-run --checkpoint-dir, --resume): every State slot of
// every stage (parameters, buffers, optimizer state) after a step, in one
// file DIR/checkpoint.bin written atomically (a temp file, then rename):
//   "CLEAVECKPT1\n", u64 step count, u64 entry count, then per entry:
//   u32 stage, u32 name length, name, u64 byte count, u64 FNV-1a, bytes.
// Entries come in stage order, then in the stage's slot order. The threaded
// run and the MPI run (whose rank 0 gathers replica 0's stages) write and
// read the same file, so either can resume the other's checkpoint.
#pragma once

#include "runtime/Executor.h"
#include "runtime/Plan.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>
#include <vector>

namespace cleave::runtime {

// One stage's entries (its State slots, in slot order, read from `ex`)
// appended to `body`; returns how many.
llvm::Expected<uint64_t> appendCheckpointEntries(std::string &body,
                                                 const StagePlan &sp,
                                                 StageExecutor &ex);

// The header, then the entries (`body`, `entries` of them), written to
// DIR/checkpoint.bin atomically; creates DIR, and removes the temp files of
// writers killed before their rename.
llvm::Error writeCheckpointFile(const std::string &dir, int64_t stepsDone,
                                uint64_t entries, llvm::StringRef body);

// Reads DIR/checkpoint.bin, checking its structure, and hands each entry of
// a stage `wanted` says yes to (checksum verified) to `apply`, which returns
// the message of an entry that does not fit (reported prefixed with the
// path); returns the steps the checkpoint had done. The other entries are
// skipped unchecked.
llvm::Expected<int64_t> readCheckpointFile(
    const std::string &dir, llvm::function_ref<bool(uint32_t stage)> wanted,
    llvm::function_ref<std::optional<std::string>(
        uint32_t stage, const std::string &name,
        const std::vector<uint8_t> &bytes)>
        apply);

// The message for an entry that does not fit the plan.
std::string foreignEntry(uint32_t stage, const std::string &name);

} // namespace cleave::runtime
