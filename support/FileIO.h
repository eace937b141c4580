// Whole-file reads and writes that untrusted paths cannot turn into a hang,
// an unbounded allocation or a partial output. Every reader of a user's file
// in cleave (models, IR text, plans, data, checkpoints) goes through
// readFile or readFileSlice, which take regular files only: a FIFO with no
// writer would block in open(), and /dev/zero (or a link to it) never ends.
// Every writer (plans, checkpoints, traces, tensor files, trained models)
// goes through writeFileAtomically, which replaces regular files only: the
// temp-file-and-rename that makes a write atomic would otherwise swap a
// device such as /dev/null for a regular file.
#pragma once

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

namespace cleave::support {

constexpr uint64_t kAnySize = std::numeric_limits<uint64_t>::max();
// Bounds for text that is parsed whole: IR text (its tensors are at most
// 256 MiB each, ir/Parser.cpp) and small text inputs (schedule CSVs, cost
// profiles).
constexpr uint64_t kMaxIrTextBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxTextBytes = uint64_t(64) << 20;

// The whole of `path`, which must be a regular file (after symlinks) of at
// most `maxBytes` bytes. Errors name the path and say what `kind` it should
// be: "'P' is a directory, not a KIND", "'P' is a character device, not a
// KIND (cleave reads regular files only)", "'P' is N bytes; a KIND may have
// at most M", "cannot open 'P': ...". The file is opened without blocking
// and checked again on the open descriptor, so a path swapped for a FIFO
// between the two checks cannot hang the read; no more than the size the
// descriptor reports is read.
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFile(const std::string &path, llvm::StringRef kind = "file",
         uint64_t maxBytes = kAnySize);

// `length` bytes of `path` from `offset`, with readFile's checks; a file
// that ends before `offset + length` is an error.
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFileSlice(const std::string &path, uint64_t offset, uint64_t length,
              llvm::StringRef kind = "file");

// Passes `length` bytes of `path` from `offset` to `consume` in order, in
// pieces of at most 8 MiB, without holding them: data is read (pread) into
// one reused buffer, and holes of a sparse file (SEEK_DATA / SEEK_HOLE)
// arrive as zeros without being read. readFile's checks hold; a file shorter
// than the range is an error. For weights of any size: the memory used is
// one piece. With `zeros`, a hole is passed to it as its byte count instead
// (a checksum that skips zeros: BlockChecksum::zeros).
llvm::Error streamFileRange(
    const std::string &path, uint64_t offset, uint64_t length,
    llvm::function_ref<llvm::Error(const uint8_t *, size_t)> consume,
    llvm::StringRef kind = "file",
    llvm::function_ref<llvm::Error(uint64_t)> zeros = nullptr);

// Standard input, read to its end but refused past `maxBytes` (stdin may be
// /dev/zero or an endless pipe).
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readStdin(llvm::StringRef kind, uint64_t maxBytes);

// An error unless `path` is a regular file (after symlinks), in readFile's
// words; for paths handed to code that opens them itself.
llvm::Error checkInputFile(const std::string &path, llvm::StringRef kind);

// An error unless `path` may be written as a regular file: it does not exist
// yet or is a regular file (after symlinks). A directory, a device, a FIFO
// or a socket there is refused ("cannot write 'P': it is a character device,
// not a regular file or a new path"), so writing never replaces or blocks on
// one. Tools call it before any work they would waste.
llvm::Error checkOutputFile(const std::string &path);

// An error unless `dir` is a directory or a new path (created later by the
// writer): "cannot write into 'P': it is a character device, not a
// directory".
llvm::Error checkOutputDirectory(const std::string &dir);

// Writes `data` to `path` through a temporary file in the same folder
// (`path.tmp.PID`) renamed into place, so a failure or a kill leaves either
// the old file or the new one, never a partial one. checkOutputFile's rule
// holds. Errors name the path.
llvm::Error writeFileAtomically(const std::string &path, llvm::StringRef data);

// What kind of file system object `path` is, for messages: "a character
// device", "a FIFO", ...; "" for a regular file or a missing path.
std::string describeNonRegular(const std::string &path);

} // namespace cleave::support
