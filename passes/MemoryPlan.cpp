#include "passes/MemoryPlan.h"

#include "ir/OpInfo.h"

#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <numeric>

namespace cleave::passes {

ArenaLayout placeLifetimes(llvm::ArrayRef<Lifetime> lifetimes) {
  std::vector<size_t> order(lifetimes.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int64_t x = alignArena(lifetimes[a].bytes),
            y = alignArena(lifetimes[b].bytes);
    if (x != y)
      return x > y;
    if (lifetimes[a].from != lifetimes[b].from)
      return lifetimes[a].from < lifetimes[b].from;
    return a < b;
  });
  struct Placed {
    int64_t offset, bytes, from, to;
  };
  ArenaLayout out;
  out.offsets.assign(lifetimes.size(), 0);
  std::vector<Placed> placed; // by offset
  std::vector<const Placed *> overlapping;
  for (size_t k : order) {
    const Lifetime &lt = lifetimes[k];
    overlapping.clear();
    for (const Placed &p : placed)
      if (p.from <= lt.to && lt.from <= p.to)
        overlapping.push_back(&p);
    int64_t need = alignArena(lt.bytes), offset = 0;
    for (const Placed *p : overlapping) { // in offset order
      if (offset + need <= p->offset)
        break;
      offset = std::max(offset, p->offset + p->bytes);
    }
    Placed mine{offset, need, lt.from, lt.to};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), mine,
                                   [](const Placed &a, const Placed &b) {
                                     return a.offset < b.offset;
                                   }),
                  mine);
    out.offsets[k] = offset;
    out.size = std::max(out.size, offset + need);
  }
  // The live peak: aligned bytes summed over a sweep of starts and ends.
  std::vector<std::pair<int64_t, int64_t>> events; // (position, +-bytes)
  for (const Lifetime &lt : lifetimes) {
    events.push_back({lt.from, alignArena(lt.bytes)});
    events.push_back({lt.to + 1, -alignArena(lt.bytes)});
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0;
  for (const auto &[pos, delta] : events) {
    live += delta;
    out.livePeak = std::max(out.livePeak, live);
  }
  return out;
}

namespace {

enum class FrameKind : uint8_t { Input, Micro, Step, Host };

struct FrameValue {
  const ir::Value *value;
  FrameKind kind;
  int64_t from = INT64_MAX, to = -1;
  int defProgram = 0; // 0..3: F, B, W, step
  int root;           // the value whose buffer it shares (itself)
};

} // namespace

int programOf(ir::Phase p) {
  switch (p) {
  case ir::Phase::Fwd:
    return 0;
  case ir::Phase::B:
    return 1;
  case ir::Phase::W:
    return 2;
  case ir::Phase::Opt:
    return 3;
  }
  return 3;
}

int inPlaceOperand(const ir::Op &op) {
  unsigned k = 0;
  switch (op.kind()) {
  case ir::OpKind::ScatterElements:
  case ir::OpKind::ScatterND:
  case ir::OpKind::ScatterElementsGradData:
  case ir::OpKind::ScatterNDGradData:
    break;
  case ir::OpKind::GatherGrad: // the sum operand, when it has one
    k = 2;
    break;
  case ir::OpKind::SliceGrad:
    k = 1;
    break;
  default:
    return -1;
  }
  if (op.numOperands() <= k || op.numResults() != 1 ||
      op.operand(k)->type() != op.result(0)->type())
    return -1;
  return int(k);
}

bool isViewOp(const ir::Op &op) {
  return ir::opInfo(op.kind()).has(ir::optrait::LayoutOnly) &&
         op.numOperands() == 1 && op.numResults() == 1 &&
         op.operand(0)->type().byteSize() == op.result(0)->type().byteSize();
}

llvm::DenseSet<const ir::Value *> updatedInPlace(const ir::Graph &g) {
  // The step's ops in program order (codegen's step program).
  llvm::DenseMap<const ir::Op *, int> position;
  for (const auto &op : g.ops())
    if (op->phase() == ir::Phase::Opt)
      position[op.get()] = int(position.size());
  llvm::DenseSet<const ir::Value *> out;
  for (const ir::StateUpdate &u : g.updates()) {
    const ir::Op *op = u.value->definingOp();
    if (!op || op->phase() != ir::Phase::Opt ||
        (op->kind() != ir::OpKind::SGD && op->kind() != ir::OpKind::AdamW) ||
        u.state->definingOp())
      continue;
    int at = position.lookup(op);
    bool readAfter = false;
    for (const ir::Use &use : u.state->uses())
      if (use.user->phase() == ir::Phase::Opt &&
          position.lookup(use.user) > at)
        readAfter = true;
    if (!readAfter)
      out.insert(u.value);
  }
  return out;
}

StageFrames planStageFrames(const ir::Graph &g, const ir::Value *loss) {
  std::vector<FrameValue> vals;
  llvm::DenseMap<const ir::Value *, int> index;
  auto add = [&](const ir::Value *v, FrameKind k) {
    index[v] = int(vals.size());
    vals.push_back({v, k, INT64_MAX, -1, 0, int(vals.size())});
  };
  for (const ir::Value *v : g.inputs())
    add(v, FrameKind::Input);
  for (const auto &op : g.ops())
    for (const ir::Value *r : op->results())
      add(r, op->phase() == ir::Phase::Opt        ? FrameKind::Step
             : op->kind() == ir::OpKind::Offload ? FrameKind::Host
                                                   : FrameKind::Micro);

  // What the step reads of the microbatches is a sum kept for the run, not
  // a frame value.
  auto summedByStep = [&](int program, const ir::Value *v) {
    auto it = index.find(v);
    return program == 3 && it != index.end() &&
           vals[it->second].kind != FrameKind::Step;
  };
  std::vector<const ir::Op *> programs[4];
  for (const auto &op : g.ops())
    programs[programOf(op->phase())].push_back(op.get());
  int64_t programEnd[4] = {0, 0, 0, 0};
  int64_t pos = 0;
  llvm::DenseMap<const ir::Op *, int64_t> positionOf;
  llvm::DenseSet<const ir::Value *> summed;
  for (int p = 0; p < 4; ++p) {
    if (p == 3)
      pos = 0; // the step frame is its own arena
    for (const ir::Op *op : programs[p]) {
      for (const ir::Value *v : op->operands()) {
        if (summedByStep(p, v)) {
          summed.insert(v);
          continue;
        }
        if (auto it = index.find(v); it != index.end())
          vals[it->second].to = std::max(vals[it->second].to, pos);
      }
      positionOf[op] = pos;
      for (const ir::Value *r : op->results()) {
        FrameValue &fv = vals[index.lookup(r)];
        if (fv.from == INT64_MAX)
          fv.defProgram = p;
        fv.from = std::min(fv.from, pos);
        fv.to = std::max(fv.to, pos);
      }
      ++pos;
    }
    programEnd[p] = pos;
  }
  auto keepToEnd = [&](const ir::Value *v) {
    auto it = index.find(v);
    if (it == index.end() || vals[it->second].kind == FrameKind::Input)
      return;
    FrameValue &fv = vals[it->second];
    fv.to = std::max(fv.to, programEnd[fv.defProgram]);
  };
  for (const ir::Value *v : summed)
    keepToEnd(v);
  for (const ir::StateUpdate &u : g.updates())
    keepToEnd(u.value);
  if (loss && loss->definingOp())
    keepToEnd(loss);

  // Layout-only results share their operand's buffer.
  auto root = [&](int i) {
    while (vals[i].root != i)
      i = vals[i].root;
    return i;
  };
  for (int p = 0; p < 4; ++p)
    for (const ir::Op *op : programs[p]) {
      if (!isViewOp(*op) || summedByStep(p, op->operand(0)))
        continue;
      auto in = index.find(op->operand(0));
      if (in == index.end())
        continue;
      int src = root(in->second), dst = index.lookup(op->result(0));
      bool sameFrame = vals[src].kind == vals[dst].kind &&
                       vals[dst].kind != FrameKind::Input;
      if (!sameFrame ||
          vals[src].value->type().byteSize() !=
              vals[dst].value->type().byteSize() ||
          vals[dst].from == INT64_MAX || vals[dst].root != dst)
        continue;
      vals[dst].root = src;
      vals[src].from = std::min(vals[src].from, vals[dst].from);
      vals[src].to = std::max(vals[src].to, vals[dst].to);
    }

  // Results written over a dying operand (inPlaceOperand): the result
  // joins the operand's buffer where nothing reads that buffer (the
  // operand, or a value sharing its bytes) after the op, no other operand
  // of the op is in it, and both are values of one frame, not inputs.
  // Program order, so a chain of scatters into one tensor (a loop that
  // fills a matrix row by row) takes one buffer.
  for (int p = 0; p < 4; ++p)
    for (const ir::Op *op : programs[p]) {
      int k = inPlaceOperand(*op);
      if (k < 0 || summedByStep(p, op->operand(k)))
        continue;
      auto in = index.find(op->operand(k));
      if (in == index.end())
        continue;
      int src = root(in->second), dst = index.lookup(op->result(0));
      bool sameFrame = vals[src].kind == vals[dst].kind &&
                       vals[dst].kind != FrameKind::Input;
      if (!sameFrame || vals[dst].root != dst ||
          vals[dst].from == INT64_MAX || vals[src].to != positionOf[op])
        continue;
      bool readTwice = false;
      for (unsigned j = 0; j < op->numOperands(); ++j)
        if (int(j) != k)
          if (auto o = index.find(op->operand(j));
              o != index.end() && root(o->second) == src)
            readTwice = true;
      if (readTwice)
        continue;
      vals[dst].root = src;
      vals[src].from = std::min(vals[src].from, vals[dst].from);
      vals[src].to = std::max(vals[src].to, vals[dst].to);
    }

  // Updates written into their state (a value another shares the buffer
  // of keeps its place: the sharer's bytes are in the frame).
  llvm::DenseSet<const ir::Value *> inPlace = updatedInPlace(g);
  for (size_t i = 0; i < vals.size(); ++i)
    if (vals[i].root != int(i))
      inPlace.erase(vals[root(int(i))].value);
  std::vector<Lifetime> micro, step, host;
  std::vector<int> microOf, stepOf, hostOf;
  StageFrames out;
  for (size_t i = 0; i < vals.size(); ++i) {
    const FrameValue &fv = vals[i];
    if (fv.root != int(i))
      continue;
    if (fv.kind == FrameKind::Step && inPlace.count(fv.value)) {
      out.inPlace.insert(fv.value);
      out.offset[fv.value] = 0;
      continue;
    }
    int64_t bytes = fv.value->type().byteSize();
    if (fv.kind == FrameKind::Input) {
      micro.push_back({-1, std::max<int64_t>(fv.to, 0), bytes});
      microOf.push_back(int(i));
    } else if (fv.from != INT64_MAX) {
      bool m = fv.kind == FrameKind::Micro, h = fv.kind == FrameKind::Host;
      (m ? micro : h ? host : step).push_back({fv.from, fv.to, bytes});
      (m ? microOf : h ? hostOf : stepOf).push_back(int(i));
    }
  }
  out.micro = placeLifetimes(micro);
  out.step = placeLifetimes(step);
  out.host = placeLifetimes(host);
  for (size_t k = 0; k < microOf.size(); ++k)
    out.offset[vals[microOf[k]].value] = out.micro.offsets[k];
  for (size_t k = 0; k < stepOf.size(); ++k)
    out.offset[vals[stepOf[k]].value] = out.step.offsets[k];
  for (size_t k = 0; k < hostOf.size(); ++k) {
    out.offset[vals[hostOf[k]].value] = out.host.offsets[k];
    out.inHost.insert(vals[hostOf[k]].value);
  }
  for (size_t i = 0; i < vals.size(); ++i) {
    int r = root(int(i));
    if (r == int(i))
      continue;
    out.sharesWith[vals[i].value] = vals[r].value;
    if (auto it = out.offset.find(vals[r].value); it != out.offset.end())
      out.offset[vals[i].value] = it->second;
  }
  for (const ir::Value *v : g.declared())
    out.persistentBytes += v->type().byteSize();
  for (const ir::Value *v : summed)
    out.persistentBytes += v->type().byteSize();
  return out;
}

} // namespace cleave::passes
