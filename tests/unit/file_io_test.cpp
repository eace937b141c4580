// support/FileIO: the one checked reader (regular files only, size bounds,
// slices) and the writer's rule on targets (regular files or new paths).
#include "support/FileIO.h"
#include "TestSupport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

namespace unit_file_io {

using namespace cleave;
using testsupport::TempDir;
using ::testing::HasSubstr;

namespace {

std::string messageOf(llvm::Error e) {
  return e ? llvm::toString(std::move(e)) : "success";
}

template <typename T> std::string errorOf(llvm::Expected<T> v) {
  return v ? "success" : llvm::toString(v.takeError());
}

void writeText(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(FileIO, ReadsARegularFileWhole) {
  TempDir dir;
  writeText(dir.file("a.txt"), "hello");
  auto buf = support::readFile(dir.file("a.txt"), "text file");
  ASSERT_TRUE(bool(buf)) << llvm::toString(buf.takeError());
  EXPECT_EQ((*buf)->getBuffer(), "hello");
  writeText(dir.file("empty"), "");
  auto empty = support::readFile(dir.file("empty"));
  ASSERT_TRUE(bool(empty));
  EXPECT_EQ((*empty)->getBufferSize(), 0u);
}

TEST(FileIO, RefusesWhatIsNotARegularFile) {
  TempDir dir;
  EXPECT_EQ(errorOf(support::readFile("/dev/zero", "plan")),
            "'/dev/zero' is a character device, not a plan (cleave reads "
            "regular files only)");
  ASSERT_EQ(::symlink("/dev/zero", dir.file("zero.npy").c_str()), 0);
  EXPECT_EQ(errorOf(support::readFile(dir.file("zero.npy"), "tensor file")),
            "'" + dir.file("zero.npy") +
                "' is a character device, not a tensor file (cleave reads "
                "regular files only)");
  // A FIFO with no writer: refused at once, not waited on.
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_EQ(errorOf(support::readFile(dir.file("fifo"), "ONNX file")),
            "'" + dir.file("fifo") +
                "' is a FIFO, not an ONNX file (cleave reads regular files "
                "only)");
  EXPECT_EQ(errorOf(support::readFileSlice(dir.file("fifo"), 0, 0)),
            "'" + dir.file("fifo") +
                "' is a FIFO, not a file (cleave reads regular files only)");
  EXPECT_EQ(errorOf(support::readFile(std::string(dir.path), "plan")),
            "'" + std::string(dir.path) + "' is a directory, not a plan");
  EXPECT_EQ(errorOf(support::readFile(dir.file("missing"), "plan")),
            "cannot open '" + dir.file("missing") +
                "': No such file or directory");
  EXPECT_EQ(messageOf(support::checkInputFile("/dev/null", "data file")),
            "'/dev/null' is a character device, not a data file (cleave "
            "reads regular files only)");
}

TEST(FileIO, SizeBoundIsCheckedBeforeReading) {
  TempDir dir;
  writeText(dir.file("big"), std::string(100, 'x'));
  EXPECT_EQ(errorOf(support::readFile(dir.file("big"), "IR file", 99)),
            "'" + dir.file("big") + "' is 100 bytes; an IR file may have at "
                                    "most 99");
  EXPECT_EQ(errorOf(support::readFile(dir.file("big"), "IR file", 100)),
            "success");
}

TEST(FileIO, SlicesStayInsideTheFile) {
  TempDir dir;
  writeText(dir.file("d"), "0123456789");
  auto mid = support::readFileSlice(dir.file("d"), 3, 4);
  ASSERT_TRUE(bool(mid));
  EXPECT_EQ((*mid)->getBuffer(), "3456");
  EXPECT_EQ(errorOf(support::readFileSlice(dir.file("d"), 8, 4)),
            "'" + dir.file("d") +
                "' is too short (10 bytes; needs 4 at offset 8)");
  EXPECT_EQ(errorOf(support::readFileSlice(dir.file("d"), 11, 0)),
            "'" + dir.file("d") +
                "' is too short (10 bytes; needs 0 at offset 11)");
  // No overflow of offset + length.
  EXPECT_THAT(errorOf(support::readFileSlice(dir.file("d"), 2, ~uint64_t(0))),
              HasSubstr("is too short"));
}

TEST(FileIO, WritesOnlyRegularFilesOrNewPaths) {
  TempDir dir;
  EXPECT_EQ(messageOf(support::checkOutputFile(dir.file("new"))), "success");
  writeText(dir.file("old"), "old");
  EXPECT_EQ(messageOf(support::writeFileAtomically(dir.file("old"), "new")),
            "success");
  EXPECT_EQ((*support::readFile(dir.file("old")))->getBuffer(), "new");

  EXPECT_EQ(messageOf(support::writeFileAtomically("/dev/null", "x")),
            "cannot write '/dev/null': it is a character device, not a "
            "regular file or a new path");
  struct stat st;
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));

  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  EXPECT_EQ(messageOf(support::writeFileAtomically(dir.file("fifo"), "x")),
            "cannot write '" + dir.file("fifo") +
                "': it is a FIFO, not a regular file or a new path");
  ASSERT_FALSE(llvm::sys::fs::create_directory(dir.file("sub")));
  EXPECT_EQ(messageOf(support::checkOutputFile(dir.file("sub"))),
            "cannot write '" + dir.file("sub") +
                "': it is a directory, not a regular file or a new path");
  EXPECT_EQ(messageOf(support::checkOutputDirectory(dir.file("sub"))),
            "success");
  EXPECT_EQ(messageOf(support::checkOutputDirectory(dir.file("old"))),
            "cannot write into '" + dir.file("old") +
                "': it is a regular file, not a directory");
  EXPECT_EQ(messageOf(support::checkOutputDirectory(dir.file("none"))),
            "success");
  // Nothing but the files made here: no temporaries left.
  EXPECT_EQ(dir.entries(),
            (std::vector<std::string>{"fifo", "old", "sub"}));
}

} // namespace

} // namespace unit_file_io
