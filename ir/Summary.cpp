#include "ir/Summary.h"

#include "ir/Printer.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>
#include <set>

namespace cleave::ir {

std::string formatBytes(int64_t bytes) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  // Compare against what "{0:f2}" would print, so 1048575 B is "1.00 MiB"
  // and not "1024.00 KiB".
  while (v >= 1024 - 0.005 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0)
    return std::to_string(bytes) + " B";
  return llvm::formatv("{0:f2} {1}", v, units[u]).str();
}

static std::string withCommas(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0)
      out += ',';
    out += s[i];
  }
  return out;
}

std::string summarizeGraph(const Graph &g, SummaryDetail detail) {
  bool full = detail == SummaryDetail::Full;
  // What a training graph adds to its outputs: one gradient per trained
  // parameter, and the state the optimizer updates.
  std::set<const Value *> updated;
  for (const StateUpdate &u : g.updates())
    updated.insert(u.value);
  int64_t gradients = 0, updates = 0;
  std::vector<const Value *> listed;
  for (const Value *v : g.outputs()) {
    if (!full && updated.count(v))
      ++updates;
    else if (!full && llvm::StringRef(v->name()).startswith("grad."))
      ++gradients;
    else
      listed.push_back(v);
  }
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "graph @" << g.name() << "\n";
  size_t width = 4;
  for (const Value *v : g.inputs())
    width = std::max(width, v->name().size());
  for (const Value *v : listed)
    width = std::max(width, v->name().size());
  os << "inputs:\n";
  for (const Value *v : g.inputs())
    os << "  " << v->name() << std::string(width - v->name().size() + 1, ' ')
       << v->type().str() << "\n";
  os << "outputs:\n";
  for (const Value *v : listed)
    os << "  " << v->name() << std::string(width - v->name().size() + 1, ' ')
       << v->type().str() << "\n";
  if (gradients || updates)
    os << llvm::formatv("  and {0} gradient{1} (grad.*), {2} updated "
                        "state{3} (.next); --verbose lists them\n",
                        gradients, gradients == 1 ? "" : "s", updates,
                        updates == 1 ? "" : "s");
  for (ValueKind kind :
       {ValueKind::Param, ValueKind::Buffer, ValueKind::Const}) {
    int64_t count = 0, elements = 0, bytes = 0;
    for (const Value *v : g.declared())
      if (v->kind() == kind) {
        ++count;
        elements += v->type().numElements();
        bytes += v->type().byteSize();
      }
    const char *label = kind == ValueKind::Param    ? "parameters"
                        : kind == ValueKind::Buffer ? "buffers"
                                                    : "constants";
    os << llvm::formatv("{0}: {1} elements, {2} in {3} tensor{4}", label,
                        withCommas(elements), formatBytes(bytes), count,
                        count == 1 ? "" : "s");
    // What is trained and what is not: the parameters are, the buffers
    // are not (rotary tables and frozen weights stay as they are; running
    // statistics and optimizer state change, but by their own updates, not
    // by a gradient); a few buffer names show which.
    if (kind == ValueKind::Param && count && g.isTraining())
      os << " (trained)";
    if (kind == ValueKind::Buffer && count) {
      constexpr int kShown = 4;
      os << " (not trained:";
      int shown = 0;
      for (const Value *v : g.declared())
        if (v->kind() == kind && shown++ < kShown)
          os << (shown > 1 ? ", " : " ") << v->name();
      if (count > kShown)
        os << ", and " << count - kShown << " more";
      os << ")";
    }
    os << "\n";
  }
  std::map<std::string_view, int> hist;
  for (const auto &op : g.ops())
    ++hist[op->name()];
  std::vector<std::pair<std::string_view, int>> sorted(hist.begin(),
                                                       hist.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](auto &a, auto &b) { return a.second > b.second; });
  if (!full) {
    constexpr size_t kShown = 6;
    os << "ops: " << g.ops().size();
    for (size_t i = 0; i < sorted.size() && i < kShown; ++i)
      os << (i ? ", " : " (") << sorted[i].first << " " << sorted[i].second;
    if (sorted.size() > kShown)
      os << ", and " << sorted.size() - kShown << " more kinds";
    os << (sorted.empty() ? "\n" : ")\n");
  } else {
    os << "ops: " << g.ops().size() << "\n";
  }
  size_t nameWidth = 24;
  for (auto &[name, n] : sorted)
    nameWidth = std::max(nameWidth, name.size());
  for (auto &[name, n] : sorted)
    if (full)
      os << "  " << name << std::string(nameWidth - name.size() + 1, ' ')
         << llvm::formatv("{0,5}\n", n);
  if (g.isTraining()) {
    std::map<Phase, int> phases;
    for (const auto &op : g.ops())
      ++phases[op->phase()];
    os << "training step:";
    for (Phase p : {Phase::Fwd, Phase::B, Phase::W, Phase::Opt})
      os << " " << phaseName(p) << " " << phases[p]
         << (p == Phase::Opt ? "" : ",");
    os << " ops\n";
    int64_t stashBytes = 0;
    for (const Value *v : g.stash())
      stashBytes += v->type().byteSize();
    os << "stash (kept per microbatch until its W runs): " << g.stash().size()
       << " values, " << formatBytes(stashBytes) << "\n";
    os << "state updates per step: " << g.updates().size() << "\n";
  }
  return os.str();
}

} // namespace cleave::ir
