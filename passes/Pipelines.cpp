// The pass lists cleavec runs (passes/Pipelines.h).
#include "passes/Pipelines.h"

namespace cleave::passes {

static const PipelineStep kGraph[] = {
    {"remove-identity",
     "exporters emit Identity copies and same-shape views that carry no "
     "work"},
    {"merge-slices",
     "x[..., :i, :j] exported as two Slices, each a copy: one Slice"},
    {"slice-packed-views",
     "packed Q, K, V picked by Transpose and Gather: one Split, its "
     "gradient one Concat"},
    {"recognize-gelu", "GELU exported as 5 to 8 elementwise ops: one Gelu"},
    {"recognize-silu", "SiLU exported as Mul(x, Sigmoid(x)): one Silu"},
    {"stable-log-sigmoid",
     "Log(Sigmoid(x)) finite where Sigmoid rounds to 0, as PyTorch's "
     "log_sigmoid"},
    {"recognize-rms-norm",
     "Llama's RMSNorm as 7 ops: one RMSNormalization"},
    {"recognize-attention",
     "attention as MatMul-scale-mask-Softmax-MatMul: one FusedAttention, "
     "the scores never stored"},
    {"pack-attention",
     "Q, K and V split from one packed projection: read in place, no Split "
     "and no Concat in the gradient"},
    {"matmul-to-gemm", "nn.Linear: no copy of W^T, its gradient, the bias"},
    {"batch-major-attention",
     "batch_first nn.MultiheadAttention without its two Transposes"},
    {"dce", "drop what no output needs (unused folded results)"},
    {"mixed-precision",
     "--precision bf16: products in bf16 (a no-op for f32)"},
};

static const PipelineStep kTraining[] = {
    {"autodiff", "the backward graph: loss and one gradient per parameter"},
    {"split-backward", "2BP: B and W parts, phase tags, the stash"},
    {"verify-2bp", "the tags hold against the dependencies"},
    {"optimizer", "the update of every trainable parameter"},
};

static const PipelineStep kPlanning[] = {
    {"recompute", "--recompute: values made again in the backward, not held"},
    {"partition", "stages of whole layers, every op tagged with its stage"},
    {"schedule", "every rank's F, B and W actions, checked and simulated"},
    {"split-stages", "one graph per stage, Send and Recv where values cross"},
    {"plan-memory",
     "each stage's frames laid out and every rank's peak against --mem-cap"},
};

llvm::ArrayRef<PipelineStep> graphPipeline() { return kGraph; }
llvm::ArrayRef<PipelineStep> trainingPipeline() { return kTraining; }
llvm::ArrayRef<PipelineStep> planningPipeline() { return kPlanning; }

std::vector<std::string> passNames(llvm::ArrayRef<PipelineStep> steps) {
  std::vector<std::string> out;
  for (const PipelineStep &s : steps)
    out.emplace_back(s.pass);
  return out;
}

bool inCompilePipeline(std::string_view name) {
  if (name == "import")
    return true;
  for (auto list : {graphPipeline(), trainingPipeline(), planningPipeline()})
    for (const PipelineStep &s : list)
      if (s.pass == name)
        return true;
  return false;
}

static std::string joined(llvm::ArrayRef<PipelineStep> steps) {
  std::string out;
  for (const PipelineStep &s : steps)
    out += (out.empty() ? "" : ", ") + std::string(s.pass);
  return out;
}

std::string describeCompilePipeline() {
  return "import, " + joined(graphPipeline()) + ", then for training " +
         joined(trainingPipeline()) + ", then with --stages " +
         joined(planningPipeline());
}

} // namespace cleave::passes
