// cleave-run: trains a compiled Plan (runtime/Plan.h) on the CPU, one
// thread per pipeline stage in one process. Data comes from .npy files in a
// folder, an .npz archive, or a deterministic synthetic stream.
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "frontend/TrainedModel.h"
#include "runtime/Executor.h"
#include "runtime/PlanFile.h"
#include "tools/ToolSupport.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

using namespace cleave;
using tools::fail;

static const char kTool[] = "cleave-run";

static const char kHelp[] = R"(usage: cleave-run PLAN.cplan [options]

Trains the model a plan describes (cleavec MODEL.onnx ... -o PLAN.cplan): on
the CPU, one thread per pipeline stage, each stage running its schedule's
actions. Every step runs the plan's M microbatches and one optimizer update;
the loss printed is the mean over the step's microbatches.

data:
  --data=DIR|FILE.npz    one array per model input, named after it (DIR/NAME.npy
                         or the archive member NAME.npy), samples along the
                         first axis; each step takes microbatch-size x M
                         samples in order, wrapping around. Without --data:
                         deterministic synthetic data (floats in [-1, 1],
                         integer inputs in the range the model indexes)
  --data=text:FILE       byte-level language modelling on a text file: a
                         model with two integer inputs [B, T] gets windows
                         of T bytes as tokens and the same windows shifted
                         by one byte as targets
  --seed=N               seed of the synthetic data and of dropout (default 0)

training:
  --steps=N              training steps (default 10)
  --lr=X                 learning rate (default: the one compiled in)
  --threads=N            kernel threads per stage (default: cores / stages,
                         at least 1)

output:
  --save=FILE.onnx       the source model with the trained parameters
  --profile=FILE.json    measured per-op times of the last step, in the format
                         `cleavec --cost-model profile:FILE` reads
  --print-plan           print the plan as text and exit
  --quiet                no per-step lines, only the summary
  --help                 show this help

exit status: 0 success, 1 bad input (plan, data) or a failed step, 2 bad usage.
)";

namespace {

// Samples of one input, `rows` of them, `rowBytes` each.
struct Feed {
  std::shared_ptr<ir::TensorData> data;
  int64_t rows = 0;
  int64_t rowBytes = 0;
};

class DataSource {
public:
  DataSource(const runtime::Plan &plan, uint64_t seed)
      : plan_(plan), seed_(seed) {}

  llvm::Error load(const std::string &path);
  runtime::DataFn forStep(int64_t step);
  bool synthetic() const { return feeds_.empty(); }
  int64_t samples() const {
    return feeds_.empty() ? 0 : feeds_.begin()->second.rows;
  }

private:
  llvm::Error fill(int64_t step, int microbatch, const runtime::PlanInput &in,
                   void *dst, size_t bytes) const;

  const runtime::Plan &plan_;
  uint64_t seed_;
  std::map<std::string, Feed> feeds_;
};

llvm::Error badData(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

// Byte-level language-model data from a text file: the model's two
// integer inputs [B, T] (tokens, then targets) get windows of T bytes and
// the same windows one byte later.
static llvm::Expected<std::map<std::string, std::shared_ptr<ir::TensorData>>>
textArrays(const runtime::Plan &plan, const std::string &file) {
  const auto &in = plan.inputs;
  bool ok = in.size() == 2 && in[0].shape.size() == 2 &&
            in[0].shape == in[1].shape;
  for (const runtime::PlanInput &i : in)
    ok = ok && (i.dtype == ir::DType::I64 || i.dtype == ir::DType::I32);
  if (!ok)
    return badData("--data text:FILE needs a model with two integer inputs "
                   "[B, T] (tokens and next-token targets)");
  if (in[0].indexLimit > 0 && in[0].indexLimit < 256)
    return badData("--data text:FILE feeds bytes (0..255) but '" +
                   in[0].name + "' indexes a table of " +
                   std::to_string(in[0].indexLimit) + " entries");
  auto buf = llvm::MemoryBuffer::getFile(file);
  if (!buf)
    return badData(file + ": " + buf.getError().message());
  llvm::StringRef text = (*buf)->getBuffer();
  int64_t t = in[0].shape[1];
  int64_t windows = text.size() > 1 ? int64_t(text.size() - 1) / t : 0;
  if (windows < in[0].shape[0])
    return badData(file + ": " + std::to_string(text.size()) +
                   " bytes is too short for one microbatch of " +
                   std::to_string(in[0].shape[0]) + " windows of " +
                   std::to_string(t) + " bytes");
  std::map<std::string, std::shared_ptr<ir::TensorData>> arrays;
  for (int k = 0; k < 2; ++k) {
    std::vector<int64_t> values(size_t(windows * t));
    for (int64_t i = 0; i < windows * t; ++i)
      values[size_t(i)] = uint8_t(text[size_t(i + k)]);
    arrays[in[k].name] =
        ir::TensorData::fromInts(in[k].dtype, {windows, t}, values);
  }
  return arrays;
}

llvm::Error DataSource::load(const std::string &path) {
  std::map<std::string, std::shared_ptr<ir::TensorData>> arrays;
  if (llvm::StringRef(path).startswith("text:")) {
    auto a = textArrays(plan_, path.substr(5));
    if (!a)
      return a.takeError();
    arrays = std::move(*a);
  } else if (llvm::StringRef(path).endswith(".npz")) {
    auto a = frontend::readNpzFile(path);
    if (!a)
      return a.takeError();
    arrays = std::move(*a);
  } else if (llvm::sys::fs::is_directory(path)) {
    for (const runtime::PlanInput &in : plan_.inputs) {
      std::string file = path + "/" + in.name + ".npy";
      if (!llvm::sys::fs::exists(file))
        return badData(path + ": no " + in.name + ".npy for the model input '" +
                       in.name + "'");
      auto t = frontend::readNpyFile(file);
      if (!t)
        return t.takeError();
      arrays[in.name] = *t;
    }
  } else {
    return badData(path + ": --data needs a folder of .npy files or an .npz "
                          "file");
  }
  int64_t rows = -1;
  for (const runtime::PlanInput &in : plan_.inputs) {
    auto it = arrays.find(in.name);
    if (it == arrays.end())
      return badData(path + ": no array for the model input '" + in.name + "'");
    const ir::TensorType &t = it->second->type();
    std::string want = std::string(ir::dtypeName(in.dtype));
    if (t.dtype != in.dtype)
      return badData(path + ": '" + in.name + "' is " +
                     std::string(ir::dtypeName(t.dtype)) + " but the model reads " +
                     want);
    bool shapeOk = t.shape.size() == in.shape.size() && !t.shape.empty();
    for (size_t d = 1; shapeOk && d < in.shape.size(); ++d)
      shapeOk = t.shape[d] == in.shape[d];
    std::string sampleShape;
    for (size_t d = 1; d < in.shape.size(); ++d)
      sampleShape += (d > 1 ? "," : "") + std::to_string(in.shape[d]);
    if (!shapeOk)
      return badData(path + ": '" + in.name + "' has shape " + t.str() +
                     "; the model needs [N," + sampleShape + "] (N samples)");
    if (t.shape[0] < in.shape[0])
      return badData(path + ": '" + in.name + "' has " +
                     std::to_string(t.shape[0]) +
                     " samples; one microbatch needs " +
                     std::to_string(in.shape[0]));
    if (rows >= 0 && t.shape[0] != rows)
      return badData(path + ": the arrays have different sample counts (" +
                     std::to_string(rows) + " and " +
                     std::to_string(t.shape[0]) + " for '" + in.name + "')");
    rows = t.shape[0];
    if (auto e = it->second->load())
      return e;
    Feed f;
    f.data = it->second;
    f.rows = t.shape[0];
    f.rowBytes = t.byteSize() / std::max<int64_t>(1, t.shape[0]);
    feeds_[in.name] = std::move(f);
  }
  return llvm::Error::success();
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

llvm::Error DataSource::fill(int64_t step, int microbatch,
                             const runtime::PlanInput &in, void *dst,
                             size_t bytes) const {
  int64_t mbRows = in.shape.empty() ? 1 : in.shape[0];
  int64_t first = (step * plan_.microbatches + microbatch) * mbRows;
  auto it = feeds_.find(in.name);
  if (it != feeds_.end()) {
    const Feed &f = it->second;
    if (size_t(f.rowBytes * mbRows) != bytes)
      return badData("input '" + in.name + "': size mismatch");
    const uint8_t *src = f.data->bytes().data();
    for (int64_t r = 0; r < mbRows; ++r)
      std::memcpy(static_cast<uint8_t *>(dst) + r * f.rowBytes,
                  src + ((first + r) % f.rows) * f.rowBytes, f.rowBytes);
    return llvm::Error::success();
  }
  // Synthetic: a hash of (seed, input, sample, element).
  uint64_t salt = runtime::fnv1a64(in.name.data(), in.name.size()) ^ seed_;
  int64_t n = 1;
  for (int64_t d : in.shape)
    n *= d;
  int64_t perRow = n / std::max<int64_t>(1, mbRows);
  for (int64_t i = 0; i < n; ++i) {
    int64_t sample = first + i / std::max<int64_t>(1, perRow);
    uint64_t h = mix(salt ^ mix(uint64_t(sample) * 1000003u + uint64_t(i % perRow)));
    double u = double(h >> 11) / double(1ull << 53); // [0, 1)
    int64_t limit = in.indexLimit > 0 ? in.indexLimit : 2;
    switch (in.dtype) {
    case ir::DType::F32:
      static_cast<float *>(dst)[i] = float(2 * u - 1);
      break;
    case ir::DType::F64:
      static_cast<double *>(dst)[i] = 2 * u - 1;
      break;
    case ir::DType::I64:
      static_cast<int64_t *>(dst)[i] = int64_t(u * double(limit));
      break;
    case ir::DType::I32:
      static_cast<int32_t *>(dst)[i] = int32_t(u * double(limit));
      break;
    case ir::DType::Bool:
      static_cast<uint8_t *>(dst)[i] = u < 0.5;
      break;
    default:
      return badData("input '" + in.name + "': no synthetic data for " +
                     std::string(ir::dtypeName(in.dtype)) + "; pass --data");
    }
  }
  return llvm::Error::success();
}

runtime::DataFn DataSource::forStep(int64_t step) {
  return [this, step](int microbatch, const std::string &name, void *dst,
                      size_t bytes) -> llvm::Error {
    for (const runtime::PlanInput &in : plan_.inputs)
      if (in.name == name)
        return fill(step, microbatch, in, dst, bytes);
    return badData("the plan has no input '" + name + "'");
  };
}

std::string formatSeconds(double s) {
  int64_t t = int64_t(std::lround(s));
  return llvm::formatv("{0}:{1:2}", t / 60, t % 60).str();
}

} // namespace

int main(int argc, char **argv) {
  tools::Flags flags({{"help", false, false},
                      {"data", true, false},
                      {"seed", true, false},
                      {"steps", true, false},
                      {"lr", true, false},
                      {"threads", true, false},
                      {"save", true, false},
                      {"profile", true, false},
                      {"print-plan", false, false},
                      {"quiet", false, false}});
  if (auto e = flags.parse(argc, argv))
    return fail(kTool, llvm::toString(std::move(e)), tools::kUsage);
  if (flags.has("help")) {
    llvm::outs() << kHelp;
    return tools::kOk;
  }
  if (flags.positional().size() != 1)
    return fail(kTool,
                flags.positional().empty()
                    ? "no plan given (usage: cleave-run PLAN.cplan [options]; "
                      "see --help)"
                    : "expected one plan, got " +
                          std::to_string(flags.positional().size()),
                tools::kUsage);
  int64_t steps = 10, seed = 0, threads = 0;
  for (auto [name, var] : {std::pair<const char *, int64_t *>{"steps", &steps},
                           {"seed", &seed},
                           {"threads", &threads}})
    if (auto v = flags.get(name)) {
      auto n = tools::parseCount(name, *v);
      if (!n)
        return fail(kTool, llvm::toString(n.takeError()), tools::kUsage);
      *var = *n;
    }
  std::optional<float> lr;
  if (auto v = flags.get("lr")) {
    char *end = nullptr;
    double x = std::strtod(v->c_str(), &end);
    if (v->empty() || *end || !(x >= 0) || !std::isfinite(x))
      return fail(kTool, "--lr needs a non-negative number, not '" + *v + "'",
                  tools::kUsage);
    lr = float(x);
  }

  const std::string &planPath = flags.positional()[0];
  auto planOr = runtime::readPlanFile(planPath);
  if (!planOr)
    return fail(kTool, llvm::toString(planOr.takeError()), tools::kBadInput);
  runtime::Plan &plan = *planOr;
  if (flags.has("print-plan")) {
    runtime::printPlan(plan, llvm::outs());
    return tools::kOk;
  }

  DataSource data(plan, uint64_t(seed));
  if (auto d = flags.get("data"))
    if (auto e = data.load(*d))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);

  int p = int(plan.stages.size());
  if (threads == 0)
    threads = std::max<int64_t>(
        1, int64_t(std::thread::hardware_concurrency()) / std::max(p, 1));
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  auto comms = runtime::createInProcessComms(p);
  std::vector<std::unique_ptr<runtime::StageExecutor>> execs;
  std::vector<runtime::StageExecutor *> raw;
  for (int s = 0; s < p; ++s) {
    backends.push_back(runtime::createCpuBackend(int(threads)));
    auto ex = runtime::StageExecutor::create(plan, s, *backends.back(),
                                             *comms[s]);
    if (!ex)
      return fail(kTool, "stage " + std::to_string(s) + ": " +
                             llvm::toString(ex.takeError()),
                  tools::kBadInput);
    execs.push_back(std::move(*ex));
    raw.push_back(execs.back().get());
  }
  if (lr) {
    std::vector<uint8_t> bytes(sizeof(float));
    std::memcpy(bytes.data(), &*lr, sizeof(float));
    for (auto &ex : execs)
      if (ex->findSlot("optimizer.lr") >= 0)
        if (auto e = ex->writeSlot("optimizer.lr", bytes))
          return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  }
  bool profiling = flags.has("profile");

  int64_t mbRows = plan.inputs.empty() || plan.inputs[0].shape.empty()
                       ? 1
                       : plan.inputs[0].shape[0];
  int64_t samplesPerStep = mbRows * plan.microbatches;
  bool quiet = flags.has("quiet");
  llvm::outs() << llvm::formatv(
      "training {0}: {1} stage(s), schedule {2}, {3} microbatches of {4} "
      "samples per step, {5} step(s), data: {6}\n",
      plan.modelName, p, plan.schedule, plan.microbatches, mbRows, steps,
      data.synthetic() ? std::string("synthetic")
                       : *flags.get("data") + " (" +
                             std::to_string(data.samples()) + " samples)");
  llvm::outs().flush();
  auto start = std::chrono::steady_clock::now();
  double firstLoss = NAN, lastLoss = NAN, stepSum = 0;
  for (int64_t step = 0; step < steps; ++step) {
    if (profiling && step + 1 == steps)
      for (auto &ex : execs)
        ex->setProfiling(true);
    if (auto e = runtime::runPipelineThreads(raw, step, data.forStep(step)))
      return fail(kTool, "step " + std::to_string(step + 1) + ": " +
                             llvm::toString(std::move(e)),
                  tools::kBadInput);
    for (auto &ex : execs)
      if (ex->hasLoss())
        lastLoss = ex->lastLoss();
    if (step == 0)
      firstLoss = lastLoss;
    if (!std::isfinite(lastLoss))
      return fail(kTool,
                  "step " + std::to_string(step + 1) +
                      ": the loss is not finite (" + std::to_string(lastLoss) +
                      "); try a smaller --lr",
                  tools::kBadInput);
    double elapsed = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    double stepTime = 0;
    for (auto &ex : execs)
      stepTime = std::max(stepTime, ex->stats().stepSeconds);
    stepSum += stepTime;
    if (!quiet) {
      double rate = double(samplesPerStep * (step + 1)) / elapsed;
      double eta = elapsed / double(step + 1) * double(steps - step - 1);
      llvm::outs() << llvm::formatv(
          "step {0,5}/{1}  loss {2:F4}  {3:F0} samples/s  ETA {4}\n", step + 1,
          steps, lastLoss, rate, formatSeconds(eta));
      llvm::outs().flush();
    }
  }
  double total = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  llvm::outs() << llvm::formatv(
      "done: {0} step(s) in {1:F2} s, loss {2:F4} -> {3:F4}\n", steps, total,
      firstLoss, lastLoss);

  // Per-stage figures of the last step.
  double measuredStep = 0;
  for (auto &ex : execs)
    measuredStep = std::max(measuredStep, ex->stats().stepSeconds);
  llvm::outs() << "stage  busy %  bubble %  peak bytes (measured / planned)  "
                  "step ms (measured / predicted)\n";
  for (int s = 0; s < p; ++s) {
    const runtime::StageStats &st = execs[s]->stats();
    double busy = 0;
    for (double b : st.busySeconds)
      busy += b;
    busy -= st.recvWaitSeconds;
    double busyPct = measuredStep > 0 ? 100 * busy / measuredStep : 0;
    llvm::outs() << llvm::formatv(
        "{0,-5}  {1,6:F1}  {2,8:F1}  {3,14} / {4,-14}  {5,8:F3} / {6:F3}\n", s,
        busyPct, 100 - busyPct, st.peakBytes,
        plan.stages[s].predictedPeakBytes, 1e3 * measuredStep,
        1e3 * plan.predictedStepTime);
  }

  if (auto path = flags.get("profile")) {
    llvm::json::Array ops;
    for (auto &ex : execs)
      for (const auto &[key, prof] : ex->profile()) {
        if (key.first.empty())
          continue;
        bool step = key.second == runtime::Phase::Step;
        const char *phase = key.second == runtime::Phase::F   ? "fwd"
                            : key.second == runtime::Phase::B ? "B"
                            : key.second == runtime::Phase::W ? "W"
                                                              : "opt";
        double per = step ? prof.seconds
                          : prof.seconds / double(plan.microbatches);
        ops.push_back(llvm::json::Object{
            {"loc", key.first}, {"phase", phase}, {"time", per}});
      }
    std::string text;
    llvm::raw_string_ostream os(text);
    os << llvm::formatv(
        "{0:2}\n", llvm::json::Value(llvm::json::Object{
                       {"time_unit", "s"}, {"ops", std::move(ops)}}));
    os.flush();
    if (auto e = tools::writeOutput(*path, text))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  }

  if (auto out = flags.get("save")) {
    frontend::ImportOptions importOpts;
    if (!plan.inputs.empty() && !plan.inputs[0].shape.empty())
      importOpts.microbatchSize = plan.inputs[0].shape[0];
    auto model = frontend::importOnnxFile(plan.sourceModel, importOpts);
    if (!model)
      return fail(kTool,
                  "--save needs the model the plan was compiled from (" +
                      plan.sourceModel +
                      "): " + llvm::toString(model.takeError()),
                  tools::kBadInput);
    std::map<std::string, std::shared_ptr<ir::TensorData>> values;
    for (const ir::Value *v : (*model)->declared()) {
      if (v->kind() == ir::ValueKind::Const || values.count(v->name()))
        continue;
      for (auto &ex : execs) {
        if (ex->findSlot(v->name()) < 0)
          continue;
        auto bytes = ex->readSlot(v->name());
        if (!bytes)
          return fail(kTool, llvm::toString(bytes.takeError()),
                      tools::kBadInput);
        values[v->name()] = std::make_shared<ir::TensorData>(v->type(), *bytes);
        break;
      }
    }
    if (auto e = frontend::writeTrainedOnnx(plan.sourceModel, values, *out))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
    llvm::outs() << "wrote " << *out << " (" << values.size()
                 << " trained tensors)\n";
  }
  return tools::kOk;
}
