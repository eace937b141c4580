// The Plan executor (see Executor.h for what it does). Layout of this file:
// seeds and error helpers, create() and its checks (slots, programs, state
// updates, the action list), runStep() and its pieces (frames, inputs,
// instructions, accumulation, loss), slot access, and the threaded driver.
#include "runtime/Executor.h"

#include "ir/OpInfo.h"

#include "support/Checksum.h"
#include "support/FileIO.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

namespace cleave::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double clockSeconds(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

llvm::Error fail(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

// Prefixes an error's message with `where` (no-op on success). A
// CommTimeout already names the stage, the peer and the message, and passes
// unchanged.
llvm::Error wrap(llvm::Error e, const llvm::Twine &where) {
  if (!e || e.isA<CommTimeout>())
    return e;
  return fail(where + ": " + llvm::toString(std::move(e)));
}

// The same with the context made only on failure (`where()` formats a
// string; made for every instruction it cost microseconds each).
template <typename F, typename = std::enable_if_t<std::is_invocable_v<F>>>
llvm::Error wrap(llvm::Error e, F &&where) {
  if (!e || e.isA<CommTimeout>())
    return e;
  return fail(where() + ": " + llvm::toString(std::move(e)));
}

// A referenced blob's bytes, read from its weight file a piece at a time
// straight into the slot's memory (one 8 MiB buffer, so loading adds no
// second copy of the weights), summed on the way.
llvm::Error loadReferenced(Backend &backend, const WeightFile &file,
                           const Blob &blob, void *dst,
                           const std::string &what) {
  support::BlockChecksum sum;
  uint64_t done = 0;
  if (auto e = support::streamFileRange(
          file.path, blob.offset, blob.size,
          [&](const uint8_t *p, size_t n) {
            sum.update(p, n);
            backend.copyToDevice(static_cast<char *>(dst) + done, p, n);
            done += n;
            return llvm::Error::success();
          },
          "weight file"))
    return fail(what + ": " + llvm::toString(std::move(e)));
  if (sum.value() != blob.checksum)
    return fail(llvm::formatv("{0}: its bytes in weight file '{1}' (at {2}, "
                              "{3} bytes) do not match the plan's checksum: "
                              "the file changed since the plan was "
                              "compiled; recompile the model",
                              what, file.path, blob.offset, blob.size));
  return llvm::Error::success();
}

// A filled blob: its element repeated over the slot, copied from one
// pattern buffer of at most 8 MiB.
void fillSlot(Backend &backend, const Blob &blob, void *dst) {
  std::vector<uint8_t> pattern(
      size_t(std::min<uint64_t>(blob.size, uint64_t(8) << 20)));
  for (size_t at = 0; at < pattern.size(); at += blob.fill.size())
    std::memcpy(pattern.data() + at, blob.fill.data(), blob.fill.size());
  for (uint64_t at = 0; at < blob.size; at += pattern.size())
    backend.copyToDevice(static_cast<char *>(dst) + at, pattern.data(),
                         size_t(std::min<uint64_t>(pattern.size(),
                                                   blob.size - at)));
}

// A receive's CommTimeout said again in the plan's terms: "no message from
// stage 0 (the activation 'x' of microbatch 3, tag 7) within 3 s
// (--comm-timeout)". Other errors pass unchanged.
llvm::Error nameTimeout(llvm::Error e, const std::string &peer,
                        const std::string &what, int64_t tag) {
  if (!e || !e.isA<CommTimeout>())
    return e;
  double seconds = 0;
  llvm::handleAllErrors(std::move(e), [&](const CommTimeout &t) {
    seconds = t.seconds;
  });
  return llvm::make_error<CommTimeout>(
      llvm::formatv("no message from {0} ({1}, tag {2}) {3}", peer, what, tag,
                    withinTimeout(seconds))
          .str(),
      seconds);
}

// What a Recv of `slot` in `phase` receives, for a timeout's message.
std::string messageText(Phase phase, const std::string &slot, int microbatch) {
  std::string mb = " of microbatch " + std::to_string(microbatch);
  switch (phase) {
  case Phase::F:
    return "the activation '" + slot + "'" + mb;
  case Phase::B:
    return "the gradient '" + slot + "'" + mb;
  case Phase::W:
    return "'" + slot + "'" + mb;
  case Phase::Step:
    break;
  }
  return "'" + slot + "' for the step";
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const ir::AttrMap &noAttrs() {
  static const ir::AttrMap m;
  return m;
}

std::string describeAction(const Action &a) {
  if (a.kind == ActionKind::Step)
    return "STEP";
  return llvm::formatv("{0} of microbatch {1}", actionKindName(a.kind),
                       a.microbatch)
      .str();
}

bool inFrame(SlotKind k) {
  return k == SlotKind::MicroTemp || k == SlotKind::Input;
}
bool isPersistent(SlotKind k) {
  return k == SlotKind::State || k == SlotKind::Const || k == SlotKind::Accum;
}

// The program phases an action runs, in order.
llvm::SmallVector<Phase, 2> phasesOf(ActionKind k) {
  switch (k) {
  case ActionKind::F: return {Phase::F};
  case ActionKind::B: return {Phase::B};
  case ActionKind::W: return {Phase::W};
  case ActionKind::BW: return {Phase::B, Phase::W};
  case ActionKind::Step: return {Phase::Step};
  }
  return {};
}

} // namespace

uint64_t kernelSeed(int64_t step, int microbatch, uint64_t seedSalt) {
  uint64_t h = splitmix64(uint64_t(step));
  h = splitmix64(h ^ uint64_t(int64_t(microbatch)));
  return splitmix64(h ^ seedSalt);
}

// ---------------------------------------------------------------------------
// Creation and checks.

StageExecutor::StageExecutor(const StagePlan &sp, int microbatches,
                             Backend &backend, Comm &comm)
    : stage_(sp), microbatches_(microbatches), backend_(backend), comm_(comm),
      hostMemory_(backend.name() == "cpu") {}

StageExecutor::~StageExecutor() {
  for (void *p : persistent_)
    if (p)
      backend_.release(p);
  if (stepFrame_)
    backend_.release(stepFrame_);
  for (void *p : allFrames_)
    backend_.release(p);
  if (reduceDevice_)
    backend_.release(reduceDevice_);
  if (wScratch_)
    backend_.release(wScratch_);
  if (clipScalar_)
    backend_.release(clipScalar_);
}

llvm::Expected<std::unique_ptr<StageExecutor>>
StageExecutor::create(const Plan &plan, int stage, Backend &backend,
                      Comm &comm) {
  if (stage < 0 || stage >= int(plan.stages.size()))
    return fail(llvm::formatv("stage {0}: the plan has {1} stages", stage,
                              plan.stages.size()));
  if (comm.rank() != stage || comm.size() != int(plan.stages.size()))
    return fail(llvm::formatv("stage {0}: the comm is rank {1} of {2}, the "
                              "plan has {3} stages",
                              stage, comm.rank(), comm.size(),
                              plan.stages.size()));
  if (plan.microbatches < 1)
    return fail(llvm::formatv("stage {0}: the plan has {1} microbatches",
                              stage, plan.microbatches));
  std::unique_ptr<StageExecutor> ex(new StageExecutor(
      plan.stages[stage], plan.microbatches, backend, comm));
  if (auto e = ex->prepare(plan))
    return wrap(std::move(e), "stage " + llvm::Twine(stage));
  return ex;
}

llvm::Error StageExecutor::prepare(const Plan &plan) {
  const StagePlan &sp = stage_;
  const int n = int(sp.slots.size());
  auto slotName = [&](int s) {
    return std::string("slot '") + sp.slots[s].name + "'";
  };
  persistent_.assign(n, nullptr);
  accumCount_.assign(n, 0);
  // The vote on non-finite values uses a tag no message of the plan has.
  for (const StagePlan &other : plan.stages)
    for (const auto &prog : other.programs)
      for (const Instr &in : prog)
        voteTag_ = std::max(voteTag_, in.tag + 1);
  normTag_ = voteTag_ + 1;
  indexClipping(plan);
  std::vector<int> feeders(n, 0); // by Accum slot: MicroTemps summed into it

  // Slots: sizes, placement, initial data.
  for (int s = 0; s < n; ++s) {
    const Slot &sl = sp.slots[s];
    byName_.emplace(sl.name, s);
    int64_t elems = 1;
    for (int64_t d : sl.shape) {
      if (d < 0)
        return fail(slotName(s) + ": negative dimension in its shape");
      elems *= d;
    }
    if (sl.bytes != elems * int64_t(ir::dtypeSize(sl.dtype)))
      return fail(llvm::formatv("{0}: {1} bytes, but {2} elements of {3} "
                                "need {4}",
                                slotName(s), sl.bytes, elems,
                                ir::dtypeName(sl.dtype),
                                elems * int64_t(ir::dtypeSize(sl.dtype))));
    switch (sl.kind) {
    case SlotKind::Input:
    case SlotKind::MicroTemp:
    case SlotKind::StepTemp: {
      int64_t frame = sl.kind == SlotKind::StepTemp ? sp.stepFrameBytes
                                                    : sp.frameBytes;
      if (sl.offset < 0 || sl.offset + sl.bytes > frame)
        return fail(llvm::formatv("{0} ({1}): bytes [{2}, {3}) outside its "
                                  "{4}-byte frame",
                                  slotName(s), slotKindName(sl.kind),
                                  sl.offset, sl.offset + sl.bytes, frame));
      break;
    }
    case SlotKind::State:
    case SlotKind::Const: {
      if (sl.blob < 0 || sl.blob >= int(plan.blobs.size()))
        return fail(llvm::formatv("{0} ({1}): blob {2} does not exist "
                                  "(the plan has {3})",
                                  slotName(s), slotKindName(sl.kind), sl.blob,
                                  plan.blobs.size()));
      const Blob &b = plan.blobs[sl.blob];
      if (int64_t(b.byteSize()) != sl.bytes)
        return fail(llvm::formatv("{0} ({1}): blob {2} has {3} bytes, the "
                                  "slot {4}",
                                  slotName(s), slotKindName(sl.kind), sl.blob,
                                  b.byteSize(), sl.bytes));
      persistent_[s] = backend_.allocate(size_t(sl.bytes));
      if (!persistent_[s])
        return fail(llvm::formatv("{0}: cannot allocate {1} bytes",
                                  slotName(s), sl.bytes));
      if (b.filled()) {
        fillSlot(backend_, b, persistent_[s]);
      } else if (b.referenced()) {
        if (b.file >= int(plan.weightFiles.size()))
          return fail(llvm::formatv("{0}: blob {1} names a weight file the "
                                    "plan does not have",
                                    slotName(s), sl.blob));
        if (auto e = loadReferenced(backend_, plan.weightFiles[size_t(b.file)],
                                    b, persistent_[s], slotName(s)))
          return e;
      } else {
        uint64_t sum = support::blockChecksum(b.bytes.data(), b.bytes.size());
        if (sum != b.checksum)
          return fail(llvm::formatv("{0} ({1}): blob {2} is corrupt "
                                    "(checksum {3:x16}, expected {4:x16})",
                                    slotName(s), slotKindName(sl.kind),
                                    sl.blob, sum, b.checksum));
        backend_.copyToDevice(persistent_[s], b.bytes.data(), b.bytes.size());
      }
      stats_.persistentBytes += sl.bytes;
      break;
    }
    case SlotKind::Accum:
      persistent_[s] = backend_.allocate(size_t(sl.bytes));
      if (!persistent_[s])
        return fail(llvm::formatv("{0}: cannot allocate {1} bytes",
                                  slotName(s), sl.bytes));
      stats_.persistentBytes += sl.bytes;
      break;
    }
    if (sl.accum >= 0) {
      if (sl.kind != SlotKind::MicroTemp)
        return fail(slotName(s) + " (" + slotKindName(sl.kind) +
                    "): only microbatch temporaries are accumulated");
      if (sl.accum >= n || sp.slots[sl.accum].kind != SlotKind::Accum)
        return fail(llvm::formatv("{0}: accumulator {1} is not an accum slot",
                                  slotName(s), sl.accum));
      const Slot &acc = sp.slots[sl.accum];
      if (acc.dtype != sl.dtype || acc.bytes != sl.bytes)
        return fail(slotName(s) + ": its accumulator '" + acc.name +
                    "' has a different type or size");
      if (++feeders[sl.accum] > 1)
        return fail("accum slot '" + acc.name +
                    "' sums more than one microbatch value");
      if (!backend_.supports(ir::OpKind::Add, sl.dtype))
        return fail(llvm::formatv("{0}: the {1} backend has no Add kernel "
                                  "for {2} to accumulate it",
                                  slotName(s), backend_.name(),
                                  ir::dtypeName(sl.dtype)));
    }
  }
  stepFrame_ = backend_.allocate(size_t(std::max<int64_t>(sp.stepFrameBytes, 0)));
  stats_.frameBytes = sp.frameBytes;
  stats_.stepFrameBytes = sp.stepFrameBytes;
  stats_.peakBytes = stats_.persistentBytes + sp.stepFrameBytes;

  // Programs: slot references, kernels, messages; which phase writes each
  // accumulated slot (the last phase that does, in F, B, W order).
  std::vector<int> writer(n, -1);
  for (int p = 0; p < kNumPhases; ++p) {
    Phase phase = Phase(p);
    for (size_t i = 0; i < sp.programs[p].size(); ++i) {
      const Instr &in = sp.programs[p][i];
      std::string where = llvm::formatv("{0} instr {1}", phaseName(phase), i);
      if (!in.loc.empty())
        where += " ('" + in.loc + "')";
      for (const auto *list : {&in.inputs, &in.outputs})
        for (int s : *list) {
          if (s < 0 || s >= n)
            return fail(llvm::formatv("{0}: slot {1} does not exist (the "
                                      "stage has {2})",
                                      where, s, n));
          if (phase == Phase::Step && inFrame(sp.slots[s].kind))
            return fail(where + ": the Step program uses " +
                        slotKindName(sp.slots[s].kind) + " slot '" +
                        sp.slots[s].name + "'");
        }
      for (int s : in.outputs) {
        SlotKind k = sp.slots[s].kind;
        if (k == SlotKind::Const || k == SlotKind::Input)
          return fail(where + ": writes " + slotKindName(k) + " slot '" +
                      sp.slots[s].name + "'");
        if (sp.slots[s].accum >= 0 && phase != Phase::Step)
          writer[s] = p;
      }
      switch (in.kind) {
      case InstrKind::Kernel: {
        ir::DType dt =
            in.inputs.empty() ? ir::DType::F32 : sp.slots[in.inputs[0]].dtype;
        if (!backend_.supports(in.op, dt))
          return fail(llvm::formatv("{0}: the {1} backend has no kernel for "
                                    "{2} on {3}",
                                    where, backend_.name(),
                                    ir::opInfo(in.op).name,
                                    ir::dtypeName(dt)));
        break;
      }
      case InstrKind::Send:
      case InstrKind::Recv: {
        bool send = in.kind == InstrKind::Send;
        if ((send ? in.inputs.size() : in.outputs.size()) != 1 ||
            (send ? in.outputs.size() : in.inputs.size()) != 0)
          return fail(where + (send ? ": a send takes one input slot"
                                    : ": a recv fills one output slot"));
        if (in.peer < 0 || in.peer >= comm_.size() || in.peer == sp.index)
          return fail(llvm::formatv("{0}: peer stage {1} is not another "
                                    "stage",
                                    where, in.peer));
        break;
      }
      }
    }
  }
  for (int s = 0; s < n; ++s) {
    if (sp.slots[s].accum < 0)
      continue;
    if (writer[s] < 0)
      return fail(slotName(s) + ": accumulated, but no F, B or W instruction "
                                "writes it");
    accumWrites_[writer[s]].push_back(s);
  }
  // Which values the first microbatch writes straight into their
  // accumulators: written by one kernel that is not a layout-only view,
  // read by no instruction, of the accumulator's type and size.
  std::vector<int> readers(n, 0), writes(n, 0);
  std::vector<bool> viewWritten(n, false);
  for (const auto &prog : sp.programs)
    for (const Instr &in : prog) {
      for (int s : in.inputs)
        ++readers[s];
      for (int s : in.outputs) {
        ++writes[s];
        if (in.kind != InstrKind::Kernel ||
            ir::opInfo(in.op).has(ir::optrait::LayoutOnly))
          viewWritten[s] = true;
      }
    }
  intoAccum_.assign(n, false);
  accumPreset_.assign(n, false);
  for (int s = 0; s < n; ++s) {
    int acc = sp.slots[s].accum;
    intoAccum_[s] = acc >= 0 && readers[s] == 0 && writes[s] == 1 &&
                    !viewWritten[s] &&
                    sp.slots[acc].dtype == sp.slots[s].dtype &&
                    sp.slots[acc].bytes == sp.slots[s].bytes;
  }

  // State updates.
  for (int which = 0; which < 2; ++which) {
    const auto &updates = which ? sp.stepUpdates : sp.fwdUpdates;
    const char *what = which ? "step update" : "forward update";
    for (size_t i = 0; i < updates.size(); ++i) {
      const StateUpdate &u = updates[i];
      if (u.state < 0 || u.state >= n || u.value < 0 || u.value >= n)
        return fail(llvm::formatv("{0} {1}: slot out of range", what, i));
      const Slot &st = sp.slots[u.state], &v = sp.slots[u.value];
      if (st.kind != SlotKind::State)
        return fail(llvm::formatv("{0} {1}: '{2}' is a {3} slot, not state",
                                  what, i, st.name, slotKindName(st.kind)));
      if (st.dtype != v.dtype || st.bytes != v.bytes)
        return fail(llvm::formatv("{0} {1}: '{2}' and '{3}' differ in type "
                                  "or size",
                                  what, i, st.name, v.name));
      if (which && inFrame(v.kind))
        return fail(llvm::formatv("{0} {1}: '{2}' is a microbatch value",
                                  what, i, v.name));
    }
  }

  // The loss.
  if (sp.lossSlot >= 0) {
    if (sp.lossSlot >= n)
      return fail(llvm::formatv("loss slot {0} does not exist", sp.lossSlot));
    const Slot &l = sp.slots[sp.lossSlot];
    if (!inFrame(l.kind) ||
        (l.dtype != ir::DType::F32 && l.dtype != ir::DType::F64) ||
        l.bytes != int64_t(ir::dtypeSize(l.dtype)))
      return fail("loss slot '" + l.name +
                  "' must be a microbatch f32 or f64 scalar");
  }
  indexWBatch();
  return checkActions();
}

void StageExecutor::setBatchW(bool on) {
  if (on && !stage_.wBatch) {
    planWBatch(stage_);
    indexWBatch();
  }
}

void StageExecutor::indexWBatch() {
  wSummed_.assign(stage_.slots.size(), false);
  for (int s : stage_.wBatchSummed)
    wSummed_[size_t(s)] = true;
}


// Actions first .. first + count - 1: W of consecutive microbatches, in
// order (runStep checked), run as one (setBatchW).
llvm::Error StageExecutor::runBatchedW(size_t first, size_t count,
                                       int64_t step) {
  const auto &acts = stage_.actions;
  const auto &prog = stage_.programs[int(Phase::W)];
  int m0 = acts[first].microbatch;
  std::vector<void *> frames;
  for (size_t j = 0; j < count; ++j) {
    auto it = live_.find(m0 + int(j));
    if (it == live_.end()) // checkActions() rules this out
      return fail("the microbatch has no frame");
    frames.push_back(it->second);
  }
  for (size_t i = 0; i < prog.size(); ++i) {
    const Instr &in = prog[i];
    int product = stage_.wBatchProduct[i];
    if (product < 0) { // per microbatch
      for (size_t j = 0; j < count; ++j)
        if (auto e = runInstr(in, i, Phase::W, step, m0 + int(j), frames[j]))
          return e;
      continue;
    }
    if (product != int(i)) {
      // In a product's chain: once, on the sum in the first frame, at its
      // own place in the program (the frame's memory plan assumes it).
      if (auto e = runInstr(in, i, Phase::W, step, m0, frames[0]))
        return e;
      continue;
    }
    // The operands of every microbatch, one after another.
    size_t bytes = 0;
    for (int s : in.inputs)
      bytes += size_t(stage_.slots[s].bytes) * count;
    if (bytes > wScratchBytes_) {
      backend_.release(wScratch_);
      wScratch_ = backend_.allocate(bytes);
      wScratchBytes_ = wScratch_ ? bytes : 0;
      if (!wScratch_)
        return fail(llvm::formatv("cannot allocate {0} bytes for batched W "
                                  "operands",
                                  bytes));
    }
    llvm::SmallVector<std::vector<int64_t>, 2> shapes;
    llvm::SmallVector<TensorRef, 2> ins;
    char *at = static_cast<char *>(wScratch_);
    for (int s : in.inputs) {
      const Slot &sl = stage_.slots[s];
      std::vector<int64_t> shape = sl.shape;
      shape[0] *= int64_t(count);
      shapes.push_back(shape);
      for (size_t j = 0; j < count; ++j) {
        TensorRef src{sl.dtype, sl.shape, slotData(s, frames[j])};
        TensorRef dst{sl.dtype, sl.shape, at + j * size_t(sl.bytes)};
        KernelCall copy{ir::OpKind::Identity, noAttrs(), src, dst, 0};
        if (auto e = backend_.run(copy))
          return wrap(std::move(e), "batching W operand '" + sl.name + "'");
      }
      ins.push_back({sl.dtype, {}, at});
      at += size_t(sl.bytes) * count;
    }
    for (size_t k = 0; k < ins.size(); ++k)
      ins[k].shape = shapes[k];
    const Slot &o = stage_.slots[in.outputs[0]];
    TensorRef out{o.dtype, o.shape, slotData(in.outputs[0], frames[0])};
    KernelCall call{in.op, in.attrs, ins, out,
                    kernelSeed(step, m0, in.seedSalt)};
    auto t0 = Clock::now();
    if (auto e = backend_.run(call))
      return wrap(std::move(e), llvm::formatv("W instr {0} ({1}, batched over "
                                              "{2} microbatches)",
                                              i, ir::opInfo(in.op).name,
                                              count)
                                    .str());
    if (profiling_) { // per microbatch, as the cost model reads it
      InstrProfile &p = profile_[{instrKey(in), Phase::W}];
      p.seconds += secondsSince(t0);
      p.calls += int64_t(count);
    }
    ++batchedProducts_;
    replacedProducts_ += int64_t(count);
  }
  // Sums: a batched chain's result (in the first frame) holds the whole
  // run's sum; everything else adds each microbatch in order.
  for (size_t j = 0; j < count; ++j)
    for (int s : accumWrites_[int(Phase::W)]) {
      int acc = stage_.slots[s].accum;
      bool summed = wSummed_[size_t(s)];
      if (summed && j > 0)
        continue;
      if (auto e = accumulateSlot(s, m0 + int(j), frames[j]))
        return e;
      if (summed)
        accumCount_[acc] += int(count) - 1;
    }
  for (size_t j = 0; j < count; ++j)
    if (lastAction_[m0 + int(j)] == int(first + j)) {
      live_.erase(m0 + int(j));
      giveFrame(frames[j]);
    }
  return llvm::Error::success();
}

llvm::Error StageExecutor::checkActions() {
  const int M = microbatches_;
  const auto &acts = stage_.actions;
  lastAction_.assign(M, -1);
  std::vector<int> forwards(M, 0);
  std::vector<int> count(stage_.slots.size(), 0);
  for (size_t i = 0; i < acts.size(); ++i) {
    const Action &a = acts[i];
    std::string where =
        llvm::formatv("action {0} ({1})", i, describeAction(a)).str();
    if (a.kind == ActionKind::Step) {
      for (int p = 0; p < 3; ++p)
        for (int s : accumWrites_[p]) {
          int acc = stage_.slots[s].accum;
          if (count[acc] != M)
            return fail(llvm::formatv("{0}: accumulator '{1}' has {2} of {3} "
                                      "microbatches summed",
                                      where, stage_.slots[acc].name,
                                      count[acc], M));
        }
      continue;
    }
    int mb = a.microbatch;
    if (mb < 0 || mb >= M)
      return fail(llvm::formatv("{0}: microbatch out of range (the plan has "
                                "{1})",
                                where, M));
    if (a.kind == ActionKind::F) {
      if (forwards[mb]++)
        return fail(where + ": a second F of the microbatch");
    } else if (!forwards[mb]) {
      return fail(where + ": comes before the microbatch's F");
    }
    for (Phase p : phasesOf(a.kind))
      for (int s : accumWrites_[int(p)]) {
        int acc = stage_.slots[s].accum;
        if (count[acc] != mb)
          return fail(llvm::formatv("{0}: sums '{1}' into '{2}' out of "
                                    "microbatch order (microbatch {3} is next)",
                                    where, stage_.slots[s].name,
                                    stage_.slots[acc].name, count[acc]));
        ++count[acc];
      }
    lastAction_[mb] = int(i);
  }
  for (int mb = 0; mb < M; ++mb)
    if (!forwards[mb])
      return fail(llvm::formatv("microbatch {0} has no F action", mb));
  return llvm::Error::success();
}

// ---------------------------------------------------------------------------
// Running a step.

void *StageExecutor::slotData(int slot, void *frame) const {
  const Slot &s = stage_.slots[slot];
  switch (s.kind) {
  case SlotKind::Input:
  case SlotKind::MicroTemp:
    return static_cast<char *>(frame) + s.offset;
  case SlotKind::StepTemp:
    return static_cast<char *>(stepFrame_) + s.offset;
  default:
    return persistent_[slot];
  }
}

llvm::Expected<void *> StageExecutor::takeFrame() {
  if (freeFrames_.empty()) {
    void *p = backend_.allocate(size_t(std::max<int64_t>(stage_.frameBytes, 0)));
    if (!p)
      return fail(llvm::formatv("cannot allocate a {0}-byte microbatch frame",
                                stage_.frameBytes));
    allFrames_.push_back(p);
    freeFrames_.push_back(p);
    stats_.framesAllocated = int(allFrames_.size());
  }
  void *f = freeFrames_.back();
  freeFrames_.pop_back();
  int inFlight = int(allFrames_.size() - freeFrames_.size());
  if (inFlight > stats_.maxFramesInFlight) {
    stats_.maxFramesInFlight = inFlight;
    stats_.peakBytes = stats_.persistentBytes +
                       int64_t(inFlight) * stage_.frameBytes +
                       stage_.stepFrameBytes;
  }
  return f;
}

void StageExecutor::giveFrame(void *frame) { freeFrames_.push_back(frame); }

std::string StageExecutor::instrKey(const Instr &in) const {
  // Recomputed ops (passes/Recompute.h) apart from the backward ops at
  // their location: the cost model times them by this key.
  if (!in.loc.empty())
    return in.attrs.count(ir::kRecomputeOfAttr) ? in.loc + " (recompute)"
                                                 : in.loc;
  switch (in.kind) {
  case InstrKind::Send:
    return "send " + stage_.slots[in.inputs[0]].name;
  case InstrKind::Recv:
    return "recv " + stage_.slots[in.outputs[0]].name;
  case InstrKind::Kernel:
    break;
  }
  std::string key(ir::opInfo(in.op).name);
  if (!in.outputs.empty())
    key += " " + stage_.slots[in.outputs[0]].name;
  return key;
}

llvm::Error StageExecutor::runInstr(const Instr &in, size_t index, Phase phase,
                                    int64_t step, int microbatch,
                                    void *frame) {
  auto where = [&] {
    std::string w = llvm::formatv("{0} instr {1}", phaseName(phase), index);
    if (in.kind == InstrKind::Kernel)
      w += " (" + std::string(ir::opInfo(in.op).name) +
           (in.loc.empty() ? "" : " '" + in.loc + "'") + ")";
    else
      w += in.kind == InstrKind::Send ? " (send" : " (recv";
    if (in.kind != InstrKind::Kernel)
      w += llvm::formatv(" '{0}' {1} stage {2}, tag {3})",
                         stage_.slots[in.kind == InstrKind::Send
                                          ? in.inputs[0]
                                          : in.outputs[0]]
                             .name,
                         in.kind == InstrKind::Send ? "to" : "from", in.peer,
                         in.tag)
               .str();
    return w;
  };
  switch (in.kind) {
  case InstrKind::Kernel: {
    // A reshape-like op whose result codegen placed on its operand's bytes
    // (Plan.h) has nothing to do.
    if (ir::opInfo(in.op).has(ir::optrait::LayoutOnly) &&
        in.inputs.size() == 1 && in.outputs.size() == 1 &&
        slotData(in.inputs[0], frame) == slotData(in.outputs[0], frame))
      return llvm::Error::success();
    llvm::SmallVector<TensorRef, 6> ins, outs;
    for (int s : in.inputs) {
      const Slot &sl = stage_.slots[s];
      ins.push_back({sl.dtype, sl.shape, slotData(s, frame)});
    }
    for (int s : in.outputs) {
      const Slot &sl = stage_.slots[s];
      void *p = slotData(s, frame);
      // The first microbatch's value of an accumulated slot nothing else
      // reads goes straight into the accumulator (accumulateSlot); a W
      // batch runs its microbatches' kernels before summing any, so only
      // microbatch 0's may.
      if (intoAccum_[s] && microbatch == 0 && accumCount_[sl.accum] == 0 &&
          !(size_t(s) < wSummed_.size() && wSummed_[size_t(s)])) {
        p = persistent_[sl.accum];
        accumPreset_[sl.accum] = true;
      }
      outs.push_back({sl.dtype, sl.shape, p});
    }
    KernelCall call{in.op, in.attrs, ins, outs,
                    kernelSeed(step, microbatch, in.seedSalt)};
    return wrap(backend_.run(call), where);
  }
  case InstrKind::Send: {
    const Slot &sl = stage_.slots[in.inputs[0]];
    void *p = slotData(in.inputs[0], frame);
    if (!hostMemory_) {
      staging_.resize(size_t(sl.bytes));
      backend_.copyToHost(staging_.data(), p, size_t(sl.bytes));
      p = staging_.data();
    }
    return wrap(comm_.send(in.peer, in.tag, microbatch, p, size_t(sl.bytes)),
                where);
  }
  case InstrKind::Recv: {
    const Slot &sl = stage_.slots[in.outputs[0]];
    void *dst = slotData(in.outputs[0], frame);
    void *p = dst;
    if (!hostMemory_) {
      staging_.resize(size_t(sl.bytes));
      p = staging_.data();
    }
    auto t0 = Clock::now();
    llvm::Error e =
        comm_.recv(in.peer, in.tag, microbatch, p, size_t(sl.bytes));
    double waited = secondsSince(t0);
    stats_.recvWaitSeconds += waited;
    if (waited > 1e-6)
      stats_.spans.push_back({"RECV", microbatch, clockSeconds(t0),
                              clockSeconds(t0) + waited});
    if (e)
      return wrap(nameTimeout(std::move(e), "stage " + std::to_string(in.peer),
                              messageText(phase, sl.name, microbatch), in.tag),
                  where);
    if (!hostMemory_)
      backend_.copyToDevice(dst, p, size_t(sl.bytes));
    return llvm::Error::success();
  }
  }
  return llvm::Error::success();
}

llvm::Error StageExecutor::runProgram(Phase phase, int64_t step,
                                      int microbatch, void *frame) {
  const auto &prog = stage_.programs[int(phase)];
  for (size_t i = 0; i < prog.size(); ++i) {
    // Profiles time kernels only: a message's time is mostly waiting for
    // the other stage, which the cost model's link and schedule account for.
    if (!profiling_ || prog[i].kind != InstrKind::Kernel) {
      if (auto e = runInstr(prog[i], i, phase, step, microbatch, frame))
        return e;
      continue;
    }
    auto t0 = Clock::now();
    llvm::Error e = runInstr(prog[i], i, phase, step, microbatch, frame);
    InstrProfile &p = profile_[{instrKey(prog[i]), phase}];
    double took = secondsSince(t0);
    p.seconds += took;
    ++p.calls;
    actionKernelSeconds_ += took;
    if (e)
      return e;
  }
  return llvm::Error::success();
}

// dst takes src's bytes (same type and size, checked at create): the
// backend's Identity kernel where it has one, else through host memory.
llvm::Error StageExecutor::copySlot(int dst, void *dstFrame, int src,
                                    void *srcFrame) {
  const Slot &d = stage_.slots[dst], &s = stage_.slots[src];
  void *dp = slotData(dst, dstFrame), *sp = slotData(src, srcFrame);
  if (dp == sp || d.bytes == 0)
    return llvm::Error::success();
  if (backend_.supports(ir::OpKind::Identity, s.dtype)) {
    TensorRef in{s.dtype, d.shape, sp}, out{d.dtype, d.shape, dp};
    KernelCall call{ir::OpKind::Identity, noAttrs(), in, out, 0};
    return wrap(backend_.run(call), [&] {
      return "copying '" + s.name + "' to '" + d.name + "'";
    });
  }
  staging_.resize(size_t(s.bytes));
  backend_.copyToHost(staging_.data(), sp, size_t(s.bytes));
  backend_.copyToDevice(dp, staging_.data(), size_t(s.bytes));
  return llvm::Error::success();
}

llvm::Error StageExecutor::accumulate(Phase phase, int microbatch,
                                      void *frame) {
  for (int s : accumWrites_[int(phase)])
    if (auto e = accumulateSlot(s, microbatch, frame))
      return e;
  return llvm::Error::success();
}

llvm::Error StageExecutor::accumulateSlot(int s, int microbatch,
                                          void *frame) {
  {
    const Slot &v = stage_.slots[s];
    int acc = v.accum;
    const Slot &a = stage_.slots[acc];
    // checkActions() proved the order for this action list; keep the
    // runtime check cheap and loud anyway.
    if (accumCount_[acc] != microbatch)
      return fail(llvm::formatv("sums '{0}' into '{1}' out of microbatch "
                                "order (microbatch {2} is next)",
                                v.name, a.name, accumCount_[acc]));
    if (accumCount_[acc] == 0) {
      if (accumPreset_[acc])
        accumPreset_[acc] = false; // the kernel wrote it there
      else if (auto e = copySlot(acc, nullptr, s, frame))
        return e;
    } else {
      TensorRef ins[2] = {{a.dtype, a.shape, persistent_[acc]},
                          {v.dtype, a.shape, slotData(s, frame)}};
      TensorRef out{a.dtype, a.shape, persistent_[acc]};
      KernelCall call{ir::OpKind::Add, noAttrs(), ins, out, 0};
      if (auto e = backend_.run(call))
        return wrap(std::move(e),
                    "summing '" + v.name + "' into '" + a.name + "'");
    }
    ++accumCount_[acc];
  }
  return llvm::Error::success();
}

llvm::Error StageExecutor::allReduceAccums() {
  Comm &dp = *dataParallel_;
  int replicas = dp.size();
  if (replicas <= 1)
    return llvm::Error::success();
  for (size_t s = 0; s < stage_.slots.size(); ++s) {
    const Slot &a = stage_.slots[s];
    if (a.kind != SlotKind::Accum)
      continue;
    void *acc = persistent_[s];
    size_t bytes = size_t(a.bytes);
    int64_t tag = int64_t(s);
    auto where = [&] { return "summing '" + a.name + "' over the replicas"; };
    std::vector<uint8_t> host(bytes);
    if (dp.rank() == 0) {
      reduceBuffer_.resize(bytes);
      // The other replicas' sums land in one backend buffer, grown to the
      // largest accumulator once and kept: the steady state allocates
      // nothing.
      if (reduceDeviceBytes_ < bytes) {
        backend_.release(reduceDevice_);
        reduceDevice_ = backend_.allocate(bytes);
        reduceDeviceBytes_ = reduceDevice_ ? bytes : 0;
        if (!reduceDevice_)
          return fail(where() + ": cannot allocate " + std::to_string(bytes) +
                      " bytes");
      }
      void *other = reduceDevice_;
      llvm::Error err = llvm::Error::success();
      for (int r = 1; r < replicas && !err; ++r) {
        if ((err = nameTimeout(
                 dp.recv(r, tag, -1, reduceBuffer_.data(), bytes),
                 "replica " + std::to_string(r),
                 "its sum of '" + a.name + "' to add", tag)))
          break;
        backend_.copyToDevice(other, reduceBuffer_.data(), bytes);
        TensorRef ins[2] = {{a.dtype, a.shape, acc}, {a.dtype, a.shape, other}};
        TensorRef out{a.dtype, a.shape, acc};
        KernelCall call{ir::OpKind::Add, noAttrs(), ins, out, 0};
        err = backend_.run(call);
      }
      if (err)
        return wrap(std::move(err), where());
      backend_.copyToHost(host.data(), acc, bytes);
      for (int r = 1; r < replicas; ++r)
        if (auto e = dp.send(r, tag, -1, host.data(), bytes))
          return wrap(std::move(e), where());
    } else {
      backend_.copyToHost(host.data(), acc, bytes);
      if (auto e = dp.send(0, tag, -1, host.data(), bytes))
        return wrap(std::move(e), where());
      if (auto e = nameTimeout(dp.recv(0, tag, -1, host.data(), bytes),
                               "replica 0",
                               "the sum of '" + a.name + "' over the replicas",
                               tag))
        return wrap(std::move(e), where());
      backend_.copyToDevice(acc, host.data(), bytes);
    }
  }
  return llvm::Error::success();
}

// What made a slot: "MatMulGradB at '/fc/MatMul'" or the slot's name.
static std::string producerOf(const StagePlan &sp, int slot) {
  for (const auto &prog : sp.programs)
    for (const Instr &in : prog)
      for (int o : in.outputs)
        if (o == slot) {
          if (in.kind == InstrKind::Recv)
            return "a message from stage " + std::to_string(in.peer);
          std::string what(ir::opInfo(in.op).name);
          return in.loc.empty() ? what : what + " at '" + in.loc + "'";
        }
  return "the data";
}

std::string StageExecutor::describeNonFinite() {
  for (size_t i = 0; i < losses_.size(); ++i)
    if (!std::isfinite(losses_[i]))
      return llvm::formatv("the loss '{0}' ({1}) is {2} in microbatch {3}",
                           stage_.slots[stage_.lossSlot].name,
                           producerOf(stage_, stage_.lossSlot), losses_[i], i)
          .str();
  std::vector<uint8_t> staging;
  for (size_t s = 0; s < stage_.slots.size(); ++s) {
    const Slot &a = stage_.slots[s];
    if (a.kind != SlotKind::Accum || !ir::isFloat(a.dtype))
      continue;
    int64_t n = a.bytes / int64_t(ir::dtypeSize(a.dtype));
    // The backend checks in place (a copy per step of every gradient into
    // fresh pages, scanned on one thread, took a fifth of a ResNet-18
    // step); only a stage with a finding copies it out to name the element.
    if (backend_.allFinite(a.dtype, persistent_[s], n))
      continue;
    staging.resize(size_t(a.bytes));
    backend_.copyToHost(staging.data(), persistent_[s], staging.size());
    const uint8_t *host = staging.data();
    for (int64_t i = 0; i < n; ++i) {
      double v = a.dtype == ir::DType::F64
                     ? reinterpret_cast<const double *>(host)[i]
                     : a.dtype == ir::DType::F32
                           ? double(reinterpret_cast<const float *>(host)[i])
                           : 0.0;
      if (std::isfinite(v))
        continue;
      // The per-microbatch value this slot sums.
      int source = -1;
      for (size_t t = 0; t < stage_.slots.size(); ++t)
        if (stage_.slots[t].accum == int(s))
          source = int(t);
      return llvm::formatv("the gradient '{0}' ({1}) has {2} at element {3}",
                           source >= 0 ? stage_.slots[source].name : a.name,
                           source >= 0 ? producerOf(stage_, source)
                                       : std::string("the step"),
                           v, i)
          .str();
    }
  }
  return "";
}

llvm::Error StageExecutor::fillInputs(int microbatch, void *frame,
                                      const DataFn &data) {
  for (size_t s = 0; s < stage_.slots.size(); ++s) {
    const Slot &sl = stage_.slots[s];
    if (sl.kind != SlotKind::Input)
      continue;
    if (!data)
      return fail("input '" + sl.name + "': no data function given");
    void *dst = slotData(int(s), frame), *p = dst;
    if (!hostMemory_) {
      staging_.resize(size_t(sl.bytes));
      p = staging_.data();
    }
    if (auto e = data(microbatch, sl.name, p, size_t(sl.bytes)))
      return wrap(std::move(e), "input '" + sl.name + "'");
    if (!hostMemory_)
      backend_.copyToDevice(dst, p, size_t(sl.bytes));
  }
  return llvm::Error::success();
}

llvm::Error StageExecutor::recordLoss(void *frame) {
  const Slot &l = stage_.slots[stage_.lossSlot];
  const void *p = slotData(stage_.lossSlot, frame);
  double v;
  if (l.dtype == ir::DType::F64) {
    backend_.copyToHost(&v, p, sizeof v);
  } else {
    float f;
    backend_.copyToHost(&f, p, sizeof f);
    v = f;
  }
  losses_.push_back(v);
  return llvm::Error::success();
}

// Predictions (the first largest score along axis 1; a NaN counts as the
// largest, as torch.argmax has it) against the labels, on the host.
llvm::Error StageExecutor::recordAccuracy(void *frame) {
  const Slot &s = stage_.slots[size_t(stage_.accuracyScoresSlot)];
  const Slot &l = stage_.slots[size_t(stage_.accuracyLabelsSlot)];
  int64_t n = s.shape[0], c = s.shape[1], inner = 1;
  for (size_t d = 2; d < s.shape.size(); ++d)
    inner *= s.shape[d];
  // A slot's elements on the host, widened: `Wide` as is, else `Narrow`.
  auto hostCopy = [&](auto wide, auto narrow, int slot, size_t count,
                      bool isWide) {
    using Wide = decltype(wide);
    using Narrow = decltype(narrow);
    std::vector<Wide> out(count);
    if (isWide) {
      backend_.copyToHost(out.data(), slotData(slot, frame),
                          count * sizeof(Wide));
    } else {
      std::vector<Narrow> in(count);
      backend_.copyToHost(in.data(), slotData(slot, frame),
                          count * sizeof(Narrow));
      std::copy(in.begin(), in.end(), out.begin());
    }
    return out;
  };
  std::vector<double> scores =
      hostCopy(0.0, 0.0f, stage_.accuracyScoresSlot, size_t(n * c * inner),
               s.dtype == ir::DType::F64);
  std::vector<int64_t> labels =
      hostCopy(int64_t(0), int32_t(0), stage_.accuracyLabelsSlot,
               size_t(n * inner), l.dtype == ir::DType::I64);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < inner; ++k) {
      int64_t label = labels[size_t(i * inner + k)];
      if (stage_.hasIgnoreIndex && label == stage_.ignoreIndex)
        continue;
      int64_t best = 0;
      double top = scores[size_t(i * c * inner + k)];
      for (int64_t j = 1; j < c && !std::isnan(top); ++j) {
        double v = scores[size_t((i * c + j) * inner + k)];
        if (v > top || std::isnan(v)) {
          top = v;
          best = j;
        }
      }
      ++accuracy_.second;
      accuracy_.first += best == label;
    }
  return llvm::Error::success();
}

double StageExecutor::lastLoss() const {
  if (losses_.empty())
    return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (double v : losses_)
    sum += v;
  return sum / double(losses_.size());
}

void StageExecutor::beginStep(int64_t step, const DataFn &data) {
  stepStart_ = Clock::now();
  step_ = step;
  data_ = data;
  // A failed earlier step may have left frames out; take them back.
  for (auto &[mb, f] : live_)
    giveFrame(f);
  live_.clear();
  std::fill(accumCount_.begin(), accumCount_.end(), 0);
  std::fill(accumPreset_.begin(), accumPreset_.end(), false);
  losses_.clear();
  stats_.busySeconds.fill(0);
  stats_.recvWaitSeconds = 0;
  stats_.spans.clear();
  stepSkipped_ = false;
  nonFiniteReport_.clear();
  update_ = Update{};
}

size_t StageExecutor::stepAction() const {
  const auto &acts = stage_.actions;
  for (size_t i = 0; i < acts.size(); ++i)
    if (acts[i].kind == ActionKind::Step)
      return i;
  return acts.size();
}

llvm::Error StageExecutor::runActions(size_t first, size_t count) {
  const auto &acts = stage_.actions;
  size_t end = std::min(first + count, stepAction());
  const int64_t step = step_;
  for (size_t i = first; i < end; ++i) {
    const Action &a = acts[i];
    auto ta = Clock::now();
    // W batching: the run of W actions of consecutive microbatches here.
    size_t run = 1;
    if (stage_.wBatch && a.kind == ActionKind::W)
      while (i + run < end && acts[i + run].kind == ActionKind::W &&
             acts[i + run].microbatch == a.microbatch + int(run))
        ++run;
    if (run > 1) {
      llvm::Error e = runBatchedW(i, run, step);
      double took = secondsSince(ta);
      stats_.busySeconds[size_t(ActionKind::W)] += took;
      for (size_t j = 0; j < run; ++j) // the run's time, shared evenly
        stats_.spans.push_back(
            {actionKindName(ActionKind::W), acts[i + j].microbatch,
             clockSeconds(ta) + took * double(j) / double(run),
             clockSeconds(ta) + took * double(j + 1) / double(run)});
      if (e)
        return wrap(std::move(e), [&] { return describeAction(a); });
      i += run - 1;
      continue;
    }
    actionKernelSeconds_ = 0;
    double waitedBefore = stats_.recvWaitSeconds;
    llvm::Error e = [&]() -> llvm::Error {
      int mb = a.microbatch;
      void *frame;
      if (a.kind == ActionKind::F) {
        auto f = takeFrame();
        if (!f)
          return f.takeError();
        frame = *f;
        live_[mb] = frame;
        if (auto e = fillInputs(mb, frame, data_))
          return e;
      } else {
        auto it = live_.find(mb);
        if (it == live_.end()) // checkActions() rules this out
          return fail("the microbatch has no frame");
        frame = it->second;
      }
      for (Phase p : phasesOf(a.kind))
        if (auto e = runProgram(p, step, mb, frame))
          return e;
      if (a.kind == ActionKind::F) {
        for (const StateUpdate &u : stage_.fwdUpdates)
          if (auto e = copySlot(u.state, nullptr, u.value, frame))
            return e;
        if (stage_.lossSlot >= 0)
          if (auto e = recordLoss(frame))
            return e;
      }
      for (Phase p : phasesOf(a.kind))
        if (auto e = accumulate(p, mb, frame))
          return e;
      if (lastAction_[mb] == int(i)) {
        live_.erase(mb);
        giveFrame(frame);
      }
      return llvm::Error::success();
    }();
    double took = secondsSince(ta);
    stats_.busySeconds[size_t(a.kind)] += took;
    stats_.spans.push_back(
        {actionKindName(a.kind), a.microbatch, clockSeconds(ta),
         clockSeconds(ta) + took});
    if (profiling_) {
      // What the action took beyond its kernels and its waits: frames,
      // inputs, gradient sums, message copies, the loop itself.
      InstrProfile &o = actionOverhead_[size_t(a.kind)];
      o.seconds += std::max(0.0, took - actionKernelSeconds_ -
                                     (stats_.recvWaitSeconds - waitedBefore));
      ++o.calls;
    }
    if (e)
      return wrap(std::move(e), [&] { return describeAction(a); });
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<double>>
StageExecutor::runForward(int64_t seedStep, const DataFn &data) {
  // The training step's losses and profile stay as the step left them.
  std::vector<double> trained = std::move(losses_);
  losses_.clear();
  accuracy_ = {0, 0};
  bool profiling = profiling_;
  profiling_ = false;
  llvm::Error err = llvm::Error::success();
  for (int mb = 0; mb < microbatches_ && !err; ++mb) {
    auto frame = takeFrame();
    if (!frame) {
      err = frame.takeError();
      break;
    }
    err = fillInputs(mb, *frame, data);
    if (!err)
      err = runProgram(Phase::F, seedStep, mb, *frame);
    if (!err && stage_.lossSlot >= 0)
      err = recordLoss(*frame);
    if (!err && stage_.accuracyScoresSlot >= 0)
      err = recordAccuracy(*frame);
    giveFrame(*frame);
    if (err)
      err = wrap(std::move(err), "evaluation, F of microbatch " +
                                     llvm::Twine(mb));
  }
  profiling_ = profiling;
  std::vector<double> out = std::move(losses_);
  losses_ = std::move(trained);
  if (err)
    return std::move(err);
  return out;
}

// The update's errors name the STEP action, as the action loop's do.
llvm::Error StageExecutor::stepError(llvm::Error e) {
  if (!e)
    return e;
  return wrap(std::move(e), [&] { return describeAction({ActionKind::Step, -1}); });
}

llvm::Error StageExecutor::beginUpdate() {
  update_ = Update{};
  update_.start = Clock::now();
  clipScale_ = 1;
  if (clipMax_ > 0)
    lastGradNorm_ = NAN;
  if (dataParallel_)
    if (auto e = allReduceAccums())
      return stepError(std::move(e));
  update_.voting = nonFinitePolicy_ != NonFinitePolicy::Ignore;
  if (!update_.voting)
    return llvm::Error::success();
  nonFiniteReport_ = describeNonFinite();
  update_.bad = nonFiniteReport_.empty() ? 0 : 1;
  if (nonFinitePolicy_ == NonFinitePolicy::StopAfter) {
    // Every other stage gets this stage's finding; the update goes ahead.
    update_.voting = false;
    for (int s = 0; s < comm_.size(); ++s)
      if (s != comm_.rank())
        if (auto e = comm_.send(s, voteTag_, -1, &update_.bad, sizeof update_.bad))
          return stepError(wrap(std::move(e), "sending its finding on non-finite values"));
    return llvm::Error::success();
  }
  if (comm_.size() <= 1) {
    update_.voting = false;
    stepSkipped_ = update_.bad != 0;
    return llvm::Error::success();
  }
  update_.nextVoter = 1;
  if (comm_.rank() != 0)
    if (auto e = comm_.send(0, voteTag_, -1, &update_.bad, sizeof update_.bad))
      return stepError(wrap(std::move(e), "agreeing on non-finite values"));
  return llvm::Error::success();
}

llvm::Expected<bool> StageExecutor::takeVotes(bool wait) {
  for (; votesOutFor_ >= 0 && nextVoteFrom_ < comm_.size(); ++nextVoteFrom_) {
    int s = nextVoteFrom_;
    if (s == comm_.rank())
      continue;
    if (!wait && !comm_.poll(s, voteTag_, -1))
      return false;
    int32_t other = 0;
    if (auto e = nameTimeout(comm_.recv(s, voteTag_, -1, &other, sizeof other),
                             "stage " + std::to_string(s),
                             "its finding on non-finite values in step " +
                                 std::to_string(votesOutFor_ + 1),
                             voteTag_))
      return stepError(wrap(std::move(e), "agreeing on non-finite values"));
    votesBad_ |= other;
  }
  if (votesOutFor_ >= 0)
    verdict_ = {votesOutFor_, votesBad_ != 0};
  votesOutFor_ = -1;
  return true;
}

llvm::Error StageExecutor::collectVotes() {
  auto done = takeVotes(/*wait=*/true);
  return done ? llvm::Error::success() : done.takeError();
}

llvm::Expected<bool> StageExecutor::continueUpdate(bool wait) {
  auto ready = [&](int peer, int64_t tag) {
    return wait || comm_.poll(peer, tag, -1);
  };
  if (nonFinitePolicy_ == NonFinitePolicy::StopAfter && !update_.voting &&
      update_.next == 0) {
    // The previous step's votes first (they are in by now: every stage
    // has done some of this step since its previous update), then this
    // step's go out (beginUpdate sent them) and are taken at the next.
    auto taken = takeVotes(wait);
    if (!taken)
      return taken.takeError();
    if (!*taken)
      return false;
  }
  auto where = [] { return std::string("agreeing on non-finite values"); };
  if (update_.voting) {
    int stages = comm_.size();
    if (comm_.rank() == 0) {
      for (; update_.nextVoter < stages; ++update_.nextVoter) {
        int s = update_.nextVoter;
        if (!ready(s, voteTag_))
          return false;
        int32_t other = 0;
        if (auto e = nameTimeout(
                comm_.recv(s, voteTag_, -1, &other, sizeof other),
                "stage " + std::to_string(s),
                "its vote on non-finite values before the step", voteTag_))
          return stepError(wrap(std::move(e), where()));
        update_.bad |= other;
      }
      for (int s = 1; s < stages; ++s)
        if (auto e = comm_.send(s, voteTag_, -1, &update_.bad, sizeof update_.bad))
          return stepError(wrap(std::move(e), where()));
    } else {
      if (!ready(0, voteTag_))
        return false;
      if (auto e = nameTimeout(
              comm_.recv(0, voteTag_, -1, &update_.bad, sizeof update_.bad),
              "stage 0",
              "the stages' vote on non-finite values before the step",
              voteTag_))
        return stepError(wrap(std::move(e), where()));
    }
    update_.voting = false;
    stepSkipped_ = update_.bad != 0;
  }
  if (stepSkipped_)
    return finishUpdate();
  const auto &prog = stage_.programs[int(Phase::Step)];
  for (; update_.next <= prog.size(); ++update_.next) {
    if (clipMax_ > 0 && update_.next == normAt_ && !update_.normKnown) {
      auto known = exchangeNorm(wait);
      if (!known)
        return stepError(known.takeError());
      if (!*known)
        return false;
    }
    if (update_.next == prog.size())
      break;
    const Instr &in = prog[update_.next];
    if (in.kind == InstrKind::Recv && !ready(in.peer, in.tag))
      return false;
    if (clipScale_ < 1 && in.kind == InstrKind::Kernel &&
        (in.op == ir::OpKind::SGD || in.op == ir::OpKind::AdamW))
      if (auto e = scaleGradient(in.inputs[1]))
        return stepError(std::move(e));
    auto t0 = Clock::now();
    llvm::Error e = runInstr(in, update_.next, Phase::Step, step_, -1, nullptr);
    if (profiling_ && in.kind == InstrKind::Kernel) {
      InstrProfile &p = profile_[{instrKey(in), Phase::Step}];
      p.seconds += secondsSince(t0);
      ++p.calls;
    }
    if (e)
      return stepError(std::move(e));
  }
  for (const StateUpdate &u : stage_.stepUpdates)
    if (auto e = copySlot(u.state, nullptr, u.value, nullptr))
      return stepError(std::move(e));
  return finishUpdate();
}

// ---------------------------------------------------------------------------
// Gradient clipping by global norm.

static bool isUpdateOp(const Instr &in) {
  return in.kind == InstrKind::Kernel &&
         (in.op == ir::OpKind::SGD || in.op == ir::OpKind::AdamW);
}

void StageExecutor::indexClipping(const Plan &plan) {
  // Per stage: where its first update op is, and its update ops' order.
  size_t stages = plan.stages.size();
  std::vector<size_t> firstUpdate(stages);
  normCounts_.assign(stages, 0);
  std::map<std::string, size_t> modelOrder;
  for (size_t i = 0; i < plan.modelTensors.size(); ++i)
    modelOrder.emplace(plan.modelTensors[i].name, i);
  // (model position, name) of every update op, stage after stage.
  std::vector<std::pair<size_t, std::string>> keys;
  for (size_t t = 0; t < stages; ++t) {
    const StagePlan &sp = plan.stages[t];
    const auto &prog = sp.programs[int(Phase::Step)];
    firstUpdate[t] = prog.size();
    for (size_t i = 0; i < prog.size(); ++i) {
      if (!isUpdateOp(prog[i]) || prog[i].inputs.size() < 2)
        continue;
      firstUpdate[t] = std::min(firstUpdate[t], i);
      ++normCounts_[t];
      const std::string &param = sp.slots[size_t(prog[i].inputs[0])].name;
      auto it = modelOrder.find(param);
      keys.push_back({it == modelOrder.end() ? SIZE_MAX : it->second, param});
      if (int(t) == stage_.index)
        optInstrs_.push_back(i);
    }
  }
  // Where each stage learns the norm: at its first update op, or earlier
  // at a receive of what another stage sends after its own first update (a
  // replica's new value: a stage without update ops waits there).
  auto sendIndex = [&](size_t to, const Instr &recv) -> size_t {
    const auto &from =
        plan.stages[size_t(recv.peer)].programs[int(Phase::Step)];
    for (size_t k = 0; k < from.size(); ++k)
      if (from[k].kind == InstrKind::Send && from[k].peer == int(to) &&
          from[k].tag == recv.tag)
        return k;
    return 0;
  };
  auto isRecv = [&](const Instr &in) {
    return in.kind == InstrKind::Recv && in.peer >= 0 &&
           size_t(in.peer) < stages;
  };
  std::vector<size_t> normAt = firstUpdate;
  for (size_t t = 0; t < stages; ++t) {
    const auto &prog = plan.stages[t].programs[int(Phase::Step)];
    for (size_t i = 0; i < normAt[t]; ++i)
      if (isRecv(prog[i]) &&
          sendIndex(t, prog[i]) >= firstUpdate[size_t(prog[i].peer)])
        normAt[t] = i;
  }
  normAt_ = normAt[size_t(stage_.index)];
  std::vector<size_t> byKey(keys.size());
  for (size_t i = 0; i < byKey.size(); ++i)
    byKey[i] = i;
  std::stable_sort(byKey.begin(), byKey.end(),
                   [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  normOrder_.assign(keys.size(), 0);
  for (size_t pos = 0; pos < byKey.size(); ++pos)
    normOrder_[byKey[pos]] = pos;

  // The norm is known before the first update op of each stage only if
  // every gradient is final there, and every message a stage waits for
  // before it is sent before the sender's own first update op.
  for (size_t t = 0; t < stages && clipRefusal_.empty(); ++t) {
    const StagePlan &sp = plan.stages[t];
    const auto &prog = sp.programs[int(Phase::Step)];
    for (size_t i = normAt[t]; i < prog.size(); ++i)
      for (int o : prog[i].outputs)
        for (size_t k = normAt[t]; k < prog.size(); ++k)
          if (isUpdateOp(prog[k]) && prog[k].inputs.size() > 1 &&
              prog[k].inputs[1] == o && clipRefusal_.empty())
            clipRefusal_ = llvm::formatv(
                "stage {0} computes the gradient '{1}' after it needs the "
                "gradient norm",
                t, sp.slots[size_t(o)].name);
    for (size_t i = 0; i < normAt[t] && clipRefusal_.empty(); ++i) {
      const Instr &in = prog[i];
      if (isRecv(in) && sendIndex(t, in) >= normAt[size_t(in.peer)])
        clipRefusal_ = llvm::formatv(
            "stage {0} waits for '{1}' before it can know the gradient "
            "norm, which stage {2} sends after it needs the norm",
            t, sp.slots[size_t(in.outputs.empty() ? 0 : in.outputs[0])].name,
            in.peer);
    }
  }
}

llvm::Error StageExecutor::setClipGradNorm(double maxNorm) {
  if (maxNorm <= 0) {
    clipMax_ = 0;
    return llvm::Error::success();
  }
  if (!clipRefusal_.empty())
    return fail("--clip-grad-norm: " + clipRefusal_ +
                "; this plan cannot clip (compile it again)");
  const auto &prog = stage_.programs[int(Phase::Step)];
  for (size_t i : optInstrs_) {
    const Slot &g = stage_.slots[size_t(prog[i].inputs[1])];
    if (g.dtype != ir::DType::F32 && g.dtype != ir::DType::F64)
      return fail("--clip-grad-norm: the gradient '" + g.name + "' is " +
                  std::string(ir::dtypeName(g.dtype)) +
                  "; clipping reads f32 and f64");
  }
  if (!clipScalar_ && !(clipScalar_ = backend_.allocate(sizeof(double))))
    return fail("--clip-grad-norm: cannot allocate its scale");
  clipMax_ = maxNorm;
  return llvm::Error::success();
}

llvm::Expected<bool> StageExecutor::exchangeNorm(bool wait) {
  const auto &prog = stage_.programs[int(Phase::Step)];
  int stages = comm_.size(), me = comm_.rank();
  auto where = [] { return std::string("agreeing on the gradient norm"); };
  if (!update_.normSent) {
    // Each gradient's sum of squares (Backend::sumOfSquares: in blocks,
    // the blocks in order, the same bits on any backend thread count).
    std::vector<double> mine;
    for (size_t i : optInstrs_) {
      const Instr &in = prog[i];
      const Slot &g = stage_.slots[size_t(in.inputs[1])];
      double scale = in.attrs.count("grad_scale")
                         ? double(in.attrs.find("grad_scale")->second.getFloat())
                         : 1.0;
      mine.push_back(backend_.sumOfSquares(
          g.dtype, slotData(in.inputs[1], stepFrame_),
          g.bytes / int64_t(ir::dtypeSize(g.dtype)), scale));
    }
    update_.normSent = true;
    update_.nextNormFrom = 1;
    if (me == 0) {
      normSums_.assign(normOrder_.size(), 0);
      std::copy(mine.begin(), mine.end(), normSums_.begin());
    } else if (!mine.empty()) {
      if (auto e = comm_.send(0, normTag_, -1, mine.data(),
                              mine.size() * sizeof(double)))
        return wrap(std::move(e), where());
    }
  }
  double total = 0;
  if (me == 0) {
    size_t offset = normCounts_[0];
    for (int s = 1; s < update_.nextNormFrom; ++s)
      offset += normCounts_[size_t(s)];
    for (; update_.nextNormFrom < stages; ++update_.nextNormFrom) {
      int s = update_.nextNormFrom;
      size_t count = normCounts_[size_t(s)];
      if (count == 0)
        continue;
      if (!wait && !comm_.poll(s, normTag_, -1))
        return false;
      if (auto e = nameTimeout(
              comm_.recv(s, normTag_, -1, normSums_.data() + offset,
                         count * sizeof(double)),
              "stage " + std::to_string(s),
              "its sums of squares of the gradients", normTag_))
        return wrap(std::move(e), where());
      offset += count;
    }
    // The model's parameter order, whichever stage holds each.
    std::vector<double> ordered(normSums_.size());
    for (size_t k = 0; k < normSums_.size(); ++k)
      ordered[normOrder_[k]] = normSums_[k];
    for (double v : ordered)
      total += v;
    for (int s = 1; s < stages; ++s)
      if (auto e = comm_.send(s, normTag_, -1, &total, sizeof total))
        return wrap(std::move(e), where());
  } else {
    if (!wait && !comm_.poll(0, normTag_, -1))
      return false;
    if (auto e = nameTimeout(comm_.recv(0, normTag_, -1, &total, sizeof total),
                             "stage 0", "the gradient norm", normTag_))
      return wrap(std::move(e), where());
  }
  update_.normKnown = true;
  lastGradNorm_ = std::sqrt(total);
  // torch.nn.utils.clip_grad_norm_: scale by max / (norm + 1e-6) where that
  // is below 1 (a NaN norm scales nothing; --on-nan catches it first).
  double scale = clipMax_ / (lastGradNorm_ + 1e-6);
  clipScale_ = scale < 1 ? scale : 1;
  return true;
}

llvm::Error StageExecutor::scaleGradient(int slot) {
  const Slot &g = stage_.slots[size_t(slot)];
  void *p = slotData(slot, stepFrame_);
  if (g.dtype == ir::DType::F64) {
    double c = clipScale_;
    backend_.copyToDevice(clipScalar_, &c, sizeof c);
  } else {
    float c = float(clipScale_);
    backend_.copyToDevice(clipScalar_, &c, sizeof c);
  }
  TensorRef ins[2] = {{g.dtype, g.shape, p}, {g.dtype, {}, clipScalar_}};
  TensorRef out{g.dtype, g.shape, p};
  KernelCall call{ir::OpKind::Mul, noAttrs(), ins, out, 0};
  if (auto e = backend_.run(call))
    return wrap(std::move(e), "clipping '" + g.name + "'");
  return llvm::Error::success();
}

bool StageExecutor::finishUpdate() {
  if (nonFinitePolicy_ == NonFinitePolicy::StopAfter) {
    votesOutFor_ = step_;
    nextVoteFrom_ = 0;
    votesBad_ = update_.bad;
  }
  double took = secondsSince(update_.start);
  stats_.busySeconds[size_t(ActionKind::Step)] += took;
  stats_.spans.push_back({actionKindName(ActionKind::Step), -1,
                          clockSeconds(update_.start),
                          clockSeconds(update_.start) + took});
  stats_.stepSeconds = secondsSince(stepStart_);
  return true;
}

llvm::Error StageExecutor::runStep(int64_t step, const DataFn &data) {
  beginStep(step, data);
  if (auto e = runActions(0, stage_.actions.size()))
    return e;
  if (!hasStepAction())
    return llvm::Error::success();
  if (auto e = beginUpdate())
    return e;
  auto done = continueUpdate(/*wait=*/true);
  if (!done)
    return done.takeError();
  return llvm::Error::success();
}

// ---------------------------------------------------------------------------
// Slot access.

int StageExecutor::findSlot(const std::string &name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? -1 : it->second;
}

llvm::Expected<std::vector<uint8_t>>
StageExecutor::readSlot(const std::string &name) const {
  int s = findSlot(name);
  if (s < 0)
    return fail(llvm::formatv("stage {0}: no slot named '{1}'", stage_.index,
                              name));
  const Slot &sl = stage_.slots[s];
  if (!isPersistent(sl.kind))
    return fail(llvm::formatv("stage {0}: slot '{1}' is a {2} slot; only "
                              "state, const and accum slots can be read",
                              stage_.index, name, slotKindName(sl.kind)));
  std::vector<uint8_t> out(size_t(sl.bytes));
  backend_.copyToHost(out.data(), persistent_[s], out.size());
  return out;
}

llvm::Error StageExecutor::writeSlot(const std::string &name,
                                     const std::vector<uint8_t> &bytes) {
  int s = findSlot(name);
  if (s < 0)
    return fail(llvm::formatv("stage {0}: no slot named '{1}'", stage_.index,
                              name));
  const Slot &sl = stage_.slots[s];
  if (sl.kind != SlotKind::State)
    return fail(llvm::formatv("stage {0}: slot '{1}' is a {2} slot; only "
                              "state slots can be written",
                              stage_.index, name, slotKindName(sl.kind)));
  if (int64_t(bytes.size()) != sl.bytes)
    return fail(llvm::formatv("stage {0}: slot '{1}' has {2} bytes, {3} "
                              "given",
                              stage_.index, name, sl.bytes, bytes.size()));
  backend_.copyToDevice(persistent_[s], bytes.data(), bytes.size());
  return llvm::Error::success();
}

// ---------------------------------------------------------------------------
// The threaded driver.

llvm::Error runPipelineThreads(std::vector<StageExecutor *> stages,
                               int64_t step, const DataFn &data) {
  std::vector<DataFn> each(stages.size(), data);
  return runPipelineThreads(std::move(stages), step, each);
}

llvm::Error runPipelineThreads(std::vector<StageExecutor *> stages,
                               int64_t step, const std::vector<DataFn> &data) {
  std::vector<RankWork> ranks;
  for (size_t i = 0; i < stages.size(); ++i)
    ranks.push_back({{stages[i]}, {data[i]}, {}});
  return runRankThreads(ranks, step);
}

namespace {

llvm::Error stageFailed(const StageExecutor &ex, llvm::Error e) {
  return fail(llvm::formatv("stage {0}: {1}", ex.stage(),
                            llvm::toString(std::move(e))));
}

} // namespace

llvm::Error runRankStep(const RankWork &work, int64_t step) {
  const auto &stages = work.stages;
  if (stages.size() == 1) {
    if (auto e = stages[0]->runStep(step, work.data[0]))
      return stageFailed(*stages[0], std::move(e));
    return llvm::Error::success();
  }
  std::map<int, size_t> local; // stage -> index in `stages`
  for (size_t i = 0; i < stages.size(); ++i) {
    local[stages[i]->stage()] = i;
    stages[i]->beginStep(step, work.data[i]);
  }
  std::vector<size_t> cursor(stages.size(), 0);
  for (size_t k = 0; k < work.program.size();) {
    auto it = local.find(work.program[k]);
    if (it == local.end()) // verifyPlan rules it out
      return fail(llvm::formatv("the rank's program names stage {0}, which "
                                "it does not run",
                                work.program[k]));
    size_t run = 1;
    while (k + run < work.program.size() && work.program[k + run] == it->first)
      ++run;
    StageExecutor &ex = *stages[it->second];
    if (auto e = ex.runActions(cursor[it->second], run))
      return stageFailed(ex, std::move(e));
    cursor[it->second] += run;
    k += run;
  }
  // The updates: every stage sends what it owes first, then they run as
  // far as each can, in turn, until all are done.
  for (StageExecutor *ex : stages)
    if (ex->hasStepAction())
      if (auto e = ex->beginUpdate())
        return stageFailed(*ex, std::move(e));
  std::vector<StageExecutor *> pending;
  for (StageExecutor *ex : stages)
    if (ex->hasStepAction())
      pending.push_back(ex);
  double timeout = 0;
  for (StageExecutor *ex : stages)
    timeout = std::max(timeout, ex->comm().timeout());
  auto idleSince = Clock::now();
  for (int polls = 0; !pending.empty();) {
    bool moved = false;
    for (size_t i = 0; i < pending.size();) {
      auto done = pending[i]->continueUpdate(/*wait=*/false);
      if (!done)
        return stageFailed(*pending[i], done.takeError());
      if (*done) {
        pending.erase(pending.begin() + long(i));
        moved = true;
      } else {
        ++i;
      }
    }
    if (moved || pending.empty()) {
      polls = 0;
      idleSince = Clock::now();
      continue;
    }
    // Every stage left waits for another rank. Past the timeout, wait in
    // the first one's recv, which reports the timeout as a recv does.
    if (timeout > 0 && secondsSince(idleSince) > timeout) {
      auto done = pending[0]->continueUpdate(/*wait=*/true);
      if (!done)
        return stageFailed(*pending[0], done.takeError());
      pending.erase(pending.begin());
      continue;
    }
    if (++polls > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return llvm::Error::success();
}

llvm::Error runRankThreads(const std::vector<RankWork> &ranks, int64_t step) {
  std::mutex mu;
  std::optional<std::string> first;
  std::vector<std::thread> threads;
  threads.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      llvm::Error e = runRankStep(ranks[i], step);
      if (!e)
        return;
      std::string msg = llvm::toString(std::move(e));
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first)
          first = msg;
      }
      // Wake every stage blocked on a message that will not come.
      for (const RankWork &r : ranks)
        for (StageExecutor *other : r.stages) {
          other->comm().abort(msg);
          if (other->dataParallel())
            other->dataParallel()->abort(msg);
        }
    });
  for (std::thread &t : threads)
    t.join();
  if (first)
    return fail(*first);
  return llvm::Error::success();
}

} // namespace cleave::runtime
