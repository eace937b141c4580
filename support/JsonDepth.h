// How deeply a JSON text nests, found without parsing it. llvm::json::parse
// recurses once per '[' or '{', so a small hostile file (50,000 '[' in
// 100 KB) overflows the stack; readers of JSON from users (cost profiles)
// check the depth with this first.
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace cleave::support {

// The nesting the readers accept: far beyond any file cleave writes (a
// profile nests 3 deep).
constexpr int kMaxJsonDepth = 64;

// An error if arrays and objects in `text` nest deeper than `maxDepth`
// (brackets inside strings do not count): "JSON nests deeper than 64
// levels (at byte N)".
llvm::Error checkJsonDepth(llvm::StringRef text, int maxDepth = kMaxJsonDepth);

} // namespace cleave::support
