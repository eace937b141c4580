// The runtime's training libraries called directly, without cleave-run:
// data sources (runtime/data/DataSource.h) on good and bad files, the
// checkpoint format (runtime/Checkpoint.h) and its damage cases, the trace
// and profile writers (runtime/trace/), agree() over a driver of several
// processes (runtime/comm/Driver.h), and the training loop
// (runtime/Trainer.h): a run stopped by a checkpoint and resumed ends with
// the bits of an unbroken one.
#include "runtime/Checkpoint.h"
#include "runtime/Trainer.h"
#include "runtime/data/DataSource.h"
#include "runtime/data/NumpyFiles.h"

#include "TestPlans.h"
#include "TestSupport.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <fstream>

using namespace cleave;
using testsupport::TempDir;

namespace {

std::string errorText(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : std::string();
}

// A plan with two inputs, as DataSource sees it: x f32[4,3], y i64[4]
// indexing 10 classes; 2 microbatches.
runtime::Plan dataPlan() {
  runtime::Plan p;
  p.microbatches = 2;
  p.inputs.push_back({"x", ir::DType::F32, {4, 3}, 0});
  p.inputs.push_back({"y", ir::DType::I64, {4}, 10});
  return p;
}

void writeNpy(const std::string &path, const ir::TensorData &t) {
  ASSERT_FALSE(bool(runtime::writeNpyFile(path, t)));
}

std::vector<uint8_t> fillOne(const runtime::DataSource &d,
                             const runtime::Plan &p, int64_t step, int mb,
                             int input) {
  const runtime::PlanInput &in = p.inputs[size_t(input)];
  size_t bytes = size_t(ir::TensorType(in.dtype, ir::Shape(in.shape.begin(), in.shape.end()))
                            .byteSize());
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(errorText(d.fill(step, mb, in, out.data(), bytes)), "");
  return out;
}

TEST(DataSource, FolderOfNpyWrapsAroundInSampleOrder) {
  TempDir dir;
  runtime::Plan p = dataPlan();
  // 6 samples: a step takes 2 microbatches of 4, so step 0 is samples
  // 0..7 mod 6 and microbatch 1 starts at sample 4.
  std::vector<double> xs(18), ys(6);
  for (int i = 0; i < 18; ++i)
    xs[size_t(i)] = i;
  for (int i = 0; i < 6; ++i)
    ys[size_t(i)] = i;
  writeNpy(dir.file("x.npy"), *ir::TensorData::fromDoubles(ir::DType::F32, {6, 3}, xs));
  writeNpy(dir.file("y.npy"), *ir::TensorData::fromDoubles(ir::DType::I64, {6}, ys));
  runtime::DataSource d(p, 0);
  ASSERT_EQ(errorText(d.load(std::string(dir.path))), "");
  EXPECT_FALSE(d.synthetic());
  EXPECT_EQ(d.samples(), 6);
  std::vector<uint8_t> y = fillOne(d, p, 0, 1, 1);
  const int64_t *v = reinterpret_cast<const int64_t *>(y.data());
  EXPECT_EQ(std::vector<int64_t>(v, v + 4), (std::vector<int64_t>{4, 5, 0, 1}));
  std::vector<uint8_t> x = fillOne(d, p, 0, 1, 0);
  EXPECT_EQ(reinterpret_cast<const float *>(x.data())[0], 12.0f);
}

TEST(DataSource, BadFilesAreOneLineNamingFileAndInput) {
  runtime::Plan p = dataPlan();
  {
    TempDir dir;
    writeNpy(dir.file("x.npy"), *ir::TensorData::fromDoubles(ir::DType::F32, {6, 3}, std::vector<double>(18)));
    runtime::DataSource d(p, 0);
    std::string e = errorText(d.load(std::string(dir.path)));
    EXPECT_NE(e.find("no y.npy for the model input 'y'"), std::string::npos) << e;
  }
  {
    TempDir dir; // wrong element type
    writeNpy(dir.file("x.npy"), *ir::TensorData::fromDoubles(ir::DType::F64, {6, 3}, std::vector<double>(18)));
    writeNpy(dir.file("y.npy"), *ir::TensorData::fromDoubles(ir::DType::I64, {6}, std::vector<double>(6)));
    runtime::DataSource d(p, 0);
    std::string e = errorText(d.load(std::string(dir.path)));
    EXPECT_NE(e.find("'x' is f64 but the model reads f32"), std::string::npos) << e;
  }
  {
    TempDir dir; // wrong sample shape, then too few samples
    writeNpy(dir.file("x.npy"), *ir::TensorData::fromDoubles(ir::DType::F32, {6, 2}, std::vector<double>(12)));
    writeNpy(dir.file("y.npy"), *ir::TensorData::fromDoubles(ir::DType::I64, {6}, std::vector<double>(6)));
    runtime::DataSource d(p, 0);
    std::string e = errorText(d.load(std::string(dir.path)));
    EXPECT_NE(e.find("the model needs [N,3]"), std::string::npos) << e;
    writeNpy(dir.file("x.npy"), *ir::TensorData::fromDoubles(ir::DType::F32, {2, 3}, std::vector<double>(6)));
    e = errorText(d.load(std::string(dir.path)));
    EXPECT_NE(e.find("has 2 samples; one microbatch needs 4"), std::string::npos) << e;
  }
  {
    TempDir dir; // text data needs two integer inputs; a short text fails
    std::ofstream(dir.file("t.txt")) << "hello";
    runtime::DataSource d(p, 0);
    std::string e = errorText(d.load("text:" + dir.file("t.txt")));
    EXPECT_NE(e.find("needs a model with two integer inputs"), std::string::npos) << e;
    runtime::Plan lm;
    lm.inputs.push_back({"tokens", ir::DType::I64, {2, 8}, 256});
    lm.inputs.push_back({"targets", ir::DType::I64, {2, 8}, 256});
    runtime::DataSource t(lm, 0);
    e = errorText(t.load("text:" + dir.file("t.txt")));
    EXPECT_NE(e.find("5 bytes is too short for one microbatch of 2 windows of 8 bytes"),
              std::string::npos) << e;
  }
  runtime::DataSource d(p, 0);
  std::string e = errorText(d.load("/nonexistent/file.txt"));
  EXPECT_NE(e.find("--data needs a folder of .npy files or an .npz file"),
            std::string::npos) << e;
}

TEST(DataSource, SyntheticIsDeterministicSeededAndInRange) {
  runtime::Plan p = dataPlan();
  runtime::DataSource a(p, 7), b(p, 7), c(p, 8);
  EXPECT_TRUE(a.synthetic());
  EXPECT_EQ(fillOne(a, p, 3, 1, 0), fillOne(b, p, 3, 1, 0));
  EXPECT_NE(fillOne(a, p, 3, 1, 0), fillOne(c, p, 3, 1, 0));
  EXPECT_NE(fillOne(a, p, 3, 1, 0), fillOne(a, p, 3, 0, 0));
  std::vector<uint8_t> x = fillOne(a, p, 0, 0, 0);
  for (size_t i = 0; i < 12; ++i) {
    float f = reinterpret_cast<const float *>(x.data())[i];
    EXPECT_TRUE(f >= -1 && f <= 1) << f;
  }
  std::vector<uint8_t> y = fillOne(a, p, 0, 0, 1);
  for (size_t i = 0; i < 4; ++i) {
    int64_t k = reinterpret_cast<const int64_t *>(y.data())[i];
    EXPECT_TRUE(k >= 0 && k < 10) << k;
  }
  // Replica 1's microbatch 0 is the step's microbatch M + 0.
  std::vector<uint8_t> viaReplica(x.size());
  runtime::DataFn f = a.forStep(0, 1);
  ASSERT_EQ(errorText(f(0, "x", viaReplica.data(), viaReplica.size())), "");
  EXPECT_EQ(viaReplica, fillOne(a, p, 0, 2, 0));
}

// One checkpoint entry in the documented byte format.
void putLe(std::string &s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    s.push_back(char((v >> (8 * i)) & 0xff));
}
std::string entry(uint32_t stage, const std::string &name,
                  const std::string &bytes) {
  std::string s;
  putLe(s, stage, 4);
  putLe(s, name.size(), 4);
  s += name;
  putLe(s, bytes.size(), 8);
  putLe(s, runtime::fnv1a64(bytes.data(), bytes.size()), 8);
  return s + bytes;
}

std::string readAll(const std::string &path) {
  auto buf = llvm::MemoryBuffer::getFile(path);
  return buf ? (*buf)->getBuffer().str() : std::string();
}

TEST(Checkpoint, RoundTripAndDamage) {
  TempDir dir;
  std::string d(dir.path);
  // A killed writer's temp file is garbage: the next write removes it.
  std::ofstream(dir.file("checkpoint.bin.tmp.99")) << "partial";
  std::string body = entry(0, "w", "abcd") + entry(1, "b", "xy");
  ASSERT_EQ(errorText(runtime::writeCheckpointFile(d, 42, 2, body)), "");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"checkpoint.bin"});

  std::map<std::string, std::string> got;
  auto read = [&](llvm::function_ref<bool(uint32_t)> wanted) {
    got.clear();
    return runtime::readCheckpointFile(
        d, wanted,
        [&](uint32_t stage, const std::string &name,
            const std::vector<uint8_t> &bytes) -> std::optional<std::string> {
          got[std::to_string(stage) + name] =
              std::string(bytes.begin(), bytes.end());
          if (name == "foreign")
            return runtime::foreignEntry(stage, name);
          return std::nullopt;
        });
  };
  auto steps = read([](uint32_t) { return true; });
  ASSERT_TRUE(bool(steps)) << llvm::toString(steps.takeError());
  EXPECT_EQ(*steps, 42);
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"0w", "abcd"}, {"1b", "xy"}}));
  // Stages not wanted are skipped (an MPI rank reads only its own).
  steps = read([](uint32_t s) { return s == 1; });
  ASSERT_TRUE(bool(steps));
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"1b", "xy"}}));

  std::string whole = readAll(dir.file("checkpoint.bin"));
  auto expectError = [&](const std::string &bytes, const std::string &want) {
    std::ofstream(dir.file("checkpoint.bin"), std::ios::binary) << bytes;
    auto r = read([](uint32_t) { return true; });
    ASSERT_FALSE(bool(r)) << "accepted: " << want;
    std::string e = llvm::toString(r.takeError());
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_NE(e.find("checkpoint.bin"), std::string::npos) << e;
  };
  expectError(whole.substr(0, whole.size() - 1), "truncated");
  std::string flipped = whole;
  flipped.back() ^= 1;
  expectError(flipped, "'b' is corrupt (checksum mismatch)");
  expectError("not a checkpoint at all", "not a cleave checkpoint");
  ASSERT_EQ(errorText(runtime::writeCheckpointFile(
                d, 1, 1, entry(3, "foreign", "zz"))),
            "");
  expectError(readAll(dir.file("checkpoint.bin")),
              "'foreign' on stage 3 is not in this plan");
}

TEST(Trace, ChromeTraceAndProfileText) {
  runtime::TraceTrack a{"stage 0", {{"F", 0, 10.0, 10.5}, {"RECV", 1, 10.5, 11}}};
  runtime::TraceTrack b{"stage 1", {{"STEP", -1, 11.0, 11.25}}};
  auto v = llvm::json::parse(runtime::chromeTraceJson({a, b}));
  ASSERT_TRUE(bool(v)) << llvm::toString(v.takeError());
  const llvm::json::Array *events = v->getAsObject()->getArray("traceEvents");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 5u); // two thread names, three spans
  std::vector<std::string> names;
  for (const llvm::json::Value &e : *events) {
    const llvm::json::Object *o = e.getAsObject();
    if (o->getString("ph") != llvm::StringRef("X"))
      continue;
    names.push_back(o->getString("name")->str());
    if (names.back() == "F0") { // times from the earliest span, in us
      EXPECT_EQ(*o->getNumber("ts"), 0);
      EXPECT_EQ(*o->getNumber("dur"), 5e5);
    }
    if (names.back() == "STEP")
      EXPECT_EQ(*o->getInteger("tid"), 1);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"F0", "RECV1", "STEP"}));
  EXPECT_EQ(runtime::traceTrackName(2, 1, 3), "replica 1 stage 2");
  EXPECT_EQ(runtime::traceTrackName(2, 0, 1), "stage 2");

  runtime::Plan plan;
  plan.microbatches = 4;
  runtime::ProfileMap prof;
  prof[{"fc1", runtime::Phase::F}] = {0.4, 1};
  prof[{"fc1", runtime::Phase::Step}] = {0.2, 1};
  prof[{"", runtime::Phase::B}] = {9, 1}; // no loc: not profiled
  llvm::json::Array ops;
  runtime::appendProfileOps(plan, prof, ops);
  auto p = llvm::json::parse(runtime::profileJson(std::move(ops)));
  ASSERT_TRUE(bool(p));
  EXPECT_EQ(p->getAsObject()->getString("time_unit"), llvm::StringRef("s"));
  const llvm::json::Array *list = p->getAsObject()->getArray("ops");
  ASSERT_EQ(list->size(), 2u);
  for (const llvm::json::Value &op : *list) {
    const llvm::json::Object *o = op.getAsObject();
    // Per microbatch, except the optimizer step's.
    double want = o->getString("phase") == llvm::StringRef("opt") ? 0.2 : 0.1;
    EXPECT_DOUBLE_EQ(*o->getNumber("time"), want);
  }
}

// Rank `rank` of a pretend run of `ranks` processes whose allGather reports
// the other ranks as `othersFailed`.
class FakeDriver : public runtime::Driver {
public:
  FakeDriver(int rank, int ranks, bool othersFailed)
      : rank_(rank), ranks_(ranks), othersFailed_(othersFailed) {}
  int rank() const override { return rank_; }
  int size() const override { return ranks_; }
  llvm::Expected<std::vector<double>>
  allGather(const std::vector<double> &mine) override {
    std::vector<double> out;
    for (int r = 0; r < ranks_; ++r)
      if (r == rank_)
        out.insert(out.end(), mine.begin(), mine.end());
      else
        out.insert(out.end(), mine.size(), othersFailed_ ? 1.0 : 0.0);
    return out;
  }
  llvm::Expected<std::vector<std::vector<uint8_t>>>
  gatherToRoot(const std::vector<uint8_t> &mine) override {
    return std::vector<std::vector<uint8_t>>{mine};
  }
  llvm::Error failAlone(llvm::Error e) override { return e; }

private:
  int rank_, ranks_;
  bool othersFailed_;
};

bool reportedElsewhere(llvm::Error e) {
  bool elsewhere = false;
  llvm::handleAllErrors(
      std::move(e),
      [&](const runtime::ReportedElsewhere &) { elsewhere = true; },
      [](const llvm::ErrorInfoBase &) {});
  return elsewhere;
}

llvm::Error failure() {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "bad");
}

TEST(Driver, AgreeGivesTheLowestFailingRankItsErrorAndTheOthersSilence) {
  FakeDriver clean(1, 3, false);
  EXPECT_FALSE(bool(runtime::agree(clean, llvm::Error::success())));
  // Rank 1 fails alone: it reports.
  EXPECT_EQ(errorText(runtime::agree(clean, failure())), "bad");
  // Every rank fails: rank 0 reports, rank 1 stays quiet.
  FakeDriver all1(1, 3, true), all0(0, 3, true);
  EXPECT_TRUE(reportedElsewhere(runtime::agree(all1, failure())));
  EXPECT_EQ(errorText(runtime::agree(all0, failure())), "bad");
  // Rank 1 succeeded but another failed: it stops too, silently.
  EXPECT_TRUE(reportedElsewhere(runtime::agree(all1, llvm::Error::success())));
  auto one = runtime::createSingleProcessDriver();
  EXPECT_EQ(errorText(runtime::agree(*one, failure())), "bad");
}

// The committed MLP as a 2-stage ZB-H1 plan of 2 microbatches.
llvm::Expected<runtime::Plan> mlpPlan() {
  return testsupport::compileTrainingPlan("mlp", 2, 2, "zb-h1");
}

// Trains `plan` from its initial values, or from `resume`, for `steps`
// steps in all; returns the model tensors' bytes.
std::map<std::string, std::vector<uint8_t>>
trainMlp(const runtime::Plan &plan, int64_t steps,
         std::optional<std::string> checkpointDir,
         std::optional<std::string> resume, std::vector<double> &losses) {
  runtime::StageOptions so;
  auto pipe = runtime::createThreadedPipeline(plan, so);
  EXPECT_TRUE(bool(pipe));
  if (!pipe) {
    llvm::consumeError(pipe.takeError());
    return {};
  }
  std::vector<runtime::LocalStage *> locals;
  for (runtime::LocalStage &st : (*pipe)->stages)
    locals.push_back(&st);
  auto driver = runtime::createSingleProcessDriver();
  runtime::DataSource data(plan, 3);
  runtime::TrainOptions to;
  to.steps = steps;
  to.checkpointDir = checkpointDir;
  runtime::Trainer trainer(
      plan, locals, *driver,
      [&](int64_t step, int replica) { return data.forStep(step, replica); },
      to);
  if (resume) {
    auto done = trainer.resume(*resume);
    EXPECT_TRUE(bool(done)) << (done ? "" : llvm::toString(done.takeError()));
  }
  EXPECT_EQ(errorText(trainer.run([&](const runtime::StepReport &r) {
              losses.push_back(r.loss);
            })),
            "");
  auto sum = trainer.summary();
  EXPECT_TRUE(bool(sum));
  if (sum) {
    EXPECT_EQ(sum->stages.size(), 2u);
    EXPECT_EQ(sum->lastLoss, losses.back());
  }
  auto tracks = trainer.traceTracks();
  EXPECT_TRUE(bool(tracks) && tracks->size() == 2u);
  auto t = trainer.modelTensors();
  EXPECT_TRUE(bool(t));
  std::map<std::string, std::vector<uint8_t>> out;
  if (t)
    for (const auto &[name, data] : *t)
      out[name].assign(data->bytes().begin(), data->bytes().end());
  return out;
}

TEST(Trainer, ResumedRunEndsWithTheBitsOfAnUnbrokenOne) {
  auto plan = mlpPlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  TempDir dir;
  std::vector<double> straight, first, second;
  auto want = trainMlp(*plan, 4, std::nullopt, std::nullopt, straight);
  ASSERT_EQ(want.size(), plan->modelTensors.size());
  ASSERT_EQ(straight.size(), 4u);
  EXPECT_NE(straight[0], straight[3]) << "training changed nothing";
  trainMlp(*plan, 2, std::string(dir.path), std::nullopt, first);
  auto got = trainMlp(*plan, 4, std::nullopt, std::string(dir.path), second);
  EXPECT_EQ(first, std::vector<double>(straight.begin(), straight.begin() + 2));
  EXPECT_EQ(second, std::vector<double>(straight.begin() + 2, straight.end()));
  EXPECT_TRUE(got == want);
}

} // namespace
