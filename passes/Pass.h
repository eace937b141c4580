// Passes over the IR, and the pipeline that runs them.
//
// A pass is one function `Graph& -> Expected<bool>` (true when it changed the
// graph) in a file of its own, registered in PassRegistry.cpp with a one-line
// summary. Any pass can be run alone from `cleave-opt --passes=NAME`; a
// pipeline runs the verifier after each pass (unless told not to) and can
// dump the IR after any or all passes.
#pragma once

#include "ir/Graph.h"
#include "ir/Printer.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cleave::passes {

// How a training graph is made (cleavec/cleave-opt flags; docs/design/
// training.md). Passes that do not train ignore it.
struct TrainingOptions {
  std::string loss;   // the loss output's name; empty: the only output
  std::string freeze; // regex of parameters to keep fixed; empty: none
  // regex of the parameters to train, the others kept fixed; empty: all
  std::string trainable;
  std::string optimizer = "sgd"; // sgd | adamw
  double lr = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  std::optional<double> weightDecay; // default: 0 for SGD, 0.01 for AdamW
  // Parameters updated without weight decay: "1-d" (every parameter of
  // rank below 2: biases, normalization weights, as nanoGPT and HF's
  // Trainer group them), "none", or a regex of whole names; empty: the
  // optimizer's default (noDecayRule).
  std::string noDecay;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  int64_t microbatches = 1; // the optimizer averages this many gradients
  int64_t dataParallel = 1; // ... on each of this many replicas
  // f32, or bf16: matrix products and convolutions in bf16 with f32 master
  // weights (the mixed-precision pass; docs/design/precision.md).
  std::string precision = "f32";
  // Attention spelled out in ops becomes one FusedAttention (the
  // recognize-attention pass; --fused-attention=off keeps it as exported).
  bool fuseAttention = true;
};

struct PassContext {
  TrainingOptions training;
};

using PassFn = llvm::Expected<bool> (*)(ir::Graph &, const PassContext &);

// A registered pass: its name, its one-line summary and its function (the
// graph passes here, the planning passes in Planning.h).
template <typename Fn> struct PassEntry {
  std::string_view name;
  std::string_view summary;
  Fn run;
};
using PassInfo = PassEntry<PassFn>;

// The entry of `table` named `name`, or null.
template <typename Fn>
const PassEntry<Fn> *findPass(llvm::ArrayRef<PassEntry<Fn>> table,
                              std::string_view name) {
  for (const PassEntry<Fn> &p : table)
    if (p.name == name)
      return &p;
  return nullptr;
}

llvm::ArrayRef<PassInfo> allPasses();
const PassInfo *lookupPass(std::string_view name);

// The passes, one per file.
llvm::Expected<bool> eliminateDeadCode(ir::Graph &g, const PassContext &);
llvm::Expected<bool> removeIdentities(ir::Graph &g, const PassContext &);
llvm::Expected<bool> slicePackedViews(ir::Graph &g, const PassContext &);
llvm::Expected<bool> mergeSlices(ir::Graph &g, const PassContext &);
llvm::Expected<bool> recognizeSilu(ir::Graph &g, const PassContext &);
// The last step of autodiff (AccumulateSparseGradients.cpp): a GatherGrad
// or SliceGrad added into another gradient takes it as its sum operand.
// Returns whether it rewrote an Add.
bool accumulateSparseGradients(ir::Graph &g);
// Also autodiff's (AccumulateSparseGradients.cpp): elementwise gradient ops
// that broadcast read an Expand's operand instead of the Expand where their
// result's shape allows; the Expand goes when nothing else reads it.
bool readExpandOperandsWhereTheyBroadcast(ir::Graph &g);
llvm::Expected<bool> stableLogSigmoid(ir::Graph &g, const PassContext &);
llvm::Expected<bool> recognizeGelu(ir::Graph &g, const PassContext &);
llvm::Expected<bool> matMulToGemm(ir::Graph &g, const PassContext &);
llvm::Expected<bool> recognizeRmsNorm(ir::Graph &g, const PassContext &);
llvm::Expected<bool> recognizeAttention(ir::Graph &g, const PassContext &);
llvm::Expected<bool> packAttention(ir::Graph &g, const PassContext &);
llvm::Expected<bool> batchMajorAttention(ir::Graph &g, const PassContext &);
llvm::Expected<bool> mixedPrecision(ir::Graph &g, const PassContext &ctx);
llvm::Expected<bool> autodiff(ir::Graph &g, const PassContext &ctx);
llvm::Expected<bool> splitBackward(ir::Graph &g, const PassContext &ctx);
llvm::Expected<bool> verify2BP(ir::Graph &g, const PassContext &ctx);
llvm::Expected<bool> addOptimizer(ir::Graph &g, const PassContext &ctx);
// The trainable parameters' names, in declaration order, split by whether
// the optimizer applies weight decay to them (TrainingOptions::noDecay).
struct DecayGroups {
  std::vector<std::string> decayed, exempt;
};
DecayGroups weightDecayGroups(const ir::Graph &g, const TrainingOptions &t);
// The rule in force: t.noDecay, or where it is empty the optimizer's
// default, "1-d" for AdamW (biases and norm weights spared, as HF's Trainer,
// Megatron and nanoGPT do) and "none" for SGD (torch.optim.SGD's one group).
std::string noDecayRule(const TrainingOptions &t);

// Appends the gradients of `y` (of its sum, when not a scalar) with respect
// to each of `xs` (inputs, parameters or results): one value per x, named
// grad.<x> where free, zeros when y does not depend on x. What autodiff and
// ONNX's Gradient op are built on.
llvm::Expected<std::vector<ir::Value *>>
differentiate(ir::Graph &g, ir::Value *y, llvm::ArrayRef<ir::Value *> xs);

// Values that depend on the graph's inputs (the data): the inputs and every
// result of an op with such an operand. Their gradients are activation
// gradients; gradients of values made from parameters alone (a transposed
// weight, a position embedding) are weight gradients.
llvm::DenseSet<const ir::Value *> dataDependentValues(const ir::Graph &g);

// Tags every backward op B or W by the dependency slice of the activation
// gradients (values that are gradients of forward activations, not of
// parameters): B when such a value depends on it, else W. Records the stash.
void tagPhases(ir::Graph &g,
               const llvm::DenseSet<const ir::Value *> &activationGradients);
// The stash of a tagged graph: the inputs and fwd/B results W ops read.
std::vector<ir::Value *> computeStash(const ir::Graph &g);

// Appends a loss to an inference graph: kind "cross-entropy" (LOGITS [N,C]
// or [N,C,...], LABELS a new i64 input) or "mse" (TARGET a new input shaped
// like OUTPUT). The loss becomes the graph's only output.
llvm::Error addLoss(ir::Graph &g, llvm::StringRef kind,
                    llvm::StringRef output, llvm::StringRef target);

struct PipelineOptions {
  // Pass names after which to print the IR; "all" for every pass.
  std::vector<std::string> dumpAfter;
  bool verifyEach = true;
  llvm::raw_ostream *dumpStream = &llvm::errs();
  ir::PrintOptions print; // how dumps print (planning modules too)
  // Planning passes' errors start "pass NAME: " (cleave-opt); cleavec's
  // user sees the message alone.
  bool planningErrorsNamePass = true;
  PassContext context;
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
