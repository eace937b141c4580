#include "runtime/data/DataSource.h"

#include "runtime/data/NumpyFiles.h"
#include "support/Checksum.h"
#include "support/FileIO.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"

#include <algorithm>
#include <cstring>

namespace cleave::runtime {

// The largest text --data text:FILE reads (its arrays take 16 bytes a byte).
constexpr uint64_t kMaxTextDataBytes = uint64_t(256) << 20;

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static llvm::Error badData(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

llvm::Expected<std::vector<int>> windowFills(const Plan &plan,
                                             const std::string &flag) {
  const auto &in = plan.inputs;
  auto need = [&](const std::string &why) {
    return badData("--data " + flag + " " + why);
  };
  bool ok = !in.empty() && in[0].shape.size() == 2;
  for (const PlanInput &i : in)
    ok = ok && i.shape == in[0].shape &&
         (i.dtype == ir::DType::I64 || i.dtype == ir::DType::I32);
  if (!ok)
    return need("needs a model whose inputs are all integer [B, T] "
                "(token ids, targets, attention masks)");
  bool known = false;
  for (const PlanInput &i : in)
    known = known || i.indexes || i.labels;
  std::vector<int> fill(in.size(), kFillOnes);
  if (!known) {
    // A plan from before the analysis: tokens, then next-token targets.
    if (in.size() != 2)
      return need("needs a model with two integer inputs [B, T] (tokens "
                  "and next-token targets); compile the plan again");
    fill = {0, 1};
    return fill;
  }
  int tokens = -1;
  bool targets = false;
  for (size_t k = 0; k < in.size(); ++k) {
    const PlanInput &i = in[k];
    if (i.labels && (i.labelShift < 0 || i.labelShift > 1))
      return need("cannot feed '" + i.name +
                  "': the model does something to its labels' sequence axis "
                  "other than a shift by one position (give the data as "
                  "arrays, --data DIR)");
    if (i.indexes) {
      if (tokens >= 0) {
        const PlanInput &other = in[size_t(tokens)];
        bool mine = i.indexLimit > other.indexLimit;
        return need("cannot tell which of '" + other.name + "' and '" +
                    i.name + "' holds the token ids: both index tables ('" +
                    (mine ? other.name : i.name) +
                    "' might be token types or positions); window data "
                    "fills token ids, targets and masks only (give the data "
                    "as arrays, --data DIR)");
      }
      tokens = int(k);
      fill[k] = 0;
      targets = targets || i.labels;
    } else if (i.labels) {
      // Next-token targets, unless the model shifts them itself.
      fill[k] = i.labelShift == 1 ? 0 : 1;
      targets = true;
    }
  }
  if (tokens < 0)
    return need("finds no input that indexes a table (the token ids)");
  if (!targets)
    return need("finds no input that reaches the loss's labels (the "
                "targets)");
  return fill;
}

std::string describeWindowFills(const Plan &plan,
                                const std::vector<int> &fill) {
  std::string s;
  for (size_t k = 0; k < fill.size() && k < plan.inputs.size(); ++k) {
    const PlanInput &i = plan.inputs[k];
    s += (k ? ", '" : "'") + i.name + "' ";
    if (fill[k] == kFillOnes)
      s += "ones (a mask)";
    else if (fill[k] == 1)
      s += "the next tokens (targets)";
    else if (i.labels && !i.indexes)
      s += "the window (targets the model shifts)";
    else
      s += "the window";
  }
  return s;
}

// Byte-level language-model data from a text file: windows of T bytes
// and the same windows one byte later, each input as windowFills says.
static llvm::Expected<std::map<std::string, std::shared_ptr<ir::TensorData>>>
textArrays(const Plan &plan, const std::string &file) {
  const auto &in = plan.inputs;
  auto fill = windowFills(plan, "text:FILE");
  if (!fill)
    return fill.takeError();
  for (const PlanInput &i : in)
    if (i.indexLimit > 0 && i.indexLimit < 256)
      return badData("--data text:FILE feeds bytes (0..255) but '" +
                     i.name + "' indexes a table of " +
                     std::to_string(i.indexLimit) + " entries");
  // Each byte becomes two 8-byte integers (tokens and targets) before the
  // arrays are made, so the text is bounded.
  auto buf = support::readFile(file, "text file", kMaxTextDataBytes);
  if (!buf)
    return buf.takeError();
  llvm::StringRef text = (*buf)->getBuffer();
  int64_t t = in[0].shape[1];
  int64_t windows = text.size() > 1 ? int64_t(text.size() - 1) / t : 0;
  if (windows < in[0].shape[0])
    return badData(file + ": " + std::to_string(text.size()) +
                   " bytes is too short for one microbatch of " +
                   std::to_string(in[0].shape[0]) + " windows of " +
                   std::to_string(t) + " bytes");
  std::map<std::string, std::shared_ptr<ir::TensorData>> arrays;
  for (size_t k = 0; k < in.size(); ++k) {
    std::vector<int64_t> values(size_t(windows * t), 1);
    int shift = (*fill)[k];
    for (int64_t i = 0; shift != kFillOnes && i < windows * t; ++i)
      values[size_t(i)] = uint8_t(text[size_t(i + shift)]);
    arrays[in[k].name] =
        ir::TensorData::fromInts(in[k].dtype, {windows, t}, values);
  }
  return arrays;
}

// A token file: checked whole (size, ids below the vocabulary) before
// any step reads it.
llvm::Error DataSource::loadTokens(const std::string &file, int width) {
  const char *flag = width == 2 ? "tokens:" : "tokens32:";
  const auto &in = plan_.inputs;
  auto fill = windowFills(plan_, std::string(flag) + "FILE");
  if (!fill)
    return fill.takeError();
  auto buf = support::readFile(file, "token file");
  if (!buf)
    return buf.takeError();
  Tokens t;
  t.file = std::move(*buf);
  t.width = width;
  uint64_t size = t.file->getBufferSize();
  if (size % uint64_t(width))
    return badData(file + ": " + std::to_string(size) +
                   " bytes is not a whole number of " +
                   (width == 2 ? "uint16" : "uint32") + " tokens (" +
                   std::to_string(width) + " bytes each)");
  t.count = int64_t(size / uint64_t(width));
  t.t = in[0].shape[1];
  t.windows = t.count > 1 ? (t.count - 1) / t.t : 0;
  if (t.windows < in[0].shape[0])
    return badData(file + ": " + std::to_string(t.count) +
                   " tokens is too short for one microbatch of " +
                   std::to_string(in[0].shape[0]) + " windows of " +
                   std::to_string(t.t) + " tokens");
  int64_t limit = 0;
  std::string limitName;
  for (size_t k = 0; k < in.size(); ++k)
    if ((*fill)[k] != kFillOnes && in[k].indexLimit > 0 &&
        (limit == 0 || in[k].indexLimit < limit)) {
      limit = in[k].indexLimit;
      limitName = in[k].name;
    }
  const auto *bytes =
      reinterpret_cast<const uint8_t *>(t.file->getBufferStart());
  for (int64_t i = 0; limit > 0 && i < t.count; ++i) {
    uint32_t id = 0;
    std::memcpy(&id, bytes + i * width, size_t(width)); // little-endian host
    if (int64_t(id) >= limit)
      return badData(file + ": token " + std::to_string(i) + " is " +
                     std::to_string(id) + " but the model's '" +
                     limitName + "' indexes a table of " + std::to_string(limit) +
                     " entries (another tokenizer's file?)");
  }
  for (size_t k = 0; k < in.size(); ++k)
    t.fill[in[k].name] = (*fill)[k];
  tokens_ = std::move(t);
  return llvm::Error::success();
}

llvm::Error DataSource::load(const std::string &path) {
  std::map<std::string, std::shared_ptr<ir::TensorData>> arrays;
  if (llvm::StringRef(path).startswith("tokens:"))
    return loadTokens(path.substr(7), 2);
  if (llvm::StringRef(path).startswith("tokens32:"))
    return loadTokens(path.substr(9), 4);
  if (llvm::StringRef(path).startswith("text:")) {
    auto a = textArrays(plan_, path.substr(5));
    if (!a)
      return a.takeError();
    arrays = std::move(*a);
  } else if (llvm::StringRef(path).endswith(".npz")) {
    auto a = readNpzFile(path);
    if (!a)
      return a.takeError();
    arrays = std::move(*a);
  } else if (llvm::sys::fs::is_directory(path)) {
    for (const PlanInput &in : plan_.inputs) {
      std::string file = path + "/" + in.name + ".npy";
      if (!llvm::sys::fs::exists(file))
        return badData(path + ": no " + in.name + ".npy for the model input '" +
                       in.name + "'");
      auto t = readNpyFile(file);
      if (!t)
        return t.takeError();
      arrays[in.name] = *t;
    }
  } else {
    return badData(path + ": --data needs a folder of .npy files or an .npz "
                          "file");
  }
  int64_t rows = -1;
  for (const PlanInput &in : plan_.inputs) {
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

// A bijection of [0, n) keyed by `key`: a 4-round Feistel network over
// the smallest even-width power of two >= n, walking the cycle until the
// value falls in range (fewer than 4 rounds' worth on average).
static int64_t permute(int64_t x, int64_t n, uint64_t key) {
  int bits = 2;
  while ((int64_t(1) << bits) < n)
    bits += 2;
  int half = bits / 2;
  uint64_t mask = (uint64_t(1) << half) - 1;
  uint64_t v = uint64_t(x);
  do {
    uint64_t l = v >> half, r = v & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = mix(key ^ mix(r * 4 + round)) & mask;
      uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    v = (l << half) | r;
  } while (int64_t(v) >= n);
  return int64_t(v);
}

int64_t DataSource::tokenWindow(int64_t sample) const {
  int64_t w = tokens_ ? tokens_->windows : 1;
  if (!shuffle_)
    return sample % w;
  int64_t epoch = sample / w;
  return permute(sample % w, w, mix(seed_ * 0x9e3779b97f4a7c15ull ^
                                    mix(uint64_t(epoch) + 1)));
}

llvm::Error DataSource::fillTokens(int64_t first, const PlanInput &in,
                                   void *dst, size_t bytes) const {
  const Tokens &t = *tokens_;
  int64_t rows = in.shape[0];
  size_t elem = ir::dtypeSize(in.dtype);
  if (size_t(rows * t.t) * elem != bytes)
    return badData("input '" + in.name + "': size mismatch");
  int shift = t.fill.at(in.name);
  if (shift == kFillOnes) {
    for (int64_t k = 0; k < rows * t.t; ++k)
      if (in.dtype == ir::DType::I64)
        static_cast<int64_t *>(dst)[k] = 1;
      else
        static_cast<int32_t *>(dst)[k] = 1;
    return llvm::Error::success();
  }
  const auto *src =
      reinterpret_cast<const uint8_t *>(t.file->getBufferStart());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t start = tokenWindow(first + r) * t.t + shift;
    for (int64_t j = 0; j < t.t; ++j) {
      uint32_t id = 0;
      std::memcpy(&id, src + (start + j) * t.width, size_t(t.width));
      int64_t k = r * t.t + j;
      if (in.dtype == ir::DType::I64)
        static_cast<int64_t *>(dst)[k] = int64_t(id);
      else
        static_cast<int32_t *>(dst)[k] = int32_t(id);
    }
  }
  return llvm::Error::success();
}

llvm::Error DataSource::fill(int64_t step, int microbatch,
                             const PlanInput &in, void *dst,
                             size_t bytes) const {
  int64_t mbRows = in.shape.empty() ? 1 : in.shape[0];
  int64_t first =
      (step * plan_.microbatches * plan_.dataParallel + microbatch) * mbRows;
  if (tokens_ && tokens_->fill.count(in.name))
    return fillTokens(first, in, dst, bytes);
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
  uint64_t salt = support::fnv1a64(in.name.data(), in.name.size(),
                                   support::kFnv1a64BasisCleave2) ^
                  seed_;
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

DataFn DataSource::forStep(int64_t step, int replica) const {
  return [this, step, replica](int microbatch, const std::string &name,
                               void *dst, size_t bytes) -> llvm::Error {
    for (const PlanInput &in : plan_.inputs)
      if (in.name == name)
        return fill(step, replica * plan_.microbatches + microbatch, in, dst,
                    bytes);
    return badData("the plan has no input '" + name + "'");
  };
}

} // namespace cleave::runtime
