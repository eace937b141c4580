// Pipelined training equals single-stage training, bit for bit.
//
// For each committed training model (tests/models/training/: an MLP, a GPT
// with a tied embedding, a CNN with BatchNorm) the test compiles plans with
// P = 1, 2 and 4 stages under every schedule, runs 3 SGD steps of M = 4
// microbatches on the CPU executor (one thread per stage, in-process
// messages) with the same data, and requires every trainable parameter,
// every replica of a tied parameter, every BatchNorm running statistic and
// every step's loss to be bit-identical to the one-stage run. A one-stage,
// one-microbatch step must also equal the reference interpreter running
// the unpartitioned training graph (the stage split changes no bit).
#include "codegen/Codegen.h"
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "interp/Interpreter.h"
#include "passes/Pass.h"
#include "runtime/Executor.h"
#include "tools/PipelinePlanning.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

using namespace cleave;

namespace {

std::string fixture(const std::string &model, const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/models/training/" + model +
         "/" + rel;
}

const std::vector<std::string> kTrainingPasses = {
    "remove-identity", "dce", "autodiff", "split-backward", "optimizer"};

std::unique_ptr<ir::Graph> trainingGraph(const std::string &model,
                                         int64_t microbatches) {
  auto g = frontend::importOnnxFile(fixture(model, "model.onnx"), {});
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  passes::PipelineOptions opts;
  opts.context.training.microbatches = microbatches;
  opts.context.training.lr = 0.1;
  opts.context.training.momentum = 0.9;
  if (auto e = passes::runPipeline(**g, kTrainingPasses, opts)) {
    ADD_FAILURE() << llvm::toString(std::move(e));
    return nullptr;
  }
  return std::move(*g);
}

// The fixture's inputs, varied per step and microbatch for float inputs
// (integer inputs are indices and labels: kept as they are).
struct Inputs {
  std::map<std::string, std::shared_ptr<ir::TensorData>> base;

  explicit Inputs(const std::string &model, const ir::Graph &g) {
    for (const ir::Value *v : g.inputs()) {
      auto t = frontend::readNpyFile(fixture(model, "inputs/" + v->name() +
                                                        ".npy"));
      if (!t)
        ADD_FAILURE() << llvm::toString(t.takeError());
      else
        base[v->name()] = *t;
    }
  }
  std::shared_ptr<ir::TensorData> at(const std::string &name, int64_t step,
                                     int mb) const {
    const ir::TensorData &t = *base.at(name);
    if (t.type().dtype != ir::DType::F32)
      return base.at(name);
    std::vector<double> v(size_t(t.type().numElements()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = float(t.getDouble(int64_t(i)) * (1.0 + 0.25 * mb) +
                   0.125 * double(step));
    return ir::TensorData::fromDoubles(t.type().dtype, t.type().shape, v);
  }
  runtime::DataFn forStep(int64_t step) const {
    return [this, step](int mb, const std::string &name, void *dst,
                        size_t bytes) -> llvm::Error {
      auto t = at(name, step, mb);
      if (t->bytes().size() != bytes)
        return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                       "size mismatch for " + name);
      std::memcpy(dst, t->bytes().data(), bytes);
      return llvm::Error::success();
    };
  }
};

struct Trained {
  std::map<std::string, std::vector<uint8_t>> state; // params and buffers
  std::vector<double> losses;
  bool ok = false;
};

Trained train(const std::string &model, int stages, int64_t microbatches,
              const std::string &schedule, int steps) {
  Trained out;
  auto g = trainingGraph(model, microbatches);
  if (!g)
    return out;
  tools::PlanningRequest req;
  req.stages = stages;
  req.microbatches = microbatches;
  req.schedule = schedule;
  req.costModel = "uniform";
  auto planned = tools::planPipeline(*g, req);
  if (!planned) {
    ADD_FAILURE() << llvm::toString(planned.takeError());
    return out;
  }
  codegen::PlanInfo info;
  info.modelName = model;
  info.lossName = g->outputs()[0]->name();
  info.optimizer = "sgd";
  info.lr = 0.1;
  auto plan = codegen::buildPlan(planned->stageGraphs, planned->schedule, info);
  if (!plan) {
    ADD_FAILURE() << llvm::toString(plan.takeError());
    return out;
  }
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  auto comms = runtime::createInProcessComms(stages);
  std::vector<std::unique_ptr<runtime::StageExecutor>> execs;
  std::vector<runtime::StageExecutor *> raw;
  for (int s = 0; s < stages; ++s) {
    backends.push_back(runtime::createCpuBackend(1));
    auto ex = runtime::StageExecutor::create(*plan, s, *backends.back(),
                                             *comms[s]);
    if (!ex) {
      ADD_FAILURE() << llvm::toString(ex.takeError());
      return out;
    }
    execs.push_back(std::move(*ex));
    raw.push_back(execs.back().get());
  }
  Inputs inputs(model, *g);
  for (int step = 0; step < steps; ++step) {
    if (auto e = runtime::runPipelineThreads(raw, step, inputs.forStep(step))) {
      ADD_FAILURE() << llvm::toString(std::move(e));
      return out;
    }
    for (auto &ex : execs)
      if (ex->hasLoss())
        out.losses.push_back(ex->lastLoss());
  }
  // Every declared parameter and buffer of the model, from every stage that
  // holds one: replicas must agree.
  for (const ir::Value *v : g->declared()) {
    if (v->kind() == ir::ValueKind::Const)
      continue;
    for (auto &ex : execs) {
      if (ex->findSlot(v->name()) < 0)
        continue;
      auto bytes = ex->readSlot(v->name());
      if (!bytes) {
        ADD_FAILURE() << llvm::toString(bytes.takeError());
        return out;
      }
      auto [it, fresh] = out.state.try_emplace(v->name(), *bytes);
      EXPECT_TRUE(fresh || it->second == *bytes)
          << "replicas of " << v->name() << " differ on stage "
          << ex->stage();
    }
  }
  out.ok = true;
  return out;
}

void expectSame(const Trained &ref, const Trained &got,
                const std::string &what) {
  ASSERT_TRUE(ref.ok && got.ok) << what;
  EXPECT_EQ(ref.losses, got.losses) << what;
  ASSERT_EQ(ref.state.size(), got.state.size()) << what;
  for (const auto &[name, bytes] : ref.state) {
    auto it = got.state.find(name);
    ASSERT_NE(it, got.state.end()) << what << ": " << name << " missing";
    EXPECT_TRUE(it->second == bytes) << what << ": " << name << " differs";
  }
}

const char *const kSchedules[] = {"gpipe",    "1f1b",  "gpipe-2bp",
                                  "1f1b-2bp", "zb-h1", "zb-h2"};

class PipelineParity : public testing::TestWithParam<const char *> {};

TEST_P(PipelineParity, EveryScheduleAndStageCountMatchesOneStage) {
  std::string model = GetParam();
  Trained ref = train(model, 1, 4, "1f1b", 3);
  ASSERT_TRUE(ref.ok);
  ASSERT_EQ(ref.losses.size(), 3u);
  EXPECT_NE(ref.losses[0], ref.losses[2]) << "training changed nothing";
  for (int p : {2, 4})
    for (const char *s : kSchedules)
      expectSame(ref, train(model, p, 4, s, 3),
                 model + " P=" + std::to_string(p) + " " + s);
}

// One stage, one microbatch, one step against the interpreter running the
// unpartitioned training graph: the updated parameters are its outputs.
TEST_P(PipelineParity, OneStageStepEqualsInterpreter) {
  std::string model = GetParam();
  Trained got = train(model, 1, 1, "1f1b", 1);
  ASSERT_TRUE(got.ok);
  auto g = trainingGraph(model, 1);
  ASSERT_TRUE(g);
  Inputs inputs(model, *g);
  std::vector<interp::Tensor> in;
  for (const ir::Value *v : g->inputs())
    in.push_back(inputs.at(v->name(), 0, 0));
  static auto backend = runtime::createCpuBackend(1);
  auto interp = interp::Interpreter::create(*g, *backend);
  ASSERT_TRUE(bool(interp)) << llvm::toString(interp.takeError());
  auto outs = (*interp)->run(in);
  ASSERT_TRUE(bool(outs)) << llvm::toString(outs.takeError());
  EXPECT_EQ(got.losses[0], (*outs)[0]->getDouble(0));
  int compared = 0;
  for (const ir::StateUpdate &u : g->updates()) {
    auto it = got.state.find(u.state->name());
    if (it == got.state.end())
      continue; // optimizer state: not a model tensor
    for (size_t k = 0; k < g->outputs().size(); ++k)
      if (g->outputs()[k] == u.value) {
        llvm::ArrayRef<uint8_t> want = (*outs)[k]->bytes();
        EXPECT_TRUE(std::equal(want.begin(), want.end(), it->second.begin(),
                               it->second.end()))
            << u.state->name() << " differs from the interpreter";
        ++compared;
      }
  }
  EXPECT_GT(compared, 3);
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineParity,
                         testing::Values("mlp", "gpt", "cnn"),
                         [](const auto &info) {
                           return std::string(info.param);
                         });

} // namespace
