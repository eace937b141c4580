#include "codegen/Codegen.h"

#include "passes/MemoryPlan.h"
#include "support/Checksum.h"
#include "support/Errors.h"
#include "support/FileIO.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/FileSystem.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace cleave::codegen {

using ir::Op;
using ir::OpKind;
using ir::Value;
using runtime::Instr;
using runtime::InstrKind;
using runtime::Phase;
using runtime::Slot;
using runtime::SlotKind;

static Phase planPhase(ir::Phase p) {
  switch (p) {
  case ir::Phase::Fwd: return Phase::F;
  case ir::Phase::B: return Phase::B;
  case ir::Phase::W: return Phase::W;
  case ir::Phase::Opt: return Phase::Step;
  }
  return Phase::F;
}


namespace {

// The blobs that refer to ranges of weight files (PlanInfo::referenceWeights):
// one blob per distinct range, shared by every stage that holds a replica
// of it, and each range read once, a slice at a time, to sum it.
class WeightReferences {
public:
  explicit WeightReferences(runtime::Plan &plan) : plan_(plan) {}

  // The blob for `origin`'s bytes, added on first use.
  llvm::Expected<int> blobFor(const ir::DataOrigin &origin) {
    auto key = std::make_tuple(origin.path, origin.offset, origin.length);
    if (auto it = blobs_.find(key); it != blobs_.end())
      return it->second;
    auto file = fileFor(origin.path);
    if (!file)
      return file.takeError();
    runtime::Blob blob;
    blob.file = *file;
    blob.offset = uint64_t(origin.offset);
    blob.size = uint64_t(origin.length);
    support::BlockChecksum sum;
    if (auto e = support::streamFileRange(
            origin.path, blob.offset, blob.size,
            [&](const uint8_t *p, size_t n) {
              sum.update(p, n);
              return llvm::Error::success();
            },
            "weight file",
            [&](uint64_t n) { // a hole: summed without being read
              sum.zeros(n);
              return llvm::Error::success();
            }))
      return std::move(e);
    blob.checksum = sum.value();
    plan_.blobs.push_back(std::move(blob));
    return blobs_[key] = int(plan_.blobs.size()) - 1;
  }

private:
  llvm::Expected<int> fileFor(const std::string &path) {
    for (size_t i = 0; i < plan_.weightFiles.size(); ++i)
      if (plan_.weightFiles[i].path == path)
        return int(i);
    uint64_t size = 0;
    if (std::error_code ec = llvm::sys::fs::file_size(path, size))
      return fail("weight file '" + path + "': " + ec.message());
    plan_.weightFiles.push_back({path, size});
    return int(plan_.weightFiles.size()) - 1;
  }

  runtime::Plan &plan_;
  std::map<std::tuple<std::string, int64_t, int64_t>, int> blobs_;
};

class StageLowering {
public:
  StageLowering(const ir::Graph &g, int index, runtime::Plan &plan,
                const PlanInfo &info, WeightReferences &refs)
      : g_(g), plan_(plan), info_(info), refs_(refs) {
    stage_.index = index;
  }
  llvm::Expected<runtime::StagePlan> run();

private:
  int addSlot(const Value *v, SlotKind kind);
  llvm::Error addDeclared();
  llvm::Error planFrames();
  void placeCopyWaits();
  void recordAccuracy();

  const ir::Graph &g_;
  runtime::Plan &plan_;
  const PlanInfo &info_;
  WeightReferences &refs_;
  runtime::StagePlan stage_;
  llvm::DenseMap<const Value *, int> slotOf_;
  llvm::DenseMap<const Value *, int> accumOf_;
};

int StageLowering::addSlot(const Value *v, SlotKind kind) {
  Slot s;
  s.name = v->name();
  s.kind = kind;
  s.dtype = v->type().dtype;
  s.shape.assign(v->type().shape.begin(), v->type().shape.end());
  s.bytes = v->type().byteSize();
  s.trainable = v->kind() == ir::ValueKind::Param;
  stage_.slots.push_back(std::move(s));
  int index = int(stage_.slots.size()) - 1;
  slotOf_[v] = index;
  return index;
}

llvm::Error StageLowering::addDeclared() {
  for (const Value *v : g_.inputs())
    addSlot(v, SlotKind::Input);
  for (const Value *v : g_.declared()) {
    ir::TensorData &data = *v->data();
    int s = addSlot(v, v->kind() == ir::ValueKind::Const ? SlotKind::Const
                                                         : SlotKind::State);
    // Bytes still in their file (external data) are referenced, not read.
    if (info_.referenceWeights && !data.isLoaded() &&
        data.origin().kind == ir::DataOrigin::Kind::RawFile) {
      auto blob = refs_.blobFor(data.origin());
      if (!blob)
        return fail("%" + v->name() + ": " + llvm::toString(blob.takeError()));
      stage_.slots[s].blob = *blob;
      continue;
    }
    runtime::Blob blob;
    if (llvm::ArrayRef<uint8_t> e = data.splatElement(); !e.empty()) {
      blob.fill = e.vec(); // zeros of optimizer state: nothing to store
      blob.size = uint64_t(data.type().byteSize());
      plan_.blobs.push_back(std::move(blob));
      stage_.slots[s].blob = int(plan_.blobs.size()) - 1;
      continue;
    }
    if (auto e = data.load())
      return fail("%" + v->name() + ": " + llvm::toString(std::move(e)));
    llvm::ArrayRef<uint8_t> bytes = data.bytes();
    blob.bytes.assign(bytes.begin(), bytes.end());
    blob.checksum = support::blockChecksum(blob.bytes.data(), blob.bytes.size());
    plan_.blobs.push_back(std::move(blob));
    stage_.slots[s].blob = int(plan_.blobs.size()) - 1;
  }
  return llvm::Error::success();
}

llvm::Expected<runtime::StagePlan> StageLowering::run() {
  if (auto e = addDeclared())
    return std::move(e);
  // Results: per microbatch or per step, by the phase of their op.
  for (const auto &op : g_.ops())
    for (const Value *r : op->results())
      addSlot(r, op->phase() == ir::Phase::Opt ? SlotKind::StepTemp
                                               : SlotKind::MicroTemp);
  // Per-microbatch values the step reads are summed into Accum slots.
  for (const auto &op : g_.ops()) {
    if (op->phase() != ir::Phase::Opt)
      continue;
    for (const Value *v : op->operands()) {
      int s = slotOf_.lookup(v);
      SlotKind k = stage_.slots[s].kind;
      if ((k != SlotKind::MicroTemp && k != SlotKind::Input) ||
          accumOf_.count(v))
        continue;
      Slot acc = stage_.slots[s];
      acc.name = v->name() + ".sum";
      acc.kind = SlotKind::Accum;
      acc.offset = -1;
      stage_.slots.push_back(std::move(acc));
      int a = int(stage_.slots.size()) - 1;
      stage_.slots[s].accum = a;
      accumOf_[v] = a;
    }
  }
  for (const auto &op : g_.ops()) {
    Instr in;
    bool step = op->phase() == ir::Phase::Opt;
    auto use = [&](const Value *v) {
      return step && accumOf_.count(v) ? accumOf_.lookup(v)
                                        : slotOf_.lookup(v);
    };
    for (const Value *v : op->operands())
      in.inputs.push_back(use(v));
    for (const Value *r : op->results())
      in.outputs.push_back(slotOf_.lookup(r));
    in.loc = op->loc();
    if (op->kind() == OpKind::Send || op->kind() == OpKind::Recv) {
      in.kind = op->kind() == OpKind::Send ? InstrKind::Send : InstrKind::Recv;
      in.peer = int(op->getInt("peer"));
      in.tag = op->getInt("tag");
    } else {
      in.kind = InstrKind::Kernel;
      in.op = op->kind();
      in.attrs = op->attrs();
      // A recomputed op draws what its original drew (passes/Recompute.h).
      auto of = op->attrs().find(ir::kRecomputeOfAttr);
      const std::string &key =
          of != op->attrs().end() ? of->second.getString()
          : op->numResults()      ? op->result()->name()
                                  : op->loc();
      in.seedSalt = runtime::fnv1a64(key.data(), key.size());
    }
    stage_.programs[int(planPhase(op->phase()))].push_back(std::move(in));
  }
  for (const ir::StateUpdate &u : g_.updates()) {
    runtime::StateUpdate su{slotOf_.lookup(u.state), slotOf_.lookup(u.value)};
    if (stage_.slots[su.value].kind == SlotKind::StepTemp)
      stage_.stepUpdates.push_back(su);
    else
      stage_.fwdUpdates.push_back(su);
  }
  if (const Value *loss = g_.lookup(info_.lossName))
    if (loss->definingOp()) {
      stage_.lossSlot = slotOf_.lookup(loss);
      recordAccuracy();
    }
  if (auto e = planFrames())
    return std::move(e);
  return std::move(stage_);
}

// Validation accuracy: the loss's stage holds one cross-entropy of class
// scores and labels that its gradient reads in B, so both are intact at the
// end of F, where the executor reads them (StagePlan::accuracyScoresSlot).
void StageLowering::recordAccuracy() {
  const Op *ce = nullptr;
  for (const auto &op : g_.ops())
    if (op->kind() == OpKind::SoftmaxCrossEntropyLoss) {
      if (ce)
        return; // several: which one is "the" accuracy is not known
      ce = op.get();
    }
  if (!ce || ce->numOperands() != 2)
    return;
  const Value *scores = ce->operand(0), *labels = ce->operand(1);
  auto readInB = [](const Value *v) {
    for (const ir::Use &u : v->uses())
      if (u.user->phase() == ir::Phase::B)
        return true;
    return false;
  };
  ir::DType st = scores->type().dtype;
  if ((st != ir::DType::F32 && st != ir::DType::F64) ||
      !ir::isInteger(labels->type().dtype) ||
      scores->type().shape.size() < 2 || !readInB(scores) ||
      !readInB(labels))
    return;
  stage_.accuracyScoresSlot = slotOf_.lookup(scores);
  stage_.accuracyLabelsSlot = slotOf_.lookup(labels);
  stage_.hasIgnoreIndex = ce->hasAttr("ignore_index");
  if (stage_.hasIgnoreIndex)
    stage_.ignoreIndex = ce->getInt("ignore_index");
}

// The frames as the memory planner lays them out (passes/MemoryPlan.h):
// the slots are the stage graph's values, one per value, and the programs
// its ops by phase, so the planner's lifetimes are the executor's. A value
// that shares its operand's buffer has its offset, and the executor skips
// the op that made it.
llvm::Error StageLowering::planFrames() {
  const Value *loss = g_.lookup(info_.lossName);
  passes::StageFrames frames = passes::planStageFrames(g_, loss);
  for (const auto &[v, offset] : frames.offset)
    stage_.slots[slotOf_.lookup(v)].offset = offset;
  for (const Value *v : frames.inHost)
    stage_.slots[slotOf_.lookup(v)].kind = SlotKind::HostTemp;
  stage_.frameBytes = frames.micro.size;
  stage_.stepFrameBytes = frames.step.size;
  stage_.hostFrameBytes = frames.host.size;
  // The updates the planner left out of the step frame must be the ones
  // the executor writes into their states, or two values would share
  // bytes.
  std::vector<int> alias = runtime::stepUpdatesInPlace(stage_);
  for (const Value *v : frames.inPlace)
    if (alias[size_t(slotOf_.lookup(v))] < 0)
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          "internal error: stage %d: the memory plan writes '%s' into its "
          "state's bytes, which the executor would not",
          stage_.index, v->name().c_str());
  placeCopyWaits();
  return llvm::Error::success();
}

// Offload copies run beside the compute where the backend has a copy queue
// (the CUDA backend's copy stream): the compute must wait for them before
// it writes bytes an Offload may still be reading, and before it reads
// what a Fetch brings. One wait covers every copy started before it
// (Instr::waitCopies), so each instruction that needs one gets the flag,
// in the frame's program order F, B, W.
void StageLowering::placeCopyWaits() {
  struct Range {
    int64_t from, to;
  };
  std::vector<Range> reading; // frame bytes Offloads copy from
  llvm::DenseSet<int> fetched;
  auto inFrame = [&](int s) {
    SlotKind k = stage_.slots[size_t(s)].kind;
    return k == SlotKind::MicroTemp || k == SlotKind::Input;
  };
  for (Phase ph : {Phase::F, Phase::B, Phase::W})
    for (Instr &in : stage_.programs[int(ph)]) {
      bool wait = false;
      for (int s : in.inputs)
        wait = wait || fetched.count(s);
      for (int s : in.outputs) {
        if (!inFrame(s) || in.op == OpKind::Fetch)
          continue;
        const Slot &sl = stage_.slots[size_t(s)];
        for (const Range &r : reading)
          wait = wait || (sl.offset < r.to && r.from < sl.offset + sl.bytes);
      }
      if (wait) {
        in.waitCopies = true;
        reading.clear();
        fetched.clear();
      }
      if (in.kind != InstrKind::Kernel)
        continue;
      if (in.op == OpKind::Offload) {
        const Slot &sl = stage_.slots[size_t(in.inputs[0])];
        reading.push_back({sl.offset, sl.offset + sl.bytes});
      } else if (in.op == OpKind::Fetch) {
        fetched.insert(in.outputs[0]);
      }
    }
}

// The bound an integer input's values must stay under: the size of the
// gathered axis, or the class count of a cross-entropy; 0 when unknown.
int64_t indexLimit(const Value *input) {
  int64_t limit = 0;
  for (const ir::Use &u : input->uses()) {
    const Op *op = u.user;
    if (op->kind() == OpKind::Gather && u.operandIndex == 1) {
      const auto &shape = op->operand(0)->type().shape;
      int64_t axis = op->getInt("axis");
      if (axis < 0)
        axis += int64_t(shape.size());
      if (axis >= 0 && axis < int64_t(shape.size()))
        limit = std::max(limit, shape[axis]);
    } else if (op->kind() == OpKind::SoftmaxCrossEntropyLoss &&
               u.operandIndex == 1 && op->operand(0)->type().shape.size() > 1) {
      limit = std::max(limit, op->operand(0)->type().shape[1]);
    }
  }
  return limit;
}

// Walks from `v` through value-moving ops to Gather indices and loss labels.
// `shift`: the positions dropped from the front of the [B, T] sequence axis
// so far (-1: unknown); `seqAxis`: where that axis is now (-1: merged away).
void traceInput(const Value *v, int64_t shift, int64_t seqAxis,
                runtime::PlanInput &out, int depth) {
  if (depth > 64)
    return;
  for (const ir::Use &u : v->uses()) {
    const Op *op = u.user;
    OpKind k = op->kind();
    if (k == OpKind::Gather && u.operandIndex == 1) {
      out.indexes = true;
      out.indexLimit = std::max(out.indexLimit, indexLimit(v));
      continue;
    }
    if (k == OpKind::SoftmaxCrossEntropyLoss && u.operandIndex == 1) {
      out.indexLimit = std::max(out.indexLimit, indexLimit(v));
      if (!out.labels || out.labelShift == shift) {
        out.labels = true;
        out.labelShift = shift;
      } else {
        out.labelShift = -1; // two paths that disagree
      }
      continue;
    }
    if (op->numResults() != 1 || u.operandIndex != 0)
      continue;
    const Value *r = op->result(0);
    int64_t next = seqAxis, nextShift = shift;
    const auto &inShape = v->type().shape, &outShape = r->type().shape;
    switch (k) {
    case OpKind::Identity:
    case OpKind::Cast:
      break;
    case OpKind::Reshape:
    case OpKind::Flatten:
    case OpKind::Squeeze:
    case OpKind::Unsqueeze: {
      // The axis survives when the dims before it keep their product and
      // it keeps its length.
      next = -1;
      if (seqAxis >= 0) {
        int64_t before = 1;
        for (int64_t i = 0; i < seqAxis; ++i)
          before *= inShape[size_t(i)];
        int64_t prod = 1;
        for (size_t i = 0; i < outShape.size(); ++i) {
          if (prod == before && outShape[i] == inShape[size_t(seqAxis)]) {
            next = int64_t(i);
            break;
          }
          prod *= outShape[i];
        }
      }
      break;
    }
    case OpKind::Slice: {
      auto axes = op->getInts("axes"), starts = op->getInts("starts"),
           steps = op->getInts("steps");
      for (size_t i = 0; i < axes.size(); ++i) {
        int64_t a = axes[i] < 0 ? axes[i] + int64_t(inShape.size()) : axes[i];
        bool unit = i >= steps.size() || steps[i] == 1;
        if (a == seqAxis && shift >= 0 && unit && starts[i] >= 0 &&
            outShape[size_t(a)] + starts[i] <= inShape[size_t(a)])
          nextShift = shift + starts[i];
        else if (a == seqAxis || seqAxis < 0)
          nextShift = -1;
      }
      break;
    }
    case OpKind::Pad: {
      // Padding at the end of the sequence axis (HF pads the labels with
      // ignore_index before it shifts them) keeps the front.
      auto pads = op->getInts("pads");
      size_t rank = inShape.size();
      if (seqAxis < 0 || pads.size() != 2 * rank || pads[size_t(seqAxis)] != 0)
        nextShift = -1;
      break;
    }
    default:
      continue;
    }
    traceInput(r, nextShift, next, out, depth + 1);
  }
}

} // namespace

std::vector<runtime::PlanInput> analyzeInputs(const ir::Graph &g) {
  std::vector<runtime::PlanInput> out;
  for (const Value *v : g.inputs()) {
    if (!ir::isInteger(v->type().dtype))
      continue;
    runtime::PlanInput &in = out.emplace_back();
    in.name = v->name();
    traceInput(v, 0, v->type().shape.size() >= 2 ? 1 : -1, in, 0);
  }
  return out;
}

namespace {

// The stage's memory under its action list: persistent slots, the step
// frame, and one frame per microbatch from its F to its last action.
int64_t plannedPeakBytes(const runtime::StagePlan &sp) {
  int64_t persistent = sp.stepFrameBytes;
  for (const Slot &sl : sp.slots)
    if (sl.kind == SlotKind::State || sl.kind == SlotKind::Const ||
        sl.kind == SlotKind::Accum)
      persistent += sl.bytes;
  std::map<int, size_t> last;
  for (size_t i = 0; i < sp.actions.size(); ++i)
    if (sp.actions[i].microbatch >= 0)
      last[sp.actions[i].microbatch] = i;
  int live = 0, most = 0;
  for (size_t i = 0; i < sp.actions.size(); ++i) {
    const runtime::Action &a = sp.actions[i];
    if (a.kind == runtime::ActionKind::F)
      most = std::max(most, ++live);
    if (a.microbatch >= 0 && last[a.microbatch] == i)
      --live;
  }
  return persistent + int64_t(most) * sp.frameBytes + sp.wBatchScratchBytes;
}

} // namespace

llvm::Expected<runtime::Plan>
buildPlan(const std::vector<std::unique_ptr<ir::Graph>> &stages,
          const passes::schedule::Schedule &schedule, const PlanInfo &info) {
  namespace sched = passes::schedule;
  if (int(stages.size()) != schedule.stages)
    return fail("the schedule has " + std::to_string(schedule.stages) +
                " stages but there are " + std::to_string(stages.size()) +
                " stage graphs");
  runtime::Plan plan;
  plan.modelName = info.modelName;
  plan.sourceModel = info.sourceModel;
  plan.sourceModelSize = info.sourceModelSize;
  plan.sourceModelSha256 = info.sourceModelSha256;
  plan.modelTensors = info.modelTensors;
  plan.schedule = schedule.name;
  plan.microbatches = schedule.microbatches;
  plan.dataParallel = info.dataParallel;
  plan.optimizer = info.optimizer;
  plan.lr = info.lr;
  plan.precision = info.precision;
  plan.predictedStepTime = info.predictedStepTime;
  plan.predictedPeriod = info.predictedPeriod;
  for (const auto &g : stages)
    for (const Value *v : g->inputs()) {
      auto it = std::find_if(plan.inputs.begin(), plan.inputs.end(),
                             [&](const runtime::PlanInput &i) {
                               return i.name == v->name();
                             });
      if (it == plan.inputs.end()) {
        plan.inputs.push_back(
            {v->name(), v->type().dtype,
             std::vector<int64_t>(v->type().shape.begin(),
                                  v->type().shape.end())});
        it = plan.inputs.end() - 1;
      }
      it->indexLimit = std::max(it->indexLimit, indexLimit(v));
      for (const runtime::PlanInput &u : info.inputUses)
        if (u.name == v->name()) {
          it->indexLimit = std::max(it->indexLimit, u.indexLimit);
          it->indexes = u.indexes;
          it->labels = u.labels;
          it->labelShift = u.labelShift;
        }
    }
  WeightReferences refs(plan);
  for (size_t s = 0; s < stages.size(); ++s) {
    auto sp = StageLowering(*stages[s], int(s), plan, info, refs).run();
    if (!sp)
      return sp.takeError();
    for (const sched::Action &a : schedule.actions[s]) {
      runtime::ActionKind k;
      switch (a.kind) {
      case sched::ActionKind::F: k = runtime::ActionKind::F; break;
      case sched::ActionKind::B: k = runtime::ActionKind::B; break;
      case sched::ActionKind::W: k = runtime::ActionKind::W; break;
      case sched::ActionKind::BW: k = runtime::ActionKind::BW; break;
      case sched::ActionKind::Step: k = runtime::ActionKind::Step; break;
      default: continue; // messages are in the programs
      }
      sp->actions.push_back({k, a.microbatch});
    }
    if (std::none_of(sp->actions.begin(), sp->actions.end(),
                     [](const runtime::Action &a) {
                       return a.kind == runtime::ActionKind::Step;
                     }))
      sp->actions.push_back({runtime::ActionKind::Step, -1});
    if (s < info.stageReports.size()) {
      const passes::StageReport &r = info.stageReports[s];
      sp->predictedF = r.f;
      sp->predictedB = r.b;
      sp->predictedW = r.w;
    }
    if (info.batchW)
      runtime::planWBatch(*sp);
    sp->predictedPeakBytes = plannedPeakBytes(*sp);
    plan.stages.push_back(std::move(*sp));
  }
  // Several stages per rank: each rank's order over its stages' compute
  // actions (messages are in the programs, STEPs run after all of them).
  if (sched::sharesRanks(schedule)) {
    for (int s = 0; s < schedule.stages; ++s)
      plan.stageRank.push_back(sched::rankOfStage(schedule, s));
    for (const auto &program : sched::rankPrograms(schedule)) {
      std::vector<int> &out = plan.rankPrograms.emplace_back();
      for (const sched::RankAction &ra : program) {
        sched::ActionKind k = schedule.actions[ra.stage][ra.index].kind;
        if (!sched::isComm(k) && k != sched::ActionKind::Step)
          out.push_back(ra.stage);
      }
    }
  }
  return plan;
}

} // namespace cleave::codegen
