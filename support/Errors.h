// Making an llvm::Error from a message. Every library reports bad input as
// an error whose message is the one line a user reads (nothing matches on
// error codes); these two make one, so that no file keeps a private copy.
#pragma once

#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/FormatVariadic.h"

#include <utility>

namespace cleave {

// An error whose message is `msg`.
inline llvm::Error fail(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

// An error whose message is llvm::formatv(fmt, vals...).
template <typename... Ts> llvm::Error failf(const char *fmt, Ts &&...vals) {
  return fail(llvm::formatv(fmt, std::forward<Ts>(vals)...).str());
}

} // namespace cleave
