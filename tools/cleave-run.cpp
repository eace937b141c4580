// cleave-run: trains a compiled Plan (runtime/Plan.h) on the CPU, one
// thread per pipeline stage in one process, or, started by mpirun, one
// process per stage of each data-parallel replica (runtime/MpiComm.h; the
// functions under "MPI" below).
// Data comes from .npy files in a folder, an .npz archive, or a
// deterministic synthetic stream.
#include "frontend/OnnxImporter.h"
#include "frontend/TensorFiles.h"
#include "frontend/TrainedModel.h"
#include "runtime/cuda/Lowering.h"
#include "runtime/Executor.h"
#ifdef CLEAVE_HAVE_MPI
#include "runtime/MpiComm.h"
#endif
#include "runtime/PlanFile.h"
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"
#endif
#include "tools/ToolSupport.h"

#include "llvm/ADT/STLExtras.h"
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
#include <cstdlib>
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
  --on-nan=stop|skip-step
                         when a loss or a gradient is NaN or infinite, stop
                         before the update, naming the value, the op that
                         made it and the stage (default), or skip that
                         step's update on every stage and go on
  --threads=N            kernel threads per stage (default: cores / stages,
                         at least 1)
  --batch-w              run adjacent W actions of consecutive microbatches
                         as one: each weight-gradient product over their
                         operands concatenated (fewer, larger GEMMs; the
                         same sums up to rounding)
  --device=cpu|cuda|cuda-emulated
                         where the kernels run (default cpu). cuda: stage s
                         on GPU s mod the GPUs visible; a plan with an op the
                         CUDA backend lacks (integer products, divisions,
                         powers and reductions) stops before training,
                         naming the op.
                         cuda-emulated: the CUDA backend's kernels run one
                         element at a time on the host, for checking them
                         without a GPU; slow (docs/design/cuda.md)

output:
  --checkpoint-dir=DIR   write DIR/checkpoint.bin (every parameter, buffer and
                         optimizer state, atomically) every --checkpoint-every
                         steps (default: only after the last step)
  --checkpoint-every=K   steps between checkpoints
  --resume=DIR           continue from DIR/checkpoint.bin: --steps counts the
                         steps in all, so a resumed run ends where an
                         uninterrupted one would, with the same bits
  --save=FILE.onnx       the source model with the trained parameters
  --trace=FILE.json      a Chrome trace (chrome://tracing, Perfetto) of the
                         last step: one track per stage, its F, B, W and STEP
                         actions and its waits for messages (RECV)
  --profile=FILE.json    measured per-op times (kernels only, not waits): each
                         op's mean over the steps after the first, its
                         fastest and slowest tenth left out, in the format
                         `cleavec --cost-model profile:FILE` reads
  --print-plan           print the plan as text and exit
  --quiet                no per-step lines, only the summary
  --help                 show this help

MPI: `mpirun -np P cleave-run PLAN.cplan ...` runs one stage per process (P
must be the plan's stage count), each loading only its own stage; rank 0
prints the same lines as the threaded run and writes --save and --profile.
A plan compiled with `--data-parallel D` needs `mpirun -np P*D`: rank w runs
stage w % P of replica w / P, with the threaded run's data, gradients and
results; --save, --profile and --checkpoint-dir come from replica 0 (ranks
0..P-1). Checkpoints are the threaded run's file: either run resumes the
other's (every rank reads it and loads its own stage). --trace has every
rank's track (its times line up when the ranks share one host).

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
  // Replica r's microbatch m of a step is the step's microbatch r * M + m.
  runtime::DataFn forStep(int64_t step, int replica = 0);
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
  int64_t first =
      (step * plan_.microbatches * plan_.dataParallel + microbatch) * mbRows;
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

runtime::DataFn DataSource::forStep(int64_t step, int replica) {
  return [this, step, replica](int microbatch, const std::string &name,
                               void *dst, size_t bytes) -> llvm::Error {
    for (const runtime::PlanInput &in : plan_.inputs)
      if (in.name == name)
        return fill(step, replica * plan_.microbatches + microbatch, in, dst,
                    bytes);
    return badData("the plan has no input '" + name + "'");
  };
}

// Checkpoints: every State slot of every stage (parameters, buffers,
// optimizer state) after a step, in one file DIR/checkpoint.bin written
// atomically (a temp file, then rename):
//   "CLEAVECKPT1\n", u64 step count, u64 entry count, then per entry:
//   u32 stage, u32 name length, name, u64 byte count, u64 FNV-1a, bytes.
// Entries come in stage order, then in the stage's slot order. The threaded
// run and the MPI run (whose rank 0 gathers replica 0's stages) write and
// read the same file, so either can resume the other's checkpoint.
const char kCheckpointMagic[] = "CLEAVECKPT1\n";

void putLittleEndian(std::string &blob, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    blob.push_back(char((v >> (8 * i)) & 0xff));
}

// One stage's entries (its State slots, in slot order) appended to `body`;
// returns how many.
llvm::Expected<uint64_t> appendCheckpointEntries(
    std::string &body, const runtime::StagePlan &sp,
    runtime::StageExecutor &ex) {
  uint64_t count = 0;
  for (const runtime::Slot &sl : sp.slots) {
    if (sl.kind != runtime::SlotKind::State)
      continue;
    auto bytes = ex.readSlot(sl.name);
    if (!bytes)
      return bytes.takeError();
    putLittleEndian(body, uint32_t(sp.index), 4);
    putLittleEndian(body, sl.name.size(), 4);
    body += sl.name;
    putLittleEndian(body, bytes->size(), 8);
    putLittleEndian(body, runtime::fnv1a64(bytes->data(), bytes->size()), 8);
    body.append(reinterpret_cast<const char *>(bytes->data()), bytes->size());
    ++count;
  }
  return count;
}

// The header, then the entries (`body`, `entries` of them), written to
// DIR/checkpoint.bin atomically.
llvm::Error writeCheckpointFile(const std::string &dir, int64_t stepsDone,
                                uint64_t entries, llvm::StringRef body) {
  std::string blob(kCheckpointMagic);
  putLittleEndian(blob, uint64_t(stepsDone), 8);
  putLittleEndian(blob, entries, 8);
  blob += body;
  if (auto ec = llvm::sys::fs::create_directories(dir))
    return badData(dir + ": " + ec.message());
  // A run killed while writing leaves its temp file; the rename below is
  // what makes a checkpoint, so those are garbage.
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (llvm::sys::path::filename(it->path()).startswith("checkpoint.bin.tmp."))
      llvm::sys::fs::remove(it->path());
  return tools::writeOutput(dir + "/checkpoint.bin", blob);
}

llvm::Error writeCheckpoint(
    const std::string &dir, int64_t stepsDone,
    const std::vector<std::unique_ptr<runtime::StageExecutor>> &execs,
    const runtime::Plan &plan) {
  std::string body;
  uint64_t entries = 0;
  for (const runtime::StagePlan &sp : plan.stages) { // replica 0's executors
    auto n = appendCheckpointEntries(body, sp, *execs[size_t(sp.index)]);
    if (!n)
      return n.takeError();
    entries += *n;
  }
  return writeCheckpointFile(dir, stepsDone, entries, body);
}

// Reads DIR/checkpoint.bin, checking its structure, and hands each entry of
// a stage `wanted` says yes to (checksum verified) to `apply`, which gives
// the path-prefixed error to report; returns the steps it had done. The
// other entries are skipped unchecked.
llvm::Expected<int64_t> readCheckpointFile(
    const std::string &dir, llvm::function_ref<bool(uint32_t stage)> wanted,
    llvm::function_ref<std::optional<std::string>(
        uint32_t stage, const std::string &name,
        const std::vector<uint8_t> &bytes)>
        apply) {
  std::string path = dir + "/checkpoint.bin";
  auto buf = llvm::MemoryBuffer::getFile(path);
  if (!buf)
    return badData(path + ": " + buf.getError().message());
  llvm::StringRef data = (*buf)->getBuffer();
  size_t pos = 0;
  bool truncated = false;
  auto get = [&](int bytes) -> uint64_t {
    if (pos + size_t(bytes) > data.size()) {
      truncated = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= uint64_t(uint8_t(data[pos + size_t(i)])) << (8 * i);
    pos += size_t(bytes);
    return v;
  };
  if (!data.startswith(kCheckpointMagic))
    return badData(path + ": not a cleave checkpoint");
  pos = sizeof(kCheckpointMagic) - 1;
  int64_t stepsDone = int64_t(get(8));
  uint64_t entries = get(8);
  for (uint64_t k = 0; k < entries && !truncated; ++k) {
    uint32_t stage = uint32_t(get(4));
    uint32_t nameLen = uint32_t(get(4));
    if (truncated || pos + nameLen > data.size())
      break;
    std::string name = data.substr(pos, nameLen).str();
    pos += nameLen;
    uint64_t size = get(8), sum = get(8);
    if (truncated || size > data.size() - pos) {
      truncated = true;
      break;
    }
    if (!wanted(stage)) {
      pos += size;
      continue;
    }
    std::vector<uint8_t> bytes(data.bytes_begin() + pos,
                               data.bytes_begin() + pos + size);
    pos += size;
    if (runtime::fnv1a64(bytes.data(), bytes.size()) != sum)
      return badData(path + ": '" + name + "' is corrupt (checksum mismatch)");
    if (auto msg = apply(stage, name, bytes))
      return badData(path + ": " + *msg);
  }
  if (truncated)
    return badData(path + ": truncated");
  return stepsDone;
}

// The message for an entry that does not fit the plan.
std::string foreignEntry(uint32_t stage, const std::string &name) {
  return "'" + name + "' on stage " + std::to_string(stage) +
         " is not in this plan (a checkpoint of another plan?)";
}

// Loads a checkpoint into the executors; returns the steps it had done.
llvm::Expected<int64_t> readCheckpoint(
    const std::string &dir,
    std::vector<std::unique_ptr<runtime::StageExecutor>> &execs, int stages) {
  return readCheckpointFile(
      dir, [](uint32_t) { return true; },
      [&](uint32_t stage, const std::string &name,
          const std::vector<uint8_t> &bytes) -> std::optional<std::string> {
        if (stage >= size_t(stages) || execs[stage]->findSlot(name) < 0)
          return foreignEntry(stage, name);
        // Every data-parallel replica of the stage gets the saved values.
        for (size_t i = stage; i < execs.size(); i += size_t(stages))
          if (auto e = execs[i]->writeSlot(name, bytes))
            return llvm::toString(std::move(e)) +
                   " (a checkpoint of another plan?)";
        return std::nullopt;
      });
}

// --checkpoint-every: 0 without it (a checkpoint only after the last step).
llvm::Expected<int64_t> parseCheckpointEvery(const tools::Flags &flags) {
  auto k = flags.get("checkpoint-every");
  if (!k)
    return 0;
  auto n = tools::parseCount("checkpoint-every", *k);
  if (!n)
    return n.takeError();
  if (*n == 0)
    return badData("--checkpoint-every needs a positive step count");
  if (!flags.has("checkpoint-dir"))
    return badData("--checkpoint-every goes with --checkpoint-dir");
  return *n;
}

// Whether a checkpoint is due after step `step` (0-based) of `steps`.
bool checkpointDue(int64_t step, int64_t steps, int64_t every) {
  return (every && (step + 1) % every == 0) || step + 1 == steps;
}

// "training gpt-tiny: 2 stage(s), schedule zb-h1, 4 microbatches of 8
// samples per step, 300 step(s), data: ..." (both drivers); a bf16 plan
// says so after the schedule.
void printTrainingHeader(const runtime::Plan &plan, int64_t mbRows,
                         int64_t steps, const DataSource &data,
                         const tools::Flags &flags) {
  int d = plan.dataParallel;
  llvm::outs() << llvm::formatv(
      "training {0}: {1} stage(s){7}, schedule {2}{8}, {3} microbatches of "
      "{4} samples per step, {5} step(s), data: {6}\n",
      plan.modelName, plan.stages.size(), plan.schedule,
      d > 1 ? std::to_string(plan.microbatches) + " x " + std::to_string(d)
            : std::to_string(plan.microbatches),
      mbRows, steps,
      data.synthetic() ? std::string("synthetic")
                       : *flags.get("data") + " (" +
                             std::to_string(data.samples()) + " samples)",
      d > 1 ? " x " + std::to_string(d) + " data-parallel replicas"
            : std::string(),
      plan.precision == "f32" ? std::string()
                              : ", precision " + plan.precision);
}

std::string formatSeconds(double s) {
  int64_t t = int64_t(std::lround(s));
  return llvm::formatv("{0}:{1:2}", t / 60, t % 60).str();
}

// --profile's figures for one executor: each instruction's time per step,
// kept for every profiled step (all but the first, which warms caches and
// pages in the frames; one step alone can be off by a third), and their
// mean with the fastest and slowest tenth of steps left out. Trimmed, the
// mean ignores the rare bursts of other work on a shared machine; a mean,
// it keeps the common small delays, which a median drops: summed over a
// step's hundreds of ops, per-op medians came out 5-10% below the measured
// step (tests/bench/pipeline_speedup.py).
class ProfileSteps {
public:
  // Takes the executor's figures of the step just run and clears them.
  void take(runtime::StageExecutor &ex) {
    for (const auto &[key, prof] : ex.profile())
      seconds_[key].push_back(prof.seconds);
    ex.clearProfile();
  }
  runtime::ProfileMap trimmedMean() const {
    runtime::ProfileMap out;
    for (auto [key, all] : seconds_) {
      std::sort(all.begin(), all.end());
      size_t cut = all.size() / 10;
      double sum = 0;
      for (size_t i = cut; i < all.size() - cut; ++i)
        sum += all[i];
      out[key] = {sum / double(all.size() - 2 * cut), 1};
    }
    return out;
  }

private:
  std::map<std::pair<std::string, runtime::Phase>, std::vector<double>> seconds_;
};

// Whether --profile and the summary's measured step time count this step:
// every step but the run's first (warm-up), unless that is the only one.
bool warmStep(int64_t step, int64_t firstStep, int64_t steps) {
  return step > firstStep || steps - firstStep == 1;
}

// --profile's entries for one stage's measured instructions, appended to
// `ops`: per-microbatch seconds, except the optimizer step's.
void appendProfileOps(const runtime::Plan &plan,
                      const runtime::ProfileMap &profile,
                      llvm::json::Array &ops) {
  for (const auto &[key, prof] : profile) {
    if (key.first.empty())
      continue;
    bool step = key.second == runtime::Phase::Step;
    const char *phase = key.second == runtime::Phase::F   ? "fwd"
                        : key.second == runtime::Phase::B ? "B"
                        : key.second == runtime::Phase::W ? "W"
                                                          : "opt";
    double per = step ? prof.seconds : prof.seconds / double(plan.microbatches);
    ops.push_back(llvm::json::Object{
        {"loc", key.first}, {"phase", phase}, {"time", per}});
  }
}

// Writes the --profile file (the format `cleavec --cost-model profile:FILE`
// reads) from its entries.
llvm::Error writeProfile(const std::string &path, llvm::json::Array ops) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}\n",
                      llvm::json::Value(llvm::json::Object{
                          {"time_unit", "s"}, {"ops", std::move(ops)}}));
  os.flush();
  return tools::writeOutput(path, text);
}

// --trace: one track per executor (tid = its index, replica * P + stage,
// which is also its world rank under MPI), each with the spans of its last
// step, times from the earliest span of all.
struct TraceTrack {
  std::string name;
  std::vector<runtime::StageStats::Span> spans;
};

std::string traceTrackName(int stage, int replica, int replicas) {
  std::string track = "stage " + std::to_string(stage);
  if (replicas > 1)
    track = "replica " + std::to_string(replica) + " " + track;
  return track;
}

llvm::Error writeTrace(const std::string &path,
                       const std::vector<TraceTrack> &tracks) {
  double t0 = INFINITY;
  for (const TraceTrack &t : tracks)
    for (const auto &span : t.spans)
      t0 = std::min(t0, span.start);
  llvm::json::Array events;
  for (size_t i = 0; i < tracks.size(); ++i) {
    events.push_back(llvm::json::Object{
        {"name", "thread_name"}, {"ph", "M"}, {"pid", 0},
        {"tid", int64_t(i)},
        {"args", llvm::json::Object{{"name", tracks[i].name}}}});
    for (const auto &span : tracks[i].spans) {
      std::string name = span.name;
      if (span.microbatch >= 0)
        name += std::to_string(span.microbatch);
      events.push_back(llvm::json::Object{
          {"name", name}, {"cat", span.name}, {"ph", "X"}, {"pid", 0},
          {"tid", int64_t(i)}, {"ts", 1e6 * (span.start - t0)},
          {"dur", 1e6 * (span.end - span.start)}});
    }
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}\n", llvm::json::Value(llvm::json::Object{
                                     {"traceEvents", std::move(events)},
                                     {"displayTimeUnit", "ms"}}));
  os.flush();
  return tools::writeOutput(path, text);
}

// Whether mpirun (Open MPI, MPICH, or any PMIx launcher) started us.
bool launchedByMpirun() {
  for (const char *var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var))
      return true;
  return false;
}

//===-- MPI: one stage per process ----------------------------------------===//
#ifdef CLEAVE_HAVE_MPI

// What cleave-run's main parsed, for the MPI driver.
struct RunOptions {
  std::string planPath;
  int64_t steps = 10, seed = 0, threads = 0;
  std::optional<float> lr;
  bool skipNonFinite = false; // --on-nan=skip-step
  std::string device = "cpu"; // --device
  bool batchW = false;        // --batch-w
};

// The backend executor `index` runs on: the CPU with `threads` kernel
// threads, or CUDA device index mod the devices visible.
llvm::Expected<std::unique_ptr<runtime::Backend>>
makeBackend(const std::string &device, int64_t threads, int index) {
  if (device == "cpu")
    return runtime::createCpuBackend(int(threads));
  if (device == "cuda-emulated")
    return runtime::cuda::createCudaEmulatedBackend();
#ifdef CLEAVE_HAVE_CUDA
  auto count = runtime::cudaDeviceCount();
  if (!count)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "--device cuda: " +
                                       llvm::toString(count.takeError()));
  return runtime::createCudaBackend(index % *count);
#else
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "--device cuda: this cleave-run was built without the CUDA backend "
      "(no nvcc at build time)");
#endif
}

// An error on this rank alone while the others may be waiting for it: print
// it, then end the whole job (MPI_Abort). Where several ranks fail at once
// (the same bad sample on every replica), the first prints and ends the job;
// the others wait for that, printing nothing (`comm` is the world's).
[[noreturn]] void mpiFailHere(runtime::MpiComm &comm, const std::string &msg) {
  llvm::outs().flush();
  if (!comm.firstToFail())
    // Aborts anyway should the first one never get there.
    std::this_thread::sleep_for(std::chrono::seconds(10));
  else
    fail(kTool, msg, tools::kBadInput);
  llvm::errs().flush();
  comm.abort(msg);
  std::abort(); // not reached: MPI_Abort ends the process
}

// Every rank calls it with its outcome (`error` empty when it succeeded):
// when a rank failed, the lowest failing rank prints its error, once even
// when every rank failed alike, and every rank gets `code` (0 when all
// succeeded), so they all exit together without MPI_Abort.
int mpiAgree(runtime::MpiComm &comm, const std::optional<std::string> &error,
             int code) {
  auto all = comm.allGather({error ? 1.0 : 0.0});
  if (!all)
    mpiFailHere(comm, llvm::toString(all.takeError()));
  for (int r = 0; r < comm.size(); ++r)
    if ((*all)[size_t(r)] != 0) {
      if (r == comm.rank())
        fail(kTool, *error, code);
      return code;
    }
  return tools::kOk;
}

std::optional<std::string> errorText(llvm::Error e) {
  if (!e)
    return std::nullopt;
  return llvm::toString(std::move(e));
}

// (name, bytes) pairs in one byte string, for gatherToRoot.
void putBytes(std::vector<uint8_t> &out, const void *data, uint64_t n) {
  const uint8_t *len = reinterpret_cast<const uint8_t *>(&n);
  out.insert(out.end(), len, len + sizeof(n));
  const uint8_t *p = static_cast<const uint8_t *>(data);
  out.insert(out.end(), p, p + n);
}
// putBytes' byte strings, in order.
std::vector<std::vector<uint8_t>> splitBytes(const std::vector<uint8_t> &in) {
  std::vector<std::vector<uint8_t>> out;
  size_t pos = 0;
  while (pos + sizeof(uint64_t) <= in.size()) {
    uint64_t n = 0;
    std::memcpy(&n, in.data() + pos, sizeof(n));
    pos += sizeof(n);
    n = std::min<uint64_t>(n, in.size() - pos);
    out.emplace_back(in.begin() + long(pos), in.begin() + long(pos + n));
    pos += n;
  }
  return out;
}
std::map<std::string, std::vector<uint8_t>>
takeNamedBytes(const std::vector<uint8_t> &in) {
  std::map<std::string, std::vector<uint8_t>> out;
  size_t pos = 0;
  auto get = [&]() {
    uint64_t n = 0;
    std::memcpy(&n, in.data() + pos, sizeof(n));
    pos += sizeof(n);
    std::vector<uint8_t> v(in.begin() + long(pos), in.begin() + long(pos + n));
    pos += n;
    return v;
  };
  while (pos < in.size()) {
    std::vector<uint8_t> name = get();
    out[std::string(name.begin(), name.end())] = get();
  }
  return out;
}

// --save under MPI: every rank of replica 0 (`contribute`; the others send
// nothing) sends the trained values it holds to rank 0, which picks each
// value from the lowest stage holding it (as the threaded run does) and
// writes the model.
int mpiSave(runtime::MpiComm &comm, const runtime::Plan &plan,
            runtime::StageExecutor &ex, bool contribute,
            const std::string &out) {
  frontend::ImportOptions importOpts;
  if (!plan.inputs.empty() && !plan.inputs[0].shape.empty())
    importOpts.microbatchSize = plan.inputs[0].shape[0];
  auto model = frontend::importOnnxFile(plan.sourceModel, importOpts);
  std::optional<std::string> err;
  if (!model)
    err = "--save needs the model the plan was compiled from (" +
          plan.sourceModel + "): " + llvm::toString(model.takeError());
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  std::vector<uint8_t> mine;
  for (const ir::Value *v : (*model)->declared()) {
    if (!contribute || v->kind() == ir::ValueKind::Const ||
        ex.findSlot(v->name()) < 0)
      continue;
    auto bytes = ex.readSlot(v->name());
    if (!bytes) {
      err = llvm::toString(bytes.takeError());
      break;
    }
    putBytes(mine, v->name().data(), v->name().size());
    putBytes(mine, bytes->data(), bytes->size());
  }
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  auto all = comm.gatherToRoot(mine);
  if (!all)
    mpiFailHere(comm, llvm::toString(all.takeError()));
  size_t saved = 0;
  if (comm.rank() == 0) {
    std::vector<std::map<std::string, std::vector<uint8_t>>> byRank;
    for (const std::vector<uint8_t> &b : *all)
      byRank.push_back(takeNamedBytes(b));
    std::map<std::string, std::shared_ptr<ir::TensorData>> values;
    for (const ir::Value *v : (*model)->declared()) {
      if (v->kind() == ir::ValueKind::Const || values.count(v->name()))
        continue;
      for (auto &m : byRank) {
        auto it = m.find(v->name());
        if (it == m.end())
          continue;
        values[v->name()] = std::make_shared<ir::TensorData>(v->type(),
                                                             it->second);
        break;
      }
    }
    saved = values.size();
    err = errorText(frontend::writeTrainedOnnx(plan.sourceModel, values, out));
  }
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  if (comm.rank() == 0)
    llvm::outs() << "wrote " << out << " (" << saved << " trained tensors)\n";
  return tools::kOk;
}

// --profile under MPI: the entries of replica 0's ranks (`contribute`; the
// others send none), concatenated in stage order on rank 0, which writes the
// file.
int mpiProfile(runtime::MpiComm &comm, const runtime::Plan &plan,
               const runtime::ProfileMap &profile, bool contribute,
               const std::string &path) {
  llvm::json::Array ops;
  if (contribute)
    appendProfileOps(plan, profile, ops);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(ops));
  os.flush();
  auto all = comm.gatherToRoot(std::vector<uint8_t>(text.begin(), text.end()));
  if (!all)
    mpiFailHere(comm, llvm::toString(all.takeError()));
  std::optional<std::string> err;
  if (comm.rank() == 0) {
    llvm::json::Array merged;
    for (const std::vector<uint8_t> &b : *all) {
      auto v = llvm::json::parse(llvm::StringRef(
          reinterpret_cast<const char *>(b.data()), b.size()));
      if (!v) {
        err = "--profile: " + llvm::toString(v.takeError());
        break;
      }
      if (llvm::json::Array *a = v->getAsArray())
        for (llvm::json::Value &op : *a)
          merged.push_back(std::move(op));
    }
    if (!err)
      err = errorText(writeProfile(path, std::move(merged)));
  }
  return mpiAgree(comm, err, tools::kBadInput);
}

// --checkpoint-dir under MPI: every rank of replica 0 (`contribute`; the
// others send nothing) serializes its stage's entries, rank 0 gathers them
// (rank order = stage order, as the threaded writer's) and writes the file
// the threaded run writes, byte for byte.
int mpiWriteCheckpoint(runtime::MpiComm &comm, const runtime::Plan &plan,
                       runtime::StageExecutor &ex, bool contribute,
                       const std::string &dir, int64_t stepsDone) {
  std::string body;
  double entries = 0;
  std::optional<std::string> err;
  if (contribute) {
    auto n = appendCheckpointEntries(body, plan.stages[size_t(ex.stage())], ex);
    if (n)
      entries = double(*n);
    else
      err = llvm::toString(n.takeError());
  }
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  auto counts = comm.allGather({entries});
  if (!counts)
    mpiFailHere(comm, llvm::toString(counts.takeError()));
  auto all = comm.gatherToRoot(std::vector<uint8_t>(body.begin(), body.end()));
  if (!all)
    mpiFailHere(comm, llvm::toString(all.takeError()));
  if (comm.rank() == 0) {
    uint64_t total = 0;
    for (double c : *counts)
      total += uint64_t(c);
    std::string whole;
    for (const std::vector<uint8_t> &b : *all)
      whole.append(b.begin(), b.end());
    err = errorText(writeCheckpointFile(dir, stepsDone, total, whole));
  }
  return mpiAgree(comm, err, tools::kBadInput);
}

// --resume under MPI: every rank reads the file itself and loads its own
// stage's entries (every replica of a stage the same values); an error is
// one line, from the lowest failing rank, and every rank exits. Sets
// `stepsDone`.
int mpiReadCheckpoint(runtime::MpiComm &comm, runtime::StageExecutor &ex,
                      int stages, const std::string &dir,
                      int64_t &stepsDone) {
  uint32_t mine = uint32_t(ex.stage());
  auto done = readCheckpointFile(
      dir,
      // Entries of a stage the plan lacks are every rank's error.
      [&](uint32_t stage) { return stage == mine || stage >= uint32_t(stages); },
      [&](uint32_t stage, const std::string &name,
          const std::vector<uint8_t> &bytes) -> std::optional<std::string> {
        if (stage != mine || ex.findSlot(name) < 0)
          return foreignEntry(stage, name);
        if (auto e = ex.writeSlot(name, bytes))
          return llvm::toString(std::move(e)) +
                 " (a checkpoint of another plan?)";
        return std::nullopt;
      });
  std::optional<std::string> err;
  if (done)
    stepsDone = *done;
  else
    err = llvm::toString(done.takeError());
  return mpiAgree(comm, err, tools::kBadInput);
}

// --trace under MPI: rank 0 gathers every rank's spans (world rank w is the
// threaded run's executor w, so the tracks match its) and writes the trace.
// The spans are steady_clock seconds, which on Linux is CLOCK_MONOTONIC,
// one clock for every process of a host: the ranks' spans line up when they
// run on one machine (across hosts their offsets are meaningless).
int mpiTrace(runtime::MpiComm &comm, runtime::StageExecutor &ex,
             int replicas, int replica, const std::string &path) {
  std::vector<uint8_t> mine;
  std::string name = traceTrackName(ex.stage(), replica, replicas);
  putBytes(mine, name.data(), name.size());
  for (const runtime::StageStats::Span &span : ex.stats().spans) {
    putBytes(mine, span.name.data(), span.name.size());
    double fixed[3] = {double(span.microbatch), span.start, span.end};
    putBytes(mine, fixed, sizeof(fixed));
  }
  auto all = comm.gatherToRoot(mine);
  if (!all)
    mpiFailHere(comm, llvm::toString(all.takeError()));
  std::optional<std::string> err;
  if (comm.rank() == 0) {
    std::vector<TraceTrack> tracks;
    for (const std::vector<uint8_t> &b : *all) {
      std::vector<std::vector<uint8_t>> parts = splitBytes(b);
      TraceTrack t;
      if (!parts.empty())
        t.name.assign(parts[0].begin(), parts[0].end());
      for (size_t i = 1; i + 1 < parts.size(); i += 2) {
        runtime::StageStats::Span span;
        span.name.assign(parts[i].begin(), parts[i].end());
        double fixed[3] = {-1, 0, 0};
        if (parts[i + 1].size() == sizeof(fixed))
          std::memcpy(fixed, parts[i + 1].data(), sizeof(fixed));
        span.microbatch = int(fixed[0]);
        span.start = fixed[1];
        span.end = fixed[2];
        t.spans.push_back(std::move(span));
      }
      tracks.push_back(std::move(t));
    }
    err = errorText(writeTrace(path, tracks));
  }
  return mpiAgree(comm, err, tools::kBadInput);
}

// Training under mpirun: world rank w runs stage w % P of replica w / P on
// this thread (with one replica, rank w runs stage w); rank 0 prints what the
// threaded run prints. Pipeline messages go over the replica's group (ranks =
// stages), the gradient all-reduce over the stage's group (ranks = replicas),
// the driver's collectives over the world.
int runUnderMpi(const tools::Flags &flags, const RunOptions &opt, int &argc,
                char **&argv) {
  auto commOr = runtime::initMpi(argc, argv);
  if (!commOr)
    return fail(kTool, llvm::toString(commOr.takeError()), tools::kBadInput);
  std::unique_ptr<runtime::MpiComm> commPtr = std::move(*commOr);
  runtime::MpiComm &comm = *commPtr;
  int rank = comm.rank(), world = comm.size();
  // Every rank checks the flags alike; rank 0 prints the error.
  auto everyOr = parseCheckpointEvery(flags);
  if (!everyOr)
    return mpiAgree(comm, llvm::toString(everyOr.takeError()), tools::kUsage);
  int64_t checkpointEvery = *everyOr;
  std::optional<std::string> checkpointDir = flags.get("checkpoint-dir");

  if (flags.has("print-plan")) {
    std::optional<std::string> err;
    if (rank == 0) {
      auto plan = runtime::readPlanFile(opt.planPath);
      if (plan)
        runtime::printPlan(*plan, llvm::outs());
      else
        err = llvm::toString(plan.takeError());
    }
    return mpiAgree(comm, err, tools::kBadInput);
  }

  // Each rank loads only its own stage. The process count decides first: a
  // rank past the plan's last stage fails to load (it may be a later
  // replica's, loaded again below), but a mismatch is the error to report.
  auto planOr = runtime::readPlanFile(opt.planPath, rank);
  std::optional<std::string> err;
  double stages = 0, replicas = 0;
  if (planOr) {
    stages = double(planOr->stages.size());
    replicas = double(planOr->dataParallel);
  } else {
    err = llvm::toString(planOr.takeError());
  }
  auto loaded = comm.allGather({stages, replicas});
  if (!loaded)
    mpiFailHere(comm, llvm::toString(loaded.takeError()));
  int p = 0, d = 1;
  for (int r = 0; r < world; ++r) {
    double s = (*loaded)[size_t(2 * r)], reps = (*loaded)[size_t(2 * r + 1)];
    if (s > 0 && s * reps != world) {
      if (r == rank) {
        std::string procs = llvm::formatv("mpirun started {0} {1}", world,
                                          world == 1 ? "process" : "processes");
        fail(kTool,
             reps > 1
                 ? llvm::formatv("the plan has {0} stages x {1} replicas but "
                                 "{2}: use mpirun -np {3}",
                                 int64_t(s), int64_t(reps), procs,
                                 int64_t(s * reps))
                       .str()
                 : llvm::formatv("the plan has {0} stages but {1}: use mpirun "
                                 "-np {0}",
                                 int64_t(s), procs)
                       .str(),
             tools::kBadInput);
      }
      return tools::kBadInput;
    }
    if (s > 0) { // the first rank that loaded agrees with the world size
      p = int(s);
      d = int(reps);
      break;
    }
  }
  // A later replica's rank loads its own stage now.
  int replica = p > 0 ? rank / p : 0, stage = p > 0 ? rank % p : rank;
  if (p > 0 && rank >= p) {
    planOr = runtime::readPlanFile(opt.planPath, stage);
    err.reset();
    if (!planOr)
      err = llvm::toString(planOr.takeError());
  }
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  runtime::Plan &plan = *planOr;
  if (int(plan.stages.size()) != p || plan.dataParallel != d)
    mpiFailHere(comm, opt.planPath + ": the plan changed while loading");
  comm.setMicrobatches(plan.microbatches);

  // The replica's pipeline group (ranks = stages) and, with replicas, the
  // stage's data-parallel group (ranks = replicas). Declared after the world
  // comm, so destroyed before it finalizes MPI.
  auto pipeOr = comm.split(replica, stage);
  if (!pipeOr)
    mpiFailHere(comm, llvm::toString(pipeOr.takeError()));
  std::unique_ptr<runtime::MpiComm> pipe = std::move(*pipeOr);
  std::unique_ptr<runtime::MpiComm> group;
  if (d > 1) {
    auto groupOr = comm.split(stage, replica);
    if (!groupOr)
      mpiFailHere(comm, llvm::toString(groupOr.takeError()));
    group = std::move(*groupOr);
  }

  DataSource data(plan, uint64_t(opt.seed));
  if (auto d = flags.get("data"))
    err = errorText(data.load(*d));
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;

  // "stage S" in errors, "replica R stage S" with replicas.
  std::string where = (d > 1 ? "replica " + std::to_string(replica) + " "
                             : std::string()) +
                      "stage " + std::to_string(stage);
  int64_t threads = opt.threads;
  if (threads == 0)
    threads = std::max<int64_t>(
        1, int64_t(std::thread::hardware_concurrency()) / std::max(world, 1));
  auto backendOr = makeBackend(opt.device, threads, rank);
  std::unique_ptr<runtime::Backend> backend;
  if (!backendOr)
    err = where + ": " + llvm::toString(backendOr.takeError());
  else
    backend = std::move(*backendOr);
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  auto exOr = runtime::StageExecutor::create(plan, stage, *backend, *pipe);
  if (!exOr) // the executor's errors name the stage
    err = (d > 1 ? "replica " + std::to_string(replica) + " " : std::string()) +
          llvm::toString(exOr.takeError());
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  runtime::StageExecutor &ex = **exOr;
  ex.setNonFinitePolicy(
      opt.skipNonFinite ? runtime::StageExecutor::NonFinitePolicy::SkipStep
                        : runtime::StageExecutor::NonFinitePolicy::Stop);
  ex.setBatchW(opt.batchW);
  if (group)
    ex.setDataParallel(group.get());
  if (opt.lr && ex.findSlot("optimizer.lr") >= 0) {
    std::vector<uint8_t> bytes(sizeof(float));
    std::memcpy(bytes.data(), &*opt.lr, sizeof(float));
    err = errorText(ex.writeSlot("optimizer.lr", bytes));
  }
  if (int rc = mpiAgree(comm, err, tools::kBadInput))
    return rc;
  int64_t firstStep = 0;
  std::optional<std::string> resumeDir = flags.get("resume");
  if (resumeDir)
    if (int rc = mpiReadCheckpoint(comm, ex, p, *resumeDir, firstStep))
      return rc;
  bool profiling = flags.has("profile");
  ProfileSteps profileSteps;

  int64_t mbRows = plan.inputs.empty() || plan.inputs[0].shape.empty()
                       ? 1
                       : plan.inputs[0].shape[0];
  int64_t samplesPerStep = mbRows * plan.microbatches * d;
  bool quiet = flags.has("quiet");
  int64_t steps = opt.steps;
  if (rank == 0) {
    printTrainingHeader(plan, mbRows, steps, data, flags);
    llvm::outs().flush();
  }
  if (rank == 0 && resumeDir) {
    llvm::outs() << "resumed from " << *resumeDir << " after step "
                 << firstStep << "\n";
    llvm::outs().flush();
  }
  auto start = std::chrono::steady_clock::now();
  double firstLoss = NAN, lastLoss = NAN, stepSum = 0;
  for (int64_t step = firstStep; step < steps; ++step) {
    ex.setProfiling(profiling && warmStep(step, firstStep, steps));
    if (auto e = ex.runStep(step, data.forStep(step, replica)))
      mpiFailHere(comm, "step " + std::to_string(step + 1) + ": " + where +
                            ": " + llvm::toString(std::move(e)));
    if (profiling)
      profileSteps.take(ex);
    // The loss lives on one stage of each replica; every rank learns their
    // mean, summed in replica order as the threaded run does (and the
    // slowest stage's time), so all of them stop together on a non-finite
    // loss.
    if (ex.stepSkipped()) {
      // Every rank skipped the update; the lowest rank that found a
      // non-finite value says what (stop), or rank 0 reports it (skip).
      std::optional<std::string> found;
      if (!ex.nonFiniteReport().empty())
        found = "step " + std::to_string(step + 1) + ": " + where + ": " +
                ex.nonFiniteReport();
      if (!opt.skipNonFinite) {
        if (found)
          *found += "; stopping before the update (--on-nan=skip-step "
                    "skips such steps)";
        if (int rc = mpiAgree(comm, found, tools::kBadInput))
          return rc;
      }
      auto reports = comm.gatherToRoot(std::vector<uint8_t>(
          found ? found->begin() : std::string::const_iterator(),
          found ? found->end() : std::string::const_iterator()));
      if (!reports)
        mpiFailHere(comm, llvm::toString(reports.takeError()));
      if (rank == 0)
        for (const auto &r : *reports)
          if (!r.empty()) {
            llvm::errs() << kTool << ": warning: "
                         << std::string(r.begin(), r.end())
                         << "; the step's update was skipped\n";
            break;
          }
    }
    auto all = comm.allGather({ex.hasLoss() ? 1.0 : 0.0,
                               ex.hasLoss() ? ex.lastLoss() : 0.0,
                               ex.stats().stepSeconds});
    if (!all)
      mpiFailHere(comm, llvm::toString(all.takeError()));
    double stepTime = 0;
    lastLoss = 0;
    for (int r = 0; r < world; ++r) {
      if ((*all)[size_t(3 * r)] != 0)
        lastLoss += (*all)[size_t(3 * r + 1)] / d;
      stepTime = std::max(stepTime, (*all)[size_t(3 * r + 2)]);
    }
    if (step == firstStep)
      firstLoss = lastLoss;
    if (!std::isfinite(lastLoss) && !ex.stepSkipped()) {
      if (rank == 0)
        fail(kTool,
             "step " + std::to_string(step + 1) +
                 ": the loss is not finite (" + std::to_string(lastLoss) +
                 "); try a smaller --lr",
             tools::kBadInput);
      return tools::kBadInput;
    }
    double elapsed = std::chrono::duration<double>(
                         std::chrono::steady_clock::now() - start)
                         .count();
    if (warmStep(step, firstStep, steps))
      stepSum += stepTime;
    if (checkpointDir && checkpointDue(step, steps, checkpointEvery))
      if (int rc = mpiWriteCheckpoint(comm, plan, ex, replica == 0,
                                      *checkpointDir, step + 1))
        return rc;
    if (!quiet && rank == 0) {
      int64_t done = step + 1 - firstStep;
      double rate = double(samplesPerStep * done) / elapsed;
      double eta = elapsed / double(done) * double(steps - step - 1);
      llvm::outs() << llvm::formatv(
          "step {0,5}/{1}  loss {2:F4}  {3:F0} samples/s  {5:F1} ms  ETA {4}\n",
          step + 1, steps, lastLoss, rate, formatSeconds(eta), 1e3 * stepTime);
      llvm::outs().flush();
    }
  }
  double total = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();

  // Per-stage figures of the last step, gathered for rank 0's table, which
  // shows replica 0's (world ranks 0..P-1), as the threaded run does.
  const runtime::StageStats &st = ex.stats();
  double busy = 0;
  for (double b : st.busySeconds)
    busy += b;
  busy -= st.recvWaitSeconds;
  auto figures =
      comm.allGather({busy, double(st.peakBytes), st.stepSeconds});
  if (!figures)
    mpiFailHere(comm, llvm::toString(figures.takeError()));
  if (rank == 0) {
    llvm::outs() << llvm::formatv(
        "done: {0} step(s) in {1:F2} s, loss {2:F4} -> {3:F4}\n",
        steps - firstStep, total, firstLoss, lastLoss);
    // As the threaded run: busy time of the last step, the mean step time.
    double measuredStep =
        stepSum / double(std::max<int64_t>(steps - firstStep - 1, 1));
    llvm::outs() << "stage  busy %  bubble %  peak bytes (measured / planned)  "
                    "step ms (measured / predicted)\n";
    for (int s = 0; s < p; ++s) {
      double b = (*figures)[size_t(3 * s)];
      double stageStep = (*figures)[size_t(3 * s + 2)];
      double busyPct = stageStep > 0 ? 100 * b / stageStep : 0;
      llvm::outs() << llvm::formatv(
          "{0,-5}  {1,6:F1}  {2,8:F1}  {3,14} / {4,-14}  {5,8:F3} / {6:F3}\n",
          s, busyPct, 100 - busyPct, int64_t((*figures)[size_t(3 * s + 1)]),
          plan.stages[s].predictedPeakBytes, 1e3 * measuredStep,
          1e3 * plan.predictedStepTime);
    }
    llvm::outs().flush();
  }

  if (auto path = flags.get("profile"))
    if (int rc = mpiProfile(comm, plan, profileSteps.trimmedMean(), replica == 0,
                            *path))
      return rc;
  if (auto path = flags.get("trace"))
    if (int rc = mpiTrace(comm, ex, d, replica, *path))
      return rc;
  if (auto out = flags.get("save"))
    if (int rc = mpiSave(comm, plan, ex, replica == 0, *out))
      return rc;
  llvm::outs().flush();
  return tools::kOk;
}

#endif // CLEAVE_HAVE_MPI

} // namespace

int main(int argc, char **argv) {
  tools::Flags flags({{"help", false, false},
                      {"data", true, false},
                      {"seed", true, false},
                      {"steps", true, false},
                      {"lr", true, false},
                      {"threads", true, false},
                      {"device", true, false},
                      {"save", true, false},
                      {"profile", true, false},
                      {"batch-w", false, false},
                      {"trace", true, false},
                      {"checkpoint-dir", true, false},
                      {"checkpoint-every", true, false},
                      {"resume", true, false},
                      {"on-nan", true, false},
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
  std::string onNan = flags.get("on-nan").value_or("stop");
  if (onNan != "stop" && onNan != "skip-step")
    return fail(kTool,
                "--on-nan must be 'stop' or 'skip-step', not '" + onNan + "'",
                tools::kUsage);
  bool skipNonFinite = onNan == "skip-step";
  std::string device = flags.get("device").value_or("cpu");
  bool batchW = flags.has("batch-w");
  if (device != "cpu" && device != "cuda" && device != "cuda-emulated")
    return fail(kTool,
                "--device must be 'cpu', 'cuda' or 'cuda-emulated', not '" +
                    device + "'",
                tools::kUsage);

  const std::string &planPath = flags.positional()[0];
  if (launchedByMpirun()) {
#ifdef CLEAVE_HAVE_MPI
    return runUnderMpi(flags,
                       RunOptions{planPath, steps, seed, threads, lr,
                                  skipNonFinite, device, batchW},
                       argc, argv);
#else
    return fail(kTool,
                "this cleave-run was built without MPI (install "
                "libopenmpi-dev and rebuild); run it without mpirun to train "
                "with one thread per stage",
                tools::kUsage);
#endif
  }
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
  // D data-parallel replicas of the pipeline: executor r * P + s runs
  // stage s of replica r; pipeline messages within a replica, the gradient
  // all-reduce among the replicas of a stage.
  int d = plan.dataParallel;
  if (threads == 0)
    threads = std::max<int64_t>(
        1, int64_t(std::thread::hardware_concurrency()) / std::max(p * d, 1));
  std::vector<std::unique_ptr<runtime::Backend>> backends;
  std::vector<std::vector<std::unique_ptr<runtime::Comm>>> pipes, groups;
  for (int r = 0; r < d; ++r)
    pipes.push_back(runtime::createInProcessComms(p));
  for (int s = 0; s < p; ++s)
    groups.push_back(runtime::createInProcessComms(d));
  std::vector<std::unique_ptr<runtime::StageExecutor>> execs;
  std::vector<runtime::StageExecutor *> raw;
  for (int r = 0; r < d; ++r)
    for (int s = 0; s < p; ++s) {
      auto backend = makeBackend(device, threads, r * p + s);
      if (!backend)
        return fail(kTool, llvm::toString(backend.takeError()),
                    tools::kBadInput);
      backends.push_back(std::move(*backend));
      auto ex = runtime::StageExecutor::create(plan, s, *backends.back(),
                                               *pipes[r][s]);
      if (!ex) // the executor's errors name the stage
        return fail(kTool, llvm::toString(ex.takeError()), tools::kBadInput);
      if (d > 1)
        (*ex)->setDataParallel(groups[s][r].get());
      (*ex)->setNonFinitePolicy(
          skipNonFinite ? runtime::StageExecutor::NonFinitePolicy::SkipStep
                        : runtime::StageExecutor::NonFinitePolicy::Stop);
      (*ex)->setBatchW(batchW);
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
  std::vector<ProfileSteps> profileSteps(execs.size());

  int64_t mbRows = plan.inputs.empty() || plan.inputs[0].shape.empty()
                       ? 1
                       : plan.inputs[0].shape[0];
  int64_t samplesPerStep = mbRows * plan.microbatches * d;
  bool live = llvm::sys::Process::StandardOutIsDisplayed();
  bool quiet = flags.has("quiet");
  printTrainingHeader(plan, mbRows, steps, data, flags);
  llvm::outs().flush();
  auto start = std::chrono::steady_clock::now();
  double firstLoss = NAN, lastLoss = NAN, stepSum = 0;
  int64_t firstStep = 0;
  if (auto dir = flags.get("resume")) {
    auto done = readCheckpoint(*dir, execs, p);
    if (!done)
      return fail(kTool, llvm::toString(done.takeError()), tools::kBadInput);
    firstStep = *done;
    llvm::outs() << "resumed from " << *dir << " after step " << firstStep
                 << "\n";
  }
  std::optional<std::string> checkpointDir = flags.get("checkpoint-dir");
  auto everyOr = parseCheckpointEvery(flags);
  if (!everyOr)
    return fail(kTool, llvm::toString(everyOr.takeError()), tools::kUsage);
  int64_t checkpointEvery = *everyOr;
  for (int64_t step = firstStep; step < steps; ++step) {
    for (auto &ex : execs)
      ex->setProfiling(profiling && warmStep(step, firstStep, steps));
    std::vector<runtime::DataFn> feeds;
    for (int r = 0; r < d; ++r)
      for (int s = 0; s < p; ++s)
        feeds.push_back(data.forStep(step, r));
    if (auto e = runtime::runPipelineThreads(raw, step, feeds))
      return fail(kTool, "step " + std::to_string(step + 1) + ": " +
                             llvm::toString(std::move(e)),
                  tools::kBadInput);
    if (profiling)
      for (size_t i = 0; i < execs.size(); ++i)
        profileSteps[i].take(*execs[i]);
    lastLoss = 0;
    for (auto &ex : execs)
      if (ex->hasLoss())
        lastLoss += ex->lastLoss() / d;
    if (step == firstStep)
      firstLoss = lastLoss;
    if (execs[0]->stepSkipped()) {
      // Every stage skipped the update; the first that found a non-finite
      // value says what.
      std::string found;
      for (auto &ex : execs)
        if (found.empty() && !ex->nonFiniteReport().empty())
          found = "step " + std::to_string(step + 1) + ": " +
                  (d > 1 ? "replica " +
                               std::to_string(size_t(&ex - &execs[0]) /
                                              size_t(p)) +
                               " "
                         : std::string()) +
                  "stage " + std::to_string(ex->stage()) + ": " +
                  ex->nonFiniteReport();
      if (!skipNonFinite)
        return fail(kTool,
                    found + "; stopping before the update "
                            "(--on-nan=skip-step skips such steps)",
                    tools::kBadInput);
      llvm::outs().flush();
      llvm::errs() << kTool << ": warning: " << found
                   << "; the step's update was skipped\n";
    } else if (!std::isfinite(lastLoss))
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
    if (warmStep(step, firstStep, steps))
      stepSum += stepTime;
    if (checkpointDir && checkpointDue(step, steps, checkpointEvery))
      if (auto e = writeCheckpoint(*checkpointDir, step + 1, execs, plan))
        return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
    if (!quiet) {
      int64_t done = step + 1 - firstStep;
      double rate = double(samplesPerStep * done) / elapsed;
      double eta = elapsed / double(done) * double(steps - step - 1);
      // On a terminal one live line, rewritten each step; else one line
      // per step (logs, pipes).
      llvm::outs() << llvm::formatv(
          "{5}step {0,5}/{1}  loss {2:F4}  {3:F0} samples/s  {7:F1} ms  ETA "
          "{4}{6}",
          step + 1, steps, lastLoss, rate, formatSeconds(eta),
          live ? "\r" : "", live ? "" : "\n", 1e3 * stepTime);
      llvm::outs().flush();
    }
  }
  if (live && !quiet)
    llvm::outs() << "\n";
  double total = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
  llvm::outs() << llvm::formatv(
      "done: {0} step(s) in {1:F2} s, loss {2:F4} -> {3:F4}\n",
      steps - firstStep, total,
      firstLoss, lastLoss);

  // Per-stage figures: busy time of the last step, the mean step time.
  double measuredStep =
      stepSum / double(std::max<int64_t>(steps - firstStep - 1, 1));
  llvm::outs() << "stage  busy %  bubble %  peak bytes (measured / planned)  "
                  "step ms (measured / predicted)\n";
  for (int s = 0; s < p; ++s) {
    const runtime::StageStats &st = execs[s]->stats();
    double busy = 0;
    for (double b : st.busySeconds)
      busy += b;
    busy -= st.recvWaitSeconds;
    double busyPct = st.stepSeconds > 0 ? 100 * busy / st.stepSeconds : 0;
    llvm::outs() << llvm::formatv(
        "{0,-5}  {1,6:F1}  {2,8:F1}  {3,14} / {4,-14}  {5,8:F3} / {6:F3}\n", s,
        busyPct, 100 - busyPct, st.peakBytes,
        plan.stages[s].predictedPeakBytes, 1e3 * measuredStep,
        1e3 * plan.predictedStepTime);
  }

  if (auto path = flags.get("profile")) {
    llvm::json::Array ops;
    for (int s = 0; s < p; ++s) // replica 0: one entry per op
      appendProfileOps(plan, profileSteps[size_t(s)].trimmedMean(), ops);
    if (auto e = writeProfile(*path, std::move(ops)))
      return fail(kTool, llvm::toString(std::move(e)), tools::kBadInput);
  }

  if (auto path = flags.get("trace")) {
    std::vector<TraceTrack> tracks;
    for (size_t i = 0; i < execs.size(); ++i)
      tracks.push_back({traceTrackName(execs[i]->stage(), int(i) / p, d),
                        execs[i]->stats().spans});
    if (auto e = writeTrace(*path, tracks))
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
