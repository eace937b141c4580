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
#include "support/Checksum.h"
#include "support/CpuShare.h"

#include "TestPlans.h"
#include "TestSupport.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <functional>
#include <sched.h>

namespace unit_runtime_training {

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
    TempDir dir; // text data needs integer [B, T] inputs; a short text fails
    std::ofstream(dir.file("t.txt")) << "hello";
    runtime::DataSource d(p, 0);
    std::string e = errorText(d.load("text:" + dir.file("t.txt")));
    EXPECT_NE(e.find("needs a model whose inputs are all integer [B, T]"), std::string::npos) << e;
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

// tokens:FILE: windows of T tokens and the targets one token later, in
// order or in a seeded permutation per epoch; bad files are one line.
TEST(DataSource, TokenFilesWindowsShuffleAndBadFiles) {
  runtime::Plan p;
  p.microbatches = 1;
  p.inputs.push_back({"idx", ir::DType::I64, {2, 4}, 100});
  p.inputs.push_back({"targets", ir::DType::I64, {2, 4}, 100});
  TempDir dir;
  auto writeTokens = [&](const std::string &name, std::vector<uint16_t> ids,
                         size_t extraBytes = 0) {
    std::string bytes(reinterpret_cast<const char *>(ids.data()),
                      ids.size() * 2);
    bytes.append(extraBytes, '\0');
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return "tokens:" + dir.file(name);
  };
  std::vector<uint16_t> ids(41);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = uint16_t(i);
  std::string spec = writeTokens("t.bin", ids);
  runtime::DataSource d(p, 7);
  ASSERT_EQ(errorText(d.load(spec)), "");
  EXPECT_FALSE(d.synthetic());
  EXPECT_EQ(d.samples(), 10); // (41 - 1) / 4 windows
  auto values = [&](int64_t step, int input) {
    std::vector<uint8_t> b = fillOne(d, p, step, 0, input);
    std::vector<int64_t> v(b.size() / 8);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  EXPECT_EQ(values(0, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(values(0, 1), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(values(5, 0), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Shuffled: every epoch a permutation of the 10 windows, epochs differ,
  // the same for the same seed.
  d.setShuffle(true);
  std::vector<int64_t> epoch0, epoch1;
  for (int64_t k = 0; k < 10; ++k) {
    epoch0.push_back(d.tokenWindow(k));
    epoch1.push_back(d.tokenWindow(10 + k));
  }
  std::vector<int64_t> sorted0 = epoch0, sorted1 = epoch1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  std::vector<int64_t> all{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(sorted0, all);
  EXPECT_EQ(sorted1, all);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(epoch0, all);
  int64_t w = d.tokenWindow(0);
  EXPECT_EQ(values(0, 0)[0], w * 4);
  EXPECT_EQ(values(0, 1)[0], w * 4 + 1);
  runtime::DataSource again(p, 7), other(p, 8);
  again.setShuffle(true);
  other.setShuffle(true);
  ASSERT_EQ(errorText(again.load(spec)), "");
  ASSERT_EQ(errorText(other.load(spec)), "");
  std::vector<int64_t> same, different;
  for (int64_t k = 0; k < 10; ++k) {
    same.push_back(again.tokenWindow(k));
    different.push_back(other.tokenWindow(k));
  }
  EXPECT_EQ(same, epoch0);
  EXPECT_NE(different, epoch0);
  // Bad files.
  runtime::DataSource bad(p, 0);
  EXPECT_THAT(errorText(bad.load(writeTokens("odd.bin", ids, 1))),
              testing::HasSubstr("83 bytes is not a whole number of uint16 "
                                 "tokens"));
  ids[17] = 100;
  EXPECT_THAT(errorText(bad.load(writeTokens("big.bin", ids))),
              testing::HasSubstr("token 17 is 100 but the model's 'idx' "
                                 "indexes a table of 100 entries"));
  EXPECT_THAT(errorText(bad.load(writeTokens("short.bin", {1, 2, 3, 4}))),
              testing::HasSubstr("4 tokens is too short for one microbatch "
                                 "of 2 windows of 4 tokens"));
}

// Window data fills each input by what the model does with it: token ids
// (indexes a table) get the window, labels the window one token later or,
// when the model drops their first position itself (HF's labels=), the
// window; anything else (a mask) ones. What cannot be told is one line.
TEST(DataSource, WindowFillsFollowHowTheModelUsesItsInputs) {
  auto input = [](const char *name, bool indexes, bool labels,
                  int64_t shift = 0, int64_t limit = 100) {
    runtime::PlanInput i{name, ir::DType::I64, {2, 4}, limit};
    i.indexes = indexes;
    i.labels = labels;
    i.labelShift = shift;
    return i;
  };
  auto fills = [](std::vector<runtime::PlanInput> in) {
    runtime::Plan p;
    p.inputs = std::move(in);
    auto f = runtime::windowFills(p, "tokens:FILE");
    if (!f) {
      ADD_FAILURE() << llvm::toString(f.takeError());
      return std::vector<int>();
    }
    return *f;
  };
  const int ones = runtime::kFillOnes;
  // nanoGPT: idx, targets (next tokens).
  EXPECT_EQ(fills({input("idx", true, false), input("targets", false, true)}),
            (std::vector<int>{0, 1}));
  // HF labels=: the model shifts, so the labels are the window itself.
  EXPECT_EQ(fills({input("input_ids", true, false),
                   input("labels", false, true, 1)}),
            (std::vector<int>{0, 0}));
  // The README's export: the ids are their own (shifted) targets; a mask.
  EXPECT_EQ(fills({input("input_ids", true, true, 1),
                   input("attention_mask", false, false)}),
            (std::vector<int>{0, ones}));
  // A plan from before the analysis: tokens, then next-token targets.
  EXPECT_EQ(fills({input("a", false, false), input("b", false, false)}),
            (std::vector<int>{0, 1}));
  auto error = [](std::vector<runtime::PlanInput> in) {
    runtime::Plan p;
    p.inputs = std::move(in);
    auto f = runtime::windowFills(p, "tokens:FILE");
    return f ? std::string() : llvm::toString(f.takeError());
  };
  EXPECT_THAT(error({input("input_ids", true, false, 0, 512),
                     input("token_type_ids", true, false, 0, 2),
                     input("labels", false, true)}),
              testing::HasSubstr("cannot tell which of 'input_ids' and "
                                 "'token_type_ids' holds the token ids"));
  EXPECT_THAT(error({input("ids", true, false),
                     input("labels", false, true, -1)}),
              testing::HasSubstr("cannot feed 'labels'"));
  EXPECT_THAT(error({input("ids", true, false), input("mask", false, false)}),
              testing::HasSubstr("finds no input that reaches the loss's "
                                 "labels"));
  // Filled from a token file: the window, the same window, ones.
  runtime::Plan p;
  p.microbatches = 1;
  p.inputs = {input("input_ids", true, false), input("labels", false, true, 1),
              input("attention_mask", false, false)};
  TempDir dir;
  std::vector<uint16_t> ids(41);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = uint16_t(i);
  std::ofstream(dir.file("t.bin"), std::ios::binary)
      << std::string(reinterpret_cast<const char *>(ids.data()), 82);
  runtime::DataSource d(p, 0);
  ASSERT_EQ(errorText(d.load("tokens:" + dir.file("t.bin"))), "");
  auto values = [&](int input) {
    std::vector<uint8_t> b = fillOne(d, p, 1, 0, input);
    std::vector<int64_t> v(b.size() / 8);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  EXPECT_EQ(values(0), (std::vector<int64_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(values(1), values(0));
  EXPECT_EQ(values(2), std::vector<int64_t>(8, 1));
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

// Checkpoint bytes in the documented format (runtime/Checkpoint.h).
void putLe(std::string &s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    s.push_back(char((v >> (8 * i)) & 0xff));
}
void putStr(std::string &s, const std::string &v) {
  putLe(s, v.size(), 4);
  s += v;
}
uint64_t getLe(const std::string &s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= uint64_t(uint8_t(s[at + size_t(i)])) << (8 * i);
  return v;
}
// One entry; `nameLength` overrides the name's length field.
std::string entry(uint32_t stage, const std::string &name,
                  const std::string &dtype, std::vector<int64_t> shape,
                  const std::string &bytes,
                  std::optional<uint32_t> nameLength = std::nullopt) {
  std::string s;
  putLe(s, stage, 4);
  putLe(s, nameLength ? *nameLength : name.size(), 4);
  s += name;
  putStr(s, dtype);
  putLe(s, shape.size(), 4);
  for (int64_t d : shape)
    putLe(s, uint64_t(d), 8);
  putLe(s, bytes.size(), 8);
  s += bytes;
  putLe(s, runtime::fnv1a64(s.data(), s.size()), 8);
  return s;
}
// Offsets of the header fields: magic (12), header length (8), version (4),
// plan identity (8), stages (4), entries (8), steps (8), body length (8).
constexpr size_t kEntriesAt = 36, kStepsAt = 44;
// The header's checksum written again after an edit of the header.
void resumHeader(std::string &file) {
  size_t end = 20 + size_t(getLe(file, 12, 8));
  std::string sum;
  putLe(sum, runtime::fnv1a64(file.data(), end), 8);
  file.replace(end, 8, sum);
}

std::string readAll(const std::string &path) {
  auto buf = llvm::MemoryBuffer::getFile(path);
  return buf ? (*buf)->getBuffer().str() : std::string();
}

runtime::Slot slot(const std::string &name, runtime::SlotKind kind,
                   ir::DType dtype, std::vector<int64_t> shape) {
  runtime::Slot s;
  s.name = name;
  s.kind = kind;
  s.dtype = dtype;
  s.shape = shape;
  s.bytes = int64_t(ir::dtypeSize(dtype));
  for (int64_t d : shape)
    s.bytes *= d;
  return s;
}

// Two stages with three State slots among others: w f32[2] and m f32[1]
// on stage 0, b i64[1] on stage 1.
runtime::Plan checkpointPlan() {
  runtime::Plan p;
  p.modelName = "tiny";
  p.optimizer = "sgd";
  p.stages.resize(2);
  p.stages[0].index = 0;
  p.stages[0].slots = {
      slot("x", runtime::SlotKind::Input, ir::DType::F32, {2}),
      slot("w", runtime::SlotKind::State, ir::DType::F32, {2}),
      slot("t", runtime::SlotKind::MicroTemp, ir::DType::F32, {2}),
      slot("m", runtime::SlotKind::State, ir::DType::F32, {1})};
  p.stages[1].index = 1;
  p.stages[1].slots = {
      slot("b", runtime::SlotKind::State, ir::DType::I64, {1})};
  return p;
}

std::string wEntry() { return entry(0, "w", "f32", {2}, "abcdefgh"); }
std::string mEntry() { return entry(0, "m", "f32", {1}, "ijkl"); }
std::string bEntry() { return entry(1, "b", "i64", {1}, "mnopqrst"); }

class CheckpointFile : public ::testing::Test {
protected:
  TempDir dir;
  std::string d{dir.path};
  runtime::Plan plan = checkpointPlan();
  std::map<std::string, std::string> got;

  llvm::Expected<int64_t> read(std::function<bool(uint32_t)> wanted =
                                   [](uint32_t) { return true; }) {
    got.clear();
    return runtime::readCheckpointFile(
        d, plan, wanted,
        [&](uint32_t stage, const std::string &name,
            const std::vector<uint8_t> &bytes) -> std::optional<std::string> {
          got[std::to_string(stage) + name] =
              std::string(bytes.begin(), bytes.end());
          return std::nullopt;
        });
  }
  void write(int64_t steps, uint64_t entries, const std::string &body) {
    ASSERT_EQ(errorText(runtime::writeCheckpointFile(d, plan, steps, entries,
                                                     body)),
              "");
  }
  std::string whole() {
    write(42, 3, wEntry() + mEntry() + bEntry());
    return readAll(dir.file("checkpoint.bin"));
  }
  // `bytes` as the checkpoint is refused with one line containing `want`,
  // naming the file, and nothing is applied.
  void expectRefused(const std::string &bytes, const std::string &want) {
    std::ofstream(dir.file("checkpoint.bin"), std::ios::binary) << bytes;
    expectRefused(want);
  }
  void expectRefused(const std::string &want) {
    auto r = read();
    ASSERT_FALSE(bool(r)) << "accepted: " << want;
    std::string e = llvm::toString(r.takeError());
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_NE(e.find("checkpoint.bin: "), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_TRUE(got.empty()) << "applied before the file was checked";
  }
};

TEST_F(CheckpointFile, RoundTripAndStaleTempFiles) {
  // A killed writer's temp file is garbage: the next write removes it.
  std::ofstream(dir.file("checkpoint.bin.tmp.99")) << "partial";
  write(42, 3, wEntry() + mEntry() + bEntry());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"checkpoint.bin"});
  std::string file = readAll(dir.file("checkpoint.bin"));
  EXPECT_EQ(file.substr(0, 12), "CLEAVECKPT3\n");
  EXPECT_EQ(getLe(file, kStepsAt, 8), 42u);
  EXPECT_EQ(getLe(file, kEntriesAt, 8), 3u);
  EXPECT_EQ(getLe(file, 24, 8), runtime::checkpointPlanIdentity(plan));
  auto steps = read();
  ASSERT_TRUE(bool(steps)) << llvm::toString(steps.takeError());
  EXPECT_EQ(*steps, 42);
  EXPECT_EQ(got, (std::map<std::string, std::string>{
                     {"0w", "abcdefgh"}, {"0m", "ijkl"}, {"1b", "mnopqrst"}}));
  // Stages not wanted are skipped (an MPI rank loads only its own).
  steps = read([](uint32_t s) { return s == 1; });
  ASSERT_TRUE(bool(steps));
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"1b", "mnopqrst"}}));
}

TEST_F(CheckpointFile, TruncatedOrAnyByteEditedIsRefused) {
  std::string file = whole();
  expectRefused(file.substr(0, file.size() - 1), "(truncated)");
  expectRefused(file.substr(0, file.size() / 2), "(truncated)");
  expectRefused(file.substr(0, 30), "truncated or corrupt header");
  expectRefused("", "not a cleave checkpoint");
  expectRefused(file + "x", "but its header says");
  // Every byte, changed: each is caught (most by a checksum).
  for (size_t i = 0; i < file.size(); ++i) {
    std::string edited = file;
    edited[i] ^= 0x20;
    std::ofstream(dir.file("checkpoint.bin"), std::ios::binary) << edited;
    auto r = read();
    EXPECT_FALSE(bool(r)) << "byte " << i << " of " << file.size()
                          << " edited, accepted";
    if (!r)
      llvm::consumeError(r.takeError());
    EXPECT_TRUE(got.empty()) << "byte " << i;
  }
  std::string flipped = file;
  flipped.back() ^= 1;
  expectRefused(flipped, "entry 3 of 3 ('b') is corrupt (checksum mismatch)");
  flipped = file;
  flipped[kStepsAt] ^= 1;
  expectRefused(flipped, "the header is corrupt (checksum mismatch)");
}

TEST_F(CheckpointFile, EntriesMustBeThePlansStateSlotsEachOnce) {
  // Written by a writer that checksums what it writes, but not the plan's.
  write(1, 0, "");
  expectRefused("holds 0 entries; this plan has 3 state slots");
  write(1, 1, wEntry());
  expectRefused("holds 1 entries; this plan has 3 state slots");
  std::string ten;
  for (int i = 0; i < 10; ++i)
    ten += wEntry();
  write(1, 10, ten);
  expectRefused("holds 10 entries; this plan has 3 state slots");
  write(1, 3, wEntry() + wEntry() + bEntry()); // 'w' twice, 'm' missing
  expectRefused("entry 2 of 3 is 'w' on stage 0, f32[2]; the plan has 'm' on "
                "stage 0, f32[1] there");
  write(1, 3, wEntry() + entry(0, "m", "f32", {2}, "ijklijkl") + bEntry());
  expectRefused("entry 2 of 3 is 'm' on stage 0, f32[2]; the plan has 'm' on "
                "stage 0, f32[1]");
  write(1, 3, wEntry() + mEntry() + entry(1, "b", "f64", {1}, "mnopqrst"));
  expectRefused("entry 3 of 3 is 'b' on stage 1, f64[1]");
  write(1, 3, wEntry() + mEntry() + entry(0, "b", "i64", {1}, "mnopqrst"));
  expectRefused("entry 3 of 3 is 'b' on stage 0, i64[1]");
  write(1, 3, wEntry() + entry(0, "m", "f32", {1}, "ijkl", 0xffffffffu) +
                  bEntry());
  expectRefused("entry 2 of 3 runs past the end of the file (corrupt: a name "
                "length of 4294967295");
  write(1, 3, wEntry() + mEntry() + bEntry() + "zz");
  expectRefused("2 bytes after its last entry");
}

TEST_F(CheckpointFile, Format2FilesAreStillRead) {
  // Format 2: the same layout, summed from FNV-1a's offset basis with its
  // last digit dropped.
  const uint64_t basis = support::kFnv1a64BasisCleave2;
  auto resum = [&](std::string e) {
    e.resize(e.size() - 8);
    putLe(e, support::fnv1a64(e.data(), e.size(), basis), 8);
    return e;
  };
  std::string file = whole();
  size_t headerEnd = 20 + size_t(getLe(file, 12, 8));
  std::string old = "CLEAVECKPT2\n" + file.substr(12, headerEnd - 12);
  old[20] = 2;
  std::string identity;
  putLe(identity, runtime::checkpointPlanIdentity(plan, basis), 8);
  old.replace(24, 8, identity);
  putLe(old, support::fnv1a64(old.data(), old.size(), basis), 8);
  old += resum(wEntry()) + resum(mEntry()) + resum(bEntry());
  std::ofstream(dir.file("checkpoint.bin"), std::ios::binary) << old;
  auto steps = read();
  ASSERT_TRUE(bool(steps)) << llvm::toString(steps.takeError());
  EXPECT_EQ(*steps, 42);
  EXPECT_EQ(got.at("0w"), "abcdefgh");
  // Its sums are not format 3's.
  expectRefused("CLEAVECKPT3\n" + old.substr(12),
                "the header is corrupt (checksum mismatch)");
  // The standard basis, not the old one.
  EXPECT_EQ(runtime::fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
}

TEST_F(CheckpointFile, NonFiniteParametersOrOptimizerStateAreRefused) {
  // The sums are recomputable, so an edit that keeps them right is caught
  // by what it writes: no run writes a NaN into a parameter or a moment.
  std::string nan(4, '\0'), inf(4, '\0');
  float n = std::nanf(""), i = INFINITY;
  std::memcpy(nan.data(), &n, 4);
  std::memcpy(inf.data(), &i, 4);
  write(42, 3, wEntry() + entry(0, "m", "f32", {1}, nan) + bEntry());
  expectRefused("'m' (stage 0) holds nan at element 0");
  write(42, 3, entry(0, "w", "f32", {2}, "abcd" + inf) + mEntry() + bEntry());
  expectRefused("'w' (stage 0) holds inf at element 1");
  // A model buffer may hold an infinity (a mask).
  plan.modelTensors.push_back({"m", ir::DType::F32, {1}});
  write(42, 3, wEntry() + entry(0, "m", "f32", {1}, inf) + bEntry());
  auto r = read();
  EXPECT_TRUE(bool(r)) << llvm::toString(r.takeError());
}

TEST_F(CheckpointFile, AnotherPlanOptimizerOrFormatIsRefused) {
  std::string file = whole();
  runtime::Plan ours = plan;
  plan.optimizer = "adamw";
  expectRefused(file, "a checkpoint of a plan trained with sgd; this plan "
                      "trains with adamw");
  plan = ours;
  plan.modelName = "other";
  expectRefused(file, "a checkpoint of model 'tiny'; this plan is of 'other'");
  plan = ours;
  plan.stages[1].slots[0].shape = {2};
  plan.stages[1].slots[0].bytes = 16;
  expectRefused(file, "a checkpoint of another plan of 'tiny' (its state "
                      "slots differ: 'b' on stage 1, i64[1] there, 'b' on "
                      "stage 1, i64[2] here)");
  plan = ours;
  // Another plan of the model (a third stage, the same State slots) reads
  // it by name; a replica of 'w' on the new stage takes the same bytes.
  plan.stages.push_back(runtime::StagePlan());
  plan.stages[2].index = 2;
  plan.stages[2].slots = {
      slot("w", runtime::SlotKind::State, ir::DType::F32, {2})};
  std::ofstream(dir.file("checkpoint.bin"), std::ios::binary) << file;
  auto resharded = read();
  ASSERT_TRUE(bool(resharded)) << llvm::toString(resharded.takeError());
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"0w", "abcdefgh"},
                                                     {"0m", "ijkl"},
                                                     {"1b", "mnopqrst"},
                                                     {"2w", "abcdefgh"}}));
  // ... but not one that lacks a slot's name or has one more.
  plan.stages[2].slots = {
      slot("v", runtime::SlotKind::State, ir::DType::F32, {2})};
  expectRefused(file, "(its state slots differ: no 'v', which this plan has "
                      "as 'v' on stage 2, f32[2])");
  plan.stages[2].slots.clear();
  plan.stages[1].slots.clear();
  expectRefused(file, "(its state slots differ: it has 'b', which this plan "
                      "does not)");
  plan = ours;
  // A step count of 2^63, with the header's checksum made to fit.
  std::string huge = file;
  huge.replace(kStepsAt, 8, std::string("\0\0\0\0\0\0\0\x80", 8));
  resumHeader(huge);
  expectRefused(huge, "records 9223372036854775808 steps done, which no run "
                      "reaches");
  // The format of an older cleave, and one of a newer.
  std::string older = "CLEAVECKPT1\n" + std::string(16, '\0');
  expectRefused(older, "a checkpoint of an older cleave (format 1");
  std::string newer = file;
  newer[20] = 4;
  resumHeader(newer);
  expectRefused(newer, "a checkpoint of format 4; this cleave reads formats 2 "
                       "and 3");
}

// CheckpointWriter streams stage by stage: the same bytes as the file
// written whole; entries short of the plan's are refused at commit, and
// neither it nor an abandoned writer leaves a file behind.
TEST_F(CheckpointFile, StreamedWriterMatchesTheWholeFile) {
  std::string expected = whole();
  llvm::sys::fs::remove(dir.file("checkpoint.bin"));
  {
    auto w = runtime::CheckpointWriter::open(d, plan, 42);
    ASSERT_TRUE(bool(w)) << llvm::toString(w.takeError());
    ASSERT_EQ(errorText((*w)->appendEntries(wEntry() + mEntry(), 2)), "");
    ASSERT_EQ(errorText((*w)->appendEntries(bEntry(), 1)), "");
    ASSERT_EQ(errorText((*w)->commit()), "");
  }
  EXPECT_EQ(readAll(dir.file("checkpoint.bin")), expected);
  llvm::sys::fs::remove(dir.file("checkpoint.bin"));
  {
    auto w = runtime::CheckpointWriter::open(d, plan, 42);
    ASSERT_TRUE(bool(w));
    ASSERT_EQ(errorText((*w)->appendEntries(wEntry() + mEntry(), 2)), "");
    EXPECT_THAT(errorText((*w)->commit()),
                testing::HasSubstr("a checkpoint of 2 entries"));
  }
  {
    auto w = runtime::CheckpointWriter::open(d, plan, 42);
    ASSERT_TRUE(bool(w));
    ASSERT_EQ(errorText((*w)->appendEntries(wEntry(), 1)), "");
  } // abandoned
  std::error_code ec;
  int files = 0;
  for (llvm::sys::fs::directory_iterator it(d, ec), end; !ec && it != end;
       it.increment(ec))
    ++files;
  EXPECT_EQ(files, 0);
}

TEST_F(CheckpointFile, StoresTheLrSchedule) {
  std::string body = wEntry() + mEntry() + bEntry();
  ASSERT_EQ(errorText(runtime::writeCheckpointFile(
                d, plan, 7, 3, body, "cosine 0.001 10 0 100")),
            "");
  std::string schedule;
  auto steps = runtime::readCheckpointFile(
      d, plan, [](uint32_t) { return true; },
      [](uint32_t, const std::string &, const std::vector<uint8_t> &)
          -> std::optional<std::string> { return std::nullopt; },
      &schedule);
  ASSERT_TRUE(bool(steps)) << llvm::toString(steps.takeError());
  EXPECT_EQ(*steps, 7);
  EXPECT_EQ(schedule, "cosine 0.001 10 0 100");
  // Format 2 files (no schedule string, the old FNV basis) are read too:
  // CheckpointFile.Format2FilesAreStillRead.
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
    if (names.back() == "STEP") {
      EXPECT_EQ(*o->getInteger("tid"), 1);
    }
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
  // Message delays: the mean over the receives that waited, filed apart;
  // a stage none of whose receives waited has no entry.
  runtime::appendMessageDelays(1, {0.03, 3, 10}, ops);
  runtime::appendMessageDelays(0, {0, 0, 10}, ops);
  auto p = llvm::json::parse(runtime::profileJson(std::move(ops)));
  ASSERT_TRUE(bool(p));
  const llvm::json::Array *messages = p->getAsObject()->getArray("messages");
  ASSERT_TRUE(messages);
  ASSERT_EQ(messages->size(), 1u);
  const llvm::json::Object *m = (*messages)[0].getAsObject();
  EXPECT_EQ(*m->getInteger("stage"), 1);
  EXPECT_DOUBLE_EQ(*m->getNumber("latency"), 0.01);
  EXPECT_EQ(*m->getInteger("waited"), 3);
  EXPECT_EQ(*m->getInteger("received"), 10);
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
llvm::Expected<runtime::Plan> mlpPlan(const std::string &optimizer = "sgd") {
  return testsupport::compileTrainingPlan("mlp", 2, 2, "zb-h1", optimizer);
}

// The plan's stages as threads of this process over synthetic data (seed
// 3), and the Trainer that runs them, as cleave-run sets them up.
struct ThreadedRun {
  std::unique_ptr<runtime::ThreadedPipeline> pipe;
  std::unique_ptr<runtime::Driver> driver =
      runtime::createSingleProcessDriver();
  runtime::DataSource data;
  std::optional<runtime::Trainer> trainer;
  std::string error; // setting the stages up failed

  ThreadedRun(const runtime::Plan &plan, const runtime::StageOptions &so,
              const runtime::TrainOptions &to)
      : data(plan, 3) {
    auto p = runtime::createThreadedPipeline(plan, so);
    if (!p) {
      error = "pipeline: " + llvm::toString(p.takeError());
      return;
    }
    pipe = std::move(*p);
    trainer.emplace(
        plan, pipe->locals(), *driver,
        [this](int64_t step, int replica) {
          return data.forStep(step, replica);
        },
        to);
  }
};

// Trains `plan` from its initial values, or from `resume`, for `steps`
// steps in all; returns the model tensors' bytes.
std::map<std::string, std::vector<uint8_t>>
trainMlp(const runtime::Plan &plan, int64_t steps,
         std::optional<std::string> checkpointDir,
         std::optional<std::string> resume, std::vector<double> &losses) {
  runtime::TrainOptions to;
  to.steps = steps;
  to.checkpointDir = checkpointDir;
  ThreadedRun run(plan, runtime::StageOptions(), to);
  EXPECT_EQ(run.error, "");
  if (!run.trainer)
    return {};
  runtime::Trainer &trainer = *run.trainer;
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

// Resumes `plan` for `steps` from DIR; the error text.
std::string resumeError(const runtime::Plan &plan, int64_t steps,
                        const std::string &dir) {
  runtime::TrainOptions to;
  to.steps = steps;
  ThreadedRun run(plan, runtime::StageOptions(), to);
  if (!run.trainer)
    return run.error;
  runtime::Trainer &trainer = *run.trainer;
  auto done = trainer.resume(dir);
  return done ? std::string() : llvm::toString(done.takeError());
}

TEST(Trainer, ResumeRefusesAnotherOptimizerAndStepsPastTheRun) {
  auto sgd = mlpPlan("sgd");
  ASSERT_TRUE(bool(sgd)) << llvm::toString(sgd.takeError());
  auto adamw = mlpPlan("adamw");
  ASSERT_TRUE(bool(adamw)) << llvm::toString(adamw.takeError());
  TempDir dir;
  std::vector<double> losses;
  trainMlp(*sgd, 2, std::string(dir.path), std::nullopt, losses);
  EXPECT_EQ(resumeError(*sgd, 2, std::string(dir.path)), "");
  EXPECT_THAT(resumeError(*sgd, 1, std::string(dir.path)),
              testing::HasSubstr("the checkpoint is after step 2 but this run "
                                 "has 1 steps in all"));
  EXPECT_THAT(resumeError(*adamw, 4, std::string(dir.path)),
              testing::HasSubstr("a checkpoint of a plan trained with sgd; "
                                 "this plan trains with adamw"));
}

// Plans whose schedule cannot complete: run threaded with a 1 s
// --comm-timeout, the step ends with one line naming the waiting stage, the
// peer and the message, instead of hanging.
std::string hangError(const runtime::Plan &plan) {
  runtime::StageOptions so;
  so.commTimeoutSeconds = 1;
  runtime::TrainOptions to;
  to.steps = 1;
  ThreadedRun run(plan, so, to);
  if (!run.trainer)
    return run.error;
  runtime::Trainer &trainer = *run.trainer;
  auto t0 = std::chrono::steady_clock::now();
  std::string e = errorText(trainer.run([](const runtime::StepReport &) {}));
  double took = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
  EXPECT_LT(took, 10) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  return e;
}

// The first instruction of `kind` in stage `stage`'s program `phase`.
runtime::Instr *firstInstr(runtime::Plan &plan, int stage, runtime::Phase phase,
                           runtime::InstrKind kind) {
  for (runtime::Instr &in : plan.stages[size_t(stage)].programs[int(phase)])
    if (in.kind == kind)
      return &in;
  return nullptr;
}

TEST(CommTimeout, ASendWithAnotherTagEndsTheRunNamingTheMessage) {
  auto plan = mlpPlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  runtime::Instr *send = firstInstr(*plan, 0, runtime::Phase::F,
                                    runtime::InstrKind::Send);
  runtime::Instr *back = firstInstr(*plan, 0, runtime::Phase::B,
                                    runtime::InstrKind::Recv);
  ASSERT_TRUE(send && back);
  int64_t tag = send->tag;
  std::string slot = plan->stages[0].slots[size_t(send->inputs[0])].name;
  std::string grad = plan->stages[0].slots[size_t(back->outputs[0])].name;
  send->tag += 1000;
  // Stage 1 waits for the activation; stage 0 for the gradient stage 1 then
  // cannot send. Whichever began waiting first reports (threads start in
  // no fixed order).
  std::string e = hangError(*plan);
  std::string waitingForActivation =
      "step 1: stage 1: no message from stage 0 (the activation '" + slot +
      "' of microbatch 0, tag " + std::to_string(tag) +
      ") within 1 s (--comm-timeout)";
  std::string waitingForGradient =
      "step 1: stage 0: no message from stage 1 (the gradient '" + grad +
      "' of microbatch 0, tag " + std::to_string(back->tag) +
      ") within 1 s (--comm-timeout)";
  EXPECT_TRUE(e == waitingForActivation || e == waitingForGradient) << e;
}

TEST(CommTimeout, ARecvWithAnotherTagEndsTheRun) {
  auto plan = mlpPlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  // Stage 0's receive of the gradient from stage 1 (its B program).
  runtime::Instr *recv = firstInstr(*plan, 0, runtime::Phase::B,
                                    runtime::InstrKind::Recv);
  ASSERT_TRUE(recv);
  std::string slot = plan->stages[0].slots[size_t(recv->outputs[0])].name;
  recv->tag += 1000;
  // Stage 1 runs on to its STEP and waits for the vote there, later.
  std::string e = hangError(*plan);
  EXPECT_TRUE(e == "step 1: stage 0: no message from stage 1 (the gradient '" +
                       slot + "' of microbatch 0, tag " +
                       std::to_string(recv->tag) +
                       ") within 1 s (--comm-timeout)" ||
              e.find("stage 1: no message from stage 0 (the stages' vote") !=
                  std::string::npos)
      << e;
}

TEST(CommTimeout, AStageWithoutItsStepActionEndsTheRun) {
  auto plan = mlpPlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  auto &acts = plan->stages[0].actions;
  auto step = std::find_if(acts.begin(), acts.end(), [](const runtime::Action &a) {
    return a.kind == runtime::ActionKind::Step;
  });
  ASSERT_NE(step, acts.end());
  acts.erase(step);
  EXPECT_THAT(hangError(*plan),
              testing::MatchesRegex(
                  "step 1: stage 1: no message from stage 0 \\(the stages' "
                  "vote on non-finite values before the step, tag [0-9]+\\) "
                  "within 1 s \\(--comm-timeout\\)"));
}

} // namespace

TEST(Trainer, CountsTheWaitOfRanksSharingOneCore) {
  // Both ranks' threads on one core: while one computes, the other is
  // often ready and waits for the core; the summary keeps each rank's wait
  // per step (StageFigures::coreWaitSeconds), never more than a step.
  if (!support::threadCoreWaitSeconds())
    GTEST_SKIP() << "the kernel keeps no run-queue delay (schedstat)";
  auto plan = mlpPlan();
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  cpu_set_t saved, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &saved))
    ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  // Every thread of the process on that core: new threads inherit the
  // mask, but the rank threads an earlier test made are kept (RankThreads)
  // and the pools' workers too.
  auto pinAll = [](const cpu_set_t &mask) {
    std::error_code ec;
    for (const auto &task :
         std::filesystem::directory_iterator("/proc/self/task", ec))
      sched_setaffinity(std::stoi(task.path().filename().string()),
                        sizeof mask, &mask);
  };
  pinAll(one);
  struct Restore {
    std::function<void()> f;
    ~Restore() { f(); }
  } restore{[&] { pinAll(saved); }};
  runtime::TrainOptions to;
  to.steps = 30;
  ThreadedRun run(*plan, runtime::StageOptions(), to);
  ASSERT_EQ(run.error, "");
  llvm::Error e = run.trainer->run([](const runtime::StepReport &) {});
  restore.f();
  restore.f = [] {};
  ASSERT_EQ(errorText(std::move(e)), "");
  auto sum = run.trainer->summary();
  ASSERT_TRUE(bool(sum)) << llvm::toString(sum.takeError());
  ASSERT_EQ(sum->stages.size(), 2u);
  double waited = 0;
  for (const runtime::StageFigures &f : sum->stages) {
    EXPECT_GE(f.coreWaitSeconds, 0);
    EXPECT_LE(f.coreWaitSeconds, sum->meanStepSeconds);
    waited += f.coreWaitSeconds;
  }
  EXPECT_GT(waited, 0);
  EXPECT_GE(sum->cores, 1);
}

} // namespace unit_runtime_training
