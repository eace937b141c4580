// One whole training step against PyTorch: the fixtures in
// tests/models/training/<model>/ (made by tests/models/export_training.py)
// hold the parameters after one torch.optim.SGD (lr 0.1, momentum 0.9,
// Nesterov, weight decay 0.01) and one torch.optim.AdamW (lr 0.01, betas
// (0.9, 0.999), eps 1e-8, weight decay 0.01) step from the exported values,
// and, for the cnn, the BatchNorm running statistics after the forward pass.
// The test runs autodiff, split-backward and the optimizer pass with the
// same hyper-parameters, interprets the graph once on the CPU and compares
// every state update (graph.updates(), also graph outputs):
//   - each parameter with PyTorch's: max|p - p_ref| / max(max|p_ref|, 1e-6)
//     below 1e-5 (for AdamW over the elements whose gradient is 0 or at
//     least 1e-4 of the tensor's largest; see below);
//   - the optimizer state a second step would read (SGD velocity, AdamW
//     m and v, the step count) with its first-step value from PyTorch's
//     gradient (velocity g + wd p, m = (1 - b1) g, v = (1 - b2) g^2): below
//     1e-4 relative, the gradient parity test's bar;
//   - BatchNorm running_mean with PyTorch's, and running_var with the ONNX
//     spec's (population batch variance; PyTorch uses the unbiased one, so
//     its running_var differs by design: the test prints by how much).
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "interp/Interpreter.h"
#include "passes/Pass.h"
#include "runtime/Kernel.h"

#include "llvm/Support/MemoryBuffer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace unit_optimizer_parity {

using namespace cleave;

namespace {

std::string fixture(const std::string &model, const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/models/training/" + model +
         "/" + rel;
}

bool endsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// max|got - ref| / max(max|ref|, 1e-6) over the elements where `use` is
// true (all when it is empty).
double relativeError(const ir::TensorData &got, const std::vector<double> &ref,
                     const std::vector<bool> &use = {}) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    scale = std::max(scale, std::abs(ref[i]));
    if (use.empty() || use[i])
      diff = std::max(diff, std::abs(got.getDouble(int64_t(i)) - ref[i]));
  }
  return diff / std::max(scale, 1e-6);
}

std::vector<double> doubles(const ir::TensorData &t) {
  std::vector<double> v(size_t(t.type().numElements()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = t.getDouble(int64_t(i));
  return v;
}

interp::Tensor load(const std::string &model, const std::string &rel) {
  auto t = runtime::readNpyFile(fixture(model, rel));
  if (!t) {
    ADD_FAILURE() << rel << ": " << llvm::toString(t.takeError());
    return nullptr;
  }
  return *t;
}

// The hyper-parameters export_training.py gives PyTorch.
passes::TrainingOptions trainingOptions(const std::string &optimizer) {
  passes::TrainingOptions t;
  t.optimizer = optimizer;
  t.weightDecay = 0.01;
  // torch.optim's one parameter group: every parameter decays (cleave's
  // AdamW default spares the 1-d ones).
  t.noDecay = "none";
  if (optimizer == "sgd") {
    t.lr = 0.1;
    t.momentum = 0.9;
    t.nesterov = true;
  } else {
    t.lr = 0.01;
    t.beta1 = 0.9;
    t.beta2 = 0.999;
    t.epsilon = 1e-8;
  }
  return t;
}

struct Case {
  const char *model;
  const char *optimizer;
};

std::ostream &operator<<(std::ostream &os, const Case &c) {
  return os << c.model << "_" << c.optimizer;
}

class OptimizerParity : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerParity, OneStepMatchesPyTorch) {
  const std::string model = GetParam().model, opt = GetParam().optimizer;
  const passes::TrainingOptions t = trainingOptions(opt);

  auto imported = frontend::importOnnxFile(fixture(model, "model.onnx"), {});
  ASSERT_TRUE(bool(imported)) << llvm::toString(imported.takeError());
  ir::Graph &g = **imported;
  passes::PipelineOptions opts;
  opts.context.training = t;
  if (auto e =
          passes::runPipeline(g,
                              {"remove-identity", "dce", "autodiff",
                               "split-backward", "verify-2bp", "optimizer"},
                              opts))
    FAIL() << llvm::toString(std::move(e));

  std::vector<interp::Tensor> inputs;
  for (const ir::Value *v : g.inputs()) {
    inputs.push_back(load(model, "inputs/" + v->name() + ".npy"));
    ASSERT_TRUE(inputs.back());
  }
  static auto backend = runtime::createCpuBackend(2);
  auto in = interp::Interpreter::create(g, *backend);
  ASSERT_TRUE(bool(in)) << llvm::toString(in.takeError());
  auto out = (*in)->run(inputs);
  ASSERT_TRUE(bool(out)) << llvm::toString(out.takeError());
  ASSERT_EQ(out->size(), g.outputs().size());

  auto outputOf = [&](const ir::Value *v) -> const ir::TensorData * {
    auto it = std::find(g.outputs().begin(), g.outputs().end(), v);
    return it == g.outputs().end() ? nullptr
                                   : (*out)[it - g.outputs().begin()].get();
  };
  // The initial value of a parameter or buffer, and PyTorch's gradient.
  auto initial = [&](const ir::Value *v) { return doubles(*v->data()); };
  auto refGrad = [&](const std::string &param) {
    interp::Tensor r = load(model, "reference/grad." + param + ".npy");
    return r ? doubles(*r) : std::vector<double>();
  };

  double worst = 0, worstState = 0, runMean = 0, runVar = 0, varVsTorch = 0;
  std::string worstName, worstStateName;
  size_t params = 0, states = 0, running = 0, illConditioned = 0;
  double worstIll = 0;
  for (const ir::StateUpdate &u : g.updates()) {
    const std::string &name = u.state->name();
    const ir::TensorData *got = outputOf(u.value);
    ASSERT_TRUE(got) << name << ": the update is not a graph output";
    ASSERT_EQ(got->type(), u.state->type()) << name;

    if (u.state->kind() == ir::ValueKind::Param) {
      interp::Tensor ref =
          load(model, "reference/" + opt + "/" + name + ".npy");
      ASSERT_TRUE(ref);
      ASSERT_EQ(ref->type(), got->type()) << name;
      std::vector<double> want = doubles(*ref);
      // AdamW's first step is p (1 - lr wd) - lr g / (|g| + eps): the
      // gradient normalized element by element. Where |g| is below the
      // gradient parity test's bar (1e-4 max|g|) that bar does not fix the
      // sign of g (an exact 0, a dead ReLU's, is compared: the step is
      // then the decay alone), and near |g| ~ eps the step amplifies a
      // gradient error
      // by eps / (|g| + eps)^2 (rounding noise of a gradient that is zero
      // in exact arithmetic, such as an attention key bias's, becomes a
      // step of up to lr). Those elements need only move by at most lr
      // each way.
      std::vector<bool> use;
      if (opt == "adamw") {
        std::vector<double> grad = refGrad(name);
        ASSERT_EQ(grad.size(), want.size()) << name;
        double gmax = 0, pmax = 0;
        for (size_t i = 0; i < grad.size(); ++i) {
          gmax = std::max(gmax, std::abs(grad[i]));
          pmax = std::max(pmax, std::abs(want[i]));
        }
        use.resize(grad.size());
        for (size_t i = 0; i < grad.size(); ++i) {
          use[i] = grad[i] == 0 || std::abs(grad[i]) >= 1e-4 * gmax;
          if (use[i])
            continue;
          ++illConditioned;
          double d = std::abs(got->getDouble(int64_t(i)) - want[i]);
          EXPECT_LE(d, 2 * t.lr + 1e-6 * pmax) << name << "[" << i << "]";
          worstIll = std::max(worstIll, d / std::max(pmax, 1e-6));
        }
      }
      double e = relativeError(*got, want, use);
      EXPECT_LT(e, 1e-5) << name;
      if (e >= worst) {
        worst = e;
        worstName = name;
      }
      ++params;
      continue;
    }

    // Optimizer state after the first step, from PyTorch's gradient.
    std::vector<double> expected;
    std::string param;
    if (name == "optimizer.step") {
      expected = {1.0};
    } else if (endsWith(name, ".momentum")) {
      param = name.substr(0, name.size() - 9);
      expected = refGrad(param);
      const ir::Value *p = g.lookup(param);
      ASSERT_TRUE(p) << param;
      std::vector<double> p0 = initial(p);
      for (size_t i = 0; i < expected.size(); ++i)
        expected[i] += *t.weightDecay * p0[i];
    } else if (endsWith(name, ".adam_m")) {
      param = name.substr(0, name.size() - 7);
      expected = refGrad(param);
      for (double &x : expected)
        x *= 1 - t.beta1;
    } else if (endsWith(name, ".adam_v")) {
      param = name.substr(0, name.size() - 7);
      expected = refGrad(param);
      for (double &x : expected)
        x = (1 - t.beta2) * x * x;
    }
    if (!expected.empty()) {
      ASSERT_EQ(int64_t(expected.size()), got->type().numElements()) << name;
      double e = relativeError(*got, expected);
      EXPECT_LT(e, 1e-4) << name;
      if (e >= worstState) {
        worstState = e;
        worstStateName = name;
      }
      ++states;
      continue;
    }

    // BatchNorm running statistics.
    bool isVar = endsWith(name, ".running_var");
    ASSERT_TRUE(isVar || endsWith(name, ".running_mean"))
        << "unexpected state update " << name;
    interp::Tensor torchRef = load(model, "reference/running/" + name + ".npy");
    interp::Tensor onnxRef =
        load(model, "reference/running_onnx/" + name + ".npy");
    ASSERT_TRUE(torchRef && onnxRef);
    ASSERT_EQ(torchRef->type(), got->type()) << name;
    if (isVar) {
      // A PyTorch export's BatchNorm follows PyTorch: input * momentum +
      // unbiased var * (1 - momentum); ONNX's rule takes the population
      // variance (printed for comparison).
      double e = relativeError(*got, doubles(*torchRef));
      EXPECT_LT(e, 1e-5) << name;
      runVar = std::max(runVar, e);
      varVsTorch =
          std::max(varVsTorch, relativeError(*got, doubles(*onnxRef)));
    } else {
      double e = relativeError(*got, doubles(*torchRef));
      EXPECT_LT(e, 1e-5) << name;
      runMean = std::max(runMean, e);
    }
    ++running;
  }

  // Every PyTorch parameter was updated; each has its optimizer state.
  auto buf =
      llvm::MemoryBuffer::getFile(fixture(model, "reference/params.txt"));
  ASSERT_TRUE(bool(buf));
  std::string list = (*buf)->getBuffer().str();
  size_t expected = std::count(list.begin(), list.end(), '\n');
  EXPECT_EQ(params, expected);
  EXPECT_EQ(states, opt == "sgd" ? expected : 2 * expected + 1);
  size_t batchNorms = 0;
  for (const auto &op : g.ops())
    batchNorms += op->kind() == ir::OpKind::BatchNormalization;
  EXPECT_EQ(running, 2 * batchNorms);

  std::printf("[optimizer parity] %-8s %-6s %zu parameters, max relative "
              "error %.3g (%s); optimizer state %.3g (%s)\n",
              model.c_str(), opt.c_str(), params, worst, worstName.c_str(),
              worstState, worstStateName.c_str());
  if (opt == "adamw")
    std::printf("[optimizer parity] %-8s %-6s %zu elements with 0 < |g| < "
                "1e-4 max|g| held to |p - p_ref| <= 2 lr; their max relative "
                "error %.3g\n",
                model.c_str(), opt.c_str(), illConditioned, worstIll);
  if (running)
    std::printf("[optimizer parity] %-8s %-6s %zu BatchNorm running stats: "
                "mean vs PyTorch %.3g, var vs PyTorch %.3g (vs the ONNX "
                "rule's population variance %.3g)\n",
                model.c_str(), opt.c_str(), running, runMean, runVar,
                varVsTorch);
}

INSTANTIATE_TEST_SUITE_P(
    Models, OptimizerParity,
    ::testing::Values(Case{"mlp", "sgd"}, Case{"mlp", "adamw"},
                      Case{"mlp_mse", "sgd"}, Case{"mlp_mse", "adamw"},
                      Case{"gpt", "sgd"}, Case{"gpt", "adamw"},
                      Case{"cnn", "sgd"}, Case{"cnn", "adamw"}),
    [](const ::testing::TestParamInfo<Case> &info) {
      return std::string(info.param.model) + "_" + info.param.optimizer;
    });

} // namespace

} // namespace unit_optimizer_parity
