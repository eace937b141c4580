#include "support/FileIO.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <unistd.h>

namespace cleave::support {

llvm::Error writeFileAtomically(const std::string &path, llvm::StringRef data) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(tmp, ec);
    if (ec)
      return llvm::createStringError(ec, "cannot write '" + path +
                                             "': " + ec.message());
    os << data;
    os.close();
    if (os.has_error()) {
      os.clear_error();
      llvm::sys::fs::remove(tmp);
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "cannot write '" + path + "'");
    }
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, path)) {
    llvm::sys::fs::remove(tmp);
    return llvm::createStringError(ec, "cannot write '" + path +
                                           "': " + ec.message());
  }
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFile(const std::string &path, llvm::StringRef kind) {
  if (llvm::sys::fs::is_directory(path))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "'" + path + "' is a directory, not a " +
                                       kind.str());
  auto buf = llvm::MemoryBuffer::getFile(path, false, false);
  if (!buf)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "cannot open '" + path +
                                       "': " + buf.getError().message());
  return std::move(*buf);
}

} // namespace cleave::support
