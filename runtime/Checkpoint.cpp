// The checkpoint file (runtime/Checkpoint.h): its writer, and a reader that
// checks the whole file against the plan before handing out one value.
#include "runtime/Checkpoint.h"

#include "support/Errors.h"
#include "support/FileIO.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <cstdint>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include <unistd.h>

namespace cleave::runtime {

static const char kMagic[] = "CLEAVECKPT3\n";
static const char kFormat2Magic[] = "CLEAVECKPT2\n"; // read, summed from
                                                     // the old FNV basis
static const char kOlderMagic[] = "CLEAVECKPT1\n";
static constexpr size_t kMagicBytes = sizeof(kMagic) - 1;
// A header is a few numbers and two names; anything longer is damage.
static constexpr uint64_t kMaxHeaderBytes = 1 << 20;

static void putLe(std::string &out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(char((v >> (8 * i)) & 0xff));
}

static void putStr(std::string &out, llvm::StringRef s) {
  putLe(out, s.size(), 4);
  out += s;
}

static void putSum(std::string &out, size_t from) {
  putLe(out, fnv1a64(out.data() + from, out.size() - from), 8);
}

// One State slot as an entry describes it, without its bytes.
static void putSlotKey(std::string &out, uint32_t stage, const Slot &sl) {
  putLe(out, stage, 4);
  putStr(out, sl.name);
  putStr(out, llvm::StringRef(ir::dtypeName(sl.dtype)));
  putLe(out, sl.shape.size(), 4);
  for (int64_t d : sl.shape)
    putLe(out, uint64_t(d), 8);
}

uint64_t checkpointPlanIdentity(const Plan &plan, uint64_t basis) {
  std::string key;
  putStr(key, plan.modelName);
  putStr(key, plan.optimizer);
  putLe(key, plan.stages.size(), 4);
  for (const StagePlan &sp : plan.stages)
    for (const Slot &sl : sp.slots)
      if (sl.kind == SlotKind::State)
        putSlotKey(key, uint32_t(sp.index), sl);
  return support::fnv1a64(key.data(), key.size(), basis);
}

static uint64_t stateSlotCount(const Plan &plan) {
  uint64_t n = 0;
  for (const StagePlan &sp : plan.stages)
    for (const Slot &sl : sp.slots)
      n += sl.kind == SlotKind::State;
  return n;
}

// Each State slot of the stage as an entry's key (slot key and byte
// count) and its bytes, read one slot at a time; returns how many.
static llvm::Expected<uint64_t> forEachEntry(
    const StagePlan &sp, StageExecutor &ex,
    llvm::function_ref<llvm::Error(const std::string &key,
                                   const std::vector<uint8_t> &bytes)>
        emit) {
  uint64_t count = 0;
  for (const Slot &sl : sp.slots) {
    if (sl.kind != SlotKind::State)
      continue;
    auto bytes = ex.readSlot(sl.name);
    if (!bytes)
      return bytes.takeError();
    std::string key;
    putSlotKey(key, uint32_t(sp.index), sl);
    putLe(key, bytes->size(), 8);
    if (auto e = emit(key, *bytes))
      return std::move(e);
    ++count;
  }
  return count;
}

llvm::Expected<uint64_t> appendCheckpointEntries(std::string &body,
                                                 const StagePlan &sp,
                                                 StageExecutor &ex) {
  return forEachEntry(sp, ex, [&](const std::string &key,
                                  const std::vector<uint8_t> &bytes) {
    size_t start = body.size();
    body += key;
    body.append(reinterpret_cast<const char *>(bytes.data()), bytes.size());
    putSum(body, start);
    return llvm::Error::success();
  });
}

// Magic, header and its sum for a body of `entries` entries, `bodyBytes`.
static std::string checkpointHead(const Plan &plan, int64_t stepsDone,
                                  uint64_t entries, uint64_t bodyBytes,
                                  llvm::StringRef lrSchedule) {
  std::string header;
  putLe(header, kCheckpointVersion, 4);
  putLe(header, checkpointPlanIdentity(plan), 8);
  putLe(header, plan.stages.size(), 4);
  putLe(header, entries, 8);
  putLe(header, uint64_t(stepsDone), 8);
  putLe(header, bodyBytes, 8);
  putStr(header, plan.modelName);
  putStr(header, plan.optimizer);
  putStr(header, lrSchedule.str());
  std::string blob(kMagic);
  putLe(blob, header.size(), 8);
  blob += header;
  putSum(blob, 0);
  return blob;
}

// Creates DIR and removes the temp files of writers killed before their
// rename.
static llvm::Error prepareCheckpointDir(const std::string &dir) {
  if (auto e = support::checkOutputDirectory(dir))
    return e;
  if (auto ec = llvm::sys::fs::create_directories(dir))
    return fail(dir + ": " + ec.message());
  // A run killed while writing leaves its temp file; the rename below is
  // what makes a checkpoint, so those are garbage.
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (llvm::sys::path::filename(it->path()).startswith("checkpoint.bin.tmp."))
      llvm::sys::fs::remove(it->path());
  return llvm::Error::success();
}

llvm::Error writeCheckpointFile(const std::string &dir, const Plan &plan,
                                int64_t stepsDone, uint64_t entries,
                                llvm::StringRef body,
                                llvm::StringRef lrSchedule) {
  if (stepsDone < 0)
    return fail(llvm::formatv("a checkpoint after {0} steps", stepsDone));
  if (auto e = prepareCheckpointDir(dir))
    return e;
  return support::writeFileAtomically(
      dir + "/checkpoint.bin",
      checkpointHead(plan, stepsDone, entries, body.size(), lrSchedule) +
          body.str());
}

llvm::Expected<std::unique_ptr<CheckpointWriter>>
CheckpointWriter::open(const std::string &dir, const Plan &plan,
                       int64_t stepsDone, llvm::StringRef lrSchedule) {
  if (stepsDone < 0)
    return fail(llvm::formatv("a checkpoint after {0} steps", stepsDone));
  if (auto e = prepareCheckpointDir(dir))
    return std::move(e);
  std::unique_ptr<CheckpointWriter> w(new CheckpointWriter());
  w->path_ = dir + "/checkpoint.bin";
  if (auto e = support::checkOutputFile(w->path_))
    return std::move(e);
  // What the body will hold: the plan's State slots, each as an entry.
  for (const StagePlan &sp : plan.stages)
    for (const Slot &sl : sp.slots)
      if (sl.kind == SlotKind::State) {
        std::string key;
        putSlotKey(key, uint32_t(sp.index), sl);
        w->wantBytes_ += key.size() + 8 + uint64_t(sl.bytes) + 8;
        ++w->wantEntries_;
      }
  w->tmp_ = w->path_ + ".tmp." + std::to_string(::getpid());
  std::error_code ec;
  w->os_ = std::make_unique<llvm::raw_fd_ostream>(w->tmp_, ec);
  if (ec)
    return fail("cannot write '" + w->path_ + "': " + ec.message());
  *w->os_ << checkpointHead(plan, stepsDone, w->wantEntries_, w->wantBytes_,
                            lrSchedule);
  return std::move(w);
}

CheckpointWriter::~CheckpointWriter() {
  if (os_) {
    os_->close();
    os_->clear_error();
    llvm::sys::fs::remove(tmp_);
  }
}

llvm::Error CheckpointWriter::put(llvm::StringRef bytes) {
  bytes_ += bytes.size();
  if (bytes_ > wantBytes_)
    return fail("checkpoint entries beyond the plan's State slots");
  *os_ << bytes;
  if (os_->has_error())
    return fail("cannot write '" + path_ + "'");
  return llvm::Error::success();
}

llvm::Error CheckpointWriter::appendStage(const StagePlan &sp,
                                          StageExecutor &ex) {
  auto n = forEachEntry(sp, ex, [&](const std::string &key,
                                    const std::vector<uint8_t> &bytes) {
    // FNV-1a runs on: the key's sum is the basis of the bytes'.
    uint64_t sum =
        support::fnv1a64(key.data(), key.size(), support::kFnv1a64Basis);
    sum = support::fnv1a64(bytes.data(), bytes.size(), sum);
    std::string tail;
    putLe(tail, sum, 8);
    if (auto e = put(key))
      return e;
    if (auto e = put(llvm::StringRef(
            reinterpret_cast<const char *>(bytes.data()), bytes.size())))
      return e;
    return put(tail);
  });
  if (!n)
    return n.takeError();
  entries_ += *n;
  return llvm::Error::success();
}

llvm::Error CheckpointWriter::appendEntries(llvm::StringRef entries,
                                            uint64_t count) {
  entries_ += count;
  return put(entries);
}

llvm::Error CheckpointWriter::commit() {
  if (entries_ != wantEntries_ || bytes_ != wantBytes_)
    return fail(llvm::formatv("a checkpoint of {0} entries ({1} bytes) where "
                              "the plan has {2} ({3} bytes)",
                              entries_, bytes_, wantEntries_, wantBytes_));
  os_->close();
  bool bad = os_->has_error();
  os_->clear_error();
  os_.reset();
  if (bad) {
    llvm::sys::fs::remove(tmp_);
    return fail("cannot write '" + path_ + "'");
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp_, path_)) {
    llvm::sys::fs::remove(tmp_);
    return fail("cannot write '" + path_ + "': " + ec.message());
  }
  return llvm::Error::success();
}

namespace {

// Little-endian fields from a byte range that never reads past its end:
// a read past it sets `short_` and gives zeros.
struct FieldReader {
  llvm::StringRef data;
  size_t pos = 0;
  bool short_ = false;

  uint64_t get(int bytes) {
    if (short_ || data.size() - pos < size_t(bytes)) {
      short_ = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= uint64_t(uint8_t(data[pos + size_t(i)])) << (8 * i);
    pos += size_t(bytes);
    return v;
  }
  // `n` bytes, or nothing and `short_` when fewer are left.
  llvm::StringRef take(uint64_t n) {
    if (short_ || data.size() - pos < n) {
      short_ = true;
      return {};
    }
    llvm::StringRef s = data.substr(pos, size_t(n));
    pos += size_t(n);
    return s;
  }
  llvm::StringRef str() { return take(get(4)); }
};

// "'w' on stage 1, f32[4,3]", for an entry that is not the plan's.
std::string slotText(llvm::StringRef name, uint64_t stage,
                     llvm::StringRef dtype, const std::vector<int64_t> &shape) {
  std::string s = "'" + name.str() + "' on stage " + std::to_string(stage) +
                  ", " + dtype.str() + "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// An entry the first pass found in order: which slot, where its bytes are.
struct EntryView {
  uint32_t stage;
  const Slot *slot;
  llvm::StringRef bytes;
};

// The first element of f32 or f64 `bytes` that is NaN or infinite, and
// which it is.
std::optional<std::pair<size_t, const char *>>
firstNonFinite(ir::DType dtype, llvm::StringRef bytes) {
  auto scan = [&](auto zero) -> std::optional<std::pair<size_t, const char *>> {
    using T = decltype(zero);
    size_t n = bytes.size() / sizeof(T);
    for (size_t i = 0; i < n; ++i) {
      T x;
      std::memcpy(&x, bytes.data() + i * sizeof(T), sizeof(T));
      if (!std::isfinite(x))
        return std::make_pair(i, std::isnan(x) ? "nan" : "inf");
    }
    return std::nullopt;
  };
  if (dtype == ir::DType::F32)
    return scan(float(0));
  if (dtype == ir::DType::F64)
    return scan(double(0));
  return std::nullopt;
}

// Resharding: a checkpoint of another plan of the model (another stage
// count or split; the same optimizer). Its entries, each checked (bounds,
// checksum), are keyed by name: a name on several stages (a tied weight's
// replicas, optimizer.lr) has one value, since the runtime keeps them
// equal. The plan's State slots must be exactly those names, with their
// types and shapes; each slot of each stage then takes its name's bytes.
llvm::Expected<std::vector<EntryView>>
readByName(FieldReader &r, llvm::StringRef data, uint64_t entries,
           const Plan &plan, const std::string &model, uint64_t basis) {
  struct Found {
    std::string dtype;
    std::vector<int64_t> shape;
    llvm::StringRef bytes;
  };
  std::map<std::string, Found> byName;
  auto differ = [&](const std::string &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "a checkpoint of another plan of '" + model +
                                       "' (its state slots differ: " + why +
                                       ")");
  };
  for (uint64_t k = 0; k < entries; ++k) {
    size_t start = r.pos;
    uint32_t stage = uint32_t(r.get(4));
    llvm::StringRef name = r.str();
    llvm::StringRef dtype = r.str();
    uint64_t rank = r.get(4);
    std::vector<int64_t> shape;
    for (uint64_t i = 0; i < rank && !r.short_; ++i)
      shape.push_back(int64_t(r.get(8)));
    llvm::StringRef bytes = r.take(r.get(8));
    size_t end = r.pos;
    uint64_t stored = r.get(8);
    std::string where =
        llvm::formatv("entry {0} of {1}", k + 1, entries).str();
    if (r.short_)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     where + " runs past the end of the file");
    if (support::fnv1a64(data.data() + start, end - start, basis) != stored)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     where + " ('" + name.str() +
                                         "') is corrupt (checksum mismatch)");
    auto [it, fresh] =
        byName.emplace(name.str(), Found{dtype.str(), shape, bytes});
    if (!fresh && (it->second.dtype != dtype || it->second.shape != shape))
      return differ("'" + name.str() + "' twice, as " +
                    slotText(name, stage, dtype, shape) + " and " +
                    it->second.dtype);
  }
  if (r.pos != data.size())
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("{0} bytes after its last entry", data.size() - r.pos));
  std::vector<EntryView> views;
  std::set<std::string> used;
  for (const StagePlan &sp : plan.stages)
    for (const Slot &sl : sp.slots) {
      if (sl.kind != SlotKind::State)
        continue;
      auto it = byName.find(sl.name);
      std::string plans = slotText(sl.name, uint64_t(sp.index),
                                   llvm::StringRef(ir::dtypeName(sl.dtype)),
                                   sl.shape);
      if (it == byName.end())
        return differ("no '" + sl.name + "', which this plan has as " + plans);
      if (it->second.dtype != llvm::StringRef(ir::dtypeName(sl.dtype)) ||
          it->second.shape != sl.shape ||
          it->second.bytes.size() != size_t(sl.bytes))
        return differ(slotText(sl.name, uint64_t(sp.index), it->second.dtype,
                               it->second.shape) +
                      " there, " + plans + " here");
      used.insert(sl.name);
      views.push_back({uint32_t(sp.index), &sl, it->second.bytes});
    }
  for (const auto &[name, found] : byName)
    if (!used.count(name))
      return differ("it has '" + name + "', which this plan does not");
  return views;
}

} // namespace

llvm::Expected<int64_t> readCheckpointFile(
    const std::string &dir, const Plan &plan,
    llvm::function_ref<bool(uint32_t stage)> wanted,
    llvm::function_ref<std::optional<std::string>(
        uint32_t stage, const std::string &name,
        const std::vector<uint8_t> &bytes)>
        apply,
    std::string *lrSchedule) {
  std::string path = dir + "/checkpoint.bin";
  auto err = [&](const llvm::Twine &msg) { return fail(path + ": " + msg); };
  auto buf = support::readFile(path, "checkpoint");
  if (!buf)
    return buf.takeError();
  llvm::StringRef data = (*buf)->getBuffer();
  if (data.startswith(kOlderMagic))
    return err("a checkpoint of an older cleave (format 1, which records no "
               "plan identity); start again without --resume");
  // Format 2 (no learning-rate schedule, sums from the basis cleave used
  // before) is still read; format 3 is written.
  bool format2 = data.startswith(kFormat2Magic);
  if (!format2 && !data.startswith(kMagic))
    return err("not a cleave checkpoint");
  uint32_t expectVersion = format2 ? 2 : kCheckpointVersion;
  uint64_t basis =
      format2 ? support::kFnv1a64BasisCleave2 : support::kFnv1a64Basis;
  auto sumOf = [&](const char *p, size_t n) {
    return support::fnv1a64(p, n, basis);
  };

  // The header, its checksum, then the file's length against the header's.
  FieldReader r{data, kMagicBytes};
  uint64_t headerBytes = r.get(8);
  if (r.short_ || headerBytes > kMaxHeaderBytes ||
      headerBytes + 8 > data.size() - r.pos)
    return err(llvm::formatv("truncated or corrupt header ({0} bytes, header "
                             "length {1})",
                             data.size(), headerBytes));
  size_t headerEnd = r.pos + size_t(headerBytes);
  uint64_t headerSum = sumOf(data.data(), headerEnd);
  FieldReader h{data.substr(0, headerEnd), r.pos};
  r.pos = headerEnd;
  if (r.get(8) != headerSum)
    return err("the header is corrupt (checksum mismatch)");
  uint64_t version = h.get(4), identity = h.get(8), stages = h.get(4),
           entries = h.get(8), steps = h.get(8), bodyBytes = h.get(8);
  std::string model = h.str().str(), optimizer = h.str().str();
  std::string schedule = version >= 3 ? h.str().str() : std::string();
  if (h.short_ || version != expectVersion)
    return err(llvm::formatv("a checkpoint of format {0}; this cleave reads "
                             "formats 2 and {1}",
                             version, kCheckpointVersion));
  size_t bodyStart = r.pos;
  if (bodyBytes != data.size() - bodyStart)
    return err(llvm::formatv("{0} bytes, but its header says {1}{2}",
                             data.size(), bodyStart + bodyBytes,
                             bodyBytes > data.size() - bodyStart
                                 ? " (truncated)"
                                 : ""));

  // Whose checkpoint it is.
  if (optimizer != plan.optimizer)
    return err("a checkpoint of a plan trained with " + optimizer +
               "; this plan trains with " + plan.optimizer);
  if (model != plan.modelName)
    return err("a checkpoint of model '" + model + "'; this plan is of '" +
               plan.modelName + "'");
  // The plan that wrote it, or another plan of the same model and
  // optimizer (another stage count or split): then the entries are matched
  // by name (resharding, below).
  bool samePlan = stages == plan.stages.size() &&
                  identity == checkpointPlanIdentity(plan, basis);
  uint64_t want = stateSlotCount(plan);
  if (samePlan && entries != want)
    return err(llvm::formatv("holds {0} entries; this plan has {1} state "
                             "slots (parameters, buffers, optimizer state)",
                             entries, want));
  if (steps > uint64_t(INT64_MAX) / 2)
    return err(llvm::formatv("records {0} steps done, which no run reaches",
                             steps));

  std::vector<EntryView> views;
  r.data = data;
  if (!samePlan) {
    auto read = readByName(r, data, entries, plan, model, basis);
    if (!read)
      return err(llvm::toString(read.takeError()));
    views = std::move(*read);
  }
  // Every entry, in order, is the plan's next State slot.
  for (const StagePlan &sp : plan.stages)
    for (const Slot &sl : sp.slots) {
      if (!samePlan)
        break;
      if (sl.kind != SlotKind::State)
        continue;
      size_t k = views.size(), start = r.pos;
      auto where = [&] {
        return llvm::formatv("entry {0} of {1}", k + 1, entries).str();
      };
      uint32_t stage = uint32_t(r.get(4));
      uint64_t nameLen = r.get(4);
      llvm::StringRef name = r.take(nameLen);
      llvm::StringRef dtype = r.str();
      uint64_t rank = r.get(4);
      std::vector<int64_t> shape;
      for (uint64_t i = 0; i < rank && !r.short_; ++i)
        shape.push_back(int64_t(r.get(8)));
      uint64_t n = r.get(8);
      llvm::StringRef bytes = r.take(n);
      size_t end = r.pos;
      uint64_t stored = r.get(8);
      if (r.short_)
        return err(where() + " runs past the end of the file (corrupt: a name "
                             "length of " + std::to_string(nameLen) +
                   ", a byte count of " + std::to_string(n) + ")");
      if (sumOf(data.data() + start, end - start) != stored)
        return err(where() + " ('" + name + "') is corrupt (checksum "
                                            "mismatch)");
      std::string plans = slotText(sl.name, uint64_t(sp.index),
                                   llvm::StringRef(ir::dtypeName(sl.dtype)),
                                   sl.shape);
      std::string found = slotText(name, stage, dtype, shape);
      if (stage != uint32_t(sp.index) || name != sl.name ||
          dtype != llvm::StringRef(ir::dtypeName(sl.dtype)) || shape != sl.shape ||
          n != uint64_t(sl.bytes))
        return err(where() + " is " + found + "; the plan has " + plans +
                   " there (a checkpoint of another plan?)");
      views.push_back({stage, &sl, bytes});
    }
  if (r.pos != data.size())
    return err(llvm::formatv("{0} bytes after its last entry",
                             data.size() - r.pos));

  // Values no run writes (the sums above cannot tell an edit).
  std::set<std::string> buffers;
  for (const PlanTensor &t : plan.modelTensors)
    buffers.insert(t.name);
  for (const EntryView &v : views) {
    const Slot &sl = *v.slot;
    if (!sl.trainable && buffers.count(sl.name))
      continue; // a model buffer may hold -inf (a mask)
    if (auto at = firstNonFinite(sl.dtype, v.bytes))
      return err(llvm::formatv("'{0}' (stage {1}) holds {2} at element {3}; "
                               "resuming would train on it (an edited "
                               "checkpoint, or one of a run with "
                               "--on-nan=off): resume from another or start "
                               "again",
                               sl.name, v.stage, at->second, at->first));
  }
  for (const EntryView &v : views) {
    if (!wanted(v.stage))
      continue;
    std::vector<uint8_t> bytes(v.bytes.bytes_begin(), v.bytes.bytes_end());
    if (auto msg = apply(v.stage, v.slot->name, bytes))
      return err(*msg);
  }
  if (lrSchedule)
    *lrSchedule = schedule;
  return int64_t(steps);
}

} // namespace cleave::runtime
