#include "runtime/LrSchedule.h"

#include "support/Errors.h"
#include "support/TextFormat.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace cleave::runtime {

llvm::StringRef decayName(LrSchedule::Decay d) {
  switch (d) {
  case LrSchedule::Decay::None:
    return "none";
  case LrSchedule::Decay::Linear:
    return "linear";
  case LrSchedule::Decay::Cosine:
    return "cosine";
  }
  return "none";
}

double LrSchedule::at(int64_t step) const {
  if (step < warmupSteps)
    return peak * double(step) / double(warmupSteps);
  if (decay == Decay::None)
    return peak;
  double span = double(std::max<int64_t>(1, decaySteps - warmupSteps));
  double p = std::min(1.0, double(step - warmupSteps) / span);
  double f = decay == Decay::Cosine ? 0.5 * (1.0 + std::cos(M_PI * p)) : 1.0 - p;
  return minLr + (peak - minLr) * f;
}

// %.17g: a double printed so that strtod gives it back exactly.
static std::string exact(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

// The shortest text of the float an lr is written as ("0.1").
static std::string shown(double lr) {
  return support::formatFloat(float(lr));
}

std::string LrSchedule::describe() const {
  std::string out = warmupSteps > 0
                        ? llvm::formatv("warm-up {0} step(s) from 0 to {1}",
                                        warmupSteps, shown(peak))
                              .str()
                        : shown(peak);
  if (decay != Decay::None)
    out += llvm::formatv(", {0} decay to {1} at step {2}", decayName(decay),
                         shown(minLr), decaySteps)
               .str();
  return out;
}

std::string LrSchedule::str() const {
  return decayName(decay).str() + " " + exact(peak) + " " +
         std::to_string(warmupSteps) + " " + exact(minLr) + " " +
         std::to_string(decaySteps);
}

llvm::Expected<LrSchedule> LrSchedule::parse(llvm::StringRef text) {
  llvm::SmallVector<llvm::StringRef, 5> parts;
  text.split(parts, ' ');
  auto bad = [&] {
    return fail("a learning-rate schedule '" + text.str() +
                "' (expected: none|linear|cosine PEAK WARMUP MIN-LR "
                "DECAY-STEPS)");
  };
  if (parts.size() != 5)
    return bad();
  LrSchedule s;
  if (parts[0] == "none")
    s.decay = Decay::None;
  else if (parts[0] == "linear")
    s.decay = Decay::Linear;
  else if (parts[0] == "cosine")
    s.decay = Decay::Cosine;
  else
    return bad();
  auto number = [](llvm::StringRef t, double &out) {
    std::string z = t.str();
    char *end = nullptr;
    out = std::strtod(z.c_str(), &end);
    return !z.empty() && *end == 0 && std::isfinite(out) && out >= 0;
  };
  if (!number(parts[1], s.peak) || !number(parts[3], s.minLr) ||
      parts[2].getAsInteger(10, s.warmupSteps) || s.warmupSteps < 0 ||
      parts[4].getAsInteger(10, s.decaySteps) || s.decaySteps < 0)
    return bad();
  return s;
}

} // namespace cleave::runtime
