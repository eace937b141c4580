// Weights that stay in their file: the block checksum (support/Checksum.h),
// reading a range of a sparse file (support::streamFileRange), and plans
// that refer to a model's external data instead of copying it
// (codegen PlanInfo::referenceWeights, runtime Blob::file): written and
// read back, each stage loading only its own weights, and a weight file
// that changed under its plan refused.
#include "support/Checksum.h"
#include "support/FileIO.h"
#include "runtime/PlanFile.h"
#include "runtime/Stages.h"
#include "runtime/comm/Comm.h"

#include "TestPlans.h"
#include "TestSupport.h"

#include "llvm/Support/FileSystem.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

namespace unit_weight_files {

using namespace cleave;
using cleave::testsupport::TempDir;

namespace {

std::string errorText(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : "(success)";
}

std::vector<uint8_t> randomBytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t &b : v)
    b = uint8_t(rng());
  return v;
}

TEST(BlockChecksum, SameSumHoweverTheBytesAreSplit) {
  std::vector<uint8_t> v = randomBytes(1000, 1);
  uint64_t whole = support::blockChecksum(v.data(), v.size());
  for (size_t piece : {1, 3, 31, 32, 33, 64, 999}) {
    support::BlockChecksum c;
    for (size_t at = 0; at < v.size(); at += piece)
      c.update(v.data() + at, std::min(piece, v.size() - at));
    EXPECT_EQ(c.value(), whole) << "pieces of " << piece;
  }
}

TEST(BlockChecksum, EveryByteAndTheLengthMatter) {
  std::vector<uint8_t> v = randomBytes(257, 2);
  uint64_t sum = support::blockChecksum(v.data(), v.size());
  for (size_t i : {size_t(0), size_t(31), size_t(32), size_t(200), size_t(256)}) {
    std::vector<uint8_t> w = v;
    w[i] ^= 1;
    EXPECT_NE(support::blockChecksum(w.data(), w.size()), sum) << "byte " << i;
  }
  std::vector<uint8_t> zeros(128, 0);
  EXPECT_NE(support::blockChecksum(zeros.data(), 64),
            support::blockChecksum(zeros.data(), 128));
  EXPECT_NE(support::blockChecksum(zeros.data(), 0),
            support::blockChecksum(zeros.data(), 1));
}

// A sparse file: a hole, data, a hole, data, as truncate and a seek write.
std::string sparseFile(const TempDir &dir, std::vector<uint8_t> &expect) {
  std::string path = dir.file("sparse.bin");
  const size_t size = size_t(40) << 20;
  expect.assign(size, 0);
  std::vector<uint8_t> a = randomBytes(5000, 3), b = randomBytes(70000, 4);
  std::copy(a.begin(), a.end(), expect.begin() + (9 << 20));
  std::copy(b.begin(), b.end(), expect.end() - b.size());
  std::fstream f(path, std::ios::out | std::ios::binary);
  f.seekp(9 << 20);
  f.write(reinterpret_cast<const char *>(a.data()), std::streamsize(a.size()));
  f.seekp(std::streamoff(size - b.size()));
  f.write(reinterpret_cast<const char *>(b.data()), std::streamsize(b.size()));
  return path;
}

// zeros(n) sums as n zero bytes do, from any position inside a chunk and
// across chunk boundaries; whole zero chunks are not read.
TEST(BlockChecksum, ZerosEqualZeroBytes) {
  const size_t chunk = support::BlockChecksum::kChunkBytes;
  std::vector<uint8_t> data = randomBytes(3 * chunk + 100, 7);
  for (size_t before : {size_t(0), size_t(5), size_t(32), chunk - 3, chunk,
                        2 * chunk + 17})
    for (size_t n : {size_t(0), size_t(1), size_t(31), chunk - before % chunk,
                     chunk, 3 * chunk + 9, size_t(10) * chunk}) {
      std::vector<uint8_t> whole(data.begin(), data.begin() + long(before));
      whole.resize(before + n, 0);
      whole.insert(whole.end(), data.begin(), data.begin() + 40);
      support::BlockChecksum a, b;
      a.update(whole.data(), whole.size());
      b.update(data.data(), before);
      b.zeros(n);
      b.update(data.data(), 40);
      EXPECT_EQ(a.value(), b.value()) << before << " + " << n << " zeros";
    }
  // A byte moved across a run of zeros changes the sum.
  std::vector<uint8_t> x(4 * chunk, 0), y(4 * chunk, 0);
  x[10] = 1;
  y[10 + chunk] = 1;
  EXPECT_NE(support::blockChecksum(x.data(), x.size()),
            support::blockChecksum(y.data(), y.size()));
}

TEST(StreamFileRange, HolesArriveAsZerosAndDataAsWritten) {
  TempDir dir;
  std::vector<uint8_t> expect;
  std::string path = sparseFile(dir, expect);
  for (auto [offset, length] :
       {std::pair<uint64_t, uint64_t>{0, expect.size()},
        {(9 << 20) - 7, 6000},
        {expect.size() - 100000, 100000},
        {123, 0}}) {
    std::vector<uint8_t> got;
    EXPECT_EQ(errorText(support::streamFileRange(
                  path, offset, length,
                  [&](const uint8_t *p, size_t n) {
                    EXPECT_LE(n, size_t(8) << 20); // one piece at a time
                    got.insert(got.end(), p, p + n);
                    return llvm::Error::success();
                  })),
              "(success)");
    ASSERT_EQ(got.size(), length);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), expect.begin() + offset))
        << "range at " << offset;
  }
  // With a zeros callback, the holes come as counts, the sum unchanged.
  support::BlockChecksum streamed;
  uint64_t holeBytes = 0;
  EXPECT_EQ(errorText(support::streamFileRange(
                path, 0, expect.size(),
                [&](const uint8_t *p, size_t n) {
                  streamed.update(p, n);
                  return llvm::Error::success();
                },
                "file",
                [&](uint64_t n) {
                  holeBytes += n;
                  streamed.zeros(n);
                  return llvm::Error::success();
                })),
            "(success)");
  EXPECT_EQ(streamed.value(),
            support::blockChecksum(expect.data(), expect.size()));
  EXPECT_GT(holeBytes, uint64_t(30) << 20); // the holes were not read
  auto none = [](const uint8_t *, size_t) { return llvm::Error::success(); };
  EXPECT_EQ(errorText(support::streamFileRange(path, expect.size() - 10, 11,
                                               none, "weight file")),
            "'" + path + "' is too short (41943040 bytes; needs 11 at offset "
                         "41943030)");
  std::string folder(dir.path);
  EXPECT_EQ(errorText(support::streamFileRange(folder, 0, 1, none,
                                               "weight file")),
            "'" + folder + "' is a directory, not a weight file");
}

// The committed tiny LLaMA (tests/models/llama/tiny) copied into `dir`, so
// its weight file can be changed.
std::string tinyLlama(const TempDir &dir) {
  std::string from = std::string(CLEAVE_SOURCE_DIR) + "/tests/models/llama/tiny/";
  for (const char *f : {"model.onnx", "model.weights"})
    EXPECT_FALSE(llvm::sys::fs::copy_file(from + f, dir.file(f)));
  return dir.file("model.onnx");
}

void flipByte(const std::string &path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(std::streamoff(at));
  char c = 0;
  f.get(c);
  f.seekp(std::streamoff(at));
  f.put(char(c ^ 0x40));
}

TEST(ReferencedWeights, PlanRefersToTheFileAndEachStageReadsItsOwn) {
  TempDir dir;
  std::string model = tinyLlama(dir);
  auto plan = testsupport::compilePlanFrom(model, 2, 2, "1f1b");
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  llvm::SmallString<256> real;
  ASSERT_FALSE(llvm::sys::fs::real_path(dir.file("model.weights"), real));
  std::string weights(real);
  ASSERT_EQ(plan->weightFiles.size(), 1u);
  EXPECT_EQ(plan->weightFiles[0].path, weights);
  EXPECT_EQ(plan->weightFiles[0].size, 132736u);
  // Every parameter is referenced, momentum is a fill: the plan holds only
  // small constants.
  uint64_t held = 0, referenced = 0;
  for (const runtime::Blob &b : plan->blobs) {
    held += b.bytes.size();
    referenced += b.referenced() ? b.size : 0;
  }
  EXPECT_GT(referenced, 130000u);
  EXPECT_LT(held, 4096u); // position ids, folded shapes and masks

  std::string path = dir.file("ref.cplan");
  ASSERT_EQ(errorText(runtime::writePlanFile(*plan, path)), "(success)");
  uint64_t planBytes = 0;
  ASSERT_FALSE(llvm::sys::fs::file_size(path, planBytes));
  EXPECT_LT(planBytes, referenced); // the weights are not in it

  // A weight only stage 0 holds: its bytes changed (same size) break stage
  // 0's load and leave stage 1's untouched, so a stage reads its own only.
  auto read = runtime::readPlanFile(path);
  ASSERT_TRUE(bool(read)) << llvm::toString(read.takeError());
  const runtime::Slot *embed = nullptr;
  for (const runtime::Slot &sl : read->stages[0].slots)
    if (sl.name == "model.embed_tokens.weight")
      embed = &sl;
  ASSERT_NE(embed, nullptr);
  const runtime::Blob &b = read->blobs[size_t(embed->blob)];
  ASSERT_TRUE(b.referenced());
  for (const runtime::Slot &sl : read->stages[1].slots)
    EXPECT_NE(sl.blob, embed->blob) << sl.name;
  flipByte(weights, b.offset + 100);

  auto comms = runtime::createInProcessComms(2, 30);
  auto s1 = runtime::createLocalStage(*read, 0, 1, {}, *comms[1], nullptr);
  EXPECT_TRUE(bool(s1)) << (s1 ? "" : llvm::toString(s1.takeError()));
  auto s0 = runtime::createLocalStage(*read, 0, 0, {}, *comms[0], nullptr);
  ASSERT_FALSE(bool(s0));
  EXPECT_EQ(llvm::toString(s0.takeError()),
            "stage 0: slot 'model.embed_tokens.weight': its bytes in weight "
            "file '" + weights + "' (at " + std::to_string(b.offset) +
                ", 16384 bytes) do not match the plan's checksum: the file "
                "changed since the plan was compiled; recompile the model");
}

TEST(ReferencedWeights, AWeightFileOfAnotherSizeOrGoneIsRefusedOnRead) {
  TempDir dir;
  std::string model = tinyLlama(dir);
  auto plan = testsupport::compilePlanFrom(model, 1, 1, "1f1b");
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  std::string path = dir.file("ref.cplan");
  ASSERT_EQ(errorText(runtime::writePlanFile(*plan, path)), "(success)");
  std::string weights = plan->weightFiles[0].path;
  {
    std::ofstream grow(weights, std::ios::app | std::ios::binary);
    grow.put('x');
  }
  auto grown = runtime::readPlanFile(path);
  ASSERT_FALSE(bool(grown));
  EXPECT_EQ(llvm::toString(grown.takeError()),
            path + ": weight file '" + weights +
                "' is 132737 bytes; the plan was compiled against 132736: it "
                "changed, recompile the model");
  ASSERT_FALSE(llvm::sys::fs::remove(weights));
  auto gone = runtime::readPlanFile(path);
  ASSERT_FALSE(bool(gone));
  EXPECT_EQ(llvm::toString(gone.takeError()),
            path + ": cannot open '" + dir.file("model.weights") +
                "': No such file or directory (the plan refers to its "
                "weights; recompile the model or restore the file)");
}

// A plan is untrusted: the weight files it names are read only inside its
// folder, unless the reader trusts another (cleave-run --trust-dir).
TEST(ReferencedWeights, WeightFilesOutsideThePlansFolderAreRefused) {
  TempDir dir;
  std::string model = tinyLlama(dir);
  auto plan = testsupport::compilePlanFrom(model, 1, 1, "1f1b");
  ASSERT_TRUE(bool(plan)) << llvm::toString(plan.takeError());
  llvm::SmallString<256> realDir;
  ASSERT_FALSE(llvm::sys::fs::real_path(dir.path, realDir));
  std::string weights = plan->weightFiles[0].path;
  // Next to the model, the plan names its weights relative to itself and
  // reads them from its folder whatever the current one is.
  ASSERT_EQ(errorText(runtime::writePlanFile(*plan, dir.file("in.cplan"))),
            "(success)");
  auto in = runtime::readPlanFile(dir.file("in.cplan"));
  ASSERT_TRUE(bool(in)) << llvm::toString(in.takeError());
  EXPECT_EQ(in->weightFiles[0].path, weights);

  ASSERT_FALSE(llvm::sys::fs::create_directory(dir.file("plans")));
  std::string path = dir.file("plans/p.cplan");
  auto refused = [&](const std::string &named, const std::string &want,
                     const support::TrustedFolders &trusted = {}) {
    runtime::Plan crafted = *plan;
    crafted.weightFiles[0].path = named;
    EXPECT_EQ(errorText(runtime::writePlanFile(crafted, path)), "(success)");
    auto r = runtime::readPlanFile(path, std::nullopt, trusted);
    if (want.empty()) {
      EXPECT_TRUE(bool(r)) << named << ": " << llvm::toString(r.takeError());
      return;
    }
    ASSERT_FALSE(bool(r)) << named;
    std::string e = llvm::toString(r.takeError());
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  };
  std::string outside = "', outside '" + std::string(realDir) + "/plans': " +
                        "pass --trust-dir " + std::string(realDir) +
                        " if you trust that folder";
  // Absolute, climbing out, through a symlink: each refused.
  refused(weights, "weight file '" + weights + "' resolves to '" + weights +
                       outside);
  refused("../model.weights",
          "weight file '../model.weights' resolves to '" + weights + outside);
  ASSERT_FALSE(llvm::sys::fs::create_link(weights, dir.file("plans/link")));
  refused("link", "weight file 'link' resolves to '" + weights + outside);
  // A NUL would cut the name short for the C library.
  refused(std::string("link\0/x", 7), "weight file path 'link...' contains a "
                                       "NUL byte");
  // A folder the reader trusts.
  support::TrustedFolders trusted{{std::string(dir.path)}};
  refused("../model.weights", "", trusted);
  refused(weights, "", trusted);
  refused("/etc/passwd", "resolves to '/etc/passwd', outside", trusted);
}

TEST(ReferencedWeights, ReferencedAndCopiedPlansStartFromTheSameBytes) {
  TempDir dir;
  std::string model = tinyLlama(dir);
  auto ref = testsupport::compilePlanFrom(model, 2, 2, "zb-h1", "adamw", true);
  auto copy =
      testsupport::compilePlanFrom(model, 2, 2, "zb-h1", "adamw", false);
  ASSERT_TRUE(ref && copy);
  EXPECT_TRUE(copy->weightFiles.empty());
  ASSERT_EQ(ref->stages.size(), copy->stages.size());
  auto a = runtime::createThreadedPipeline(*ref, {});
  auto c = runtime::createThreadedPipeline(*copy, {});
  ASSERT_TRUE(a && c);
  for (size_t s = 0; s < ref->stages.size(); ++s) {
    for (const runtime::Slot &sl : ref->stages[s].slots) {
      if (sl.blob < 0)
        continue;
      auto x = (*a)->locals()[s]->executor->readSlot(sl.name);
      auto y = (*c)->locals()[s]->executor->readSlot(sl.name);
      ASSERT_TRUE(x && y);
      EXPECT_EQ(*x, *y) << sl.name;
    }
  }
}

} // namespace

} // namespace unit_weight_files
