// printPlan: the text form of a Plan (runtime/PlanFile.h), for
// `cleave-run --print-plan` and for tests. One line per slot, instruction
// and update; floats in their shortest exact form, so output is
// deterministic. docs/design/plan.md shows the shape of it.
#include "runtime/PlanFile.h"
#include "runtime/PlanTypes.h"

#include "support/TextFormat.h"

#include "llvm/Support/FormatVariadic.h"

namespace cleave::runtime {

namespace {

std::string quoted(llvm::StringRef s) { return support::quoteString(s); }
std::string number(double v) { return support::formatDouble(v); }

std::string attrText(const ir::Attribute &a) {
  auto list = [](const auto &vals, auto fmt) {
    std::string s = "[";
    for (size_t i = 0; i < vals.size(); ++i)
      s += (i ? ", " : "") + fmt(vals[i]);
    return s + "]";
  };
  auto floatText = [](float f) { return support::formatFloat(f); };
  switch (a.kind()) {
  case ir::AttrKind::Int:
    return std::to_string(a.getInt());
  case ir::AttrKind::Float:
    return floatText(a.getFloat());
  case ir::AttrKind::String:
    return quoted(a.getString());
  case ir::AttrKind::Ints:
    return list(a.getInts(), [](int64_t v) { return std::to_string(v); });
  case ir::AttrKind::Floats:
    return list(a.getFloats(), floatText);
  case ir::AttrKind::Strings:
    return list(a.getStrings(), quoted);
  case ir::AttrKind::Tensor: {
    const ir::TensorData &t = *a.getTensor();
    std::string s = t.type().str();
    int64_t n = t.type().numElements();
    if (!t.isLoaded() || n > 8)
      return s + " <" + std::to_string(t.type().byteSize()) + " bytes>";
    s += " [";
    for (int64_t i = 0; i < n; ++i)
      s += (i ? ", " : "") + (ir::isFloat(t.type().dtype)
                                  ? number(t.getDouble(i))
                                  : std::to_string(t.getInt(i)));
    return s + "]";
  }
  }
  return "?";
}

std::string slotList(const std::vector<int> &slots) {
  std::string s;
  for (size_t i = 0; i < slots.size(); ++i)
    s += (i ? ", %" : "%") + std::to_string(slots[i]);
  return s;
}

void printInstr(const Instr &in, llvm::raw_ostream &os) {
  os << "    ";
  switch (in.kind) {
  case InstrKind::Send:
    os << "send " << slotList(in.inputs) << " -> stage " << in.peer << " tag "
       << in.tag;
    break;
  case InstrKind::Recv:
    os << slotList(in.outputs) << " = recv <- stage " << in.peer << " tag "
       << in.tag;
    break;
  case InstrKind::Kernel: {
    if (!in.outputs.empty())
      os << slotList(in.outputs) << " = ";
    os << ir::opInfo(in.op).name << "(" << slotList(in.inputs) << ")";
    if (!in.attrs.empty()) {
      os << " {";
      bool first = true;
      for (const auto &[name, a] : in.attrs) {
        os << (first ? "" : ", ") << name << " = " << attrText(a);
        first = false;
      }
      os << "}";
    }
    if (in.seedSalt)
      os << " seed " << in.seedSalt;
    break;
  }
  }
  if (!in.loc.empty())
    os << " @" << quoted(in.loc);
  os << "\n";
}

void printUpdates(const char *what, const std::vector<StateUpdate> &updates,
                  llvm::raw_ostream &os) {
  if (updates.empty())
    return;
  os << "  " << what << ":";
  for (const StateUpdate &u : updates)
    os << " %" << u.state << " <- %" << u.value;
  os << "\n";
}

std::string ms(double seconds) {
  return llvm::formatv("{0:F3} ms", seconds * 1e3).str();
}

} // namespace

void printPlan(const Plan &plan, llvm::raw_ostream &os) {
  uint64_t blobBytes = 0, referenced = 0, referencedBytes = 0;
  for (const Blob &b : plan.blobs) {
    blobBytes += b.bytes.size();
    referenced += b.referenced();
    referencedBytes += b.referenced() ? b.size : 0;
  }
  os << "plan " << quoted(plan.modelName) << " (format version " << plan.version
     << ")\n";
  if (!plan.sourceModel.empty())
    os << "  source " << quoted(plan.sourceModel) << "\n";
  os << "  schedule " << plan.schedule << ", " << plan.stages.size()
     << " stages, " << plan.microbatches << " microbatches"
     << (plan.dataParallel > 1
             ? " per replica, " + std::to_string(plan.dataParallel) +
                   " data-parallel replicas"
             : std::string())
     << "\n";
  if (!plan.stageRank.empty())
    for (int r = 0; r < rankCount(plan); ++r) {
      os << "  rank " << r << ": stages";
      for (int s : stagesOfRank(plan, r))
        os << " " << s;
      os << "; program";
      // Runs of one stage's actions: "0x2 3x1 ..." (stage x count).
      const std::vector<int> &prog = size_t(r) < plan.rankPrograms.size()
                                         ? plan.rankPrograms[size_t(r)]
                                         : std::vector<int>();
      for (size_t k = 0; k < prog.size();) {
        size_t n = 1;
        while (k + n < prog.size() && prog[k + n] == prog[k])
          ++n;
        os << " " << prog[k] << "x" << n;
        k += n;
      }
      os << "\n";
    }
  for (const PlanInput &in : plan.inputs)
    os << "  input " << quoted(in.name) << " : " << typeText(in.dtype, in.shape)
       << (in.indexLimit > 0 ? " (values below " + std::to_string(in.indexLimit) + ")"
                             : std::string())
       << (in.indexes ? " (indexes a table)" : "")
       << (in.labels ? in.labelShift == 0
                           ? std::string(" (loss labels)")
                           : " (loss labels, shifted by " +
                                 std::to_string(in.labelShift) +
                                 " in the model)"
                     : std::string())
       << "\n";
  for (const PlanTensor &t : plan.modelTensors)
    os << "  model tensor " << quoted(t.name) << " : "
       << typeText(t.dtype, t.shape) << "\n";
  os << "  optimizer " << (plan.optimizer.empty() ? "none" : plan.optimizer)
     << ", lr " << number(plan.lr) << ", precision " << plan.precision
     << "\n";
  os << "  blobs " << plan.blobs.size() << " (" << blobBytes
     << " bytes loaded)";
  if (referenced)
    os << ", " << referenced << " of them referenced (" << referencedBytes
       << " bytes)";
  os << "\n";
  for (const WeightFile &f : plan.weightFiles)
    os << "  weight file " << quoted(f.path) << " (" << f.size
       << " bytes)\n";
  if (plan.predictedStepTime > 0)
    os << "  predicted step time " << ms(plan.predictedStepTime) << "\n";
  if (plan.predictedPeriod > 0)
    os << "  predicted period of overlapping steps " << ms(plan.predictedPeriod)
       << "\n";

  for (const StagePlan &s : plan.stages) {
    os << "\nstage " << s.index << "\n";
    os << "  slots:\n";
    for (size_t i = 0; i < s.slots.size(); ++i) {
      const Slot &sl = s.slots[i];
      os << "    %" << i << " " << slotKindName(sl.kind) << " "
         << quoted(sl.name) << " " << typeText(sl.dtype, sl.shape) << " "
         << sl.bytes << " B";
      if (sl.kind == SlotKind::MicroTemp || sl.kind == SlotKind::StepTemp)
        os << " @" << sl.offset;
      if (sl.blob >= 0)
        os << " blob " << sl.blob;
      if (sl.blob >= 0 && size_t(sl.blob) < plan.blobs.size()) {
        const Blob &b = plan.blobs[size_t(sl.blob)];
        if (b.referenced())
          os << " (file " << b.file << " at " << b.offset << ")";
        if (b.filled())
          os << " (fill)";
      }
      if (sl.accum >= 0)
        os << " accum %" << sl.accum;
      if (sl.trainable)
        os << " trainable";
      os << "\n";
    }
    os << "  frame " << s.frameBytes << " B, step frame " << s.stepFrameBytes
       << " B\n";
    if (s.lossSlot >= 0)
      os << "  loss %" << s.lossSlot << "\n";
    if (s.accuracyScoresSlot >= 0)
      os << "  accuracy of %" << s.accuracyScoresSlot << " against %"
         << s.accuracyLabelsSlot
         << (s.hasIgnoreIndex
                 ? " (labels " + std::to_string(s.ignoreIndex) + " ignored)"
                 : std::string())
         << "\n";
    for (int p = 0; p < kNumPhases; ++p) {
      size_t n = s.programs[p].size();
      os << "  program " << phaseName(Phase(p)) << " (" << n
         << (n == 1 ? " instr)\n" : " instrs)\n");
      for (const Instr &in : s.programs[p])
        printInstr(in, os);
    }
    printUpdates("forward updates", s.fwdUpdates, os);
    printUpdates("step updates", s.stepUpdates, os);
    os << "  actions:";
    for (const Action &a : s.actions) {
      os << " " << actionKindName(a.kind);
      if (a.kind != ActionKind::Step)
        os << a.microbatch;
    }
    os << "\n";
    if (s.wBatch) {
      size_t products = 0;
      for (size_t i = 0; i < s.wBatchProduct.size(); ++i)
        products += s.wBatchProduct[i] == int(i);
      os << "  W batching: " << products << " product(s) run once per run "
         << "of consecutive microbatches, scratch " << s.wBatchScratchBytes
         << " B\n";
    }
    os << "  predicted: F " << ms(s.predictedF) << ", B " << ms(s.predictedB)
       << ", W " << ms(s.predictedW) << ", peak " << s.predictedPeakBytes
       << " B\n";
  }
}

} // namespace cleave::runtime
