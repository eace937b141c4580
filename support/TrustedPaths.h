// Where a file named inside an untrusted input may be read from.
//
// Plans name their weight files and their source model, and `.cir` text
// names the files its tensors live in. Such a name is data, not the user's
// word: followed blindly, a crafted plan could make cleave read any file
// the user can read (and `--save` copy it into an output). So every such
// name is resolved against the folder of the file that holds it (a plan's
// folder, a `.cir`'s folder) and must land inside that folder, symlinks
// resolved, or inside a folder the user named on the command line with
// `--trust-dir`. Absolute names and names that climb out with `..` are
// refused unless they land in one of those folders. This is the rule the
// importer already applies to an ONNX model's external data.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace cleave::support {

// The folders a run trusts besides the input's own: --trust-dir values.
struct TrustedFolders {
  std::vector<std::string> dirs;
};

// Resolves `name` (stored in the input file `holder`, which lives in
// `baseDir`; `what` says what the name is, e.g. "weight file") to the real
// path of an existing file inside `baseDir` or a trusted folder. The error
// is one line naming the name, where it resolved and the flag that allows
// it; a file that does not exist is "cannot open 'PATH': ..." with the
// path joined to `baseDir`.
llvm::Expected<std::string> resolveConfined(const std::string &name,
                                            const std::string &baseDir,
                                            const TrustedFolders &trusted,
                                            const std::string &what);

// The folder holding `file` ("." for a bare name).
std::string folderOf(const std::string &file);

// `path` as a name relative to `dir` if it lies inside it (both resolved),
// else `path` unchanged: how cleavec stores the files a plan refers to.
std::string relativeIfInside(const std::string &path, const std::string &dir);

// The SHA-256 of the bytes of the regular file `path` as 64 hex digits,
// read in pieces (support::streamFileRange): the identity a plan records
// for its source model.
llvm::Expected<std::string> sha256OfFile(const std::string &path,
                                         const std::string &what);

// The --help text of --trust-dir, shared by the tools that take it.
extern const char kTrustDirHelp[];

} // namespace cleave::support
