#include "runtime/Checkpoint.h"

#include "support/FileIO.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

namespace cleave::runtime {

static llvm::Error fail(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

static const char kCheckpointMagic[] = "CLEAVECKPT1\n";

static void putLittleEndian(std::string &blob, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    blob.push_back(char((v >> (8 * i)) & 0xff));
}

llvm::Expected<uint64_t> appendCheckpointEntries(
    std::string &body, const StagePlan &sp,
    StageExecutor &ex) {
  uint64_t count = 0;
  for (const Slot &sl : sp.slots) {
    if (sl.kind != SlotKind::State)
      continue;
    auto bytes = ex.readSlot(sl.name);
    if (!bytes)
      return bytes.takeError();
    putLittleEndian(body, uint32_t(sp.index), 4);
    putLittleEndian(body, sl.name.size(), 4);
    body += sl.name;
    putLittleEndian(body, bytes->size(), 8);
    putLittleEndian(body, fnv1a64(bytes->data(), bytes->size()), 8);
    body.append(reinterpret_cast<const char *>(bytes->data()), bytes->size());
    ++count;
  }
  return count;
}

llvm::Error writeCheckpointFile(const std::string &dir, int64_t stepsDone,
                                uint64_t entries, llvm::StringRef body) {
  std::string blob(kCheckpointMagic);
  putLittleEndian(blob, uint64_t(stepsDone), 8);
  putLittleEndian(blob, entries, 8);
  blob += body;
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
  return support::writeFileAtomically(dir + "/checkpoint.bin", blob);
}

llvm::Expected<int64_t> readCheckpointFile(
    const std::string &dir, llvm::function_ref<bool(uint32_t stage)> wanted,
    llvm::function_ref<std::optional<std::string>(
        uint32_t stage, const std::string &name,
        const std::vector<uint8_t> &bytes)>
        apply) {
  std::string path = dir + "/checkpoint.bin";
  auto buf = support::readFile(path, "checkpoint");
  if (!buf)
    return buf.takeError();
  llvm::StringRef data = (*buf)->getBuffer();
  size_t pos = 0;
  bool truncated = false;
  auto get = [&](int bytes) -> uint64_t {
    if (pos + size_t(bytes) > data.size()) {
      truncated = true;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= uint64_t(uint8_t(data[pos + size_t(i)])) << (8 * i);
    pos += size_t(bytes);
    return v;
  };
  if (!data.startswith(kCheckpointMagic))
    return fail(path + ": not a cleave checkpoint");
  pos = sizeof(kCheckpointMagic) - 1;
  int64_t stepsDone = int64_t(get(8));
  uint64_t entries = get(8);
  for (uint64_t k = 0; k < entries && !truncated; ++k) {
    uint32_t stage = uint32_t(get(4));
    uint32_t nameLen = uint32_t(get(4));
    if (truncated || pos + nameLen > data.size())
      break;
    std::string name = data.substr(pos, nameLen).str();
    pos += nameLen;
    uint64_t size = get(8), sum = get(8);
    if (truncated || size > data.size() - pos) {
      truncated = true;
      break;
    }
    if (!wanted(stage)) {
      pos += size;
      continue;
    }
    std::vector<uint8_t> bytes(data.bytes_begin() + pos,
                               data.bytes_begin() + pos + size);
    pos += size;
    if (fnv1a64(bytes.data(), bytes.size()) != sum)
      return fail(path + ": '" + name + "' is corrupt (checksum mismatch)");
    if (auto msg = apply(stage, name, bytes))
      return fail(path + ": " + *msg);
  }
  if (truncated)
    return fail(path + ": truncated");
  return stepsDone;
}

std::string foreignEntry(uint32_t stage, const std::string &name) {
  return "'" + name + "' on stage " + std::to_string(stage) +
         " is not in this plan (a checkpoint of another plan?)";
}

} // namespace cleave::runtime
