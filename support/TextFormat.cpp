#include "support/TextFormat.h"

#include "llvm/ADT/StringExtras.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cleave::support {

std::string quoteString(llvm::StringRef s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += '\\';
      out += llvm::hexdigit(c >> 4, true);
      out += llvm::hexdigit(c & 15, true);
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

template <typename T>
static std::string shortestFloat(T v, int minDigits, int maxDigits) {
  if (std::isnan(v))
    return "nan";
  if (std::isinf(v))
    return v < 0 ? "-inf" : "inf";
  char buf[64];
  for (int digits = minDigits; digits <= maxDigits; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, double(v));
    T back = sizeof(T) == 4 ? T(std::strtof(buf, nullptr))
                            : T(std::strtod(buf, nullptr));
    if (back == v)
      break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos)
    s += ".0";
  return s;
}

std::string formatFloat(float v) { return shortestFloat(v, 1, 9); }
std::string formatDouble(double v) { return shortestFloat(v, 1, 17); }

} // namespace cleave::support
