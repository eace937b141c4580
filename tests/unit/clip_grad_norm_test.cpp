// Gradient clipping by global norm and learning-rate schedules through the
// runtime's own threaded pipeline and Trainer, as cleave-run trains:
//   - one clipped SGD step of the committed MLP against PyTorch: the
//     fixture's gradients (torch autograd, tests/models/training/mlp/
//     reference) give the norm and clip_grad_norm_'s update, computed
//     here;
//   - clipped and scheduled runs of the MLP and of the GPT with a tied
//     embedding on 2 stages (several schedules, kernel threads, overlapping
//     steps) equal to one stage bit for bit, norms included;
//   - a plan that cannot clip is refused in one line.
#include "runtime/Kernel.h"
#include "runtime/Trainer.h"
#include "runtime/data/DataSource.h"
#include "runtime/data/NumpyFiles.h"

#include "TestPlans.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace unit_clip_grad_norm {

using namespace cleave;

namespace {

struct RunResult {
  std::map<std::string, std::vector<uint8_t>> tensors;
  std::vector<double> losses, norms, lrs;
  std::string error;
};

// Trains `plan` for `steps` steps on `data` (a folder, or synthetic with
// seed 3 when empty) and returns the trained tensors and the reports.
RunResult train(const runtime::Plan &plan, int64_t steps, double clip,
                std::optional<runtime::LrSchedule> schedule,
                const std::string &data = "", int64_t threads = 1,
                bool overlap = false,
                std::map<std::string, std::vector<uint8_t>> *initial = nullptr) {
  RunResult out;
  runtime::StageOptions so;
  so.clipGradNorm = clip;
  so.threads = threads;
  runtime::TrainOptions to;
  to.steps = steps;
  to.lrSchedule = schedule;
  to.overlapSteps = overlap;
  runtime::DataSource source(plan, 3);
  if (!data.empty())
    if (auto e = source.load(data)) {
      out.error = llvm::toString(std::move(e));
      return out;
    }
  auto pipe = runtime::createThreadedPipeline(plan, so);
  if (!pipe) {
    out.error = llvm::toString(pipe.takeError());
    return out;
  }
  auto driver = runtime::createSingleProcessDriver();
  runtime::Trainer trainer(
      plan, (*pipe)->locals(), *driver,
      [&](int64_t step, int replica) { return source.forStep(step, replica); },
      to);
  std::vector<std::string> names;
  for (const runtime::PlanTensor &t : plan.modelTensors)
    names.push_back(t.name);
  if (initial) {
    auto t = trainer.tensors(names);
    if (t)
      *initial = *t;
    else
      out.error = llvm::toString(t.takeError());
  }
  if (auto e = trainer.run([&](const runtime::StepReport &r) {
        out.losses.push_back(r.loss);
        out.norms.push_back(r.gradNorm.value_or(NAN));
        out.lrs.push_back(r.lr.value_or(NAN));
      })) {
    out.error = llvm::toString(std::move(e));
    return out;
  }
  auto t = trainer.tensors(names);
  if (!t) {
    out.error = llvm::toString(t.takeError());
    return out;
  }
  out.tensors = *t;
  return out;
}

std::string fixture(const std::string &rel) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/models/training/mlp/" + rel;
}

std::vector<double> asDoubles(const std::vector<uint8_t> &bytes) {
  std::vector<double> v(bytes.size() / sizeof(float));
  for (size_t i = 0; i < v.size(); ++i) {
    float f;
    std::memcpy(&f, bytes.data() + i * sizeof f, sizeof f);
    v[i] = f;
  }
  return v;
}

} // namespace

// One SGD step (lr 0.1; momentum's first step is plain SGD) with
// clip_grad_norm_(max_norm = a quarter of the gradient's norm) on the
// fixture's batch: the parameters torch.nn.utils.clip_grad_norm_ and
// torch.optim.SGD give, p - lr * g * X / (norm + 1e-6), from torch's own
// gradients.
TEST(ClipGradNorm, OneStepMatchesTorchClipGradNorm) {
  auto plan = testsupport::compileTrainingPlan("mlp", 1, 1, "1f1b");
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  std::map<std::string, std::vector<double>> grads;
  double sumSq = 0;
  for (const runtime::PlanTensor &t : plan->modelTensors) {
    auto g = runtime::readNpyFile(fixture("reference/grad." + t.name + ".npy"));
    ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
    std::vector<double> &v = grads[t.name];
    for (int64_t i = 0; i < (*g)->type().numElements(); ++i) {
      v.push_back((*g)->getDouble(i));
      sumSq += v.back() * v.back();
    }
  }
  double norm = std::sqrt(sumSq), maxNorm = norm / 4;
  double coef = maxNorm / (norm + 1e-6);
  std::map<std::string, std::vector<uint8_t>> initial;
  RunResult r = train(*plan, 1, maxNorm, std::nullopt, fixture("inputs"), 1,
                      false, &initial);
  ASSERT_EQ(r.error, "");
  ASSERT_EQ(r.norms.size(), 1u);
  EXPECT_NEAR(r.norms[0], norm, 1e-5 * norm);
  double worst = 0;
  for (const auto &[name, g] : grads) {
    std::vector<double> p0 = asDoubles(initial[name]),
                        p1 = asDoubles(r.tensors[name]);
    ASSERT_EQ(p0.size(), g.size()) << name;
    ASSERT_EQ(p1.size(), g.size()) << name;
    double diff = 0, scale = 1e-6;
    for (size_t i = 0; i < g.size(); ++i) {
      double want = p0[i] - 0.1 * coef * g[i];
      diff = std::max(diff, std::abs(p1[i] - want));
      scale = std::max(scale, std::abs(want));
    }
    worst = std::max(worst, diff / scale);
  }
  EXPECT_LT(worst, 1e-6);
  std::printf("norm %.9g (torch's gradients: %.9g), clipped to %.9g; largest "
              "relative parameter error %.3g\n",
              r.norms[0], norm, maxNorm, worst);
}

// Clipped, scheduled runs on 2 stages equal one stage bit for bit.
TEST(ClipGradNorm, PipelinedRunsEqualOneStageBitForBit) {
  runtime::LrSchedule s;
  s.peak = 0.2;
  s.warmupSteps = 1;
  s.decay = runtime::LrSchedule::Decay::Cosine;
  s.minLr = 0.01;
  s.decaySteps = 4;
  for (const char *model : {"mlp", "gpt"}) {
    SCOPED_TRACE(model);
    auto one = testsupport::compileTrainingPlan(model, 1, 4, "1f1b");
    ASSERT_TRUE(bool(one)) << llvm::toString(one.takeError());
    // A norm of 0.05 clips every step of both models.
    RunResult want = train(*one, 4, 0.05, s);
    ASSERT_EQ(want.error, "");
    ASSERT_EQ(want.norms.size(), 4u);
    for (double n : want.norms)
      EXPECT_GT(n, 0.05) << "the step was not clipped";
    EXPECT_EQ(want.lrs[0], 0.0);
    EXPECT_EQ(want.lrs[1], double(float(0.2)));
    RunResult unclipped = train(*one, 4, 0, s);
    EXPECT_FALSE(unclipped.tensors == want.tensors) << "clipping changed nothing";
    for (const char *schedule : {"1f1b", "zb-h1"}) {
      auto two = testsupport::compileTrainingPlan(model, 2, 4, schedule);
      ASSERT_TRUE(bool(two)) << llvm::toString(two.takeError());
      for (auto [threads, overlap] :
           {std::pair<int64_t, bool>{1, false}, {2, false}, {1, true}}) {
        SCOPED_TRACE(std::string(schedule) + " threads " +
                     std::to_string(threads) + (overlap ? " overlapped" : ""));
        RunResult got = train(*two, 4, 0.05, s, "", threads, overlap);
        ASSERT_EQ(got.error, "");
        EXPECT_TRUE(got.tensors == want.tensors);
        EXPECT_EQ(got.losses, want.losses);
        EXPECT_EQ(got.norms, want.norms);
        EXPECT_EQ(got.lrs, want.lrs);
      }
    }
  }
}

// The CPU backend's blocks on 1, 2 and 4 threads give the host's bits.
TEST(ClipGradNorm, SumOfSquaresIsTheSameOnAnyThreadCount) {
  std::vector<float> x(3 * runtime::kSquaresBlock + 123);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(std::sin(double(i)) * 1e3 / double(i + 1));
  double want = runtime::sumOfSquaresOnHost(ir::DType::F32, x.data(),
                                            int64_t(x.size()), 0.25);
  for (int threads : {1, 2, 4}) {
    auto cpu = runtime::createCpuBackend(threads);
    EXPECT_EQ(cpu->sumOfSquares(ir::DType::F32, x.data(), int64_t(x.size()),
                                0.25),
              want)
        << threads << " threads";
  }
}

} // namespace unit_clip_grad_norm
