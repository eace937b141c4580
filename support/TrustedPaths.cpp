#include "support/TrustedPaths.h"

#include "support/Errors.h"
#include "support/FileIO.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/Path.h"

namespace cleave::support {

const char kTrustDirHelp[] =
    "  --trust-dir DIR       also read files that the input names inside DIR\n"
    "                        (repeatable); without it a plan or .cir may name\n"
    "                        only files inside its own folder\n";

// Whether real path `p` is `dir` itself or lies below it.
static bool inside(llvm::StringRef p, llvm::StringRef dir) {
  if (dir == "/")
    return true;
  return p.startswith(dir) && p.size() > dir.size() &&
         llvm::sys::path::is_separator(p[dir.size()]);
}

std::string folderOf(const std::string &file) {
  llvm::StringRef parent = llvm::sys::path::parent_path(file);
  return parent.empty() ? "." : parent.str();
}

llvm::Expected<std::string> resolveConfined(const std::string &name,
                                            const std::string &baseDir,
                                            const TrustedFolders &trusted,
                                            const std::string &what) {
  if (name.empty())
    return fail(what + " has an empty path");
  if (name.find('\0') != std::string::npos)
    return fail(what + " path '" + name.substr(0, name.find('\0')) +
                "...' contains a NUL byte");
  llvm::SmallString<256> full;
  if (llvm::sys::path::is_absolute(name)) {
    full = name;
  } else {
    full = baseDir;
    llvm::sys::path::append(full, name);
  }
  llvm::SmallString<256> real, realBase;
  if (std::error_code ec = llvm::sys::fs::real_path(full, real))
    return fail("cannot open '" + std::string(full) + "': " + ec.message());
  if (!llvm::sys::fs::real_path(baseDir, realBase) && inside(real, realBase))
    return std::string(real);
  for (const std::string &dir : trusted.dirs) {
    llvm::SmallString<256> realDir;
    if (!llvm::sys::fs::real_path(dir, realDir) && inside(real, realDir))
      return std::string(real);
  }
  return fail(what + " '" + name + "' resolves to '" + std::string(real) +
              "', outside '" +
              std::string(realBase.empty() ? llvm::StringRef(baseDir)
                                           : llvm::StringRef(realBase)) +
              "': pass --trust-dir " + folderOf(std::string(real)) +
              " if you trust that folder");
}

std::string relativeIfInside(const std::string &path, const std::string &dir) {
  llvm::SmallString<256> real, realDir;
  if (llvm::sys::fs::real_path(path, real) ||
      llvm::sys::fs::real_path(dir, realDir) || !inside(real, realDir))
    return path;
  llvm::StringRef rest = llvm::StringRef(real).drop_front(realDir.size());
  while (!rest.empty() && llvm::sys::path::is_separator(rest.front()))
    rest = rest.drop_front();
  return rest.str();
}

llvm::Expected<std::string> sha256OfFile(const std::string &path,
                                         const std::string &what) {
  uint64_t size = 0;
  if (std::error_code ec = llvm::sys::fs::file_size(path, size))
    return fail("cannot open " + what + " '" + path + "': " + ec.message());
  llvm::SHA256 sha;
  if (llvm::Error e = streamFileRange(
          path, 0, size,
          [&](const uint8_t *p, size_t n) {
            sha.update(llvm::ArrayRef<uint8_t>(p, n));
            return llvm::Error::success();
          },
          what))
    return std::move(e);
  return llvm::toHex(sha.final(), /*LowerCase=*/true);
}

} // namespace cleave::support
