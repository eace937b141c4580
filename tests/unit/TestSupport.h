// Helpers shared by the unit tests that are not about one library piece.
#ifndef CLEAVE_TESTS_UNIT_TESTSUPPORT_H
#define CLEAVE_TESTS_UNIT_TESTSUPPORT_H

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace cleave::testsupport {

// Whether this build runs under a sanitizer (the CI's ASan + UBSan and
// ThreadSanitizer builds). Sweeps that repeat one property over hundreds of
// variations (every byte of a file flipped, every operand offset) take a
// sample there: the sanitizers look for memory errors and races, which the
// sample exercises, and the release build runs the whole sweep.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// A fresh folder under the system temp dir, removed at scope exit.
struct TempDir {
  llvm::SmallString<128> path;
  explicit TempDir(llvm::StringRef prefix = "cleave-unit-test") {
    std::error_code ec = llvm::sys::fs::createUniqueDirectory(prefix, path);
    EXPECT_FALSE(ec) << ec.message();
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  // std::filesystem removes what LLVM's remove_directories leaves behind
  // (a FIFO a test made, and so the folder itself).
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(std::string(path), ec);
  }

  // The path of `name` inside the folder.
  std::string file(const std::string &name) const {
    llvm::SmallString<128> p(path);
    llvm::sys::path::append(p, name);
    return std::string(p);
  }
  // The names in the folder, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (llvm::sys::fs::directory_iterator it(path, ec), end; !ec && it != end;
         it.increment(ec))
      out.push_back(llvm::sys::path::filename(it->path()).str());
    std::sort(out.begin(), out.end());
    return out;
  }
};

} // namespace cleave::testsupport

#endif // CLEAVE_TESTS_UNIT_TESTSUPPORT_H
