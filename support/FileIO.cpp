#include "support/FileIO.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

#include <cerrno>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cleave::support {

static llvm::Error error(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

static const char *describeMode(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  return "not a regular file";
}

std::string describeNonRegular(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode))
    return "";
  return describeMode(st.st_mode);
}

// "a KIND" or "an KIND", as English has it for the words cleave uses.
static std::string withArticle(llvm::StringRef kind) {
  bool vowel = !kind.empty() && llvm::StringRef("AEIOUaeiou").contains(kind[0]);
  return (vowel ? "an " : "a ") + kind.str();
}

static llvm::Error notRegular(const std::string &path, mode_t mode,
                              llvm::StringRef kind) {
  if (S_ISDIR(mode))
    return error("'" + path + "' is a directory, not " + withArticle(kind));
  return error("'" + path + "' is " + describeMode(mode) + ", not " +
               withArticle(kind) + " (cleave reads regular files only)");
}

static llvm::Error cannotOpen(const std::string &path, int err) {
  return error("cannot open '" + path + "': " + std::strerror(err));
}

llvm::Error checkInputFile(const std::string &path, llvm::StringRef kind) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return cannotOpen(path, errno);
  if (!S_ISREG(st.st_mode))
    return notRegular(path, st.st_mode, kind);
  return llvm::Error::success();
}

namespace {
// A descriptor closed at scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0)
      ::close(fd);
  }
};
} // namespace

// Opens `path` for reading if it is a regular file: checked by name first
// (so a FIFO is never opened), then opened with O_NONBLOCK (so one swapped in
// meanwhile cannot block) and checked again on the descriptor.
static llvm::Error openRegular(const std::string &path, llvm::StringRef kind,
                               Fd &file, uint64_t &size) {
  if (llvm::Error e = checkInputFile(path, kind))
    return e;
  file.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (file.fd < 0)
    return cannotOpen(path, errno);
  struct stat st;
  if (::fstat(file.fd, &st) != 0)
    return cannotOpen(path, errno);
  if (!S_ISREG(st.st_mode))
    return notRegular(path, st.st_mode, kind);
  size = uint64_t(st.st_size);
  return llvm::Error::success();
}

static llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readOpen(const Fd &file, const std::string &path, uint64_t size,
         uint64_t offset) {
  auto buf = offset == 0 && size > 0
                 ? llvm::MemoryBuffer::getOpenFile(
                       file.fd, path, size, /*RequiresNullTerminator=*/false)
                 : llvm::MemoryBuffer::getOpenFileSlice(file.fd, path, size,
                                                        int64_t(offset));
  if (!buf)
    return error("cannot read '" + path + "': " + buf.getError().message());
  return std::move(*buf);
}

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFile(const std::string &path, llvm::StringRef kind, uint64_t maxBytes) {
  Fd file;
  uint64_t size = 0;
  if (llvm::Error e = openRegular(path, kind, file, size))
    return std::move(e);
  if (size > maxBytes)
    return error("'" + path + "' is " + std::to_string(size) + " bytes; " +
                 withArticle(kind) + " may have at most " +
                 std::to_string(maxBytes));
  if (size == 0)
    return llvm::MemoryBuffer::getMemBuffer("", path);
  return readOpen(file, path, size, 0);
}

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readFileSlice(const std::string &path, uint64_t offset, uint64_t length,
              llvm::StringRef kind) {
  Fd file;
  uint64_t size = 0;
  if (llvm::Error e = openRegular(path, kind, file, size))
    return std::move(e);
  if (offset > size || length > size - offset)
    return error("'" + path + "' is too short (" + std::to_string(size) +
                 " bytes; needs " + std::to_string(length) + " at offset " +
                 std::to_string(offset) + ")");
  if (length == 0)
    return llvm::MemoryBuffer::getMemBuffer("", path);
  return readOpen(file, path, length, offset);
}

llvm::Error streamFileRange(
    const std::string &path, uint64_t offset, uint64_t length,
    llvm::function_ref<llvm::Error(const uint8_t *, size_t)> consume,
    llvm::StringRef kind, llvm::function_ref<llvm::Error(uint64_t)> zeros) {
  Fd file;
  uint64_t size = 0;
  if (llvm::Error e = openRegular(path, kind, file, size))
    return e;
  if (offset > size || length > size - offset)
    return error("'" + path + "' is too short (" + std::to_string(size) +
                 " bytes; needs " + std::to_string(length) + " at offset " +
                 std::to_string(offset) + ")");
  constexpr size_t kPiece = size_t(8) << 20;
  static const std::vector<uint8_t> zeroPiece(kPiece, 0);
  std::vector<uint8_t> buf(std::min<uint64_t>(length, kPiece));
  const uint64_t end = offset + length;
  for (uint64_t at = offset; at < end;) {
    // Where the data resumes: past a hole, which reads as zeros.
    off_t data = ::lseek(file.fd, off_t(at), SEEK_DATA);
    uint64_t dataAt = data < 0 ? end : std::min<uint64_t>(uint64_t(data), end);
    if (zeros && at < dataAt) {
      if (llvm::Error e = zeros(dataAt - at))
        return e;
      at = dataAt;
    }
    for (; at < dataAt;) {
      size_t n = size_t(std::min<uint64_t>(kPiece, dataAt - at));
      if (llvm::Error e = consume(zeroPiece.data(), n))
        return e;
      at += n;
    }
    if (at >= end)
      break;
    off_t hole = ::lseek(file.fd, off_t(at), SEEK_HOLE);
    uint64_t holeAt = hole < 0 ? end : std::min<uint64_t>(uint64_t(hole), end);
    for (; at < holeAt;) {
      size_t n = size_t(std::min<uint64_t>(kPiece, holeAt - at));
      ssize_t got = ::pread(file.fd, buf.data(), n, off_t(at));
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        return error("cannot read '" + path + "' at byte " +
                     std::to_string(at) + ": " +
                     (got < 0 ? std::strerror(errno) : "it ended early"));
      if (llvm::Error e = consume(buf.data(), size_t(got)))
        return e;
      at += uint64_t(got);
    }
  }
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
readStdin(llvm::StringRef kind, uint64_t maxBytes) {
  std::string data;
  char chunk[1 << 16];
  while (true) {
    ssize_t n = ::read(STDIN_FILENO, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return error(std::string("cannot read standard input: ") +
                   std::strerror(errno));
    if (n == 0)
      break;
    if (uint64_t(n) > maxBytes - data.size())
      return error("standard input holds more than " +
                   std::to_string(maxBytes) + " bytes, the most " +
                   withArticle(kind) + " may have");
    data.append(chunk, size_t(n));
  }
  return llvm::MemoryBuffer::getMemBufferCopy(data, "<stdin>");
}

llvm::Error checkOutputFile(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode))
    return llvm::Error::success(); // new (or unreachable: the write says why)
  return error("cannot write '" + path + "': it is " +
               describeMode(st.st_mode) +
               ", not a regular file or a new path");
}

llvm::Error checkOutputDirectory(const std::string &dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || S_ISDIR(st.st_mode))
    return llvm::Error::success();
  return error("cannot write into '" + dir + "': it is " +
               (S_ISREG(st.st_mode) ? "a regular file"
                                    : describeMode(st.st_mode)) +
               ", not a directory");
}

llvm::Error writeFileAtomically(const std::string &path, llvm::StringRef data) {
  if (llvm::Error e = checkOutputFile(path))
    return e;
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

} // namespace cleave::support
