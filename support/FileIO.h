// Whole-file reads and writes that untrusted paths cannot turn into a
// partial output: every writer in cleave (plans, checkpoints, traces, tensor
// files, trained models) goes through writeFileAtomically.
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <memory>

#include <string>

namespace cleave::support {

// Writes `data` to `path` through a temporary file in the same folder
// (`path.tmp.PID`) renamed into place, so a failure or a kill leaves either
// the old file or the new one, never a partial one. Errors name the path.
llvm::Error writeFileAtomically(const std::string &path, llvm::StringRef data);

// The whole of `path`; a folder ("'P' is a directory, not a KIND") or a file
// that cannot be opened is an error naming the path.
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFile(const std::string &path, llvm::StringRef kind = "file");

} // namespace cleave::support
