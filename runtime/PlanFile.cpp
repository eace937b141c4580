// Writes and reads .cplan files (runtime/PlanFile.h, docs/design/plan.md).
//
// The file is a preamble (magic, u32 format version, u64 header length), the
// protobuf header (plan.proto), zero padding to a multiple of 64, then the
// blobs, each starting at a multiple of 64. The header's blob table gives
// each blob's absolute offset, size and FNV-1a checksum.
//
// The reader treats the file as untrusted input: every index, enum, dtype and
// op name coming from the header is checked while converting it to a Plan,
// and the Plan then goes through verifyPlan (PlanVerifier.cpp), so a corrupt
// file ends in one error line. Blobs are read with seeks, one at a time, only
// those wanted.
#include "runtime/PlanFile.h"

#include "runtime/PlanTypes.h"

#include "plan.pb.h" // generated from runtime/plan.proto
#include "support/Checksum.h"
#include "support/FileIO.h"
#include "support/Limits.h"
#include "support/TrustedPaths.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <unistd.h>

namespace cleave::runtime {

namespace pb = cleave::plan;

namespace {

constexpr char kMagic[] = "CLEAVEPLAN"; // written with its '\0': 11 bytes
constexpr size_t kMagicBytes = sizeof(kMagic);
constexpr uint64_t kPreambleBytes = kMagicBytes + 4 + 8;
constexpr uint64_t kAlign = 64;

uint64_t alignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Prefixes an error's message with "<path>: ".
llvm::Error atPath(const std::string &path, llvm::Error e) {
  if (!e)
    return e;
  return fail(path + ": " + llvm::toString(std::move(e)));
}

// The header's counts against support/Limits.h's large bounds, before
// anything is sized by them: a microbatch count of 2^31-1 took the verifier
// tens of seconds and gigabytes before its error.
llvm::Error checkHeaderCounts(const pb::Header &h) {
  const support::SizeLimits limits = support::largeLimits();
  int64_t stages = h.stages_size(), dp = std::max<int64_t>(h.data_parallel(), 1);
  if (h.microbatches() > limits.microbatches)
    return invalidPlan(
        llvm::formatv("{0} microbatches; cleave runs at most {1}",
                      h.microbatches(), limits.microbatches));
  if (stages > limits.workers || dp > limits.workers / std::max<int64_t>(stages, 1))
    return invalidPlan(llvm::formatv("{0} stages x {1} data-parallel replicas; "
                                     "cleave runs at most {2} workers",
                                     stages, dp, limits.workers));
  return llvm::Error::success();
}

} // namespace

//===----------------------------------------------------------------------===//
// Plan -> header
//===----------------------------------------------------------------------===//

namespace {

// A name, element type and shape (a PlanInput or a PlanTensor) as an Input
// record.
template <typename T> pb::Input *namedTensorTo(const T &t, pb::Input &p) {
  p.set_name(t.name);
  p.set_dtype(std::string(ir::dtypeName(t.dtype)));
  p.mutable_shape()->Add(t.shape.begin(), t.shape.end());
  return &p;
}

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
  p.set_wait_copies(in.waitCopies);
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
  p.set_host_frame_bytes(s.hostFrameBytes);
  p.set_loss_slot(s.lossSlot);
  p.set_accuracy_scores_slot_plus1(s.accuracyScoresSlot + 1);
  p.set_accuracy_labels_slot_plus1(s.accuracyLabelsSlot + 1);
  p.set_has_ignore_index(s.hasIgnoreIndex);
  p.set_ignore_index(s.ignoreIndex);
  p.set_predicted_f(s.predictedF);
  p.set_predicted_b(s.predictedB);
  p.set_predicted_w(s.predictedW);
  p.set_predicted_peak_bytes(s.predictedPeakBytes);
  p.set_w_batch(s.wBatch);
  for (int i : s.wBatchProduct)
    p.add_w_batch_product(i);
  for (int i : s.wBatchSummed)
    p.add_w_batch_summed(i);
  p.set_w_batch_scratch_bytes(s.wBatchScratchBytes);
}

// The header, with every blob's offset left at 0 for the caller to place.
pb::Header toProto(const Plan &plan) {
  pb::Header h;
  h.set_version(kPlanFileVersion);
  h.set_model_name(plan.modelName);
  h.set_source_model(plan.sourceModel);
  h.set_schedule(plan.schedule);
  h.set_microbatches(plan.microbatches);
  h.set_data_parallel(plan.dataParallel);
  for (const PlanInput &in : plan.inputs) {
    pb::Input *pi = namedTensorTo(in, *h.add_inputs());
    pi->set_index_limit(in.indexLimit);
    pi->set_indexes(in.indexes);
    pi->set_labels(in.labels);
    pi->set_label_shift(in.labelShift);
  }
  for (const PlanTensor &t : plan.modelTensors)
    namedTensorTo(t, *h.add_model_tensors());
  h.set_optimizer(plan.optimizer);
  h.set_lr(plan.lr);
  h.set_precision(plan.precision);
  for (const StagePlan &s : plan.stages)
    toProto(s, *h.add_stages());
  for (int r : plan.stageRank)
    h.add_stage_rank(r);
  for (const std::vector<int> &prog : plan.rankPrograms) {
    pb::RankProgram *rp = h.add_rank_programs();
    for (int st : prog)
      rp->add_stages(st);
  }
  std::vector<int> owner(plan.blobs.size(), -1);
  for (const StagePlan &s : plan.stages)
    for (const Slot &sl : s.slots)
      if (sl.blob >= 0 && owner[sl.blob] < 0)
        owner[sl.blob] = s.index;
  for (size_t b = 0; b < plan.blobs.size(); ++b) {
    const Blob &blob = plan.blobs[b];
    pb::BlobRef *r = h.add_blobs();
    r->set_stage(owner[b]);
    r->set_size(blob.byteSize());
    if (blob.referenced()) {
      // Its bytes are not in memory: the compiler summed them as it read.
      r->set_weight_file(uint32_t(blob.file) + 1);
      r->set_offset(blob.offset);
      r->set_checksum(blob.checksum);
    } else if (blob.filled()) {
      r->set_fill(std::string(blob.fill.begin(), blob.fill.end()));
    } else {
      r->set_checksum(
          support::blockChecksum(blob.bytes.data(), blob.bytes.size()));
    }
  }
  for (const WeightFile &f : plan.weightFiles) {
    pb::WeightFile *w = h.add_weight_files();
    w->set_path(f.path);
    w->set_size(f.size);
  }
  h.set_predicted_step_time(plan.predictedStepTime);
  h.set_predicted_period(plan.predictedPeriod);
  h.set_source_model_size(plan.sourceModelSize);
  h.set_source_model_sha256(plan.sourceModelSha256);
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
  return invalidPlan(what + " has unknown dtype '" + name + "'");
}

// An Input record as a PlanInput or a PlanTensor; `what` names it in
// errors.
template <typename T>
llvm::Error namedTensorFrom(const pb::Input &p, const char *what, T &t) {
  t.name = p.name();
  llvm::Expected<ir::DType> dtype =
      dtypeFrom(p.dtype(), std::string(what) + " '" + t.name + "'");
  if (!dtype)
    return dtype.takeError();
  t.dtype = *dtype;
  t.shape.assign(p.shape().begin(), p.shape().end());
  return llvm::Error::success();
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
    return ir::Attribute(
        std::vector<int64_t>(p.ints().begin(), p.ints().end()));
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
      return invalidPlan(llvm::formatv("{0}: {1} bytes for {2}", what,
                                       t.data().size(),
                                       typeText(*dtype, shape)));
    return ir::Attribute(std::make_shared<ir::TensorData>(
        ir::TensorType(*dtype, ir::Shape(shape.begin(), shape.end())),
        t.data()));
  }
  default:
    return invalidPlan(what + " has an unknown kind");
  }
}

llvm::Error fromProto(const pb::Instr &p, const std::string &where, Instr &in) {
  if (!pb::InstrKind_IsValid(p.kind()))
    return invalidPlan(where + ": unknown instruction kind");
  in.kind = InstrKind(p.kind());
  if (in.kind == InstrKind::Kernel) {
    std::optional<ir::OpKind> op = ir::lookupOp(p.op());
    if (!op)
      return invalidPlan(where + ": unknown op '" + p.op() + "'");
    in.op = *op;
  }
  for (const pb::Attr &pa : p.attrs()) {
    llvm::Expected<ir::Attribute> a = fromProto(pa, where);
    if (!a)
      return a.takeError();
    if (!in.attrs.emplace(pa.name(), std::move(*a)).second)
      return invalidPlan(where + ": attribute '" + pa.name() + "' given twice");
  }
  in.inputs.assign(p.inputs().begin(), p.inputs().end());
  in.outputs.assign(p.outputs().begin(), p.outputs().end());
  in.peer = p.peer();
  in.tag = p.tag();
  in.seedSalt = p.seed_salt();
  in.loc = p.loc();
  in.waitCopies = p.wait_copies();
  return llvm::Error::success();
}

llvm::Error fromProto(const pb::Stage &p, int si, StagePlan &s) {
  s.index = p.index();
  for (const pb::Slot &ps : p.slots()) {
    Slot sl;
    sl.name = ps.name();
    std::string what =
        llvm::formatv("stage {0} slot {1} '{2}'", si, s.slots.size(), sl.name);
    if (!pb::SlotKind_IsValid(ps.kind()))
      return invalidPlan(what + " has an unknown kind");
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
    return invalidPlan(llvm::formatv("stage {0} has {1} programs, not {2}", si,
                                     p.programs_size(), kNumPhases));
  for (int ph = 0; ph < kNumPhases; ++ph)
    for (const pb::Instr &pi : p.programs(ph).instrs()) {
      std::string where =
          llvm::formatv("stage {0} {1} instr {2}", si, phaseName(Phase(ph)),
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
      return invalidPlan(llvm::formatv("stage {0}: unknown action kind", si));
    s.actions.push_back({ActionKind(pa.kind()), pa.microbatch()});
  }
  s.frameBytes = p.frame_bytes();
  s.stepFrameBytes = p.step_frame_bytes();
  s.hostFrameBytes = p.host_frame_bytes();
  s.lossSlot = p.loss_slot();
  s.accuracyScoresSlot = p.accuracy_scores_slot_plus1() - 1;
  s.accuracyLabelsSlot = p.accuracy_labels_slot_plus1() - 1;
  s.hasIgnoreIndex = p.has_ignore_index();
  s.ignoreIndex = p.ignore_index();
  s.predictedF = p.predicted_f();
  s.predictedB = p.predicted_b();
  s.predictedW = p.predicted_w();
  s.predictedPeakBytes = p.predicted_peak_bytes();
  s.wBatch = p.w_batch();
  s.wBatchProduct.assign(p.w_batch_product().begin(),
                         p.w_batch_product().end());
  s.wBatchSummed.assign(p.w_batch_summed().begin(), p.w_batch_summed().end());
  s.wBatchScratchBytes = p.w_batch_scratch_bytes();
  return llvm::Error::success();
}

llvm::Expected<Plan> fromProto(const pb::Header &h) {
  if (h.version() != kPlanFileVersion)
    return invalidPlan(llvm::formatv("header version {0} in a version {1} file",
                                     h.version(), kPlanFileVersion));
  Plan plan;
  plan.version = kPlanVersion;
  plan.modelName = h.model_name();
  plan.sourceModel = h.source_model();
  plan.schedule = h.schedule();
  plan.microbatches = h.microbatches();
  plan.dataParallel = h.data_parallel() > 0 ? h.data_parallel() : 1;
  for (const pb::Input &pi : h.inputs()) {
    PlanInput &in = plan.inputs.emplace_back();
    if (auto e = namedTensorFrom(pi, "input", in))
      return std::move(e);
    in.indexLimit = pi.index_limit();
    in.indexes = pi.indexes();
    in.labels = pi.labels();
    in.labelShift = pi.label_shift();
  }
  for (const pb::Input &pt : h.model_tensors())
    if (auto e = namedTensorFrom(pt, "model tensor",
                                 plan.modelTensors.emplace_back()))
      return std::move(e);
  plan.optimizer = h.optimizer();
  plan.lr = h.lr();
  plan.precision = h.precision().empty() ? "f32" : h.precision();
  plan.stages.resize(h.stages_size());
  for (int si = 0; si < h.stages_size(); ++si)
    if (llvm::Error e = fromProto(h.stages(si), si, plan.stages[si]))
      return std::move(e);
  plan.stageRank.assign(h.stage_rank().begin(), h.stage_rank().end());
  for (const pb::RankProgram &rp : h.rank_programs())
    plan.rankPrograms.emplace_back(rp.stages().begin(), rp.stages().end());
  for (const pb::WeightFile &w : h.weight_files())
    plan.weightFiles.push_back({w.path(), w.size()});
  plan.blobs.resize(h.blobs_size());
  for (int b = 0; b < h.blobs_size(); ++b) {
    const pb::BlobRef &r = h.blobs(b);
    Blob &blob = plan.blobs[b];
    blob.checksum = r.checksum();
    if (!r.fill().empty()) {
      size_t w = r.fill().size();
      if ((w != 1 && w != 2 && w != 4 && w != 8) || r.size() % w != 0 ||
          r.weight_file())
        return invalidPlan(llvm::formatv(
            "blob {0}: a fill of {1} bytes over {2}", b, w, r.size()));
      blob.fill.assign(r.fill().begin(), r.fill().end());
      blob.size = r.size();
      continue;
    }
    if (r.weight_file() == 0)
      continue;
    if (r.weight_file() > uint32_t(h.weight_files_size()))
      return invalidPlan(
          llvm::formatv("blob {0} names weight file {1}; the plan "
                        "has {2}",
                        b, r.weight_file(), h.weight_files_size()));
    blob.file = int(r.weight_file()) - 1;
    blob.offset = r.offset();
    blob.size = r.size();
    const WeightFile &f = plan.weightFiles[size_t(blob.file)];
    if (blob.offset > f.size || blob.size > f.size - blob.offset)
      return invalidPlan(
          llvm::formatv("blob {0} ends at byte {1} of weight file "
                        "'{2}', which has {3}",
                        b, blob.offset + blob.size, f.path, f.size));
  }
  plan.predictedStepTime = h.predicted_step_time();
  plan.predictedPeriod = h.predicted_period();
  plan.sourceModelSize = h.source_model_size();
  plan.sourceModelSha256 = h.source_model_sha256();
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
  // Streamed through its own temp file (blobs are not copied into one
  // buffer), under support::writeFileAtomically's rule on targets.
  if (llvm::Error e = support::checkOutputFile(path))
    return e;
  if (llvm::Error e = verifyPlan(plan))
    return atPath(path, std::move(e));
  // Tensor attributes known only by reference are stored by value.
  for (const StagePlan &s : plan.stages)
    for (const auto &program : s.programs)
      for (const Instr &in : program)
        for (const auto &[name, a] : in.attrs)
          if (a.kind() == ir::AttrKind::Tensor && !a.getTensor()->isLoaded())
            if (llvm::Error e = a.getTensor()->load())
              return fail(path +
                          ": cannot write: " + llvm::toString(std::move(e)));
  pb::Header header = toProto(plan);
  // The files the plan refers to are named from its folder, so that a
  // reader can hold them to it (support/TrustedPaths.h).
  std::string folder = support::folderOf(path);
  header.set_source_model(support::relativeIfInside(plan.sourceModel, folder));
  for (pb::WeightFile &w : *header.mutable_weight_files())
    w.set_path(support::relativeIfInside(w.path(), folder));

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
      if (r.weight_file() || !r.fill().empty())
        continue; // in its weight file, or nothing to store
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
    if (plan.blobs[b].referenced() || plan.blobs[b].filled())
      continue;
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
                                  std::optional<int> onlyStage,
                                  const support::TrustedFolders &trusted) {
  return readPlanFile(path, onlyStage, false, trusted);
}

llvm::Expected<Plan> readPlanFileForRank(const std::string &path, int rank,
                                         const support::TrustedFolders &trusted) {
  return readPlanFile(path, rank, true, trusted);
}

llvm::Expected<Plan> readPlanFile(const std::string &path,
                                  std::optional<int> only, bool byRank,
                                  const support::TrustedFolders &trusted) {
  std::optional<int> onlyStage = only;
  auto error = [&](const llvm::Twine &msg) { return fail(path + ": " + msg); };
  // Mapped, not read: only the header and the wanted blobs are touched.
  auto file = support::readFile(path, "plan");
  if (!file)
    return file.takeError();
  const unsigned char *bytes =
      reinterpret_cast<const unsigned char *>((*file)->getBufferStart());
  uint64_t fileSize = (*file)->getBufferSize();

  if (fileSize < kMagicBytes || std::memcmp(bytes, kMagic, kMagicBytes) != 0)
    return error("not a cleave plan");
  if (fileSize < kPreambleBytes)
    return error("truncated: the file ends inside its preamble");
  const unsigned char *preamble = bytes;
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
  if (!header.ParseFromArray(bytes + kPreambleBytes, int(headerBytes)))
    return error("invalid plan: the header does not parse");
  if (llvm::Error e = checkHeaderCounts(header))
    return atPath(path, std::move(e));
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
  if (llvm::Error e = verifyPlan(plan, sizes))
    return atPath(path, std::move(e));

  // Referenced blobs are bounded by their files as held ones are by this
  // one: no stage allocates more state from them than the files hold.
  uint64_t weightBytes = 0;
  for (const WeightFile &w : plan.weightFiles)
    weightBytes += w.size;
  // Filled blobs (optimizer state) are bounded by the stage's other state:
  // AdamW keeps two moments per parameter.
  for (const StagePlan &s : plan.stages) {
    uint64_t referenced = 0, filled = 0, other = 0;
    for (const Slot &sl : s.slots) {
      if (sl.blob < 0)
        continue;
      const Blob &b = plan.blobs[size_t(sl.blob)];
      (b.referenced() ? referenced : b.filled() ? filled : other) +=
          sizes[size_t(sl.blob)]; // held bytes are not read yet
    }
    if (referenced > weightBytes)
      return error(llvm::formatv("invalid plan: stage {0} reads {1} bytes "
                                 "from weight files of {2} bytes",
                                 s.index, referenced, weightBytes));
    if (filled > 2 * (referenced + other) + (uint64_t(1) << 16))
      return error(llvm::formatv("invalid plan: stage {0} fills {1} bytes of "
                                 "state for {2} bytes of parameters",
                                 s.index, filled, referenced + other));
  }

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
    if (r.weight_file() || !r.fill().empty())
      continue; // fromProto checked its range against its weight file
    if (r.offset() % kAlign != 0 || r.offset() < dataStart)
      return error(llvm::formatv("invalid plan: {0} is at bad offset {1}",
                                 blobName(b), r.offset()));
    if (r.offset() > fileSize || r.size() > fileSize - r.offset())
      return error(llvm::formatv("truncated: {0} ends at byte {1}; the file "
                                 "has {2} bytes",
                                 blobName(b), r.offset() + r.size(), fileSize));
  }

  std::vector<bool> wanted(plan.blobs.size(), !onlyStage);
  if (onlyStage && byRank) {
    int ranks = rankCount(plan);
    if (*onlyStage < 0 || *onlyStage >= ranks)
      return error(llvm::formatv("no rank {0} (the plan has {1} ranks)",
                                 *onlyStage, ranks));
    for (int st : stagesOfRank(plan, *onlyStage))
      for (const Slot &sl : plan.stages[size_t(st)].slots)
        if (sl.blob >= 0)
          wanted[sl.blob] = true;
  } else if (onlyStage) {
    if (*onlyStage < 0 || *onlyStage >= nstages)
      return error(llvm::formatv("no stage {0} (the plan has {1} stages)",
                                 *onlyStage, nstages));
    for (const Slot &sl : plan.stages[*onlyStage].slots)
      if (sl.blob >= 0)
        wanted[sl.blob] = true;
  }
  // Weight files the wanted blobs read must be the ones compiled against:
  // same size now (each blob's checksum is checked as the executor loads
  // it, so a file is read once).
  std::vector<bool> fileWanted(plan.weightFiles.size(), false);
  for (size_t b = 0; b < plan.blobs.size(); ++b) {
    Blob &blob = plan.blobs[b];
    if (!wanted[b])
      continue;
    if (blob.referenced()) {
      fileWanted[size_t(blob.file)] = true;
      continue;
    }
    if (blob.filled())
      continue;
    const pb::BlobRef &r = header.blobs(int(b));
    blob.bytes.assign(bytes + r.offset(), bytes + r.offset() + r.size());
    if (support::blockChecksum(blob.bytes.data(), blob.bytes.size()) !=
        blob.checksum)
      return error(blobName(int(b)) + " is corrupt: checksum mismatch");
  }
  for (size_t f = 0; f < plan.weightFiles.size(); ++f) {
    if (!fileWanted[f])
      continue;
    WeightFile &w = plan.weightFiles[f];
    // Named from the plan's folder and held inside it (or a --trust-dir).
    auto resolved = support::resolveConfined(w.path, support::folderOf(path),
                                             trusted, "weight file");
    if (!resolved) {
      std::string msg = llvm::toString(resolved.takeError());
      if (llvm::StringRef(msg).startswith("cannot open"))
        msg += " (the plan refers to its weights; recompile the model or "
               "restore the file)";
      return error(msg);
    }
    w.path = *resolved;
    if (llvm::Error e = support::checkInputFile(w.path, "weight file"))
      return error(llvm::toString(std::move(e)) +
                   " (the plan refers to its weights; recompile the model "
                   "or restore the file)");
    uint64_t now = 0;
    if (llvm::sys::fs::file_size(w.path, now) || now != w.size)
      return error(llvm::formatv("weight file '{0}' is {1} bytes; the plan "
                                 "was compiled against {2}: it changed, "
                                 "recompile the model",
                                 w.path, now, w.size));
  }
  return std::move(plan);
}

llvm::Expected<uint64_t> planHeaderDigest(const std::string &path) {
  auto pre = support::readFileSlice(path, 0, kPreambleBytes, "plan");
  if (!pre)
    return pre.takeError();
  uint64_t headerBytes = getLE(
      reinterpret_cast<const unsigned char *>((*pre)->getBufferStart()) +
          kMagicBytes + 4,
      8);
  auto all = support::readFileSlice(path, 0, kPreambleBytes + headerBytes,
                                    "plan");
  if (!all)
    return all.takeError();
  return support::blockChecksum((*all)->getBufferStart(),
                                (*all)->getBufferSize());
}

llvm::Error resolveSourceModel(Plan &plan, const std::string &planPath,
                               const support::TrustedFolders &trusted) {
  auto error = [&](const llvm::Twine &msg) {
    return fail(planPath + ": " + msg);
  };
  if (plan.sourceModelSha256.empty())
    return error("the plan records no identity for its source model (an "
                 "older cleavec wrote it): recompile the model to use --save");
  auto resolved = support::resolveConfined(
      plan.sourceModel, support::folderOf(planPath), trusted, "source model");
  if (!resolved)
    return error(llvm::toString(resolved.takeError()));
  uint64_t size = 0;
  if (std::error_code ec = llvm::sys::fs::file_size(*resolved, size))
    return error("source model '" + *resolved + "': " + ec.message());
  if (size != plan.sourceModelSize)
    return error(llvm::formatv("source model '{0}' is {1} bytes; the plan was "
                               "compiled from {2}: it is another model, "
                               "recompile",
                               *resolved, size, plan.sourceModelSize));
  auto digest = support::sha256OfFile(*resolved, "source model");
  if (!digest)
    return error(llvm::toString(digest.takeError()));
  if (*digest != plan.sourceModelSha256)
    return error("source model '" + *resolved +
                 "' is not the model the plan was compiled from (its SHA-256 "
                 "differs): recompile");
  plan.sourceModel = *resolved;
  return llvm::Error::success();
}

} // namespace cleave::runtime
