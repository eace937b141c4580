#include "support/JsonDepth.h"

#include <string>

namespace cleave::support {

llvm::Error checkJsonDepth(llvm::StringRef text, int maxDepth) {
  int depth = 0;
  bool inString = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (inString) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > maxDepth)
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            "JSON nests deeper than " + std::to_string(maxDepth) +
                " levels (at byte " + std::to_string(i) + ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return llvm::Error::success();
}

} // namespace cleave::support
