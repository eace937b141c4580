// Text forms of strings and numbers shared by the IR printer and the plan
// printer (ir/Printer.h re-exports them in cleave::ir).
#pragma once

#include "llvm/ADT/StringRef.h"

#include <string>

namespace cleave::support {

// A double-quoted string; '"' and backslash escaped with a backslash, other
// bytes outside printable ASCII as a backslash and two hex digits.
std::string quoteString(llvm::StringRef s);
// Shortest decimal text that reads back as exactly `v` (with a '.', 'e',
// "inf" or "nan" so it cannot be mistaken for an integer).
std::string formatFloat(float v);
std::string formatDouble(double v);

} // namespace cleave::support
