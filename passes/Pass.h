// Passes over the IR, and the pipeline that runs them.
//
// A pass is one function `Graph& -> Expected<bool>` (true when it changed the
// graph) in a file of its own, registered in PassRegistry.cpp with a one-line
// summary. Any pass can be run alone from `cleave-opt --passes=NAME`; a
// pipeline runs the verifier after each pass (unless told not to) and can
// dump the IR after any or all passes.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <string_view>
#include <vector>

namespace cleave::passes {

using PassFn = llvm::Expected<bool> (*)(ir::Graph &);

struct PassInfo {
  std::string_view name;
  std::string_view summary;
  PassFn run;
};

llvm::ArrayRef<PassInfo> allPasses();
const PassInfo *lookupPass(std::string_view name);

// The passes, one per file.
llvm::Expected<bool> eliminateDeadCode(ir::Graph &g);
llvm::Expected<bool> removeIdentities(ir::Graph &g);

struct PipelineOptions {
  // Pass names after which to print the IR; "all" for every pass.
  std::vector<std::string> dumpAfter;
  bool verifyEach = true;
  llvm::raw_ostream *dumpStream = &llvm::errs();
};

// Prints the IR dump banner and graph as `--dump-ir-after` does.
void dumpIR(const ir::Graph &g, std::string_view after,
            llvm::raw_ostream &os);
bool wantsDump(const PipelineOptions &opts, std::string_view pass);

// Checks every name in `names` is a registered pass.
llvm::Error checkPassNames(llvm::ArrayRef<std::string> names);

// Runs the named passes in order. Errors name the pass.
llvm::Error runPipeline(ir::Graph &g, llvm::ArrayRef<std::string> names,
                        const PipelineOptions &opts);

} // namespace cleave::passes
