// Writes and reads .cplan files (runtime/PlanFile.h, docs/design/plan.md).
//
// The file is a preamble (magic, u32 format version, u64 header length), the
// protobuf header (plan.proto), zero padding to a multiple of 64, then the
// blobs, each starting at a multiple of 64. The header's blob table gives
// each blob's absolute offset, size and FNV-1a checksum.
//
// The reader treats the file as untrusted input: every index, enum, dtype and
// op name coming from the header is checked while converting it to a Plan,
// and the Plan then goes through verifyPlan, so a corrupt file ends in one
// error line. Blobs are read with seeks, one at a time, only those wanted.
#include "runtime/PlanFile.h"

#include "ir/Printer.h"
#include "plan.pb.h" // generated from runtime/plan.proto

#include "llvm/Support/FormatVariadic.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>

namespace cleave::runtime {

namespace pb = cleave::plan;

namespace {

constexpr char kMagic[] = "CLEAVEPLAN"; // written with its '\0': 11 bytes
constexpr size_t kMagicBytes = sizeof(kMagic);
constexpr uint64_t kPreambleBytes = kMagicBytes + 4 + 8;
constexpr uint64_t kAlign = 64;

uint64_t alignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

llvm::Error fail(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

llvm::Error invalid(const llvm::Twine &msg) {
  return fail("invalid plan: " + msg);
}

// Prefixes an error's message with "<path>: ".
llvm::Error atPath(const std::string &path, llvm::Error e) {
  if (!e)
    return e;
  return fail(path + ": " + llvm::toString(std::move(e)));
}

// Byte size of a dense tensor, or nullopt for a negative dimension or an
// overflow.
std::optional<int64_t> denseBytes(ir::DType dtype,
                                  llvm::ArrayRef<int64_t> shape) {
  int64_t n = int64_t(ir::dtypeSize(dtype));
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return std::nullopt;
  return n;
}

std::string typeText(ir::DType dtype, llvm::ArrayRef<int64_t> shape) {
  return ir::TensorType(dtype, ir::Shape(shape.begin(), shape.end())).str();
}

bool validDType(ir::DType t) { return size_t(t) <= size_t(ir::DType::Bool); }

} // namespace

//===----------------------------------------------------------------------===//
// verifyPlan
//===----------------------------------------------------------------------===//

namespace {

std::string instrWhere(const StagePlan &s, int phase, size_t i,
                       const Instr &in) {
  std::string w = llvm::formatv("stage {0} {1} instr {2}", s.index,
                                phaseName(Phase(phase)), i)
                      .str();
  if (!in.loc.empty())
    w += " (" + in.loc + ")";
  return w;
}

// Attributes an op declares must have the declared kind, and required ones
// must be present; kernels read only declared attributes, so others are
// carried along unchecked.
llvm::Error checkDeclaredAttributes(const ir::OpInfo &info,
                                    const ir::AttrMap &attrs) {
  for (const ir::AttrSpec &spec : info.attrs) {
    auto it = attrs.find(spec.name);
    if (it == attrs.end()) {
      if (spec.required())
        return fail("missing required attribute '" + spec.name + "'");
      continue;
    }
    if (it->second.kind() != spec.kind)
      return fail(llvm::formatv("attribute '{0}' must be of kind {1}, not {2}",
                                spec.name, ir::attrKindName(spec.kind),
                                ir::attrKindName(it->second.kind()))
                      .str());
  }
  for (const auto &[name, a] : attrs)
    if (a.kind() == ir::AttrKind::Tensor && !a.getTensor())
      return fail("attribute '" + name + "' has no tensor");
  return llvm::Error::success();
}

llvm::Error verifyInstr(const Plan &plan, const StagePlan &s, int phase,
                        size_t i, const Instr &in) {
  int nslots = int(s.slots.size());
  auto where = [&] { return instrWhere(s, phase, i, in); };
  auto checkSlots = [&](const std::vector<int> &v,
                        const char *what) -> llvm::Error {
    for (int x : v)
      if (x < 0 || x >= nslots)
        return invalid(llvm::formatv("{0}: {1} slot {2} out of range (the "
                                     "stage has {3} slots)",
                                     where(), what, x, nslots));
    return llvm::Error::success();
  };
  if (llvm::Error e = checkSlots(in.inputs, "input"))
    return e;
  if (llvm::Error e = checkSlots(in.outputs, "output"))
    return e;
  auto checkPeer = [&]() -> llvm::Error {
    if (in.peer < 0 || in.peer >= int(plan.stages.size()) ||
        in.peer == s.index)
      return invalid(llvm::formatv("{0}: bad peer stage {1}", where(),
                                   in.peer));
    return llvm::Error::success();
  };
  switch (in.kind) {
  case InstrKind::Kernel: {
    if (size_t(in.op) >= ir::allOps().size())
      return invalid(where() + ": unknown op");
    const ir::OpInfo &info = ir::opInfo(in.op);
    int n = int(in.inputs.size()), r = int(in.outputs.size());
    if (n < info.minOperands || (info.maxOperands >= 0 && n > info.maxOperands))
      return invalid(llvm::formatv("{0}: {1} has {2} inputs", where(),
                                   info.name, n));
    if (r < info.minResults || (info.maxResults >= 0 && r > info.maxResults))
      return invalid(llvm::formatv("{0}: {1} has {2} outputs", where(),
                                   info.name, r));
    if (llvm::Error e = checkDeclaredAttributes(info, in.attrs))
      return invalid(where() + ": " + std::string(info.name) + ": " +
                     llvm::toString(std::move(e)));
    return llvm::Error::success();
  }
  case InstrKind::Send:
    if (in.inputs.size() != 1 || !in.outputs.empty())
      return invalid(where() + ": a send takes one input and no outputs");
    return checkPeer();
  case InstrKind::Recv:
    if (!in.inputs.empty() || in.outputs.size() != 1)
      return invalid(where() + ": a recv takes no inputs and one output");
    return checkPeer();
  }
  return invalid(where() + ": unknown instruction kind");
}

llvm::Error verifyUpdates(const StagePlan &s, const char *what,
                          const std::vector<StateUpdate> &updates) {
  int nslots = int(s.slots.size());
  for (const StateUpdate &u : updates) {
    if (u.state < 0 || u.state >= nslots || u.value < 0 || u.value >= nslots)
      return invalid(llvm::formatv("stage {0}: {1} update {2} <- {3} out of "
                                   "range",
                                   s.index, what, u.state, u.value));
    const Slot &st = s.slots[u.state], &v = s.slots[u.value];
    if (st.kind != SlotKind::State)
      return invalid(llvm::formatv("stage {0}: {1} update of slot '{2}', "
                                   "which is not state",
                                   s.index, what, st.name));
    if (st.bytes != v.bytes)
      return invalid(llvm::formatv("stage {0}: {1} update of slot '{2}' "
                                   "({3} bytes) from '{4}' ({5} bytes)",
                                   s.index, what, st.name, st.bytes, v.name,
                                   v.bytes));
  }
  return llvm::Error::success();
}

// verifyPlan with the blob sizes given separately (the reader checks a
// header before, or without, loading the blobs).
llvm::Error verifyPlanWith(const Plan &plan,
                           llvm::ArrayRef<uint64_t> blobSizes) {
  if (plan.microbatches < 1)
    return invalid(llvm::formatv("{0} microbatches", plan.microbatches));
  for (const PlanInput &in : plan.inputs)
    if (!validDType(in.dtype) || !denseBytes(in.dtype, in.shape))
      return invalid("input '" + in.name + "' has a bad type");
  int nstages = int(plan.stages.size());
  for (int si = 0; si < nstages; ++si) {
    const StagePlan &s = plan.stages[si];
    if (s.index != si)
      return invalid(llvm::formatv("stage {0} says it is stage {1}", si,
                                   s.index));
    if (s.frameBytes < 0 || s.stepFrameBytes < 0)
      return invalid(llvm::formatv("stage {0}: negative frame size", si));
    int nslots = int(s.slots.size());
    for (int i = 0; i < nslots; ++i) {
      const Slot &sl = s.slots[i];
      auto bad = [&](const llvm::Twine &msg) {
        return invalid(llvm::formatv("stage {0} slot {1} '{2}': ", si, i,
                                     sl.name) +
                       msg);
      };
      if (!validDType(sl.dtype) || uint8_t(sl.kind) > uint8_t(SlotKind::Accum))
        return bad("bad dtype or kind");
      std::optional<int64_t> bytes = denseBytes(sl.dtype, sl.shape);
      if (!bytes || *bytes != sl.bytes)
        return bad(llvm::formatv("{0} bytes for {1}", sl.bytes,
                                 typeText(sl.dtype, sl.shape)));
      if (sl.kind == SlotKind::MicroTemp || sl.kind == SlotKind::StepTemp) {
        int64_t frame = sl.kind == SlotKind::MicroTemp ? s.frameBytes
                                                       : s.stepFrameBytes;
        if (sl.offset < 0 || sl.offset > frame - sl.bytes)
          return bad(llvm::formatv("offset {0} + {1} bytes is outside its "
                                   "frame ({2} bytes)",
                                   sl.offset, sl.bytes, frame));
      }
      if (sl.blob != -1) {
        if (sl.kind != SlotKind::State && sl.kind != SlotKind::Const)
          return bad("only state and const slots have blobs");
        if (sl.blob < 0 || size_t(sl.blob) >= blobSizes.size())
          return bad(llvm::formatv("blob {0} out of range ({1} blobs)",
                                   sl.blob, blobSizes.size()));
        if (blobSizes[sl.blob] != uint64_t(sl.bytes))
          return bad(llvm::formatv("its blob {0} has {1} bytes, not {2}",
                                   sl.blob, blobSizes[sl.blob], sl.bytes));
      }
      if (sl.accum != -1) {
        if (sl.kind != SlotKind::MicroTemp)
          return bad("only micro slots have accumulators");
        if (sl.accum < 0 || sl.accum >= nslots ||
            s.slots[sl.accum].kind != SlotKind::Accum ||
            s.slots[sl.accum].bytes != sl.bytes)
          return bad(llvm::formatv("bad accumulator slot {0}", sl.accum));
      }
    }
    for (int p = 0; p < kNumPhases; ++p)
      for (size_t i = 0; i < s.programs[p].size(); ++i)
        if (llvm::Error e = verifyInstr(plan, s, p, i, s.programs[p][i]))
          return e;
    if (llvm::Error e = verifyUpdates(s, "forward", s.fwdUpdates))
      return e;
    if (llvm::Error e = verifyUpdates(s, "step", s.stepUpdates))
      return e;
    for (const Action &a : s.actions) {
      if (uint8_t(a.kind) > uint8_t(ActionKind::Step))
        return invalid(llvm::formatv("stage {0}: bad action kind", si));
      bool ok = a.kind == ActionKind::Step
                    ? a.microbatch == -1
                    : a.microbatch >= 0 && a.microbatch < plan.microbatches;
      if (!ok)
        return invalid(llvm::formatv("stage {0}: action {1} of microbatch {2}",
                                     si, actionKindName(a.kind),
                                     a.microbatch));
    }
    if (s.lossSlot < -1 || s.lossSlot >= nslots)
      return invalid(llvm::formatv("stage {0}: loss slot {1} out of range", si,
                                   s.lossSlot));
  }
  return llvm::Error::success();
}

} // namespace

llvm::Error verifyPlan(const Plan &plan) {
  std::vector<uint64_t> sizes;
  for (const Blob &b : plan.blobs)
    sizes.push_back(b.bytes.size());
  return verifyPlanWith(plan, sizes);
}

//===----------------------------------------------------------------------===//
// Plan -> header
//===----------------------------------------------------------------------===//

namespace {

void toProto(const ir::Attribute &a, const std::string &name, pb::Attr &p) {
  p.set_name(name);
  p.set_kind(pb::AttrKind(a.kind()));
  switch (a.kind()) {
  case ir::AttrKind::Int:
    p.set_i(a.getInt());
    break;
  case ir::AttrKind::Float:
    p.set_f(a.getFloat());
    break;
  case ir::AttrKind::String:
    p.set_s(a.getString());
    break;
  case ir::AttrKind::Ints:
    p.mutable_ints()->Add(a.getInts().begin(), a.getInts().end());
    break;
  case ir::AttrKind::Floats:
    p.mutable_floats()->Add(a.getFloats().begin(), a.getFloats().end());
    break;
  case ir::AttrKind::Strings:
    for (const std::string &s : a.getStrings())
      p.add_strings(s);
    break;
  case ir::AttrKind::Tensor: {
    const ir::TensorData &t = *a.getTensor();
    pb::Tensor *pt = p.mutable_tensor();
    pt->set_dtype(std::string(ir::dtypeName(t.type().dtype)));
    pt->mutable_shape()->Add(t.type().shape.begin(), t.type().shape.end());
    llvm::ArrayRef<uint8_t> bytes = t.bytes();
    pt->set_data(bytes.data(), bytes.size());
    break;
  }
  }
}

void toProto(const Instr &in, pb::Instr &p) {
  p.set_kind(pb::InstrKind(in.kind));
  if (in.kind == InstrKind::Kernel)
    p.set_op(std::string(ir::opInfo(in.op).name));
  for (const auto &[name, a] : in.attrs)
    toProto(a, name, *p.add_attrs());
  p.mutable_inputs()->Add(in.inputs.begin(), in.inputs.end());
  p.mutable_outputs()->Add(in.outputs.begin(), in.outputs.end());
  p.set_peer(in.peer);
  p.set_tag(in.tag);
  p.set_seed_salt(in.seedSalt);
  p.set_loc(in.loc);
}

void toProto(const StateUpdate &u, pb::StateUpdate &p) {
  p.set_state(u.state);
  p.set_value(u.value);
}

void toProto(const StagePlan &s, pb::Stage &p) {
  p.set_index(s.index);
  for (const Slot &sl : s.slots) {
    pb::Slot *ps = p.add_slots();
    ps->set_name(sl.name);
    ps->set_kind(pb::SlotKind(sl.kind));
    ps->set_dtype(std::string(ir::dtypeName(sl.dtype)));
    ps->mutable_shape()->Add(sl.shape.begin(), sl.shape.end());
    ps->set_bytes(sl.bytes);
    ps->set_offset(sl.offset);
    ps->set_blob(sl.blob);
    ps->set_accum(sl.accum);
    ps->set_trainable(sl.trainable);
  }
  for (int ph = 0; ph < kNumPhases; ++ph) {
    pb::Program *prog = p.add_programs();
    for (const Instr &in : s.programs[ph])
      toProto(in, *prog->add_instrs());
  }
  for (const StateUpdate &u : s.fwdUpdates)
    toProto(u, *p.add_fwd_updates());
  for (const StateUpdate &u : s.stepUpdates)
    toProto(u, *p.add_step_updates());
  for (const Action &a : s.actions) {
    pb::Action *pa = p.add_actions();
    pa->set_kind(pb::ActionKind(a.kind));
    pa->set_microbatch(a.microbatch);
  }
  p.set_frame_bytes(s.frameBytes);
  p.set_step_frame_bytes(s.stepFrameBytes);
  p.set_loss_slot(s.lossSlot);
  p.set_predicted_f(s.predictedF);
  p.set_predicted_b(s.predictedB);
  p.set_predicted_w(s.predictedW);
  p.set_predicted_peak_bytes(s.predictedPeakBytes);
}

// The header, with every blob's offset left at 0 for the caller to place.
pb::Header toProto(const Plan &plan) {
  pb::Header h;
  h.set_version(kPlanFileVersion);
  h.set_model_name(plan.modelName);
  h.set_source_model(plan.sourceModel);
  h.set_schedule(plan.schedule);
  h.set_microbatches(plan.microbatches);
  for (const PlanInput &in : plan.inputs) {
    pb::Input *pi = h.add_inputs();
    pi->set_name(in.name);
    pi->set_dtype(std::string(ir::dtypeName(in.dtype)));
    pi->mutable_shape()->Add(in.shape.begin(), in.shape.end());
  }
  h.set_optimizer(plan.optimizer);
  h.set_lr(plan.lr);
  for (const StagePlan &s : plan.stages)
    toProto(s, *h.add_stages());
  std::vector<int> owner(plan.blobs.size(), -1);
  for (const StagePlan &s : plan.stages)
    for (const Slot &sl : s.slots)
      if (sl.blob >= 0 && owner[sl.blob] < 0)
        owner[sl.blob] = s.index;
  for (size_t b = 0; b < plan.blobs.size(); ++b) {
    const std::vector<uint8_t> &bytes = plan.blobs[b].bytes;
    pb::BlobRef *r = h.add_blobs();
    r->set_stage(owner[b]);
    r->set_size(bytes.size());
    r->set_checksum(fnv1a64(bytes.data(), bytes.size()));
  }
  h.set_predicted_step_time(plan.predictedStepTime);
  return h;
}

} // namespace

//===----------------------------------------------------------------------===//
// header -> Plan
//===----------------------------------------------------------------------===//

namespace {

llvm::Expected<ir::DType> dtypeFrom(const std::string &name,
                                    const llvm::Twine &what) {
  if (std::optional<ir::DType> t = ir::parseDType(name))
    return *t;
  return invalid(what + " has unknown dtype '" + name + "'");
}

llvm::Expected<ir::Attribute> fromProto(const pb::Attr &p,
                                        const std::string &where) {
  std::string what = where + ": attribute '" + p.name() + "'";
  switch (p.kind()) {
  case pb::ATTR_INT:
    return ir::Attribute(int64_t(p.i()));
  case pb::ATTR_FLOAT:
    return ir::Attribute(p.f());
  case pb::ATTR_STRING:
    return ir::Attribute(p.s());
  case pb::ATTR_INTS:
    return ir::Attribute(std::vector<int64_t>(p.ints().begin(), p.ints().end()));
  case pb::ATTR_FLOATS:
    return ir::Attribute(
        std::vector<float>(p.floats().begin(), p.floats().end()));
  case pb::ATTR_STRINGS:
    return ir::Attribute(
        std::vector<std::string>(p.strings().begin(), p.strings().end()));
  case pb::ATTR_TENSOR: {
    const pb::Tensor &t = p.tensor();
    llvm::Expected<ir::DType> dtype = dtypeFrom(t.dtype(), what);
    if (!dtype)
      return dtype.takeError();
    std::vector<int64_t> shape(t.shape().begin(), t.shape().end());
    std::optional<int64_t> bytes = denseBytes(*dtype, shape);
    if (!bytes || uint64_t(*bytes) != t.data().size())
      return invalid(llvm::formatv("{0}: {1} bytes for {2}", what,
                                   t.data().size(), typeText(*dtype, shape)));
    return ir::Attribute(std::make_shared<ir::TensorData>(
        ir::TensorType(*dtype, ir::Shape(shape.begin(), shape.end())),
        t.data()));
  }
  default:
    return invalid(what + " has an unknown kind");
  }
}

llvm::Error fromProto(const pb::Instr &p, const std::string &where,
                      Instr &in) {
  if (!pb::InstrKind_IsValid(p.kind()))
    return invalid(where + ": unknown instruction kind");
  in.kind = InstrKind(p.kind());
  if (in.kind == InstrKind::Kernel) {
    std::optional<ir::OpKind> op = ir::lookupOp(p.op());
    if (!op)
      return invalid(where + ": unknown op '" + p.op() + "'");
    in.op = *op;
  }
  for (const pb::Attr &pa : p.attrs()) {
    llvm::Expected<ir::Attribute> a = fromProto(pa, where);
    if (!a)
      return a.takeError();
    if (!in.attrs.emplace(pa.name(), std::move(*a)).second)
      return invalid(where + ": attribute '" + pa.name() + "' given twice");
  }
  in.inputs.assign(p.inputs().begin(), p.inputs().end());
  in.outputs.assign(p.outputs().begin(), p.outputs().end());
  in.peer = p.peer();
  in.tag = p.tag();
  in.seedSalt = p.seed_salt();
  in.loc = p.loc();
  return llvm::Error::success();
}

llvm::Error fromProto(const pb::Stage &p, int si, StagePlan &s) {
  s.index = p.index();
  for (const pb::Slot &ps : p.slots()) {
    Slot sl;
    sl.name = ps.name();
    std::string what = llvm::formatv("stage {0} slot {1} '{2}'", si,
                                     s.slots.size(), sl.name);
    if (!pb::SlotKind_IsValid(ps.kind()))
      return invalid(what + " has an unknown kind");
    sl.kind = SlotKind(ps.kind());
    llvm::Expected<ir::DType> dtype = dtypeFrom(ps.dtype(), what);
    if (!dtype)
      return dtype.takeError();
    sl.dtype = *dtype;
    sl.shape.assign(ps.shape().begin(), ps.shape().end());
    sl.bytes = ps.bytes();
    sl.offset = ps.offset();
    sl.blob = ps.blob();
    sl.accum = ps.accum();
    sl.trainable = ps.trainable();
    s.slots.push_back(std::move(sl));
  }
  if (p.programs_size() != kNumPhases)
    return invalid(llvm::formatv("stage {0} has {1} programs, not {2}", si,
                                 p.programs_size(), kNumPhases));
  for (int ph = 0; ph < kNumPhases; ++ph)
    for (const pb::Instr &pi : p.programs(ph).instrs()) {
      std::string where = llvm::formatv("stage {0} {1} instr {2}", si,
                                        phaseName(Phase(ph)),
                                        s.programs[ph].size());
      Instr in;
      if (llvm::Error e = fromProto(pi, where, in))
        return e;
      s.programs[ph].push_back(std::move(in));
    }
  for (const pb::StateUpdate &u : p.fwd_updates())
    s.fwdUpdates.push_back({u.state(), u.value()});
  for (const pb::StateUpdate &u : p.step_updates())
    s.stepUpdates.push_back({u.state(), u.value()});
  for (const pb::Action &pa : p.actions()) {
    if (!pb::ActionKind_IsValid(pa.kind()))
      return invalid(llvm::formatv("stage {0}: unknown action kind", si));
    s.actions.push_back({ActionKind(pa.kind()), pa.microbatch()});
  }
  s.frameBytes = p.frame_bytes();
  s.stepFrameBytes = p.step_frame_bytes();
  s.lossSlot = p.loss_slot();
  s.predictedF = p.predicted_f();
  s.predictedB = p.predicted_b();
  s.predictedW = p.predicted_w();
  s.predictedPeakBytes = p.predicted_peak_bytes();
  return llvm::Error::success();
}

llvm::Expected<Plan> fromProto(const pb::Header &h) {
  if (h.version() != kPlanFileVersion)
    return invalid(llvm::formatv("header version {0} in a version {1} file",
                                 h.version(), kPlanFileVersion));
  Plan plan;
  plan.version = kPlanVersion;
  plan.modelName = h.model_name();
  plan.sourceModel = h.source_model();
  plan.schedule = h.schedule();
  plan.microbatches = h.microbatches();
  for (const pb::Input &pi : h.inputs()) {
    PlanInput in;
    in.name = pi.name();
    llvm::Expected<ir::DType> dtype = dtypeFrom(pi.dtype(), "input '" + in.name + "'");
    if (!dtype)
      return dtype.takeError();
    in.dtype = *dtype;
    in.shape.assign(pi.shape().begin(), pi.shape().end());
    plan.inputs.push_back(std::move(in));
  }
  plan.optimizer = h.optimizer();
  plan.lr = h.lr();
  plan.stages.resize(h.stages_size());
  for (int si = 0; si < h.stages_size(); ++si)
    if (llvm::Error e = fromProto(h.stages(si), si, plan.stages[si]))
      return std::move(e);
  plan.blobs.resize(h.blobs_size());
  for (int b = 0; b < h.blobs_size(); ++b)
    plan.blobs[b].checksum = h.blobs(b).checksum();
  plan.predictedStepTime = h.predicted_step_time();
  return std::move(plan);
}

} // namespace

//===----------------------------------------------------------------------===//
// writePlanFile
//===----------------------------------------------------------------------===//

namespace {

void putLE(std::string &out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(char((v >> (8 * i)) & 0xff));
}

uint64_t getLE(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

// An output file that is removed unless commit() succeeds.
class TempFile {
public:
  TempFile(std::string tmp, std::string path)
      : tmp_(std::move(tmp)), path_(std::move(path)) {}
  ~TempFile() {
    if (f_)
      std::fclose(f_);
    if (!committed_)
      std::remove(tmp_.c_str());
  }

  llvm::Error open() {
    f_ = std::fopen(tmp_.c_str(), "wb");
    return f_ ? llvm::Error::success() : sysError("cannot create " + tmp_);
  }
  llvm::Error write(const void *data, size_t n) {
    if (n && std::fwrite(data, 1, n, f_) != n)
      return sysError("cannot write");
    return llvm::Error::success();
  }
  llvm::Error zeros(size_t n) {
    static const char z[kAlign] = {};
    return write(z, n);
  }
  llvm::Error commit() {
    bool ok = std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
    int err = errno;
    ok = std::fclose(f_) == 0 && ok;
    f_ = nullptr;
    if (!ok) {
      errno = err ? err : errno;
      return sysError("cannot write");
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0)
      return sysError("cannot rename " + tmp_ + " to it");
    committed_ = true;
    return llvm::Error::success();
  }

private:
  llvm::Error sysError(const std::string &what) {
    return fail(path_ + ": " + what + ": " + std::strerror(errno));
  }
  std::string tmp_, path_;
  FILE *f_ = nullptr;
  bool committed_ = false;
};

} // namespace

llvm::Error writePlanFile(const Plan &plan, const std::string &path) {
  if (llvm::Error e = verifyPlan(plan))
    return atPath(path, std::move(e));
  // Tensor attributes known only by reference are stored by value.
  for (const StagePlan &s : plan.stages)
    for (const auto &program : s.programs)
      for (const Instr &in : program)
        for (const auto &[name, a] : in.attrs)
          if (a.kind() == ir::AttrKind::Tensor && !a.getTensor()->isLoaded())
            if (llvm::Error e = a.getTensor()->load())
              return fail(path + ": cannot write: " +
                          llvm::toString(std::move(e)));
  pb::Header header = toProto(plan);

  // Place the blobs after the header. Offsets are fixed64 and never 0, so
  // the header's size is known before they are; iterate anyway in case a
  // future field makes it depend on them.
  std::string headerBytes;
  bool placed = false;
  for (int round = 0; round < 8 && !placed; ++round) {
    size_t size = header.ByteSizeLong();
    if (size > size_t(INT_MAX))
      return fail(path + ": cannot write: the plan header exceeds 2 GiB");
    uint64_t at = alignUp(kPreambleBytes + size);
    for (pb::BlobRef &r : *header.mutable_blobs()) {
      r.set_offset(at);
      at = alignUp(at + r.size());
    }
    placed = header.ByteSizeLong() == size;
  }
  if (!placed)
    return fail(path + ": cannot write: the header size does not settle");
  if (!header.SerializeToString(&headerBytes))
    return fail(path + ": cannot write: the plan header does not serialize");

  std::string preamble(kMagic, kMagicBytes);
  putLE(preamble, kPlanFileVersion, 4);
  putLE(preamble, headerBytes.size(), 8);

  TempFile out(path + ".tmp-" + std::to_string(::getpid()), path);
  if (llvm::Error e = out.open())
    return e;
  uint64_t at = 0;
  auto put = [&](const void *data, size_t n) {
    at += n;
    return out.write(data, n);
  };
  auto padTo = [&](uint64_t target) {
    uint64_t n = target - at;
    at = target;
    return out.zeros(n);
  };
  if (llvm::Error e = put(preamble.data(), preamble.size()))
    return e;
  if (llvm::Error e = put(headerBytes.data(), headerBytes.size()))
    return e;
  for (size_t b = 0; b < plan.blobs.size(); ++b) {
    if (llvm::Error e = padTo(header.blobs(b).offset()))
      return e;
    const std::vector<uint8_t> &bytes = plan.blobs[b].bytes;
    if (llvm::Error e = put(bytes.data(), bytes.size()))
      return e;
  }
  if (llvm::Error e = padTo(alignUp(at)))
    return e;
  return out.commit();
}

//===----------------------------------------------------------------------===//
// readPlanFile
//===----------------------------------------------------------------------===//

llvm::Expected<Plan> readPlanFile(const std::string &path,
                                  std::optional<int> onlyStage) {
  auto error = [&](const llvm::Twine &msg) { return fail(path + ": " + msg); };
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return error(llvm::Twine("cannot open: ") + std::strerror(errno));
  in.seekg(0, std::ios::end);
  std::streamoff endPos = in.tellg();
  if (endPos < 0)
    return error("cannot read");
  uint64_t fileSize = uint64_t(endPos);
  in.seekg(0);

  unsigned char preamble[kPreambleBytes];
  in.read(reinterpret_cast<char *>(preamble), kMagicBytes);
  if (!in || std::memcmp(preamble, kMagic, kMagicBytes) != 0)
    return error("not a cleave plan");
  if (fileSize < kPreambleBytes)
    return error("truncated: the file ends inside its preamble");
  in.read(reinterpret_cast<char *>(preamble + kMagicBytes),
          kPreambleBytes - kMagicBytes);
  if (!in)
    return error("cannot read the preamble");
  uint64_t version = getLE(preamble + kMagicBytes, 4);
  if (version != kPlanFileVersion)
    return error(llvm::formatv("plan format version {0}; this cleave reads "
                               "version {1}: recompile the model with this "
                               "cleavec",
                               version, kPlanFileVersion));
  uint64_t headerBytes = getLE(preamble + kMagicBytes + 4, 8);
  if (headerBytes > fileSize - kPreambleBytes)
    return error(llvm::formatv("truncated: the header needs {0} bytes after "
                               "the preamble; the file has {1} bytes in all",
                               headerBytes, fileSize));
  if (headerBytes > uint64_t(INT_MAX))
    return error("invalid plan: the header exceeds 2 GiB");

  pb::Header header;
  {
    std::string buf(headerBytes, '\0');
    in.read(buf.data(), std::streamsize(headerBytes));
    if (!in)
      return error("cannot read the header");
    if (!header.ParseFromArray(buf.data(), int(buf.size())))
      return error("invalid plan: the header does not parse");
  }
  llvm::Expected<Plan> planOr = fromProto(header);
  if (!planOr)
    return atPath(path, planOr.takeError());
  Plan plan = std::move(*planOr);
  int nstages = int(plan.stages.size());

  // The blob table: inside the file, after the header, aligned.
  uint64_t dataStart = alignUp(kPreambleBytes + headerBytes);
  std::vector<uint64_t> sizes;
  for (const pb::BlobRef &r : header.blobs())
    sizes.push_back(r.size());
  if (llvm::Error e = verifyPlanWith(plan, sizes))
    return atPath(path, std::move(e));

  // What a blob is called in errors: its first slot.
  auto blobName = [&](int b) -> std::string {
    for (const StagePlan &s : plan.stages)
      for (const Slot &sl : s.slots)
        if (sl.blob == b)
          return llvm::formatv("blob of slot '{0}' (stage {1})", sl.name,
                               s.index);
    return llvm::formatv("blob {0}", b);
  };
  for (int b = 0; b < header.blobs_size(); ++b) {
    const pb::BlobRef &r = header.blobs(b);
    if (r.stage() < -1 || r.stage() >= nstages)
      return error(llvm::formatv("invalid plan: {0} belongs to stage {1}",
                                 blobName(b), r.stage()));
    if (r.offset() % kAlign != 0 || r.offset() < dataStart)
      return error(llvm::formatv("invalid plan: {0} is at bad offset {1}",
                                 blobName(b), r.offset()));
    if (r.offset() > fileSize || r.size() > fileSize - r.offset())
      return error(llvm::formatv("truncated: {0} ends at byte {1}; the file "
                                 "has {2} bytes",
                                 blobName(b), r.offset() + r.size(),
                                 fileSize));
  }

  std::vector<bool> wanted(plan.blobs.size(), !onlyStage);
  if (onlyStage) {
    if (*onlyStage < 0 || *onlyStage >= nstages)
      return error(llvm::formatv("no stage {0} (the plan has {1} stages)",
                                 *onlyStage, nstages));
    for (const Slot &sl : plan.stages[*onlyStage].slots)
      if (sl.blob >= 0)
        wanted[sl.blob] = true;
  }
  for (size_t b = 0; b < plan.blobs.size(); ++b) {
    if (!wanted[b])
      continue;
    const pb::BlobRef &r = header.blobs(int(b));
    Blob &blob = plan.blobs[b];
    blob.bytes.resize(r.size());
    in.seekg(std::streamoff(r.offset()));
    in.read(reinterpret_cast<char *>(blob.bytes.data()),
            std::streamsize(r.size()));
    if (!in)
      return error("cannot read the " + blobName(int(b)));
    if (fnv1a64(blob.bytes.data(), blob.bytes.size()) != blob.checksum)
      return error(blobName(int(b)) + " is corrupt: checksum mismatch");
  }
  return std::move(plan);
}

//===----------------------------------------------------------------------===//
// printPlan
//===----------------------------------------------------------------------===//

namespace {

std::string quoted(llvm::StringRef s) { return ir::quoteString(s); }
std::string number(double v) { return ir::formatDouble(v); }

std::string attrText(const ir::Attribute &a) {
  auto list = [](const auto &vals, auto fmt) {
    std::string s = "[";
    for (size_t i = 0; i < vals.size(); ++i)
      s += (i ? ", " : "") + fmt(vals[i]);
    return s + "]";
  };
  auto floatText = [](float f) { return ir::formatFloat(f); };
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
  uint64_t blobBytes = 0;
  for (const Blob &b : plan.blobs)
    blobBytes += b.bytes.size();
  os << "plan " << quoted(plan.modelName) << " (format version "
     << plan.version << ")\n";
  if (!plan.sourceModel.empty())
    os << "  source " << quoted(plan.sourceModel) << "\n";
  os << "  schedule " << plan.schedule << ", " << plan.stages.size()
     << " stages, " << plan.microbatches << " microbatches\n";
  for (const PlanInput &in : plan.inputs)
    os << "  input " << quoted(in.name) << " : "
       << typeText(in.dtype, in.shape) << "\n";
  os << "  optimizer " << (plan.optimizer.empty() ? "none" : plan.optimizer)
     << ", lr " << number(plan.lr) << "\n";
  os << "  blobs " << plan.blobs.size() << " (" << blobBytes
     << " bytes loaded)\n";
  if (plan.predictedStepTime > 0)
    os << "  predicted step time " << ms(plan.predictedStepTime) << "\n";

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
    os << "  predicted: F " << ms(s.predictedF) << ", B " << ms(s.predictedB)
       << ", W " << ms(s.predictedW) << ", peak " << s.predictedPeakBytes
       << " B\n";
  }
}

} // namespace cleave::runtime
