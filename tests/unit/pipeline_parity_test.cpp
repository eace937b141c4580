// Pipelined training equals single-stage training, bit for bit.
//
// For each committed training model (tests/models/training/: an MLP, a GPT
// with a tied embedding, a CNN with BatchNorm) the test compiles plans with
// P = 1, 2 and 4 stages (3 for the three-layer mlp_mse) under every schedule, runs 3 SGD steps of M = 4
// microbatches on the CPU executor (one thread per stage, in-process
// messages) with the same data, and requires every trainable parameter,
// every replica of a tied parameter, every BatchNorm running statistic and
// every step's loss to be bit-identical to the one-stage run. A one-stage,
// one-microbatch step must also equal the reference interpreter running
// the unpartitioned training graph (the stage split changes no bit).
#include "codegen/Codegen.h"
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "interp/Interpreter.h"
#include "passes/Pass.h"
#include "passes/schedule/Generators.h"
#include "runtime/cuda/Lowering.h"
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"
#endif
#include "runtime/Executor.h"
#include "runtime/Trainer.h"
#include "tools/PipelinePlanning.h"

#include "llvm/Support/FileSystem.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <set>

namespace unit_pipeline_parity {

using namespace cleave;

namespace {

std::string fixture(const std::string &model, const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/models/training/" + model +
         "/" + rel;
}

// recognize-attention as cleavec runs it: the gpt fixture's masked_fill
// attention trains through FusedAttention against PyTorch's own step.
const std::vector<std::string> kTrainingPasses = {
    "remove-identity", "recognize-attention", "dce",
    "mixed-precision", "autodiff",            "split-backward",
    "optimizer"};

std::unique_ptr<ir::Graph> trainingGraph(const std::string &model,
                                         int64_t microbatches,
                                         int64_t replicas = 1,
                                         const std::string &precision = "f32") {
  auto g = frontend::importOnnxFile(fixture(model, "model.onnx"), {});
  if (!g) {
    ADD_FAILURE() << llvm::toString(g.takeError());
    return nullptr;
  }
  passes::PipelineOptions opts;
  opts.context.training.microbatches = microbatches;
  opts.context.training.dataParallel = replicas;
  opts.context.training.lr = 0.1;
  opts.context.training.momentum = 0.9;
  opts.context.training.precision = precision;
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
      auto t = runtime::readNpyFile(fixture(model, "inputs/" + v->name() +
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
  // Per step, when the step was skipped for non-finite values: what the
  // first stage that found one reported; else empty.
  std::vector<std::string> skipped;
  bool ok = false;
  // W batching: products run batched, and the products they replaced.
  int64_t batched = 0, replaced = 0;
};

using DataForStep = std::function<runtime::DataFn(int64_t step)>;

Trained train(const std::string &model, int stages, int64_t microbatches,
              const std::string &schedule, int steps,
              DataForStep data = nullptr, int replicas = 1,
              runtime::StageExecutor::NonFinitePolicy policy =
                  runtime::StageExecutor::NonFinitePolicy::Ignore,
              const std::string &precision = "f32",
              const std::string &device = "cpu", bool batchW = false,
              int chunks = 1, bool overlap = false) {
  Trained out;
  auto g = trainingGraph(model, microbatches, replicas, precision);
  if (!g)
    return out;
  tools::PlanningRequest req;
  req.stages = stages;
  req.chunks = chunks;
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
  info.dataParallel = replicas;
  auto plan = codegen::buildPlan(planned->stageGraphs, planned->schedule, info);
  if (!plan) {
    ADD_FAILURE() << llvm::toString(plan.takeError());
    return out;
  }
  // The runtime's own wiring and training loop (runtime/Stages.h,
  // runtime/Trainer.h), as cleave-run uses them: executor r * stages + s
  // is stage s of replica r.
  runtime::StageOptions opts;
  opts.device = device;
  opts.threads = 1;
  opts.nonFinite = policy;
  opts.batchW = batchW;
  auto pipeline = runtime::createThreadedPipeline(*plan, opts);
  if (!pipeline) {
    ADD_FAILURE() << llvm::toString(pipeline.takeError());
    return out;
  }
  std::vector<runtime::LocalStage *> locals;
  std::vector<runtime::StageExecutor *> execsRaw;
  for (runtime::LocalStage &st : (*pipeline)->stages) {
    locals.push_back(&st);
    execsRaw.push_back(st.executor.get());
  }
  Inputs inputs(model, *g);
  if (!data)
    data = [&](int64_t step) { return inputs.forStep(step); };
  // Replica r's microbatch m is microbatch r * M + m of the step.
  runtime::StepData feed = [&](int64_t step, int r) {
    runtime::DataFn all = data(step);
    return runtime::DataFn([all, r, microbatches](int mb, const std::string &n,
                                                  void *dst, size_t bytes) {
      return all(int(r * microbatches + mb), n, dst, bytes);
    });
  };
  auto driver = runtime::createSingleProcessDriver();
  runtime::TrainOptions topt;
  topt.steps = steps;
  topt.skipNonFinite =
      policy == runtime::StageExecutor::NonFinitePolicy::SkipStep;
  topt.overlapSteps = overlap;
  runtime::Trainer trainer(*plan, locals, *driver, feed, topt);
  auto e = trainer.run([&](const runtime::StepReport &r) {
    out.losses.push_back(r.loss);
    out.skipped.push_back(r.skipped.value_or(""));
    // Overlapping, the executors are in later steps by now.
    if (!overlap) {
      for (runtime::StageExecutor *ex : execsRaw)
        EXPECT_EQ(ex->stepSkipped(), execsRaw[0]->stepSkipped())
            << "the stages disagree on skipping step " << r.step;
    }
  });
  if (e) {
    ADD_FAILURE() << llvm::toString(std::move(e));
    return out;
  }
  std::vector<runtime::StageExecutor *> &execs = execsRaw;
  // Every declared parameter and buffer of the model, from every stage that
  // holds one: replicas must agree.
  for (const ir::Value *v : g->declared()) {
    if (v->kind() == ir::ValueKind::Const)
      continue;
    for (size_t i = 0; i < execs.size(); ++i) {
      auto &ex = execs[i];
      if (ex->findSlot(v->name()) < 0)
        continue;
      // Data-parallel replicas keep their own BatchNorm statistics.
      if (i >= size_t(stages * chunks) &&
          v->name().find("running_") != std::string::npos)
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
  for (auto &ex : execs) {
    out.batched += ex->batchedProducts();
    out.replaced += ex->replacedProducts();
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
  // mlp_mse has three layers.
  for (int p : {2, model == "mlp_mse" ? 3 : 4})
    for (const char *s : kSchedules)
      expectSame(ref, train(model, p, 4, s, 3),
                 model + " P=" + std::to_string(p) + " " + s);
}

// Several stages per rank (cleavec --chunks): every interleaved, looping
// and V schedule trains to the one-stage bits, the stages of a rank taking
// turns on one thread; with a NaN in step 1 every stage skips that update;
// and two data-parallel replicas of a V pipeline agree with each other.
TEST_P(PipelineParity, SeveralStagesPerRankMatchOneStage) {
  std::string model = GetParam();
  using Policy = runtime::StageExecutor::NonFinitePolicy;
  Trained ref = train(model, 1, 4, "1f1b", 3);
  ASSERT_TRUE(ref.ok);
  // mlp_mse has three layers: one rank with both of its stages.
  int ranks = model == "mlp_mse" ? 1 : 2;
  for (const std::string &s : passes::schedule::chunkedScheduleNames())
    expectSame(ref,
               train(model, ranks, 4, s, 3, nullptr, 1, Policy::Ignore, "f32",
                     "cpu", false, 2),
               model + " " + std::to_string(ranks) + " ranks x 2 " + s);
  // The vote on non-finite values among stages that share a rank.
  Trained skipping = train(model, ranks, 4, "zb-v", 3, nullptr, 1,
                           Policy::SkipStep, "f32", "cpu", false, 2);
  expectSame(ref, skipping, model + " zb-v, voting");
  Trained dp = train(model, ranks, 2, "zb-v", 2, nullptr, 2, Policy::Stop,
                     "f32", "cpu", false, 2);
  EXPECT_TRUE(dp.ok) << model << " zb-v, 2 replicas";
}

// Overlapping steps (cleave-run --overlap-steps: each rank goes on to the
// next step as soon as its own update is done) give the isolated steps'
// bits, with one and with several stages per rank, with the non-finite
// check on and off; a NaN in step 1 under skip-step is skipped as in
// isolated steps.
TEST_P(PipelineParity, OverlappingStepsMatchIsolatedSteps) {
  std::string model = GetParam();
  using Policy = runtime::StageExecutor::NonFinitePolicy;
  Trained ref = train(model, 1, 4, "1f1b", 4);
  ASSERT_TRUE(ref.ok);
  int p = model == "mlp_mse" ? 3 : 4;
  for (const char *s : {"1f1b", "zb-h2"})
    for (Policy policy : {Policy::Ignore, Policy::Stop})
      expectSame(ref,
                 train(model, p, 4, s, 4, nullptr, 1, policy, "f32", "cpu",
                       false, 1, /*overlap=*/true),
                 model + " P=" + std::to_string(p) + " " + s + " overlapping");
  int ranks = model == "mlp_mse" ? 1 : 2;
  expectSame(ref,
             train(model, ranks, 4, "zb-v", 4, nullptr, 1, Policy::Ignore,
                   "f32", "cpu", false, 2, /*overlap=*/true),
             model + " zb-v overlapping");
}

// --precision bf16: pipelined training is bit-identical to one stage for
// every stage count and schedule (the casts are ops like any other, and the
// per-microbatch weight gradients are summed in f32 in the same order);
// three steps stay within bf16 tolerance of f32 training without equalling
// it.
TEST_P(PipelineParity, Bf16EveryScheduleMatchesOneStageAndTracksF32) {
  std::string model = GetParam();
  auto ignore = runtime::StageExecutor::NonFinitePolicy::Ignore;
  Trained ref = train(model, 1, 4, "1f1b", 3, nullptr, 1, ignore, "bf16");
  ASSERT_TRUE(ref.ok);
  for (int p : {2, model == "mlp_mse" ? 3 : 4})
    for (const char *s : kSchedules)
      expectSame(ref,
                 train(model, p, 4, s, 3, nullptr, 1, ignore, "bf16"),
                 model + " bf16 P=" + std::to_string(p) + " " + s);
  Trained f32 = train(model, 1, 4, "1f1b", 3);
  ASSERT_TRUE(f32.ok);
  ASSERT_EQ(f32.losses.size(), ref.losses.size());
  double worst = 0;
  for (size_t k = 0; k < f32.losses.size(); ++k)
    worst = std::max(worst, std::abs(ref.losses[k] - f32.losses[k]) /
                                std::abs(f32.losses[k]));
  EXPECT_LT(worst, 1e-2);
  EXPECT_NE(ref.state, f32.state) << "bf16 training equals f32 training";
  std::printf("[pipeline bf16] %-8s losses within %.3g of f32\n",
              model.c_str(), worst);
}

// The largest relative difference of two runs' losses, and of their float
// parameters and buffers (each relative to its largest element; BatchNorm
// running statistics left out, optimizer velocities unless withMomentum).
std::pair<double, double> differences(const Trained &ref, const Trained &got,
                                      bool withMomentum) {
  double lossErr = 0, paramErr = 0;
  for (size_t k = 0; k < ref.losses.size() && k < got.losses.size(); ++k)
    lossErr = std::max(lossErr, std::abs(ref.losses[k] - got.losses[k]) /
                                    std::abs(ref.losses[k]));
  for (const auto &[name, bytes] : ref.state) {
    auto it = got.state.find(name);
    if (bytes.size() % 4 || name.find("running_") != std::string::npos ||
        (!withMomentum && name.find(".momentum") != std::string::npos) ||
        it == got.state.end() || it->second.size() != bytes.size())
      continue;
    const float *a = reinterpret_cast<const float *>(bytes.data());
    const float *b = reinterpret_cast<const float *>(it->second.data());
    double diff = 0, scale = 1e-6;
    for (size_t i = 0; i < bytes.size() / 4; ++i) {
      diff = std::max(diff, double(std::abs(a[i] - b[i])));
      scale = std::max(scale, double(std::abs(a[i])));
    }
    paramErr = std::max(paramErr, diff / scale);
  }
  return {lossErr, paramErr};
}

// The CUDA backend's kernels (lowered to device steps, run on the host by
// the emulated backend) train three steps of every committed model (the
// CNN's convolutions, pools and batch norms included), on two stages, f32
// and bf16, and agree with the CPU backend: losses within 1e-5 (f32) or
// 1e-3 (bf16, where a sum that lands near a rounding boundary rounds the
// other way), parameters within 1e-4 or 1e-2 of their largest element.
void cudaTrainsLikeTheCpu(const std::string &model, const std::string &device) {
  auto ignore = runtime::StageExecutor::NonFinitePolicy::Ignore;
  for (const char *precision : {"f32", "bf16"}) {
    SCOPED_TRACE(precision);
    bool bf16 = std::string(precision) == "bf16";
    Trained cpu = train(model, 2, 4, "zb-h1", 3, nullptr, 1, ignore, precision);
    Trained cuda = train(model, 2, 4, "zb-h1", 3, nullptr, 1, ignore, precision,
                         device);
    ASSERT_TRUE(cpu.ok && cuda.ok);
    auto [lossErr, paramErr] = differences(cpu, cuda, /*withMomentum=*/true);
    // On a GPU, cuDNN's bf16 convolutions (tensor cores) sum in another
    // order than the CPU's and round some sums the other way; the CNN's
    // BatchNorm over 4 samples carries that into every parameter. Measured
    // on an H200: the CNN's bf16 parameters within 0.035 of the CPU's
    // (1.9e-5 with CLEAVE_CUDNN=0), its loss within 1.2e-3, while its bf16
    // gradients are as close to PyTorch's as the CPU's are
    // (TrainingParity.CudaBf16GradientsMatchPyTorchBf16: 0.0125 both).
    bool cudnnBf16 = bf16 && device == "cuda";
    EXPECT_LT(lossErr, cudnnBf16 ? 3e-3 : bf16 ? 1e-3 : 1e-5);
    EXPECT_LT(paramErr, cudnnBf16 ? 5e-2 : bf16 ? 1e-2 : 1e-4);
    std::printf("[%s] %-8s %s: losses within %.2g, parameters "
                "within %.2g of the CPU's\n",
                device.c_str(), model.c_str(), precision, lossErr, paramErr);
  }
}

TEST_P(PipelineParity, CudaKernelsTrainLikeTheCpu) {
  cudaTrainsLikeTheCpu(GetParam(), "cuda-emulated");
}

// The same on a GPU: both stages on GPU 0, each its own stream (the
// pipeline machinery on one device). Skips where no GPU is visible.
TEST_P(PipelineParity, CudaDeviceTrainsLikeTheCpu) {
  std::string model = GetParam();
#ifdef CLEAVE_HAVE_CUDA
  auto count = runtime::cudaDeviceCount();
  if (!count)
    GTEST_SKIP() << llvm::toString(count.takeError());
  cudaTrainsLikeTheCpu(model, "cuda");
#else
  GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// W batching (setBatchW): schedules that put W actions of consecutive
// microbatches next to each other (gpipe-2bp: all of them; zb-h1 and
// 1f1b-2bp: the last ones) run their weight-gradient products once over the
// concatenated operands. Training matches the unbatched run up to the
// order of the sums: losses within 1e-6 (f32) or 1e-3 (bf16, where a
// rounding step may flip), parameters and optimizer state within 1e-5 of
// their largest element (f32), parameters within 1e-2 (bf16: a batched
// product rounds its sum once, not each microbatch's part; the CNN's
// velocities, small sums with cancellation, then differ by a few percent);
// and products were batched, each replacing several.
TEST_P(PipelineParity, BatchedWTrainsLikeUnbatched) {
  std::string model = GetParam();
  auto ignore = runtime::StageExecutor::NonFinitePolicy::Ignore;
  for (const char *precision : {"f32", "bf16"})
    for (const char *schedule : {"gpipe-2bp", "zb-h1"}) {
      SCOPED_TRACE(std::string(precision) + " " + schedule);
      bool bf16 = std::string(precision) == "bf16";
      Trained ref = train(model, 2, 4, schedule, 3, nullptr, 1, ignore,
                          precision);
      Trained got = train(model, 2, 4, schedule, 3, nullptr, 1, ignore,
                          precision, "cpu", /*batchW=*/true);
      ASSERT_TRUE(ref.ok && got.ok);
      EXPECT_EQ(ref.batched, 0);
      EXPECT_GT(got.batched, 0);
      EXPECT_GT(got.replaced, got.batched);
      auto [lossErr, paramErr] = differences(ref, got, !bf16);
      EXPECT_LT(lossErr, bf16 ? 1e-3 : 1e-6);
      EXPECT_LT(paramErr, bf16 ? 1e-2 : 1e-5);
      std::printf("[batch-w] %-8s %s %-9s: %lld products batched for %lld; "
                  "losses within %.2g, parameters within %.2g\n",
                  model.c_str(), precision, schedule, (long long)got.batched,
                  (long long)got.replaced, lossErr, paramErr);
    }
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

// Three steps of M = 4 microbatches on two stages (zb-h1) against PyTorch's
// SGD (lr 0.1, momentum 0.9, loss / 4 per microbatch) on the same data:
// tests/models/training/<model>/steps/ from export_training.py. Prints the
// largest relative error per model; requires it below 1e-4.
double relativeError(const std::vector<uint8_t> &got,
                     const ir::TensorData &ref) {
  double diff = 0, scale = 0;
  const auto *g = reinterpret_cast<const float *>(got.data());
  for (int64_t i = 0; i < ref.type().numElements(); ++i) {
    diff = std::max(diff, std::abs(double(g[i]) - ref.getDouble(i)));
    scale = std::max(scale, std::abs(ref.getDouble(i)));
  }
  return diff / std::max(scale, 1e-6);
}

// Three SGD steps (lr 0.1, momentum 0.9) of 4 microbatches on 2 stages
// (ZB-H1) of `model`'s fixture: the losses and the trained tensors as
// PyTorch's (steps/losses.npy, steps/params, steps/buffers).
void expectThreeStepsMatchPyTorchSgd(const std::string &model) {
  auto g = trainingGraph(model, 4);
  ASSERT_TRUE(g);
  std::map<std::string, std::shared_ptr<ir::TensorData>> arrays;
  for (const ir::Value *v : g->inputs()) {
    auto t = runtime::readNpyFile(fixture(model, "steps/data/" + v->name() +
                                                      ".npy"));
    ASSERT_TRUE(bool(t)) << llvm::toString(t.takeError());
    arrays[v->name()] = *t;
  }
  DataForStep data = [&](int64_t step) -> runtime::DataFn {
    return [&arrays, step](int mb, const std::string &name, void *dst,
                           size_t bytes) -> llvm::Error {
      const ir::TensorData &t = *arrays.at(name);
      size_t offset = size_t(step * 4 + mb) * bytes;
      if (offset + bytes > t.bytes().size())
        return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                       "fixture too short for " + name);
      std::memcpy(dst, t.bytes().data() + offset, bytes);
      return llvm::Error::success();
    };
  };
  Trained got = train(model, 2, 4, "zb-h1", 3, data);
  ASSERT_TRUE(got.ok);
  auto losses = runtime::readNpyFile(fixture(model, "steps/losses.npy"));
  ASSERT_TRUE(bool(losses)) << llvm::toString(losses.takeError());
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(got.losses[s], (*losses)->getDouble(s),
                1e-5 * std::abs((*losses)->getDouble(s)))
        << "step " << s;
  double worst = 0;
  int compared = 0;
  for (const ir::Value *v : g->declared()) {
    // BatchNorm statistics by PyTorch's rule (unbiased running variance):
    // the importer gives a PyTorch export's BatchNorms that rule.
    std::string dir = v->kind() == ir::ValueKind::Param ? "steps/params/"
                                                        : "steps/buffers/";
    std::string file = fixture(model, dir + v->name() + ".npy");
    if (v->kind() == ir::ValueKind::Const || !llvm::sys::fs::exists(file))
      continue;
    auto ref = runtime::readNpyFile(file);
    ASSERT_TRUE(bool(ref)) << llvm::toString(ref.takeError());
    ASSERT_TRUE(got.state.count(v->name())) << v->name();
    double err = relativeError(got.state.at(v->name()), **ref);
    EXPECT_LT(err, 1e-4) << v->name();
    worst = std::max(worst, err);
    ++compared;
  }
  EXPECT_GT(compared, 3);
  std::printf("%s: %d tensors after 3 SGD steps on 2 stages (zb-h1), largest "
              "relative error against PyTorch %.3g\n",
              model.c_str(), compared, worst);
}

TEST_P(PipelineParity, ThreeStepsMatchPyTorchSgd) {
  expectThreeStepsMatchPyTorchSgd(GetParam());
}

// The corpus's row_fill (a matrix filled a row at a time, as the chunked
// delta rule of Qwen3.5 and OLMo-Hybrid): its scatters write over their
// operand and its selects' and slices' gradients add into the running sum
// in the plan's own bytes (passes/MemoryPlan.h inPlaceOperand), which the
// interpreter-based corpus tests do not run.
TEST(PipelineParityCorpus, RowFillThreeStepsMatchPyTorchSgd) {
  for (const char *m : {"../corpus/row_fill-dynamo", "../corpus/row_fill-legacy"}) {
    SCOPED_TRACE(m);
    expectThreeStepsMatchPyTorchSgd(m);
  }
}

// Two data-parallel replicas of a two-stage pipeline, two microbatches
// each, against one pipeline with four microbatches on the same samples:
// the same update up to the order of the gradient additions.
TEST_P(PipelineParity, DataParallelReplicasMatchMoreMicrobatches) {
  std::string model = GetParam();
  Trained one = train(model, 2, 4, "1f1b", 3);
  Trained two = train(model, 2, 2, "zb-h1", 3, nullptr, 2);
  ASSERT_TRUE(one.ok && two.ok);
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(one.losses[s], two.losses[s], 1e-5 * std::abs(one.losses[s]));
  int compared = 0;
  for (const auto &[name, bytes] : one.state) {
    if (name.find("running_") != std::string::npos)
      continue; // each replica keeps its own BatchNorm statistics
    const auto *a = reinterpret_cast<const float *>(bytes.data());
    const auto *b = reinterpret_cast<const float *>(two.state.at(name).data());
    double diff = 0, scale = 1e-6;
    for (size_t i = 0; i < bytes.size() / 4; ++i) {
      diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
      scale = std::max(scale, std::abs(double(a[i])));
    }
    EXPECT_LT(diff / scale, 1e-5) << name;
    ++compared;
  }
  EXPECT_GT(compared, 3);
}

// A NaN in one sample of step 1: every stage skips that step's update (the
// stage that saw it says what), and the run ends where a run without step
// 1 would.
TEST_P(PipelineParity, NonFiniteGradientsSkipTheStepOnEveryStage) {
  std::string model = GetParam();
  auto g = trainingGraph(model, 4);
  ASSERT_TRUE(g);
  Inputs inputs(model, *g);
  std::string floatInput;
  for (const ir::Value *v : g->inputs())
    if (v->type().dtype == ir::DType::F32)
      floatInput = v->name();
  if (floatInput.empty())
    GTEST_SKIP() << model << " has no float input to poison";
  auto poisoned = [&](std::set<int64_t> nanSteps, std::vector<int64_t> order) {
    return [&inputs, floatInput, nanSteps, order](int64_t step) {
      int64_t real = order[size_t(step)];
      runtime::DataFn base = inputs.forStep(real);
      return runtime::DataFn([=](int mb, const std::string &name, void *dst,
                                 size_t bytes) -> llvm::Error {
        if (auto e = base(mb, name, dst, bytes))
          return e;
        if (nanSteps.count(real) && mb == 2 && name == floatInput)
          static_cast<float *>(dst)[0] = NAN;
        return llvm::Error::success();
      });
    };
  };
  using Policy = runtime::StageExecutor::NonFinitePolicy;
  Trained got = train(model, 2, 4, "zb-h1", 3, poisoned({1}, {0, 1, 2}), 1,
                      Policy::SkipStep);
  ASSERT_TRUE(got.ok);
  ASSERT_EQ(got.skipped.size(), 3u);
  EXPECT_EQ(got.skipped[0], "");
  EXPECT_NE(got.skipped[1], "");
  EXPECT_NE(got.skipped[1].find("nan"), std::string::npos)
      << got.skipped[1];
  EXPECT_EQ(got.skipped[2], "");
  std::printf("%s: %s\n", model.c_str(), got.skipped[1].c_str());
  // Overlapping steps skip it the same way.
  Trained overlapped = train(model, 2, 4, "zb-h1", 3, poisoned({1}, {0, 1, 2}),
                             1, Policy::SkipStep, "f32", "cpu", false, 1,
                             /*overlap=*/true);
  ASSERT_TRUE(overlapped.ok);
  EXPECT_EQ(overlapped.skipped, got.skipped);
  ASSERT_EQ(overlapped.losses.size(), got.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) // the NaN's bits too
    EXPECT_EQ(std::memcmp(&overlapped.losses[i], &got.losses[i], sizeof(double)), 0)
        << "step " << i;
  for (const auto &[name, bytes] : got.state)
    EXPECT_TRUE(overlapped.state.at(name) == bytes) << name << " (overlapping)";
  // The same as steps 0 and 2 alone.
  Trained want = train(model, 2, 4, "zb-h1", 2, poisoned({}, {0, 2}), 1,
                       Policy::SkipStep);
  ASSERT_TRUE(want.ok);
  for (const auto &[name, bytes] : want.state) {
    if (name.find("running_") != std::string::npos)
      continue; // the forward of step 1 still moved them
    EXPECT_TRUE(got.state.at(name) == bytes) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PipelineParity,
                         testing::Values("mlp", "gpt", "cnn", "mlp_mse"),
                         [](const auto &info) {
                           return std::string(info.param);
                         });

} // namespace

} // namespace unit_pipeline_parity
