// The planning passes' registry and pass manager, the module verifier, and
// how a module prints (passes/Planning.h).
#include "passes/Planning.h"

#include "ir/Verifier.h"
#include "passes/planning/PlanningSupport.h"
#include "passes/schedule/Generators.h"
#include "passes/schedule/ScheduleCsv.h"
#include "passes/schedule/ScheduleReport.h"
#include "passes/schedule/Validator.h"

#include "llvm/Support/FormatVariadic.h"

#include <map>

namespace cleave::passes {

using namespace planning;

static const PlanningPassInfo kPlanningPasses[] = {
    {"recompute",
     "with --recompute none, selective or full: make forward values the "
     "backward reads again in the backward (clones named <value>.rc) "
     "instead of holding them; auto leaves the choice to partition",
     recomputePass},
    {"partition",
     "cut the training graph into --stages x --chunks stages of whole "
     "layers (searched under --mem-cap, or --split-at) and tag every op "
     "[s] with its stage",
     partitionPass},
    {"schedule",
     "order every rank's F, B and W actions (--schedule), check them "
     "against the memory cap and simulate the step",
     schedulePass},
    {"split-stages",
     "make one graph per stage, with Send and Recv ops where values cross "
     "stages",
     splitStagesPass},
    {"plan-memory",
     "lay out every stage's frames as codegen does and check each rank's "
     "peak under the schedule against --mem-cap (partitioning again under "
     "a tighter cap where the layout's gaps overshoot it)",
     planMemoryPass},
};

llvm::ArrayRef<PlanningPassInfo> planningPasses() { return kPlanningPasses; }

const PlanningPassInfo *lookupPlanningPass(std::string_view name) {
  return findPass(planningPasses(), name);
}

llvm::Error verifyModule(const PipelineModule &m) {
  if (auto e = ir::verifyGraph(m.graph))
    return e;
  if (!m.partition)
    return llvm::Error::success();
  int stages = m.stageCount();
  for (const auto &op : m.graph.ops()) {
    int s = op->stage();
    if (s < 0 || s >= stages)
      return planningError(llvm::formatv(
          "{0} has stage tag {1}; the partition has stages 0 to {2}",
          op->describe(), s, stages - 1));
    if (s != m.partition->stageOfOp.lookup(op.get()))
      return planningError(llvm::formatv(
          "{0} is tagged stage {1}, but the partition puts it in stage {2}",
          op->describe(), s, m.partition->stageOfOp.lookup(op.get())));
    // Activations flow forward through the stages: a forward op reads
    // forward values of its own stage or of earlier ones.
    if (op->phase() != ir::Phase::Fwd)
      continue;
    for (const ir::Value *v : op->operands())
      if (const ir::Op *d = v->definingOp())
        if (d->phase() == ir::Phase::Fwd && d->stage() > s)
          return planningError(llvm::formatv(
              "{0} (stage {1}) reads {2}, made in the later stage {3}",
              op->describe(), s, v->name(), d->stage()));
  }
  if (!m.stageGraphs.empty()) {
    if (int(m.stageGraphs.size()) != stages)
      return planningError(llvm::formatv(
          "{0} stage graphs for {1} stages", m.stageGraphs.size(), stages));
    for (size_t s = 0; s < m.stageGraphs.size(); ++s)
      if (auto e = ir::verifyGraph(*m.stageGraphs[s]))
        return planningError(llvm::formatv("stage graph {0}: {1}", s,
                                           llvm::toString(std::move(e))));
  }
  if (m.schedule) {
    if (m.schedule->stages != stages)
      return planningError(llvm::formatv(
          "the schedule has {0} stages, the partition {1}",
          m.schedule->stages, stages));
    const PartitionResult &part = *m.partition;
    sched::HeldCap cap = part.memCap
                             ? sched::heldCapFor(part.costs, *part.memCap)
                             : sched::HeldCap();
    if (auto e = sched::validateSchedule(*m.schedule, part.costs, cap))
      return planningError("schedule " + m.schedule->name + ": " +
                           llvm::toString(std::move(e)));
  }
  if (!m.memory.empty() && m.memory.size() != m.stageGraphs.size())
    return planningError(llvm::formatv("{0} memory rows for {1} stage graphs",
                                       m.memory.size(), m.stageGraphs.size()));
  return llvm::Error::success();
}

static llvm::Error afterPass(const PipelineModule &m, std::string_view name,
                             const PipelineOptions &opts) {
  if (opts.verifyEach)
    if (auto e = verifyModule(m))
      return planningError("the module is invalid after pass " +
                           std::string(name) + ": " +
                           llvm::toString(std::move(e)));
  if (wantsDump(opts, name)) {
    *opts.dumpStream << "// -----// IR after " << name << " //----- //\n";
    printModule(m, *opts.dumpStream, opts.print);
    opts.dumpStream->flush();
  }
  return llvm::Error::success();
}

// Runs passes [first, last] on `m`, verifying after each; no dumps.
static llvm::Error runQuietly(PipelineModule &m,
                              llvm::ArrayRef<PlanningPassInfo> passes,
                              const PipelineOptions &opts) {
  PipelineOptions quiet = opts;
  quiet.dumpAfter.clear();
  for (const PlanningPassInfo &p : passes) {
    if (auto e = p.run(m))
      return e;
    if (auto e = afterPass(m, p.name, quiet))
      return e;
  }
  return llvm::Error::success();
}

// Plans again from passes[first] (partition) through passes[last] with the
// margin the last pass asked for, as long as it asks, at most three times.
static llvm::Error replan(PipelineModule &m,
                          llvm::ArrayRef<PlanningPassInfo> passes,
                          const PipelineOptions &opts) {
  constexpr int kMostReplans = 3;
  std::optional<int64_t> userCap = m.options.memCap;
  int replans = 0;
  while (m.replanMargin && replans < kMostReplans) {
    PlanningOptions tighter = m.options;
    tighter.capMargin = *m.replanMargin;
    PipelineModule again(m.graph, tighter);
    if (llvm::Error e = runQuietly(again, passes, opts)) {
      // No split fits the tighter count: keep the plan before.
      llvm::consumeError(std::move(e));
      tagOps(m);
      break;
    }
    ++replans;
    // A fixed --recompute was applied by the recompute pass, which the
    // replan does not run again: the graph keeps it, and so does the
    // module's account of it.
    std::string recompute = m.recompute;
    StashStats recomputeStats = m.recomputeStats;
    static_cast<PlanResults &>(m) = std::move(again);
    if (m.recompute.empty()) {
      m.recompute = recompute;
      m.recomputeStats = recomputeStats;
    }
    // The table shows the user's cap, not the tightened one.
    if (userCap && m.partition)
      m.partition->memCap = *userCap / m.chunks;
  }
  m.memoryRefits = replans;
  m.replanMargin.reset();
  return llvm::Error::success();
}

llvm::Error runPlanningPasses(PipelineModule &m,
                              llvm::ArrayRef<PlanningPassInfo> passes,
                              const PipelineOptions &opts) {
  std::optional<size_t> partitionAt;
  for (size_t i = 0; i < passes.size(); ++i) {
    const PlanningPassInfo &p = passes[i];
    if (p.run == partitionPass)
      partitionAt = i;
    if (auto e = p.run(m))
      return opts.planningErrorsNamePass
                 ? planningError("pass " + std::string(p.name) + ": " +
                                 llvm::toString(std::move(e)))
                 : std::move(e);
    if (m.replanMargin) {
      if (partitionAt)
        if (auto e = replan(m, passes.slice(*partitionAt, i + 1 - *partitionAt),
                            opts))
          return e;
      m.replanMargin.reset(); // a given split is not planned again
    }
    if (auto e = afterPass(m, p.name, opts))
      return e;
  }
  return llvm::Error::success();
}

llvm::Error runPlanningPasses(PipelineModule &m,
                              llvm::ArrayRef<std::string> names,
                              const PipelineOptions &opts) {
  std::vector<PlanningPassInfo> passes;
  for (const std::string &n : names) {
    const PlanningPassInfo *p = lookupPlanningPass(n);
    if (!p) {
      std::string known;
      for (const PlanningPassInfo &q : planningPasses())
        known += (known.empty() ? "" : ", ") + std::string(q.name);
      return planningError("unknown planning pass '" + n +
                           "' (known: " + known + ")");
    }
    passes.push_back(*p);
  }
  return runPlanningPasses(m, passes, opts);
}

// What recomputation the plan has, and what the planner weighed.
static std::string recomputeSummary(const PipelineModule &m) {
  const StashStats &st = m.recomputeStats;
  std::string out;
  if (!m.recomputeByStage.empty()) {
    out = "recompute: chosen per stage under --mem-cap:";
    for (size_t s = 0; s < m.recomputeByStage.size(); ++s)
      out += (s ? ", " : " ") + std::to_string(s) + " " +
             m.recomputeByStage[s];
    if (m.recomputeEased)
      out += llvm::formatv("; {0} layer(s) with less where their stage "
                           "still fits",
                           m.recomputeEased)
                 .str();
    out += llvm::formatv(" ({0} op(s) run again in the backward, {1} made "
                         "again per microbatch)\n",
                         st.clonedOps, formatBytes(st.clonedBytes))
               .str();
  } else if (st.offloadedValues && !st.clonedOps) {
    out = ""; // the offload line says it
  } else if (m.recompute == "none" || !st.clonedOps) {
    out = "recompute: none (every value the backward reads is held from the "
          "forward)\n";
  } else {
    out = llvm::formatv("recompute: {0} on every layer ({1} op(s) run again "
                        "in the backward, {2} made again per microbatch)\n",
                        m.recompute, st.clonedOps,
                        formatBytes(st.clonedBytes))
              .str();
  }
  if (st.offloadedValues)
    out += llvm::formatv("offload: {0} value(s), {1} per microbatch, copied "
                         "to host memory after their last forward reader "
                         "and back before the backward reads them\n",
                         st.offloadedValues, formatBytes(st.offloadedBytes))
               .str();
  if (!m.recomputeTable.empty())
    out += "each stage's peak and F+B+W time under each policy (over: "
           "above its share of --mem-cap):\n" +
           m.recomputeTable;
  return out;
}

std::string planningSummary(const PipelineModule &m) {
  std::string text;
  llvm::raw_string_ostream os(text);
  if (!m.recompute.empty())
    os << recomputeSummary(m);
  if (m.partition) {
    printStageTable(*m.partition, os);
    os << m.layerHint;
    if (!m.autoTried.empty())
      os << "auto tried:\n" << m.autoTried;
  }
  if (m.schedule && m.sim)
    os << sched::scheduleSummary(*m.schedule, *m.sim, m.partition->costs);
  os.flush();
  return text;
}

static void printCommented(llvm::StringRef text, llvm::raw_ostream &os) {
  llvm::SmallVector<llvm::StringRef, 32> lines;
  text.rtrim('\n').split(lines, '\n');
  for (llvm::StringRef l : lines)
    os << (l.empty() ? "//" : "// ") << l << "\n";
}

void printModule(const PipelineModule &m, llvm::raw_ostream &os,
                 const ir::PrintOptions &opts) {
  if (m.stageGraphs.empty()) {
    ir::printGraph(m.graph, os, opts);
  } else {
    for (size_t s = 0; s < m.stageGraphs.size(); ++s) {
      if (s)
        os << "\n";
      ir::printGraph(*m.stageGraphs[s], os, opts);
    }
  }
  std::string summary = planningSummary(m);
  if (!summary.empty()) {
    os << "// pipeline: " << m.stageCount() << " stage(s), " << m.chunks
       << " per rank\n";
    printCommented(summary, os);
  }
  if (m.schedule) {
    os << "// schedule (PyTorch pipelining notation):\n";
    printCommented(sched::scheduleToCsv(*m.schedule), os);
  }
  if (!m.memory.empty()) {
    os << "// memory plan (bytes; peak = persistent + step frame + held x "
          "frame):\n";
    os << llvm::formatv("// {0,5} {1,4} {2,12} {3,12} {4,12} {5,12} {6,4} "
                        "{7,12}\n",
                        "stage", "rank", "frame", "live peak", "step frame",
                        "persistent", "held", "peak");
    std::map<int, int64_t> rankPeak;
    for (size_t s = 0; s < m.memory.size(); ++s) {
      const PipelineModule::StageMemory &x = m.memory[s];
      int rank = rankOfStage(m, int(s));
      rankPeak[rank] += x.peakBytes;
      os << llvm::formatv("// {0,5} {1,4} {2,12} {3,12} {4,12} {5,12} {6,4} "
                          "{7,12}\n",
                          s, rank, x.frameBytes, x.frameLivePeak,
                          x.stepFrameBytes, x.persistentBytes, x.heldFrames,
                          x.peakBytes);
    }
    for (size_t s = 0; s < m.memory.size(); ++s)
      if (const auto &x = m.memory[s]; x.hostFrameBytes)
        os << llvm::formatv("// stage {0}: host frame {1} per microbatch, "
                            "{2} of host memory for {3} held (offloaded "
                            "activations, not in the peak)\n",
                            s, x.hostFrameBytes,
                            formatBytes(x.hostFrameBytes * x.heldFrames),
                            x.heldFrames);
    for (const auto &[rank, peak] : rankPeak) {
      os << "// rank " << rank << ": peak " << peak << " (" << formatBytes(peak)
         << ")";
      if (m.options.memCap)
        os << (peak > *m.options.memCap ? ", above" : ", within")
           << " --mem-cap " << formatBytes(*m.options.memCap);
      os << "\n";
    }
    if (m.memoryRefits)
      os << "// partitioned again " << m.memoryRefits
         << " time(s) under a tighter cap: the first layout overshot it\n";
  }
  os.flush();
}

} // namespace cleave::passes
