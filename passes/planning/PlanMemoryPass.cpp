// The plan-memory pass: every stage's frames laid out as codegen lays them
// out, and each rank's peak under the schedule against --mem-cap
// (passes/Planning.h, docs/design/memory-count.md).
#include "passes/MemoryPlan.h"
#include <map>
#include "passes/planning/PlanningSupport.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

namespace cleave::passes {

using namespace planning;

// The most microbatch frames stage `stage` holds at once: one from each
// microbatch's F to its last compute action there (what the executor
// keeps, and codegen's plannedPeakBytes counts).
static int heldFrames(const sched::Schedule &s, int stage) {
  const std::vector<sched::Action> &acts = s.actions[size_t(stage)];
  auto computes = [](sched::ActionKind k) {
    return k == sched::ActionKind::F || k == sched::ActionKind::B ||
           k == sched::ActionKind::W || k == sched::ActionKind::BW;
  };
  std::vector<size_t> last(size_t(s.microbatches), 0);
  for (size_t i = 0; i < acts.size(); ++i)
    if (computes(acts[i].kind) && acts[i].microbatch >= 0)
      last[size_t(acts[i].microbatch)] = i;
  int live = 0, most = 0;
  for (size_t i = 0; i < acts.size(); ++i) {
    if (!computes(acts[i].kind) || acts[i].microbatch < 0)
      continue;
    if (acts[i].kind == sched::ActionKind::F)
      most = std::max(most, ++live);
    if (last[size_t(acts[i].microbatch)] == i)
      --live;
  }
  return most;
}

static void layOutMemory(PipelineModule &m) {
  m.memory.clear();
  const ir::Value *loss =
      m.graph.outputs().empty() ? nullptr : m.graph.outputs()[0];
  for (size_t s = 0; s < m.stageGraphs.size(); ++s) {
    const ir::Graph &stage = *m.stageGraphs[s];
    StageFrames frames = planStageFrames(
        stage, loss ? stage.lookup(loss->name()) : nullptr);
    PipelineModule::StageMemory mem;
    mem.frameBytes = frames.micro.size;
    mem.frameLivePeak = frames.micro.livePeak;
    mem.stepFrameBytes = frames.step.size;
    mem.hostFrameBytes = frames.host.size;
    mem.persistentBytes = frames.persistentBytes;
    mem.heldFrames = heldFrames(*m.schedule, int(s));
    mem.peakBytes = mem.persistentBytes + mem.stepFrameBytes +
                    int64_t(mem.heldFrames) * mem.frameBytes;
    m.memory.push_back(mem);
  }
}

namespace {
struct RankOver {
  int rank = 0;
  std::string stages;
  int64_t peak = 0;
};
} // namespace

// The rank furthest above the cap, if one is.
static std::optional<RankOver> worstRank(const PipelineModule &m,
                                         int64_t cap) {
  std::map<int, RankOver> ranks;
  for (size_t s = 0; s < m.memory.size(); ++s) {
    RankOver &r = ranks[rankOfStage(m, int(s))];
    r.rank = rankOfStage(m, int(s));
    r.peak += m.memory[s].peakBytes;
    r.stages += (r.stages.empty() ? "" : ",") + std::to_string(s);
  }
  std::optional<RankOver> worst;
  for (const auto &[rank, r] : ranks)
    if (r.peak > cap && (!worst || r.peak > worst->peak))
      worst = r;
  return worst;
}

llvm::Error planMemoryPass(PipelineModule &m) {
  if (auto e = ensurePartition(m, "plan-memory"))
    return e;
  // Run alone on a tagged module, it makes what it reads.
  if (m.stageGraphs.empty())
    if (auto e = splitStagesPass(m))
      return e;
  if (!m.schedule)
    if (auto e = schedulePass(m))
      return e;
  layOutMemory(m);
  m.memoryWarning.clear();
  m.replanMargin.reset();
  if (!m.options.memCap)
    return llvm::Error::success();
  // --mem-cap bounds the partitioner's count: the peak of live bytes of
  // each stage's frames (docs/design/memory-count.md). Laying the frames out
  // can leave gaps of a few percent: where that puts a rank above the cap,
  // ask the pass manager to partition again with a margin the size of the
  // overshoot (only where the partition was searched), and say so if a rank
  // is above it.
  int64_t cap = *m.options.memCap;
  std::optional<RankOver> over = worstRank(m, cap);
  if (!over)
    return llvm::Error::success();
  if (m.partitionSearched)
    m.replanMargin = m.options.capMargin + (over->peak - cap);
  m.memoryWarning = llvm::formatv(
      "the memory plan of rank {0} (stage {1}) peaks at {2} ({3} bytes), "
      "above --mem-cap {4}: the partition counts the peak of live bytes, "
      "and laying out the frames left gaps that no other split avoided",
      over->rank, over->stages, formatBytes(over->peak), over->peak,
      formatBytes(cap));
  return llvm::Error::success();
}

} // namespace cleave::passes
