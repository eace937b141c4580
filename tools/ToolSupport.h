// What cleavec and cleave-opt share: a small flag parser, error reporting
// with the project's exit codes (2 for usage, 1 for bad input), writing an
// output file so that a failure never leaves a partial file behind, and the
// flags that bind input shapes.
#pragma once

#include "frontend/OnnxImporter.h"
#include "ir/Printer.h"
#include "passes/Pass.h"
#include "support/Limits.h"
#include "support/TrustedPaths.h"

#include "llvm/Support/Error.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cleave::tools {

enum ExitCode { kOk = 0, kBadInput = 1, kUsage = 2 };

// `text` in lines of at most `width` columns, each indented by `indent`
// spaces (the last without a newline), for --help.
std::string wrapText(llvm::StringRef text, unsigned indent, unsigned width);

// Prints `<tool>: error: <message>` on one line and returns `code`. Control
// characters in the message are escaped (escapeControls).
int fail(const std::string &tool, const std::string &message, int code);

// `text` with a newline written as the two characters \n and every other
// byte below 0x20, and 0x7f, as \xNN.
std::string escapeControls(llvm::StringRef text);

// Flags as `--name=value`, `--name value` or `-o value`; bare words are
// positional. Each flag is declared with whether it takes a value and
// whether it may repeat; anything else is a usage error.
class Flags {
public:
  struct Spec {
    std::string name; // without dashes
    bool takesValue;
    bool repeatable;
  };
  explicit Flags(std::vector<Spec> specs) : specs_(std::move(specs)) {}
  llvm::Error parse(int argc, char **argv);

  bool has(const std::string &name) const { return values_.count(name); }
  std::optional<std::string> get(const std::string &name) const;
  std::vector<std::string> getAll(const std::string &name) const;
  const std::vector<std::string> &positional() const { return positional_; }

  // Whether `help` (a tool's --help text) documents exactly the flags this
  // parser takes, each once: the error names the first flag that is
  // documented but not taken, taken but not documented, or documented
  // twice. A flag is documented by an entry, a line that starts with two
  // spaces and the flag; an entry may name several ("  -h, --help").
  llvm::Error checkHelp(llvm::StringRef help) const;

private:
  std::vector<Spec> specs_;
  std::multimap<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Parses a non-negative integer flag value; the error names the flag (and
// says "too large" for one beyond int64).
llvm::Expected<int64_t> parseCount(const std::string &flag,
                                   const std::string &value);

// The flags the entries of a --help text document, in order, as written
// ("--stages", "-o"), repeats kept (Flags::checkHelp).
std::vector<std::string> documentedFlags(llvm::StringRef help);

// --help: prints `help` after checking it against the parser
// (Flags::checkHelp; a mismatch is an internal error, exit 1).
int printHelp(const std::string &tool, const Flags &flags,
              llvm::StringRef help);

// --allow-large, which raises the bounds of support/Limits.h from the
// standard to the large ones, and its --help entry, which names the bounds
// of the tool's own flags.
Flags::Spec allowLargeFlagSpec();
enum class LargeBound { Threads, Workers, Stages, Microbatches, Steps };
std::string allowLargeHelp(const std::vector<LargeBound> &bounds);

// Runs a tool's body. An allocation that fails (std::bad_alloc: a size
// from an input that no check caught, or a machine short of memory) ends
// it with one line and exit 1 instead of an abort.
int guardedMain(const char *tool, int argc, char **argv,
                int (*body)(int, char **));

// --trust-dir DIR (repeatable): folders besides an input's own from which
// the files it names may be read (support/TrustedPaths.h); each must be
// an existing folder (a usage error otherwise).
Flags::Spec trustDirFlagSpec();
llvm::Expected<support::TrustedFolders> readTrustDirs(const Flags &flags);
support::SizeLimits limitsFor(const Flags &flags);

// The count `value` of --`flag` (a number of `what`) against `limit`:
// "--microbatches=1000000000000 is more than 1048576 microbatches, the most
// cleave runs without --allow-large (which allows up to 16777216)".
llvm::Error checkLimit(const Flags &flags, const std::string &flag,
                       int64_t value, int64_t support::SizeLimits::*limit,
                       const std::string &what);
// Stages x data-parallel replicas against the workers bound.
llvm::Error checkWorkers(const Flags &flags, int64_t stages,
                         int64_t dataParallel);
// A schedule CSV's stages, ranks and microbatches against the same bounds
// the flags have (`source`: "csv:FILE").
llvm::Error checkCsvLimits(const Flags &flags, const std::string &source,
                           int64_t stages, int64_t ranks,
                           int64_t microbatches);
// Splits "a,b,c" into its non-empty parts.
std::vector<std::string> splitList(const std::string &s);

// Fills PrintOptions from --inline-limit.
llvm::Error readPrintFlags(const Flags &flags, ir::PrintOptions &opts);
// Reads the data of `g`'s parameters, buffers and constants of at most
// `limit` elements that are still in their files (external data stays on
// disk until needed), so IR text spells them out as --inline-limit says.
llvm::Error loadSmallTensors(ir::Graph &g, int64_t limit);

// Fills ImportOptions from --input-shape, --microbatch-size and
// --module-mode, and gives the importer autodiff (passes::differentiate)
// for ONNX's Gradient op.
llvm::Error readImportFlags(const Flags &flags,
                            frontend::ImportOptions &opts);

// After import: --microbatch-size binds only a symbolic leading dimension,
// so on a model whose inputs all have a fixed one it would do nothing. That
// is refused (re-export with a dynamic batch) rather than ignored: the run
// would train the exported batch, not the one asked for.
llvm::Error checkMicrobatchSizeUsed(const ir::Graph &g,
                                    const frontend::ImportOptions &opts);

// The flags that shape a training graph, shared by cleavec and cleave-opt,
// and their --help text.
std::vector<Flags::Spec> trainingFlagSpecs();
extern const char kTrainingHelp[];

// What --add-loss KIND:OUTPUT,TARGET asks for.
struct LossRequest {
  std::string kind, output, target;
};

// Fills TrainingOptions (and `addLoss` when --add-loss is given) from the
// training flags; usage errors name the flag.
// "weight decay 0.01: N parameter(s) (a, b, ...)\nno weight decay
// (--no-decay 1-d): M parameter(s) (c, ...)\n": the optimizer's two groups.
std::string decayGroupsText(const ir::Graph &g,
                            const passes::TrainingOptions &t);

llvm::Error readTrainingFlags(const Flags &flags, passes::TrainingOptions &opts,
                              std::optional<LossRequest> &addLoss);

// Writes `text` to `path` ("-" for stdout) through a temporary file that is
// renamed into place only when complete; a path that holds anything but a
// regular file (a device, a FIFO, a directory) is refused.
llvm::Error writeOutput(const std::string &path, const std::string &text);

// The values of the flags in `fileFlags` (output files; "-" is stdout) and
// `dirFlags` (output folders) checked before any work, as writeOutput and
// the writers of folders will check them: one error for the first path
// that is not a regular file (or folder) or a new path.
llvm::Error checkOutputs(const Flags &flags,
                         const std::vector<std::string> &fileFlags,
                         const std::vector<std::string> &dirFlags = {});

} // namespace cleave::tools
