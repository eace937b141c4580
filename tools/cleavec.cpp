// cleavec: the cleave compiler driver. Today it imports an ONNX model and
// prints it as cleave IR or as a summary; the training passes, partitioner
// and schedules join its pipeline as they land.
#include "frontend/OnnxImporter.h"
#include "ir/Printer.h"
#include "ir/Summary.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/raw_ostream.h"

using namespace cleave;
using tools::fail;

static const char kTool[] = "cleavec";

static const char kHelp[] = R"(usage: cleavec MODEL.onnx [options]

Compiles an ONNX model for pipeline-parallel training. Today cleavec imports
the model (ONNX checker and shape inference, shape folding, static shapes)
and prints it; the training, partitioning and scheduling passes follow.

output:
  --emit=summary|ir      what to print (default: summary): inputs, outputs,
                         parameter count and bytes, op histogram; or the
                         whole graph as cleave IR text (.cir)
  -o FILE                write the output to FILE instead of stdout; FILE is
                         written only when compilation succeeds
  --inline-limit=N       in IR text, spell out tensors of at most N elements
                         (default 16); larger ones refer to their file

shapes:
  --microbatch-size=N    bind a symbolic leading (batch) dimension of every
                         input to N
  --input-shape=NAME=D0,D1,...
                         give input NAME this static shape (repeatable)

inspection:
  --dump-ir-after=PASS|all
                         print the IR to stderr after PASS (repeatable);
                         passes: import, then those of the pipeline
                         (remove-identity, dce)
  --list-ops             list the ONNX ops cleave imports and exit
  --help                 show this help
  --version              show the version

exit status: 0 success, 1 bad input (model, data), 2 bad usage.
)";

// The passes cleavec runs after import, each with why it is there.
static const std::vector<std::string> kPipeline = {
    "remove-identity", // exporters emit Identity copies that carry no work
    "dce",             // drop what no output needs (unused folded results)
};

static int listOps() {
  std::vector<std::string> folded;
  auto ops = frontend::supportedOnnxOps(&folded);
  llvm::outs() << "ONNX ops imported by cleave (default domain, opsets "
               << frontend::kMinOpset << "-" << frontend::kMaxOpset << "):\n";
  for (const std::string &op : ops) {
    bool f = std::find(folded.begin(), folded.end(), op) != folded.end();
    llvm::outs() << "  " << op << (f ? "  (must fold to a constant)" : "")
                 << "\n";
  }
  return tools::kOk;
}

int main(int argc, char **argv) {
  tools::Flags flags({{"emit", true, false},
                      {"o", true, false},
                      {"inline-limit", true, false},
                      {"microbatch-size", true, false},
                      {"input-shape", true, true},
                      {"dump-ir-after", true, true},
                      {"list-ops", false, false},
                      {"help", false, false},
                      {"h", false, false},
                      {"version", false, false}});
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help") || flags.has("h")) {
    llvm::outs() << kHelp;
    return tools::kOk;
  }
  if (flags.has("version")) {
    llvm::outs() << "cleavec " << CLEAVE_VERSION << "\n";
    return tools::kOk;
  }
  if (flags.has("list-ops"))
    return listOps();
  if (flags.positional().size() != 1)
    return fail(kTool,
                flags.positional().empty()
                    ? "no input model given (usage: cleavec MODEL.onnx "
                      "[options]; see --help)"
                    : "expected one input model, got " +
                          std::to_string(flags.positional().size()),
                tools::kUsage);
  std::string emit = flags.get("emit").value_or("summary");
  if (emit != "summary" && emit != "ir")
    return fail(kTool, "--emit must be 'summary' or 'ir', not '" + emit + "'",
                tools::kUsage);
  ir::PrintOptions print;
  if (auto e = tools::readPrintFlags(flags, print))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  frontend::ImportOptions importOpts;
  if (auto e = tools::readImportFlags(flags, importOpts))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  passes::PipelineOptions pipe;
  pipe.dumpAfter = flags.getAll("dump-ir-after");
  for (const std::string &d : pipe.dumpAfter)
    if (d != "all" && d != "import" &&
        std::find(kPipeline.begin(), kPipeline.end(), d) == kPipeline.end())
      return fail(kTool,
                  "--dump-ir-after names '" + d +
                      "', which is not in cleavec's pipeline (import, "
                      "remove-identity, dce, or all)",
                  tools::kUsage);

  auto graph = frontend::importOnnxFile(flags.positional()[0], importOpts);
  if (!graph)
    return fail(kTool, llvm::toString(graph.takeError()), tools::kBadInput);
  if (auto e = ir::verifyGraph(**graph))
    return fail(kTool, "imported IR is invalid: " + llvm::toString(std::move(e)),
                tools::kBadInput);
  if (passes::wantsDump(pipe, "import"))
    passes::dumpIR(**graph, "import", llvm::errs());
  if (auto e = passes::runPipeline(**graph, kPipeline, pipe))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);

  std::string out = emit == "ir" ? ir::printGraph(**graph, print)
                                 : ir::summarizeGraph(**graph);
  if (auto e = tools::writeOutput(flags.get("o").value_or("-"), out))
    return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  return tools::kOk;
}
