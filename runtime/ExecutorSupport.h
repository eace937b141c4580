// What the executor's files share (internal to runtime/): the clock, error
// helpers that name where a failure happened, weight loading, and the
// small facts about slots and actions. runtime/Executor.h is the interface.
#pragma once

#include "runtime/Executor.h"
#include "support/Errors.h"

#include "ir/OpInfo.h"

#include "support/Checksum.h"
#include "support/FileIO.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

namespace cleave::runtime::detail {

using Clock = std::chrono::steady_clock;

inline double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline double clockSeconds(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// Prefixes an error's message with `where` (no-op on success). A
// CommTimeout already names the stage, the peer and the message, and passes
// unchanged.
inline llvm::Error wrap(llvm::Error e, const llvm::Twine &where) {
  if (!e || e.isA<CommTimeout>())
    return e;
  return fail(where + ": " + llvm::toString(std::move(e)));
}

// The same with the context made only on failure (`where()` formats a
// string; made for every instruction it cost microseconds each).
template <typename F, typename = std::enable_if_t<std::is_invocable_v<F>>>
inline llvm::Error wrap(llvm::Error e, F &&where) {
  if (!e || e.isA<CommTimeout>())
    return e;
  return fail(where() + ": " + llvm::toString(std::move(e)));
}

// A referenced blob's bytes, read from its weight file a piece at a time
// straight into the slot's memory (one 8 MiB buffer, so loading adds no
// second copy of the weights), summed on the way.
inline llvm::Error loadReferenced(Backend &backend, const WeightFile &file,
                           const Blob &blob, void *dst,
                           const std::string &what) {
  support::BlockChecksum sum;
  uint64_t done = 0;
  if (auto e = support::streamFileRange(
          file.path, blob.offset, blob.size,
          [&](const uint8_t *p, size_t n) {
            sum.update(p, n);
            backend.copyToDevice(static_cast<char *>(dst) + done, p, n);
            done += n;
            return llvm::Error::success();
          },
          "weight file"))
    return fail(what + ": " + llvm::toString(std::move(e)));
  if (sum.value() != blob.checksum)
    return fail(llvm::formatv("{0}: its bytes in weight file '{1}' (at {2}, "
                              "{3} bytes) do not match the plan's checksum: "
                              "the file changed since the plan was "
                              "compiled; recompile the model",
                              what, file.path, blob.offset, blob.size));
  return llvm::Error::success();
}

// A filled blob: its element repeated over the slot, copied from one
// pattern buffer of at most 8 MiB.
inline void fillSlot(Backend &backend, const Blob &blob, void *dst) {
  std::vector<uint8_t> pattern(
      size_t(std::min<uint64_t>(blob.size, uint64_t(8) << 20)));
  for (size_t at = 0; at < pattern.size(); at += blob.fill.size())
    std::memcpy(pattern.data() + at, blob.fill.data(), blob.fill.size());
  for (uint64_t at = 0; at < blob.size; at += pattern.size())
    backend.copyToDevice(static_cast<char *>(dst) + at, pattern.data(),
                         size_t(std::min<uint64_t>(pattern.size(),
                                                   blob.size - at)));
}

// A receive's CommTimeout said again in the plan's terms: "no message from
// stage 0 (the activation 'x' of microbatch 3, tag 7) within 3 s
// (--comm-timeout)". Other errors pass unchanged.
inline llvm::Error nameTimeout(llvm::Error e, const std::string &peer,
                        const std::string &what, int64_t tag) {
  if (!e || !e.isA<CommTimeout>())
    return e;
  double seconds = 0;
  llvm::handleAllErrors(std::move(e), [&](const CommTimeout &t) {
    seconds = t.seconds;
  });
  return llvm::make_error<CommTimeout>(
      llvm::formatv("no message from {0} ({1}, tag {2}) {3}", peer, what, tag,
                    withinTimeout(seconds))
          .str(),
      seconds);
}

// What a Recv of `slot` in `phase` receives, for a timeout's message.
inline std::string messageText(Phase phase, const std::string &slot, int microbatch) {
  std::string mb = " of microbatch " + std::to_string(microbatch);
  switch (phase) {
  case Phase::F:
    return "the activation '" + slot + "'" + mb;
  case Phase::B:
    return "the gradient '" + slot + "'" + mb;
  case Phase::W:
    return "'" + slot + "'" + mb;
  case Phase::Step:
    break;
  }
  return "'" + slot + "' for the step";
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline const ir::AttrMap &noAttrs() {
  static const ir::AttrMap m;
  return m;
}

inline std::string describeAction(const Action &a) {
  if (a.kind == ActionKind::Step)
    return "STEP";
  return llvm::formatv("{0} of microbatch {1}", actionKindName(a.kind),
                       a.microbatch)
      .str();
}

inline bool inFrame(SlotKind k) {
  return k == SlotKind::MicroTemp || k == SlotKind::Input;
}
inline bool isPersistent(SlotKind k) {
  return k == SlotKind::State || k == SlotKind::Const || k == SlotKind::Accum;
}

} // namespace cleave::runtime::detail
