// The real-model corpus (tests/models/corpus, made by export_corpus.py from
// PyTorch 2 with transformers and torchvision): every export imports with
// default flags, trains exactly the parameters PyTorch declares, and its
// first-microbatch gradients are as close to float64 as PyTorch's own
// float32 ones are.
//
// The error of a gradient tensor is max|g - g64| / scale, where scale is
// the tensor's max|g64| or, for a gradient that is zero in exact arithmetic
// (a bias feeding BatchNorm, a key bias under softmax), the model's largest
// max|g64|. A model's error is its worst tensor's. cleave's error must be
// within 10x of PyTorch float32's (floored at 1e-7, the f32 rounding of
// one operation).
//
// The same checks run on tests/models/opset23 (make_attention_opset23.py):
// decoders written with onnx.helper around opset 23's RotaryEmbedding and
// Attention, which the importer expands through their ONNX function bodies,
// against PyTorch's sdpa and a hand-written rotary embedding.
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "interp/Interpreter.h"
#include "passes/Pass.h"
#include "passes/Pipelines.h"
#include "runtime/Kernel.h"
#include "DeviceBackends.h"

#include "llvm/Support/MemoryBuffer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

namespace unit_corpus {

using namespace cleave;

namespace {

// `model` is a folder under tests/models ("corpus/gpt2-legacy").
std::string corpus(const std::string &model, const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/models/" + model + "/" +
         rel;
}

std::set<std::string> readLines(const std::string &path) {
  std::set<std::string> lines;
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    return lines;
  llvm::SmallVector<llvm::StringRef> parts;
  (*buf)->getBuffer().split(parts, '\n', -1, false);
  for (llvm::StringRef p : parts)
    if (!p.trim().empty())
      lines.insert(p.trim().str());
  return lines;
}

double maxAbs(const ir::TensorData &t) {
  double m = 0;
  for (int64_t i = 0; i < t.type().numElements(); ++i)
    m = std::max(m, std::abs(t.getDouble(i)));
  return m;
}

double maxDiff(const ir::TensorData &a, const ir::TensorData &b) {
  double m = 0;
  for (int64_t i = 0; i < b.type().numElements(); ++i)
    m = std::max(m, std::abs(a.getDouble(i) - b.getDouble(i)));
  return m;
}

// Imports `model`, runs cleavec's graph passes (attention fused or, with
// `fuseAttention` false, as exported) and the backward on `backend` (the
// CPU's by default), and checks the loss and first-microbatch gradients
// against PyTorch's float64.
void checkAgainstFloat64(const std::string &model, bool fuseAttention,
                         runtime::Backend *backend = nullptr) {
  auto g = frontend::importOnnxFile(corpus(model, "model.onnx"), {});
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());

  // Trained: exactly PyTorch's parameters (a tied one once).
  std::set<std::string> params;
  for (const ir::Value *v : (*g)->declared())
    if (v->kind() == ir::ValueKind::Param)
      params.insert(v->name());
  EXPECT_EQ(params, readLines(corpus(model, "reference/params.txt")));

  passes::PipelineOptions opts;
  opts.context.training.fuseAttention = fuseAttention;
  std::vector<std::string> names = passes::passNames(passes::graphPipeline());
  for (const char *p : {"autodiff", "split-backward", "verify-2bp"})
    names.push_back(p);
  ASSERT_FALSE(bool(passes::runPipeline(**g, names, opts)));
  std::vector<interp::Tensor> inputs;
  for (const ir::Value *v : (*g)->inputs()) {
    auto t = runtime::readNpyFile(corpus(model, "inputs/" + v->name() + ".npy"));
    ASSERT_TRUE(bool(t)) << llvm::toString(t.takeError());
    inputs.push_back(*t);
  }
  static auto cpu = runtime::createCpuBackend(2);
  auto in = interp::Interpreter::create(**g, backend ? *backend : *cpu);
  ASSERT_TRUE(bool(in)) << llvm::toString(in.takeError());
  auto out = (*in)->run(inputs);
  ASSERT_TRUE(bool(out)) << llvm::toString(out.takeError());

  auto loss64 = runtime::readNpyFile(corpus(model, "reference64/loss.npy"));
  ASSERT_TRUE(bool(loss64));
  double lossRef = (*loss64)->getDouble(0);
  EXPECT_NEAR((*out)[0]->getDouble(0), lossRef, 1e-5 * std::abs(lossRef))
      << "loss";

  struct Grad {
    interp::Tensor mine, f32, f64;
  };
  std::map<std::string, Grad> grads;
  double modelScale = 0;
  const auto &outputs = (*g)->outputs();
  for (size_t k = 1; k < outputs.size(); ++k) {
    std::string name = outputs[k]->name(); // grad.<param>
    auto f32 = runtime::readNpyFile(corpus(model, "reference/" + name + ".npy"));
    auto f64 = runtime::readNpyFile(corpus(model, "reference64/" + name + ".npy"));
    ASSERT_TRUE(f32 && f64) << name;
    ASSERT_EQ((*f32)->type().shape, (*out)[k]->type().shape) << name;
    modelScale = std::max(modelScale, maxAbs(**f64));
    grads[name] = Grad{(*out)[k], *f32, *f64};
  }
  ASSERT_EQ(grads.size(), params.size());
  double mine = 0, torch = 0;
  std::string worst;
  for (const auto &[name, gr] : grads) {
    double own = maxAbs(*gr.f64);
    double scale = own < 1e-4 * modelScale ? modelScale : own;
    double e = maxDiff(*gr.mine, *gr.f64) / scale;
    if (e > mine) {
      mine = e;
      worst = name;
    }
    torch = std::max(torch, maxDiff(*gr.f32, *gr.f64) / scale);
  }
  std::printf("  %-22s %-8s %3zu gradients: error against float64 cleave "
              "%.2e, PyTorch f32 %.2e (worst: %s)\n",
              model.c_str(),
              backend ? std::string(backend->name()).c_str()
                      : fuseAttention ? "fused" : "unfused",
              grads.size(), mine, torch, worst.c_str());
  EXPECT_LE(mine, 10 * std::max(torch, 1e-7)) << worst;
}

class Corpus : public ::testing::TestWithParam<const char *> {};

// cleavec's default: attention fused (recognize-attention).
TEST_P(Corpus, ImportsTrainsDeclaredParametersGradientsMatchFloat64) {
  checkAgainstFloat64(GetParam(), true);
}

// --fused-attention=off: the exported ops.
TEST_P(Corpus, UnfusedAttentionGradientsMatchFloat64) {
  checkAgainstFloat64(GetParam(), false);
}

// The CUDA backend's arithmetic (its lowering, run on the host): the
// same bar as the CPU's. On a GPU, the device's own kernels (cuBLAS,
// cuDNN) too.
TEST_P(Corpus, CudaEmulatedGradientsMatchFloat64) {
  checkAgainstFloat64(GetParam(), true, &testsupport::cudaEmulated());
}

TEST_P(Corpus, CudaGradientsMatchFloat64) {
  std::string why;
  runtime::Backend *gpu = testsupport::cudaGpu(why);
  if (!gpu)
    GTEST_SKIP() << why;
  checkAgainstFloat64(GetParam(), true, gpu);
}

// The test's name: the folder's, without its parent, '-' as '_'.
std::string testName(const ::testing::TestParamInfo<const char *> &info) {
  std::string n = llvm::StringRef(info.param).rsplit('/').second.str();
  for (char &c : n)
    if (c == '-')
      c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(
    Models, Corpus,
    ::testing::Values("corpus/gpt2-legacy", "corpus/gpt2-dynamo",
                      "corpus/llama-legacy", "corpus/llama-dynamo",
                      "corpus/bert-legacy", "corpus/bert-dynamo",
                      "corpus/resnet18-legacy", "corpus/resnet18-dynamo",
                      "corpus/mobilenet_v2-legacy",
                      "corpus/mobilenet_v2-dynamo", "corpus/vit-legacy",
                      "corpus/vit-dynamo", "corpus/unet-legacy",
                      "corpus/unet-dynamo", "corpus/rnn-legacy",
                      "corpus/rnn-dynamo", "corpus/saturating-legacy",
                      "corpus/saturating-dynamo", "corpus/topk_gate-legacy",
                      "corpus/topk_gate-dynamo", "corpus/index_pairs-legacy",
                      "corpus/index_pairs-dynamo", "corpus/grid_warp-legacy",
                      "corpus/grid_warp-dynamo", "corpus/detached-dynamo",
                      "corpus/row_fill-legacy", "corpus/row_fill-dynamo"),
    testName);

INSTANTIATE_TEST_SUITE_P(Opset23, Corpus,
                         ::testing::Values("opset23/rope-causal-gqa",
                                           "opset23/float-mask-3d",
                                           "opset23/bool-mask-causal"),
                         testName);

TEST(CorpusErrors, FoldedDynamoExportIsRefusedInOneLine) {
  auto g = frontend::importOnnxFile(corpus("corpus/gpt2-dynamo-folded", "model.onnx"),
                                    {});
  ASSERT_FALSE(bool(g));
  std::string msg = llvm::toString(g.takeError());
  EXPECT_EQ(msg.find('\n'), std::string::npos);
  EXPECT_NE(msg.find("the exporter folded them; export for training with "
                     "torch.onnx.export(..., dynamo=True, optimize=False)"),
            std::string::npos)
      << msg;
}

} // namespace

} // namespace unit_corpus
