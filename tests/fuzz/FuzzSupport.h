// Shared by the fuzz targets: a private scratch folder for inputs the code
// under test reads by path.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace cleave::fuzz {

// A folder of its own per process (so parallel fuzz jobs do not clash, and
// relative external-data references in a fuzzed model find nothing of ours),
// removed at a normal exit. libFuzzer's own exits skip atexit handlers, so
// scripts/fuzz.sh sets TMPDIR to a folder it removes itself.
inline const std::string &scratchDir() {
  static const std::string dir = [] {
    const char *tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") +
                       "/cleave-fuzz-XXXXXX";
    if (!mkdtemp(tmpl.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] { rmdir(scratchDir().c_str()); });
    return tmpl;
  }();
  return dir;
}

// Writes the fuzz input to `<scratch>/<name>` and returns the path.
inline std::string writeInput(const char *name, const uint8_t *data,
                              size_t size) {
  std::string path = scratchDir() + "/" + name;
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::abort();
  }
  if (size && std::fwrite(data, 1, size, f) != size) {
    std::perror(path.c_str());
    std::abort();
  }
  std::fclose(f);
  return path;
}

} // namespace cleave::fuzz
