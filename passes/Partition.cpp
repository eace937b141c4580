// Partitioning a training graph (Partition.h): layers, their costs and the
// values between them become a LayerChain; the solver (or --split-at) picks
// the cuts; every op then takes its layer's stage, and the stage table and
// the PipelineCosts for the schedules are read off the cost table.
#include "passes/Partition.h"

#include "passes/MemoryPlan.h"

#include "ir/OpInfo.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <iterator>

namespace cleave::passes {

static llvm::Error partitionError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

static void sortUnique(std::vector<int> &v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// The values that can cross a cut: graph inputs and forward results, with
// the layers that read them forward and keep them for the backward pass.
static std::vector<ChainValue> chainValues(const ir::Graph &g,
                                           const Layering &layering) {
  std::vector<const ir::Value *> sources(g.inputs().begin(), g.inputs().end());
  for (const auto &op : g.ops())
    if (op->phase() == ir::Phase::Fwd)
      sources.insert(sources.end(), op->results().begin(),
                     op->results().end());
  std::vector<ChainValue> values;
  for (const ir::Value *v : sources) {
    ChainValue cv;
    if (v->definingOp())
      cv.producer = int(layering.layerOfOp.lookup(v->definingOp()));
    for (const ir::Use &u : v->uses()) {
      ir::Phase phase = u.user->phase();
      int layer = int(layering.layerOfOp.lookup(u.user));
      if (phase == ir::Phase::Fwd)
        cv.readers.push_back(layer);
      else if (phase == ir::Phase::B || phase == ir::Phase::W)
        cv.holders.push_back(layer);
    }
    if (cv.readers.empty() && cv.holders.empty())
      continue;
    sortUnique(cv.readers);
    sortUnique(cv.holders);
    cv.bytes = v->type().byteSize();
    // Float activations get a gradient of their size back (an
    // approximation: one that no trainable parameter depends on gets none).
    cv.gradBytes = ir::isFloat(v->type().dtype) ? cv.bytes : 0;
    values.push_back(std::move(cv));
  }
  return values;
}

namespace {

// The values of the graph by number, with what the frame sweep asks of
// each.
struct SweepValues {
  llvm::DenseMap<const ir::Value *, int> id;
  std::vector<int64_t> bytes;
  std::vector<int> defLayer;   // -1: a graph input
  std::vector<int> defPhase;   // 0 F, 1 B, 2 W, 3 opt; -1: a graph input
  std::vector<bool> readByOpt; // summed over the microbatches
  std::vector<bool> output;    // a graph output or a state update's value
};

// An op as the sweep reads it: its layer, and its per-microbatch (or, for
// the step, optimizer-made) operands and results by value number.
struct SweepOp {
  int layer = 0;
  std::vector<int> operands, results;
  int aliasOf = -1; // a layout-only op's operand, whose bytes it shares
};

// One candidate stage's peak of live bytes over a program made of one
// phase list's ops of layers [first, end) (F, B and W in graph order, one
// after the other; or the step's), as codegen lays out a frame
// (codegen/Codegen.cpp): a value lives from its op to its last reader; a
// value made elsewhere and read here for the whole program (codegen's
// Input slots); one summed over the microbatches to the end of its phase's
// program; a graph output or a state update's value to the end; the
// result of a layout-only op on the bytes of its operand made here.
struct FrameSweep {
  const SweepValues &vals;
  std::vector<int> start, last, alias, stamp, touched;
  std::vector<int64_t> diff;
  int now = 0;

  explicit FrameSweep(const SweepValues &v)
      : vals(v), start(v.bytes.size()), last(v.bytes.size()),
        alias(v.bytes.size()), stamp(v.bytes.size(), -1) {}

  void touch(int v) {
    if (stamp[size_t(v)] == now)
      return;
    stamp[size_t(v)] = now;
    start[size_t(v)] = last[size_t(v)] = -1;
    alias[size_t(v)] = v;
    touched.push_back(v);
  }
  int root(int v) const {
    while (alias[size_t(v)] != v)
      v = alias[size_t(v)];
    return v;
  }

  // The program's phases in order: each one's number (0 F, 1 B, 2 W, 3
  // step), its ops, and the indices of the stage's ops among them, in
  // graph order.
  struct PhaseOps {
    int phase;
    const std::vector<SweepOp> *ops;
    const std::vector<int> *inStage;
  };
  int64_t peak(llvm::ArrayRef<PhaseOps> phases) {
    ++now;
    touched.clear();
    int pos = 0;
    int phaseEnd[4] = {-1, -1, -1, -1};
    for (const PhaseOps &ph : phases) {
      int phase = ph.phase;
      for (int index : *ph.inStage) {
        const SweepOp &op = (*ph.ops)[size_t(index)];
        for (int v : op.operands) {
          touch(v); // first seen at a reader: made elsewhere
          last[size_t(v)] = pos;
        }
        for (int v : op.results) {
          touch(v);
          start[size_t(v)] = last[size_t(v)] = pos;
        }
        if (op.aliasOf >= 0 && stamp[size_t(op.aliasOf)] == now &&
            start[size_t(op.aliasOf)] >= 0)
          alias[size_t(op.results[0])] = root(op.aliasOf);
        ++pos;
      }
      phaseEnd[phase] = pos - 1;
    }
    for (int v : touched)
      if (start[size_t(v)] >= 0) {
        int ph = vals.defPhase[size_t(v)];
        if (vals.readByOpt[size_t(v)] && ph >= 0 && ph < 3)
          last[size_t(v)] = std::max(last[size_t(v)], phaseEnd[ph]);
        if (vals.output[size_t(v)])
          last[size_t(v)] = pos - 1;
      }
    for (int v : touched)
      if (alias[size_t(v)] != v) {
        int r = root(v);
        last[size_t(r)] = std::max(last[size_t(r)], last[size_t(v)]);
      }
    diff.assign(size_t(pos) + 2, 0);
    for (int v : touched) {
      int64_t bytes = vals.bytes[size_t(v)];
      if (alias[size_t(v)] != v || bytes == 0)
        continue;
      int from = start[size_t(v)] + 1,
          to = std::max(last[size_t(v)], start[size_t(v)]) + 1;
      diff[size_t(from)] += bytes;
      diff[size_t(to) + 1] -= bytes;
    }
    int64_t live = 0, most = 0;
    for (int64_t d : diff) {
      live += d;
      most = std::max(most, live);
    }
    return most;
  }
};

} // namespace

// LayerChain::frameBytes and stepFrameBytes for every candidate stage.
static void fillFrameTables(const ir::Graph &g, const Layering &layering,
                            LayerChain &chain) {
  SweepValues vals;
  // Updates written into their states' bytes take no step-frame room
  // (MemoryPlan.h's updatedInPlace, as the plan lays the frame out).
  const llvm::DenseSet<const ir::Value *> inPlace = updatedInPlace(g);
  auto add = [&](const ir::Value *v, int layer, int phase) {
    vals.id[v] = int(vals.bytes.size());
    // An offloaded copy is in host memory: it weighs nothing on the device.
    bool host = v->definingOp() &&
                v->definingOp()->kind() == ir::OpKind::Offload;
    vals.bytes.push_back(host || inPlace.count(v) ? 0 : v->type().byteSize());
    vals.defLayer.push_back(layer);
    vals.defPhase.push_back(phase);
    bool opt = false;
    for (const ir::Use &u : v->uses())
      opt = opt || u.user->phase() == ir::Phase::Opt;
    vals.readByOpt.push_back(opt);
    vals.output.push_back(g.isOutput(v));
  };
  for (const ir::Value *v : g.inputs())
    add(v, -1, -1);
  for (const auto &op : g.ops())
    for (const ir::Value *r : op->results())
      add(r, int(layering.layerOfOp.lookup(op.get())),
          programOf(op->phase()));
  for (const ir::StateUpdate &u : g.updates())
    if (auto it = vals.id.find(u.value); it != vals.id.end())
      vals.output[size_t(it->second)] = true;
  // The ops by phase. The step's program reads the microbatch sums, which
  // live in accumulators (state, not a frame), so a step op's operands are
  // only what other step ops made; a microbatch op's, what is made per
  // microbatch.
  std::vector<SweepOp> phaseOps[4];
  for (const auto &op : g.ops()) {
    int phase = programOf(op->phase());
    SweepOp so;
    so.layer = int(layering.layerOfOp.lookup(op.get()));
    for (const ir::Value *v : op->operands()) {
      auto it = v ? vals.id.find(v) : vals.id.end();
      if (it != vals.id.end() &&
          (phase == 3) == (vals.defPhase[size_t(it->second)] == 3))
        so.operands.push_back(it->second);
    }
    for (const ir::Value *r : op->results())
      so.results.push_back(vals.id.lookup(r));
    if (op->numOperands() == 1 && op->numResults() == 1 &&
        so.operands.size() == 1 &&
        ir::opInfo(op->kind()).has(ir::optrait::LayoutOnly) &&
        vals.bytes[size_t(so.operands[0])] == vals.bytes[size_t(so.results[0])] &&
        vals.defPhase[size_t(so.operands[0])] == phase)
      so.aliasOf = so.operands[0];
    phaseOps[phase].push_back(std::move(so));
  }
  int n = int(chain.layers.size());
  chain.frameBytes.assign(size_t(n) * n, 0);
  chain.stepFrameBytes.assign(size_t(n) * n, 0);
  FrameSweep sweep(vals);
  // Each phase's ops by layer, in graph order; a stage's are its layers'
  // merged, grown one layer at a time, so a stage costs its own ops.
  std::vector<std::vector<int>> byLayer[4];
  for (int ph = 0; ph < 4; ++ph) {
    byLayer[ph].resize(size_t(n));
    for (size_t i = 0; i < phaseOps[ph].size(); ++i)
      byLayer[ph][size_t(phaseOps[ph][i].layer)].push_back(int(i));
  }
  std::vector<int> inStage[4], merged;
  for (int first = 0; first < n; ++first) {
    for (auto &v : inStage)
      v.clear();
    for (int end = first + 1; end <= n; ++end) {
      for (int ph = 0; ph < 4; ++ph) {
        const std::vector<int> &add = byLayer[ph][size_t(end - 1)];
        merged.clear();
        std::merge(inStage[ph].begin(), inStage[ph].end(), add.begin(),
                   add.end(), std::back_inserter(merged));
        inStage[ph].swap(merged);
      }
      const FrameSweep::PhaseOps perMicrobatch[] = {
          {0, &phaseOps[0], &inStage[0]},
          {1, &phaseOps[1], &inStage[1]},
          {2, &phaseOps[2], &inStage[2]}};
      const FrameSweep::PhaseOps step[] = {{3, &phaseOps[3], &inStage[3]}};
      size_t cell = size_t(first) * n + end - 1;
      chain.frameBytes[cell] = sweep.peak(perMicrobatch);
      chain.stepFrameBytes[cell] = sweep.peak(step);
    }
  }
}

LayerChain buildLayerChain(const ir::Graph &g, const Layering &layering,
                           llvm::ArrayRef<double> opTimes,
                           bool overlapCopies) {
  LayerChain chain;
  chain.layers.resize(layering.layers.size());
  for (const Layer &l : layering.layers)
    chain.names.push_back(l.name);
  if (opTimes.empty()) {
    for (LayerCost &c : chain.layers)
      c.f = c.b = c.w = 1;
  }
  // Offload copies (passes/Recompute.h) run on a copy stream beside the
  // compute where the device has a host link of its own: a layer's F, B
  // or W then takes the longer of its compute and its copies. Where it has
  // none (the emulation on the CPU) they are memcpys among the kernels.
  bool copiesOverlap = false;
  std::vector<LayerCost> copies(chain.layers.size());
  for (size_t i = 0; i < opTimes.size(); ++i) {
    const ir::Op &op = *g.ops()[i];
    unsigned layer = layering.layerOfOp.lookup(&op);
    bool copy = op.info().cost == ir::CostClass::HostCopy && overlapCopies;
    copiesOverlap = copiesOverlap || copy;
    LayerCost &c = copy ? copies[layer] : chain.layers[layer];
    // Optimizer ops run once per step, not per microbatch: they are the
    // stage's update, not part of its F, B or W.
    if (op.phase() == ir::Phase::Opt)
      c.step += opTimes[i];
    else if (op.phase() == ir::Phase::Fwd)
      c.f += opTimes[i];
    else if (op.phase() == ir::Phase::B)
      c.b += opTimes[i];
    else if (op.phase() == ir::Phase::W)
      c.w += opTimes[i];
  }
  if (copiesOverlap)
    for (size_t l = 0; l < chain.layers.size(); ++l) {
      LayerCost &c = chain.layers[l];
      c.f = std::max(c.f, copies[l].f);
      c.b = std::max(c.b, copies[l].b);
      c.w = std::max(c.w, copies[l].w);
    }
  for (const auto &[value, layer] : layering.layerOfDeclared) {
    if (value->kind() == ir::ValueKind::Input)
      continue;
    LayerCost &c = chain.layers[layer];
    if (value->kind() == ir::ValueKind::Param)
      c.paramBytes += value->type().byteSize();
    c.staticBytes += staticBytes(*value);
  }
  chain.values = chainValues(g, layering);
  fillFrameTables(g, layering, chain);
  // Parameters and buffers read by forward ops of several layers.
  for (const auto &[value, owner] : layering.layerOfDeclared) {
    if (value->kind() != ir::ValueKind::Param &&
        value->kind() != ir::ValueKind::Buffer)
      continue;
    SharedState st;
    st.owner = int(owner);
    for (const ir::Use &u : value->uses())
      if (u.user->phase() == ir::Phase::Fwd) {
        int layer = int(layering.layerOfOp.lookup(u.user));
        if (layer != st.owner)
          st.readers.push_back(layer);
      }
    if (st.readers.empty())
      continue;
    sortUnique(st.readers);
    st.bytes = value->type().byteSize();
    chain.shared.push_back(std::move(st));
  }
  std::sort(chain.shared.begin(), chain.shared.end(),
            [](const SharedState &a, const SharedState &b) {
              return std::tie(a.owner, a.readers, a.bytes) <
                     std::tie(b.owner, b.readers, b.bytes);
            });
  return chain;
}

// "a, b, c": every layer name, or the first six and last three of a long
// list.
static std::string layerList(const Layering &l) {
  std::vector<std::string> names;
  size_t n = l.layers.size();
  for (size_t i = 0; i < n; ++i) {
    if (n > 12 && i == 6) {
      names.push_back("...");
      i = n - 3;
    }
    names.push_back(l.layers[i].name);
  }
  return llvm::join(names, ", ");
}

// The stage starts --split-at names: each name is the first layer of a
// stage after the first, in model order.
static llvm::Expected<std::vector<int>>
splitAtStarts(const Layering &layering, llvm::ArrayRef<std::string> names) {
  std::vector<int> starts = {0};
  for (const std::string &name : names) {
    std::optional<unsigned> layer = layering.find(name);
    if (!layer)
      return partitionError("--split-at names '" + name +
                            "', which is not a layer (layers: " +
                            layerList(layering) + ")");
    if (*layer == 0)
      return partitionError("--split-at names '" + name +
                            "', the first layer; name the first layer of "
                            "each stage after the first");
    if (int(*layer) <= starts.back())
      return partitionError("--split-at: '" + name + "' comes before or "
                            "with the layer named before it; list the "
                            "layers in model order");
    starts.push_back(int(*layer));
  }
  return starts;
}

// The split a user gave must still fit the cap.
static llvm::Error checkSplitFits(const StageCostTable &table,
                                  const SolverOptions &opts,
                                  llvm::ArrayRef<int> starts,
                                  const Layering &layering,
                                  llvm::StringRef from) {
  if (!opts.memCap)
    return llvm::Error::success();
  for (size_t s = 0; s < starts.size(); ++s) {
    int end = s + 1 < starts.size() ? starts[s + 1] : table.numLayers();
    int64_t peak = table.peakBytes(starts[s], end, heldMicrobatches(opts, s));
    if (peak > *opts.memCap)
      return partitionError(llvm::formatv(
          "{5}: stage {0} ({1}..{2}) needs {3}, over the memory cap "
          "of {4}; move its cuts or raise --mem-cap",
          s, layering.layers[starts[s]].name, layering.layers[end - 1].name,
          formatBytes(peak), formatBytes(*opts.memCap), from));
  }
  return llvm::Error::success();
}

// The stage starts the ops' stage tags give: every op of a layer on the
// same stage, each layer on the stage of the layer before it or the next.
static llvm::Expected<std::vector<int>>
tagStarts(const ir::Graph &g, const Layering &layering, int stages) {
  std::vector<int> stageOfLayer(layering.layers.size(), -1);
  for (const auto &owned : g.ops()) { // in program order, for the message
    const ir::Op *op = owned.get();
    auto it = layering.layerOfOp.find(op);
    if (it == layering.layerOfOp.end())
      continue;
    unsigned layer = it->second;
    int s = op->stage();
    if (s < 0)
      return partitionError(op->describe() +
                            " has no stage tag; run the partition pass on "
                            "the whole training graph first");
    int &mine = stageOfLayer[layer];
    if (mine >= 0 && mine != s)
      return partitionError(llvm::formatv(
          "layer '{0}' has ops on stages {1} and {2} ({3}); a stage holds "
          "whole layers (is --layer-depth the one the tags were made with?)",
          layering.layers[layer].name, std::min(mine, s), std::max(mine, s),
          op->describe()));
    mine = s;
  }
  std::vector<int> starts = {0};
  for (size_t l = 0; l < stageOfLayer.size(); ++l) {
    int s = stageOfLayer[l], before = l ? stageOfLayer[l - 1] : 0;
    if (s == before)
      continue;
    if (s != before + 1)
      return partitionError(llvm::formatv(
          "layer '{0}' is tagged stage {1} after a layer of stage {2}; "
          "stages hold consecutive layers, numbered in model order",
          layering.layers[l].name, s, before));
    starts.push_back(int(l));
  }
  if (stageOfLayer.empty() || stageOfLayer.front() != 0)
    return partitionError("the first layer is not tagged stage 0");
  if (int(starts.size()) != stages)
    return partitionError(llvm::formatv(
        "the stage tags make {0} stages, but {1} are asked for",
        starts.size(), stages));
  return starts;
}

static llvm::Expected<std::vector<int>>
chooseStarts(const ir::Graph &g, const StageCostTable &table,
             const SolverOptions &solver, const PartitionOptions &opts,
             const Layering &layering) {
  if (opts.followStageTags) {
    auto starts = tagStarts(g, layering, solver.stages);
    if (!starts)
      return starts.takeError();
    if (auto e = checkSplitFits(table, solver, *starts, layering,
                                "the stage tags"))
      return std::move(e);
    return starts;
  }
  if (opts.splitAt.empty()) {
    auto split = solveChain(table, solver);
    if (!split)
      return split.takeError();
    return split->starts;
  }
  auto starts = splitAtStarts(layering, opts.splitAt);
  if (!starts)
    return starts.takeError();
  if (auto e = checkSplitFits(table, solver, *starts, layering, "--split-at"))
    return e;
  return starts;
}

// The stage table and the schedules' view of it.
// The executor's own time per F, B and W action, from a profile: added to
// every stage's action times (zero for the other cost models).
struct ActionOverhead {
  double f = 0, b = 0, w = 0, step = 0;
  // The measured delay of a message to each stage (StageCost::recvLatency),
  // by stage; empty without a profile that timed its messages.
  std::vector<double> recvLatency;
};

static void fillStages(PartitionResult &r, const StageCostTable &table,
                       const SolverOptions &solver, llvm::ArrayRef<int> starts,
                       bool uniform, const LinkModel &link,
                       const ActionOverhead &overhead) {
  int n = table.numLayers();
  r.stageOfLayer.assign(n, 0);
  double slowest = 0, total = 0;
  for (size_t s = 0; s < starts.size(); ++s) {
    int first = starts[s], end = s + 1 < starts.size() ? starts[s + 1] : n;
    StageReport st;
    st.index = int(s);
    st.firstLayer = first;
    st.lastLayer = end - 1;
    st.paramBytes = table.paramBytes(first, end);
    st.staticBytes = table.staticBytes(first, end);
    st.activationBytes = table.activationBytes(first, end);
    st.heldMicrobatches = heldMicrobatches(solver, int(s));
    st.peakBytes = table.peakBytes(first, end, st.heldMicrobatches);
    // The sender's share of each message (LinkModel::sendSeconds; a
    // profile's action overheads already hold it: there it is 0).
    st.f = table.f(first, end) + overhead.f +
           double(table.fSends(first, end)) * link.sendSeconds;
    st.b = table.b(first, end) + overhead.b +
           double(table.bSends(first, end)) * link.sendSeconds;
    st.w = table.w(first, end) + overhead.w;
    st.step = table.step(first, end) + overhead.step;
    st.comm = table.commTime(first, end);
    st.sendBytes = table.sendBytes(first, end);
    st.recvBytes = table.recvBytes(first, end);
    for (int l = first; l < end; ++l)
      r.stageOfLayer[l] = int(s);
    slowest = std::max(slowest, st.time());
    total += st.time();
    StageCost cost{st.f, st.b, st.w, st.activationBytes, st.sendBytes,
                   st.recvBytes, st.staticBytes};
    cost.step = st.step;
    if (uniform)
      cost.f = cost.b = cost.w = 1, cost.step = 0;
    // A stage whose B has no work (an embedding of integer tokens alone)
    // still runs its B action: it receives the gradient and ends the
    // microbatch there. The schedules need positive times, so such an
    // action takes a nanosecond.
    constexpr double kLeastActionTime = 1e-9;
    cost.f = std::max(cost.f, kLeastActionTime);
    cost.b = std::max(cost.b, kLeastActionTime);
    if (!uniform && size_t(s) < overhead.recvLatency.size())
      cost.recvLatency = overhead.recvLatency[size_t(s)];
    r.costs.stages.push_back(cost);
    r.stages.push_back(st);
  }
  r.imbalance = total > 0 ? slowest / (total / double(starts.size())) : 1;
  r.stepTime = predictedStepTime(table, starts, solver.microbatches);
  r.costs.timeUnit = uniform ? "unit" : "s";
  r.costs.bwSendsAfterB = !uniform;
  r.costs.linkLatency = link.latency;
  r.costs.linkBytesPerUnit = link.bytesPerSecond;
}

llvm::Expected<PartitionResult> partition(const ir::Graph &g,
                                          const PartitionOptions &opts) {
  auto layering = groupLayers(g, opts.layers);
  if (!layering)
    return layering.takeError();
  bool uniform = opts.costModel.kind == CostModelKind::Uniform;
  auto device = lookupDeviceProfile(opts.deviceProfile);
  if (!device)
    return device.takeError();
  std::vector<double> opTimes;
  if (!uniform) {
    auto times = predictOpTimes(g, opts.costModel, *device);
    if (!times)
      return times.takeError();
    opTimes = std::move(*times);
  }
  std::map<std::pair<std::string, ir::Phase>, double> byLocation;
  {
    size_t i = 0;
    for (const auto &op : g.ops()) {
      if (i < opTimes.size() && !op->loc().empty())
        byLocation[{op->loc(), op->phase()}] += opTimes[i];
      ++i;
    }
  }
  // A profile's own figures: the executor's time per action, and the
  // latency its messages met (both measured on the machine that will run).
  std::optional<OpProfile> profile;
  if (opts.costModel.kind == CostModelKind::Profile) {
    auto loaded = OpProfile::load(opts.costModel.profilePath);
    if (!loaded)
      return loaded.takeError();
    profile = std::move(*loaded);
  }
  // A profile measured while other processes kept cores busy: its ranks
  // had the rest (the simulator's shared cores; docs/design/runtime.md,
  // "Sharing the cores"), and the waits for a core it measured in its
  // ops, actions and messages are left to the simulation, which makes
  // them (OpProfile::sharesCores: below a quarter of a core it is noise).
  double sharedCores = profile ? profile->coresLeft() : 0;
  // Messages the profile timed: their measured delay replaces the device's
  // link latency (it holds the hand-off), per receiving stage where the
  // profile has that stage, else the mean over those it has; the split is
  // chosen with the mean.
  const bool timedMessages = profile && profile->messageLatency();
  LinkModel link;
  if (!uniform) {
    link = {device->linkLatency, device->linkBandwidth,
            profile ? 0.0 : device->sendOverhead};
    if (timedMessages)
      link.latency = *profile->messageLatency();
  }
  LayerChain chain =
      buildLayerChain(g, *layering, opTimes, device->canOffload());
  StageCostTable table(chain, link);

  SolverOptions solver;
  solver.stages = opts.stages ? opts.stages : int(opts.splitAt.size()) + 1;
  if (!opts.splitAt.empty() && solver.stages != int(opts.splitAt.size()) + 1)
    return partitionError(llvm::formatv(
        "--split-at names {0} layers, which makes {1} stages, but --stages "
        "is {2}",
        opts.splitAt.size(), opts.splitAt.size() + 1, opts.stages));
  solver.microbatches = opts.microbatches;
  solver.memCap = opts.memCap;
  solver.heldMicrobatches = opts.heldMicrobatches;
  auto starts = chooseStarts(g, table, solver, opts, *layering);
  if (!starts)
    return starts.takeError();

  PartitionResult r;
  r.memCap = opts.memCap;
  r.microbatches = opts.microbatches;
  ActionOverhead overhead;
  if (profile) {
    overhead.f = profile->actionOverhead("F");
    // A profile of a schedule without 2BP has BW actions only.
    overhead.b = profile->actionOverhead("B");
    if (overhead.b == 0)
      overhead.b = profile->actionOverhead("BW");
    overhead.w = profile->actionOverhead("W");
    overhead.step = profile->actionOverhead("STEP");
    if (timedMessages) {
      for (int st = 0; st < solver.stages; ++st)
        overhead.recvLatency.push_back(
            profile->messageLatency(st).value_or(*profile->messageLatency()));
      link.latency = 0;
    }
  }
  fillStages(r, table, solver, *starts, uniform, link, overhead);
  r.opTimes = std::move(byLocation);
  r.costs.sharedCores = sharedCores;
  for (const auto &[op, layer] : layering->layerOfOp)
    r.stageOfOp[op] = r.stageOfLayer[layer];
  r.layering = std::move(*layering);
  return r;
}

} // namespace cleave::passes
