// The schedule pass: order every rank's actions and simulate the step
// (passes/Planning.h).
#include "passes/planning/PlanningSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::passes {

using namespace planning;

llvm::Error schedulePass(PipelineModule &m) {
  if (auto e = ensurePartition(m, "schedule"))
    return e;
  auto csv = readCsv(m.options);
  if (!csv)
    return csv.takeError();
  auto s = scheduleFor(m, std::move(*csv), *m.partition, m.chunks);
  if (!s)
    return s.takeError();
  m.schedule = std::move(s->schedule);
  m.sim = std::move(s->sim);
  return llvm::Error::success();
}

} // namespace cleave::passes
