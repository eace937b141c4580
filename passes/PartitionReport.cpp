// The stage table (Partition.h): what a user reads to judge a partition,
// as text and as the JSON report (`--report FILE.json`), and the byte sizes
// `--mem-cap` takes.
#include "passes/Partition.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cmath>

namespace cleave::passes {

std::string formatBytes(int64_t bytes) {
  static const char *const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int unit = 0;
  while (std::fabs(v) >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  if (unit == 0)
    return std::to_string(bytes) + " B";
  return llvm::formatv("{0:F2} {1}", v, kUnits[unit]).str();
}

llvm::Expected<int64_t> parseByteSize(llvm::StringRef text) {
  struct Suffix {
    const char *name;
    double scale;
  };
  // Longest first, so "GiB" is not read as "B".
  static const Suffix kSuffixes[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
      {"TB", 1e12}, {"B", 1}};
  llvm::StringRef number = text.trim();
  double scale = 1;
  for (const Suffix &s : kSuffixes)
    if (number.consume_back(s.name)) {
      scale = s.scale;
      break;
    }
  double value;
  if (number.trim().getAsDouble(value) || !(value >= 0) ||
      value * scale > 9.2e18)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        "expected a byte size such as 2GiB, 512MiB, 1.5GB or 1000000, not '" +
            text.str() + "'");
  return int64_t(std::llround(value * scale));
}

// Seconds as "12.3 ms"; model units as plain numbers.
static std::string formatTime(double t, llvm::StringRef unit) {
  if (unit != "s")
    return llvm::formatv("{0:F2}", t).str();
  if (t >= 1)
    return llvm::formatv("{0:F3} s", t).str();
  if (t >= 1e-3)
    return llvm::formatv("{0:F3} ms", t * 1e3).str();
  return llvm::formatv("{0:F1} us", t * 1e6).str();
}

static std::string layerRange(const PartitionResult &r, const StageReport &s) {
  const auto &layers = r.layering.layers;
  if (s.firstLayer == s.lastLayer)
    return layers[s.firstLayer].name;
  return layers[s.firstLayer].name + ".." + layers[s.lastLayer].name;
}

void printStageTable(const PartitionResult &r, llvm::raw_ostream &os) {
  llvm::StringRef unit = r.costs.timeUnit;
  os << llvm::formatv("{0,-5} {1,-28} {2,11} {3,10} {4,10} {5,10} {6,10} "
                      "{7,11} {8,4} {9,11} {10,11} {11,11}\n",
                      "stage", "layers", "params", "F", "B", "W", "comm",
                      "act/mb", "held", "peak", "send/mb", "recv/mb");
  for (const StageReport &s : r.stages)
    os << llvm::formatv(
        "{0,-5} {1,-28} {2,11} {3,10} {4,10} {5,10} {6,10} {7,11} {8,4} "
        "{9,11} {10,11} {11,11}\n",
        s.index, layerRange(r, s), formatBytes(s.paramBytes),
        formatTime(s.f, unit), formatTime(s.b, unit), formatTime(s.w, unit),
        formatTime(s.comm, unit), formatBytes(s.activationBytes),
        s.heldMicrobatches, formatBytes(s.peakBytes), formatBytes(s.sendBytes),
        formatBytes(s.recvBytes));
  // The schedule's simulator gives the predicted step time; this is the
  // partition search's own objective (1F1B-like), shown to explain the split.
  os << llvm::formatv("{0} layers in {1} stages, {2} microbatches: search "
                      "objective {3}, imbalance {4:F3}",
                      r.layering.layers.size(), r.stages.size(),
                      r.microbatches, formatTime(r.stepTime, unit),
                      r.imbalance);
  if (r.memCap)
    os << ", memory cap " << formatBytes(*r.memCap);
  os << "\n";
}

void writeStageReportJson(const PartitionResult &r, llvm::raw_ostream &os) {
  llvm::json::OStream json(os, 2);
  json.object([&] {
    json.attributeArray("stages", [&] {
      for (const StageReport &s : r.stages)
        json.object([&] {
          json.attribute("index", s.index);
          json.attributeArray("layers", [&] {
            for (int l = s.firstLayer; l <= s.lastLayer; ++l)
              json.value(r.layering.layers[l].name);
          });
          json.attribute("param_bytes", s.paramBytes);
          json.attribute("static_bytes", s.staticBytes);
          json.attribute("activation_bytes", s.activationBytes);
          json.attribute("held_microbatches", s.heldMicrobatches);
          json.attribute("peak_bytes", s.peakBytes);
          json.attribute("f_time", s.f);
          json.attribute("b_time", s.b);
          json.attribute("w_time", s.w);
          json.attribute("comm_time", s.comm);
          json.attribute("send_bytes", s.sendBytes);
          json.attribute("recv_bytes", s.recvBytes);
        });
    });
    json.attribute("imbalance", r.imbalance);
    json.attribute("time_unit", r.costs.timeUnit);
    json.attribute("partition_objective", r.stepTime);
    json.attribute("microbatches", r.microbatches);
    json.attribute("num_layers", int64_t(r.layering.layers.size()));
    if (r.memCap)
      json.attribute("mem_cap", *r.memCap);
    else
      json.attribute("mem_cap", nullptr);
  });
  os << "\n";
}

} // namespace cleave::passes
