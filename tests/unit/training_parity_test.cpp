// Whole-model gradients against PyTorch autograd: the fixtures in
// tests/models/training/<model>/ (made by tests/models/export_training.py)
// hold the ONNX export, the inputs and PyTorch's loss and gradients. The
// relative error of a parameter's gradient is max|g - g_ref| /
// max(max|g_ref|, 1e-6); the test prints the largest per model and requires
// it below 1e-4. It also checks that split-backward leaves every gradient
// bit-identical.
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "interp/Interpreter.h"
#include "ir/Printer.h"
#include "passes/Pass.h"
#include "runtime/Kernel.h"
#include "DeviceBackends.h"

#include "llvm/Support/MemoryBuffer.h"

#include <gtest/gtest.h>

#include <cmath>

namespace unit_training_parity {

using namespace cleave;

namespace {

std::string fixture(const std::string &model, const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/models/training/" + model +
         "/" + rel;
}

struct ModelRun {
  std::unique_ptr<ir::Graph> graph;
  std::vector<interp::Tensor> outputs;
};

// On `backend`, the CPU's by default.
ModelRun trainGraph(const std::string &model,
                    const std::vector<std::string> &passNames,
                    const std::string &precision = "f32",
                    runtime::Backend *backend = nullptr) {
  ModelRun r;
  auto g = frontend::importOnnxFile(fixture(model, "model.onnx"), {});
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return r;
  }
  passes::PipelineOptions opts;
  opts.context.training.precision = precision;
  if (auto e = passes::runPipeline(**g, passNames, opts)) {
    ADD_FAILURE() << llvm::toString(std::move(e));
    return r;
  }
  std::vector<interp::Tensor> inputs;
  for (const ir::Value *v : (*g)->inputs()) {
    auto t = runtime::readNpyFile(fixture(model, "inputs/" + v->name() + ".npy"));
    if (!t) {
      ADD_FAILURE() << llvm::toString(t.takeError());
      return r;
    }
    inputs.push_back(*t);
  }
  static auto cpu = runtime::createCpuBackend(2);
  auto in = interp::Interpreter::create(**g, backend ? *backend : *cpu);
  if (!in) {
    ADD_FAILURE() << llvm::toString(in.takeError());
    return r;
  }
  auto out = (*in)->run(inputs);
  if (!out) {
    ADD_FAILURE() << llvm::toString(out.takeError());
    return r;
  }
  r.graph = std::move(*g);
  r.outputs = std::move(*out);
  return r;
}

double relativeError(const ir::TensorData &got, const ir::TensorData &ref) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < ref.type().numElements(); ++i) {
    diff = std::max(diff, std::abs(got.getDouble(i) - ref.getDouble(i)));
    scale = std::max(scale, std::abs(ref.getDouble(i)));
  }
  return diff / std::max(scale, 1e-6);
}

class TrainingParity : public ::testing::TestWithParam<const char *> {};

TEST_P(TrainingParity, GradientsMatchPyTorch) {
  const std::string model = GetParam();
  ModelRun r = trainGraph(model, {"remove-identity", "recognize-gelu",
                                  "recognize-rms-norm", "matmul-to-gemm", "dce",
                                  "autodiff", "split-backward", "verify-2bp"});
  ASSERT_TRUE(r.graph);
  const ir::Graph &g = *r.graph;
  ASSERT_EQ(g.outputs().size(), r.outputs.size());

  auto loss = runtime::readNpyFile(fixture(model, "reference/loss.npy"));
  ASSERT_TRUE(bool(loss)) << llvm::toString(loss.takeError());
  double lossErr = relativeError(*r.outputs[0], **loss);
  EXPECT_LT(lossErr, 1e-5) << "loss";

  double worst = 0;
  std::string worstName;
  size_t checked = 0;
  for (size_t k = 1; k < g.outputs().size(); ++k) {
    std::string name = g.outputs()[k]->name(); // grad.<param>
    auto ref = runtime::readNpyFile(fixture(model, "reference/" + name + ".npy"));
    ASSERT_TRUE(bool(ref)) << name << ": " << llvm::toString(ref.takeError());
    ASSERT_EQ((*ref)->type(), r.outputs[k]->type()) << name;
    double e = relativeError(*r.outputs[k], **ref);
    EXPECT_LT(e, 1e-4) << name;
    if (e >= worst) {
      worst = e;
      worstName = name;
    }
    ++checked;
  }
  // Every PyTorch parameter has a gradient here.
  std::string params;
  {
    auto buf = llvm::MemoryBuffer::getFile(fixture(model, "reference/params.txt"));
    ASSERT_TRUE(bool(buf));
    params = (*buf)->getBuffer().str();
  }
  size_t expected = std::count(params.begin(), params.end(), '\n');
  EXPECT_EQ(checked, expected);
  std::printf("[parity] %-8s %zu parameter gradients, max relative error "
              "%.3g (%s), loss %.3g\n",
              model.c_str(), checked, worst, worstName.c_str(), lossErr);

  // split-backward changes no bit of any output.
  ModelRun unsplit = trainGraph(model, {"remove-identity", "recognize-gelu",
                                        "recognize-rms-norm", "matmul-to-gemm",
                                        "dce", "autodiff"});
  ASSERT_EQ(unsplit.outputs.size(), r.outputs.size());
  for (size_t k = 0; k < r.outputs.size(); ++k)
    EXPECT_EQ(unsplit.outputs[k]->bytes(), r.outputs[k]->bytes())
        << g.outputs()[k]->name();
}

// --precision bf16 against PyTorch under the same semantics (products and
// convolutions on bf16 casts of their operands, results cast back to f32:
// reference_bf16/, from tests/models/export_bf16_reference.py). The two
// round the same products and differ in the order of f32 sums, and a sum
// that lands near a bf16 rounding boundary rounds the other way: one step
// of 2^-8 relative, which the ops after it carry on. So the loss must agree
// within 1e-3 and each gradient within 3e-2 of its largest element. The
// bf16 gradients must also differ from the f32 ones, or the rewrite did
// not take effect.
void bf16AgainstPyTorch(const std::string &model,
                        runtime::Backend *backend = nullptr) {
  std::vector<std::string> passes = {"remove-identity", "dce",
                                     "mixed-precision", "autodiff",
                                     "split-backward", "verify-2bp"};
  ModelRun r = trainGraph(model, passes, "bf16", backend);
  ASSERT_TRUE(r.graph);
  const ir::Graph &g = *r.graph;
  auto loss = runtime::readNpyFile(fixture(model, "reference_bf16/loss.npy"));
  ASSERT_TRUE(bool(loss)) << llvm::toString(loss.takeError());
  double lossErr = relativeError(*r.outputs[0], **loss);
  EXPECT_LT(lossErr, 1e-3) << "loss";

  ModelRun f32 = trainGraph(model, passes, "f32", backend);
  ASSERT_TRUE(f32.graph);
  ASSERT_EQ(f32.outputs.size(), r.outputs.size());
  double worst = 0, worstF32 = 0;
  std::string worstName;
  size_t differing = 0;
  for (size_t k = 1; k < g.outputs().size(); ++k) {
    std::string name = g.outputs()[k]->name();
    auto ref = runtime::readNpyFile(
        fixture(model, "reference_bf16/" + name + ".npy"));
    ASSERT_TRUE(bool(ref)) << name << ": " << llvm::toString(ref.takeError());
    ASSERT_EQ((*ref)->type(), r.outputs[k]->type()) << name;
    double e = relativeError(*r.outputs[k], **ref);
    EXPECT_LT(e, 3e-2) << name;
    if (e >= worst) {
      worst = e;
      worstName = name;
    }
    worstF32 = std::max(worstF32, relativeError(*r.outputs[k], *f32.outputs[k]));
    differing += f32.outputs[k]->bytes() != r.outputs[k]->bytes();
  }
  EXPECT_GT(differing, 0u) << "bf16 gradients equal the f32 ones";
  std::printf("[parity bf16%s%s] %-8s max relative error %.3g (%s), loss "
              "%.3g; against cleave f32 %.3g\n",
              backend ? " " : "",
              backend ? std::string(backend->name()).c_str() : "",
              model.c_str(), worst, worstName.c_str(), lossErr, worstF32);
}

TEST_P(TrainingParity, Bf16GradientsMatchPyTorchBf16) {
  bf16AgainstPyTorch(GetParam());
}

// The CUDA backend's arithmetic against the same references with the same
// bar: its lowering run on the host, and on a GPU its kernels (cuBLAS,
// cuDNN), where one is visible.
TEST_P(TrainingParity, CudaEmulatedBf16GradientsMatchPyTorchBf16) {
  bf16AgainstPyTorch(GetParam(), &testsupport::cudaEmulated());
}

TEST_P(TrainingParity, CudaBf16GradientsMatchPyTorchBf16) {
  std::string why;
  runtime::Backend *gpu = testsupport::cudaGpu(why);
  if (!gpu)
    GTEST_SKIP() << why;
  bf16AgainstPyTorch(GetParam(), gpu);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainingParity,
                         ::testing::Values("mlp", "mlp_mse", "gpt", "cnn"));

} // namespace

} // namespace unit_training_parity
