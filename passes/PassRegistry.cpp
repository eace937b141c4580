// The list of passes, with a one-line reason for each, and the pipeline
// driver shared by cleavec and cleave-opt.
#include "passes/Pass.h"

#include "ir/Printer.h"
#include "ir/Verifier.h"

#include <algorithm>

namespace cleave::passes {

static const PassInfo kPasses[] = {
    {"dce", "remove ops and declared tensors that no output depends on",
     eliminateDeadCode},
    {"remove-identity",
     "forward the operand of every Identity op, of every Dropout that "
     "drops nothing (inference mode or ratio 0, mask unused), and of every "
     "view or Cast that leaves its operand's type as it is, to its users",
     removeIdentities},
    {"merge-slices",
     "make a Slice of a Slice over other axes, which nothing else reads, "
     "one Slice (x[..., :i, :j] is exported as two copies)",
     mergeSlices},
    {"slice-packed-views",
     "replace a Gather of one constant index read through Transposes and "
     "reshapes (nn.MultiheadAttention's packed Q, K, V) by a Slice of the "
     "value the views start from, one Split where the Slices tile it",
     slicePackedViews},
    {"recognize-gelu",
     "replace GELU spelled out in elementwise ops (erf or tanh form) by one "
     "Gelu op",
     recognizeGelu},
    {"recognize-silu",
     "replace Mul(x, Sigmoid(x)) (SiLU as exported) by one Silu op",
     recognizeSilu},
    {"stable-log-sigmoid",
     "compute Log(Sigmoid(x)) (F.logsigmoid, the log terms of "
     "binary_cross_entropy_with_logits as exported) as min(x, 0) - log(1 + "
     "exp(-|x|)), which stays finite where Sigmoid rounds to 0",
     stableLogSigmoid},
    {"recognize-rms-norm",
     "replace RMS norm spelled out in elementwise ops and a ReduceMean by "
     "one RMSNormalization op",
     recognizeRmsNorm},
    {"recognize-attention",
     "replace attention spelled out as MatMul, scale, mask, Softmax and "
     "MatMul by one FusedAttention op that never stores the scores",
     recognizeAttention},
    {"pack-attention",
     "let a FusedAttention whose Q, K and V are one Split's three parts (a "
     "packed projection) read them in place from the Split's operand "
     "(packed_kv_heads), the Split and its gradient's Concat gone",
     packAttention},
    {"matmul-to-gemm",
     "replace MatMul(x, Transpose(W)) [+ b] (nn.Linear as exported) by a "
     "Gemm with transB = 1 and the bias as C, x and the result reshaped",
     matMulToGemm},
    {"batch-major-attention",
     "run nn.MultiheadAttention with batch_first (Transposes to [T, B, E] "
     "and back around row-wise ops and a packed time_major FusedAttention) "
     "on the input's own [B, T] rows: the Transposes gone, the attention "
     "seq_major",
     batchMajorAttention},
    {"verify", "check the IR invariants (types, SSA order, attributes)",
     [](ir::Graph &, const PassContext &) -> llvm::Expected<bool> {
       return false;
     }},
    {"mixed-precision",
     "with --precision bf16: MatMul, Gemm and Conv read bf16 casts of their "
     "f32 operands and their results are cast back to f32",
     mixedPrecision},
    {"autodiff",
     "append the backward graph: outputs become the loss and grad.<param> "
     "per trainable parameter",
     autodiff},
    {"split-backward",
     "split combined gradient ops into data (B) and weight (W) parts, tag "
     "every op fwd/B/W/opt, record the stash",
     splitBackward},
    {"verify-2bp",
     "check the fwd/B/W/opt tags and the stash against the graph's "
     "dependencies",
     verify2BP},
    {"optimizer",
     "append SGD or AdamW updates for every trainable parameter (tagged opt)",
     addOptimizer},
};

llvm::ArrayRef<PassInfo> allPasses() { return kPasses; }

const PassInfo *lookupPass(std::string_view name) {
  return findPass(allPasses(), name);
}

void dumpIR(const ir::Graph &g, std::string_view after,
            llvm::raw_ostream &os) {
  os << "// -----// IR after " << after << " //----- //\n";
  ir::printGraph(g, os);
  os.flush();
}

bool wantsDump(const PipelineOptions &opts, std::string_view pass) {
  return std::any_of(opts.dumpAfter.begin(), opts.dumpAfter.end(),
                     [&](const std::string &d) {
                       return d == "all" || d == pass;
                     });
}

llvm::Error checkPassNames(llvm::ArrayRef<std::string> names) {
  for (const std::string &n : names)
    if (!lookupPass(n)) {
      std::string known;
      for (const PassInfo &p : kPasses)
        known += (known.empty() ? "" : ", ") + std::string(p.name);
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "unknown pass '" + n +
                                         "' (known passes: " + known + ")");
    }
  return llvm::Error::success();
}

llvm::Error runPipeline(ir::Graph &g, llvm::ArrayRef<std::string> names,
                        const PipelineOptions &opts) {
  if (auto e = checkPassNames(names))
    return e;
  for (const std::string &name : names) {
    const PassInfo *p = lookupPass(name);
    auto changed = p->run(g, opts.context);
    if (!changed)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "pass " + name + ": " +
                                         llvm::toString(changed.takeError()));
    if (opts.verifyEach || name == "verify")
      if (auto e = ir::verifyGraph(g))
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            "IR is invalid after pass " + name + ": " +
                llvm::toString(std::move(e)));
    if (wantsDump(opts, name))
      dumpIR(g, name, *opts.dumpStream);
  }
  return llvm::Error::success();
}

} // namespace cleave::passes
