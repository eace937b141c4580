// readNpzFile on NumPy archives (tests/unit/data/npz, written by its
// make_fixtures.py with numpy.savez / savez_compressed): names, dtypes,
// shapes and values; and one clear error, never a crash, for archives that
// are truncated, corrupted or not zip files at all.
#include "frontend/TensorFiles.h"
#include "runtime/data/NumpyFiles.h"
#include "TestSupport.h"

#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace unit_npz {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;

namespace {

using Arrays = std::map<std::string, std::shared_ptr<TensorData>>;

std::string fixture(const std::string &name) {
  return std::string(CLEAVE_SOURCE_DIR) + "/tests/unit/data/npz/" + name;
}

std::string readBytes(const std::string &path) {
  auto buf = llvm::MemoryBuffer::getFile(path, false, false);
  EXPECT_TRUE(bool(buf)) << path;
  return buf ? (*buf)->getBuffer().str() : "";
}

void writeBytes(const std::string &path, llvm::StringRef bytes) {
  std::error_code ec;
  llvm::raw_fd_ostream os(path, ec);
  ASSERT_FALSE(ec) << path << ": " << ec.message();
  os << bytes;
}

Arrays readOrDie(const std::string &path) {
  auto a = runtime::readNpzFile(path);
  if (!a) {
    ADD_FAILURE() << llvm::toString(a.takeError());
    return {};
  }
  return std::move(*a);
}

// The message of a read that must fail ("" if it succeeded).
std::string readError(const std::string &path) {
  auto a = runtime::readNpzFile(path);
  if (a)
    return "";
  return llvm::toString(a.takeError());
}

std::vector<double> doubles(const TensorData &t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.type().numElements(); ++i)
    v.push_back(t.getDouble(i));
  return v;
}

std::vector<int64_t> ints(const TensorData &t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.type().numElements(); ++i)
    v.push_back(t.getInt(i));
  return v;
}

// The arrays make_fixtures.py saves into arrays*.npz.
void expectFixtureArrays(const Arrays &a) {
  std::vector<std::string> names;
  for (const auto &kv : a)
    names.push_back(kv.first);
  EXPECT_EQ(names, (std::vector<std::string>{"empty", "f64", "i32", "i64",
                                             "mask", "net.0.weight",
                                             "scalar"}));
  if (a.size() != 7)
    return;
  const TensorData &w = *a.at("net.0.weight");
  EXPECT_EQ(w.type().str(), TensorType(DType::F32, {2, 3}).str());
  EXPECT_EQ(doubles(w), (std::vector<double>{-1, -0.5, 0, 0.5, 1, 1.5}));

  const TensorData &f64 = *a.at("f64");
  EXPECT_EQ(f64.type(), TensorType(DType::F64, {4}));
  EXPECT_EQ(doubles(f64), (std::vector<double>{1.5, -2.25, 1e300, 0.0}));

  const TensorData &i64 = *a.at("i64");
  EXPECT_EQ(i64.type(), TensorType(DType::I64, {2, 2}));
  EXPECT_EQ(ints(i64), (std::vector<int64_t>{-1, int64_t(1) << 40, 3,
                                             -(int64_t(1) << 62)}));

  const TensorData &i32 = *a.at("i32");
  EXPECT_EQ(i32.type(), TensorType(DType::I32, {3}));
  EXPECT_EQ(ints(i32), (std::vector<int64_t>{7, -8, 2147483647}));

  const TensorData &mask = *a.at("mask");
  EXPECT_EQ(mask.type(), TensorType(DType::Bool, {5}));
  EXPECT_EQ(ints(mask), (std::vector<int64_t>{1, 0, 0, 1, 1}));

  const TensorData &scalar = *a.at("scalar");
  EXPECT_EQ(scalar.type(), TensorType(DType::F32, {}));
  EXPECT_EQ(doubles(scalar), (std::vector<double>{3.25}));

  const TensorData &empty = *a.at("empty");
  EXPECT_EQ(empty.type(), TensorType(DType::F32, {0, 3}));
  EXPECT_EQ(empty.bytes().size(), 0u);
}

} // namespace

TEST(Npz, Savez) { expectFixtureArrays(readOrDie(fixture("arrays.npz"))); }

TEST(Npz, SavezCompressed) {
  if (runtime::canReadCompressedNpz()) {
    expectFixtureArrays(readOrDie(fixture("arrays_compressed.npz")));
  } else {
    std::string msg = readError(fixture("arrays_compressed.npz"));
    EXPECT_THAT(msg, HasSubstr("is compressed; save with numpy.savez, not "
                               "savez_compressed"));
    EXPECT_THAT(msg, HasSubstr("arrays_compressed.npz"));
  }
}

TEST(Npz, PositionalNames) {
  Arrays a = readOrDie(fixture("positional.npz"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_TRUE(a.count("arr_0") && a.count("arr_1"));
  EXPECT_EQ(a["arr_0"]->type(), TensorType(DType::I64, {2}));
  EXPECT_EQ(ints(*a["arr_0"]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(a["arr_1"]->type(), TensorType(DType::F32, {1, 1}));
  EXPECT_EQ(doubles(*a["arr_1"]), (std::vector<double>{0.5}));
}

// Sizes and offsets in ZIP64 records, as written for archives over 4 GiB.
TEST(Npz, Zip64Records) {
  Arrays a = readOrDie(fixture("zip64.npz"));
  ASSERT_EQ(a.size(), 2u);
  ASSERT_TRUE(a.count("w") && a.count("n"));
  EXPECT_EQ(a["w"]->type(), TensorType(DType::F32, {1, 2}));
  EXPECT_EQ(doubles(*a["w"]), (std::vector<double>{1, -2}));
  EXPECT_EQ(a["n"]->type(), TensorType(DType::I64, {3}));
  EXPECT_EQ(ints(*a["n"]), (std::vector<int64_t>{5, 6, 7}));
}

TEST(Npz, UnsupportedMembers) {
  std::string msg = readError(fixture("uint8.npz"));
  EXPECT_THAT(msg, HasSubstr("uint8.npz' member 'bytes.npy'"));
  EXPECT_THAT(msg, HasSubstr("NumPy dtype '|u1' is not supported"));

  msg = readError(fixture("not_npy.npz"));
  EXPECT_THAT(msg, HasSubstr("not_npy.npz' member 'notes.txt' is not a .npy "
                             "array"));
}

TEST(Npz, NotAZip) {
  testsupport::TempDir dir;
  writeBytes(dir.file("text.npz"), "hello, this is not a zip archive at all");
  std::string msg = readError(dir.file("text.npz"));
  EXPECT_THAT(msg, HasSubstr("text.npz' is not a .npz file"));

  writeBytes(dir.file("tiny.npz"), "PK");
  EXPECT_THAT(readError(dir.file("tiny.npz")),
              HasSubstr("tiny.npz' is not a .npz file"));

  EXPECT_THAT(readError(dir.file("missing.npz")),
              HasSubstr("cannot open '" + dir.file("missing.npz") + "'"));
  EXPECT_THAT(readError(std::string(dir.path)), HasSubstr("is a directory"));
}

TEST(Npz, EmptyArchive) {
  // What numpy.savez writes with no arrays: only the end record.
  testsupport::TempDir dir;
  std::string eocd = std::string("PK\x05\x06", 4) + std::string(18, '\0');
  writeBytes(dir.file("empty.npz"), eocd);
  auto a = runtime::readNpzFile(dir.file("empty.npz"));
  ASSERT_TRUE(bool(a)) << llvm::toString(a.takeError());
  EXPECT_TRUE(a->empty());
}

// Every truncation of an archive is an error naming the file.
TEST(Npz, Truncated) {
  for (const char *name :
       {"arrays.npz", "arrays_compressed.npz", "zip64.npz"}) {
    std::string all = readBytes(fixture(name));
    testsupport::TempDir dir;
    std::string path = dir.file("cut.npz");
    for (size_t n = 0; n < all.size(); ++n) {
      writeBytes(path, llvm::StringRef(all).take_front(n));
      std::string msg = readError(path);
      ASSERT_THAT(msg, HasSubstr("'" + path + "'")) << name << " cut at " << n;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
    writeBytes(path, llvm::StringRef(all).drop_back(1));
    EXPECT_THAT(readError(path), HasSubstr("is not a .npz file"));
    // Losing the start keeps the end record, whose offsets now miss.
    for (size_t n = 1; n < all.size(); n += n < 64 ? 1 : 97) {
      writeBytes(path, llvm::StringRef(all).drop_front(n));
      std::string msg = readError(path);
      ASSERT_THAT(msg, HasSubstr("'" + path + "'")) << name << " from " << n;
    }
  }
}

// Flipping any byte either still reads (a timestamp, say) or gives one
// error naming the file; data damage is caught by the CRC. Under a
// sanitizer every fifth byte (all of them took 31 s under TSan).
TEST(Npz, Corrupted) {
  const size_t step = testsupport::kSanitized ? 5 : 1;
  for (const char *name :
       {"arrays.npz", "arrays_compressed.npz", "zip64.npz"}) {
    std::string all = readBytes(fixture(name));
    testsupport::TempDir dir;
    std::string path = dir.file("bad.npz");
    for (size_t at = 0; at < all.size(); at += step) {
      std::string bad = all;
      bad[at] = char(bad[at] ^ 0x5a);
      writeBytes(path, bad);
      auto a = runtime::readNpzFile(path);
      if (!a) {
        std::string msg = llvm::toString(a.takeError());
        ASSERT_THAT(msg, HasSubstr("'" + path + "'")) << name << " @" << at;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
  }
  // A damaged data byte of a stored member: caught by the checksum.
  std::string all = readBytes(fixture("arrays.npz"));
  size_t at = all.find("\x93NUMPY");
  ASSERT_NE(at, std::string::npos);
  at = all.find('\n', at) + 1; // first data byte of the first member
  all[at] = char(all[at] ^ 1);
  testsupport::TempDir dir;
  writeBytes(dir.file("crc.npz"), all);
  EXPECT_THAT(readError(dir.file("crc.npz")), HasSubstr("checksum mismatch"));
}

} // namespace unit_npz
