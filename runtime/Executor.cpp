// The Plan executor (see Executor.h for what it does): the seeds, create()
// and its checks (slots, programs, state updates, the action list). The
// rest of the executor is one file per job in runtime/executor/: the stage
// memory, the action walk, the accumulators, the update (non-finite vote,
// clipping) and the rank loop; what they share is ExecutorSupport.h.
#include "runtime/ExecutorSupport.h"

namespace cleave::runtime {

using namespace detail;

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
      hostMemory_(hostMemory(backend)) {}

StageExecutor::~StageExecutor() {
  for (void *p : persistent_)
    if (p)
      backend_.release(p);
  if (stepFrame_)
    backend_.release(stepFrame_);
  for (void *p : allFrames_)
    backend_.release(p);
  for (auto &[frame, host] : hostFrames_)
    backend_.releaseHost(host);
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
  // A device backend's messages go straight from its memory where the
  // comm can carry them so (NCCL's channels); the rest are staged.
  if (!ex->hostMemory_)
    comm.bindBackend(backend);
  // CLEAVE_GEMM_GELU=0 keeps the pairs apart (for comparisons).
  const char *fuse = std::getenv("CLEAVE_GEMM_GELU");
  if (backend.fusesGemmGelu() && !(fuse && std::string(fuse) == "0"))
    ex->fuseGemmGelu();
  if (auto e = ex->prepare(plan))
    return wrap(std::move(e), "stage " + llvm::Twine(stage));
  return ex;
}

// A Gemm with a bias (three inputs) followed at once by a tanh Gelu of its
// result becomes one call that writes both (Backend::fusesGemmGelu). The
// Gelu's output is then written at the Gemm, earlier than the memory plan
// placed it: safe unless its bytes overlap one of the Gemm's inputs, which
// may die at the Gemm (the only values live at the Gemm and not at the
// Gelu); those pairs stay apart.
void StageExecutor::fuseGemmGelu() {
  // Which frame a slot's bytes are in (inputs share the microbatch's);
  // -1: a buffer of its own.
  auto frameOf = [](SlotKind k) {
    switch (k) {
    case SlotKind::Input:
    case SlotKind::MicroTemp:
      return 0;
    case SlotKind::StepTemp:
      return 1;
    case SlotKind::HostTemp:
      return 2;
    default:
      return -1;
    }
  };
  auto overlaps = [&](int a, int b) {
    const Slot &x = stage_.slots[size_t(a)], &y = stage_.slots[size_t(b)];
    if (a == b)
      return true;
    int f = frameOf(x.kind);
    return f >= 0 && f == frameOf(y.kind) && x.offset < y.offset + y.bytes &&
           y.offset < x.offset + x.bytes;
  };
  for (Phase phase : {Phase::F, Phase::B, Phase::W}) {
    auto &prog = stage_.programs[int(phase)];
    for (size_t i = 0; i + 1 < prog.size(); ++i) {
      Instr &gemm = prog[i];
      if (gemm.kind != InstrKind::Kernel || gemm.op != ir::OpKind::Gemm ||
          gemm.inputs.size() != 3 || gemm.outputs.size() != 1)
        continue;
      // A reshape of the product on its own bytes may come between (the
      // Gelu of a [B, T, F] activation after a [B*T, F] Gemm).
      size_t g = i + 1;
      int x = gemm.outputs[0];
      if (const Instr &r = prog[g];
          r.kind == InstrKind::Kernel &&
          ir::opInfo(r.op).has(ir::optrait::LayoutOnly) &&
          r.inputs.size() == 1 && r.outputs.size() == 1 &&
          r.inputs[0] == x && !r.waitCopies && g + 1 < prog.size()) {
        const Slot &a = stage_.slots[size_t(x)],
                   &b = stage_.slots[size_t(r.outputs[0])];
        if (frameOf(a.kind) >= 0 && frameOf(a.kind) == frameOf(b.kind) &&
            a.offset == b.offset) {
          x = r.outputs[0];
          ++g;
        }
      }
      const Instr &gelu = prog[g];
      if (gelu.kind != InstrKind::Kernel || gelu.op != ir::OpKind::Gelu ||
          gelu.inputs.size() != 1 || gelu.outputs.size() != 1 ||
          gelu.inputs[0] != x)
        continue;
      auto approx = gelu.attrs.find("approximate");
      if (approx == gelu.attrs.end() ||
          approx->second.getString() != "tanh")
        continue;
      int y = gelu.outputs[0];
      if (stage_.slots[size_t(y)].dtype !=
              stage_.slots[size_t(gemm.outputs[0])].dtype ||
          std::any_of(gemm.inputs.begin(), gemm.inputs.end(),
                      [&](int in) { return overlaps(in, y); }))
        continue;
      gemm.outputs.push_back(y);
      gemm.attrs.insert_or_assign(kGeluEpilogueAttr, ir::Attribute(int64_t(1)));
      gemm.waitCopies = gemm.waitCopies || gelu.waitCopies;
      prog.erase(prog.begin() + std::ptrdiff_t(g));
      ++fusedEpilogues_;
    }
  }
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
  // Updates written into their state's bytes have no place in the step
  // frame (Plan.h).
  placeUpdatesInPlace();

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
    case SlotKind::StepTemp:
    case SlotKind::HostTemp: {
      if (sl.kind == SlotKind::HostTemp && !backend_.offloads())
        return fail(llvm::formatv(
            "{0}: the plan offloads activations to host memory, and the {1} "
            "backend has no memory apart from the host's (compile with "
            "--offload=none, or run with --device cuda or cuda-emulated)",
            slotName(s), backend_.name()));
      int64_t frame = sl.kind == SlotKind::StepTemp   ? sp.stepFrameBytes
                      : sl.kind == SlotKind::HostTemp ? sp.hostFrameBytes
                                                      : sp.frameBytes;
      if (sl.kind == SlotKind::StepTemp && stepAlias_[size_t(s)] >= 0)
        break;
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
          if (phase == Phase::Step && (inFrame(sp.slots[s].kind) ||
                                       sp.slots[s].kind == SlotKind::HostTemp))
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
        bool copy = in.op == ir::OpKind::Offload || in.op == ir::OpKind::Fetch;
        // The host side is a HostTemp slot, which a backend without host
        // memory of its own refused above.
        if (copy && (in.inputs.size() != 1 || in.outputs.size() != 1 ||
                     sp.slots[in.inputs[0]].bytes !=
                         sp.slots[in.outputs[0]].bytes ||
                     sp.slots[in.op == ir::OpKind::Offload ? in.outputs[0]
                                                           : in.inputs[0]]
                             .kind != SlotKind::HostTemp))
          return fail(where + ": an offload copy moves one slot to or from "
                              "a host slot of the same size");
        if (!copy && !backend_.supports(in.op, dt))
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


// An optimizer writes each new parameter (and its moments) into the
// state's own bytes where stepUpdatesInPlace (Plan.h) allows it: the
// update's copy of every parameter (a pass over all the model's bytes each
// step) is then no copy (copySlot skips a slot onto itself), and the step
// frame has no room for those values. Other writers (a Recv of a tied
// replica's value, a step counter's Add) keep the copy.
void StageExecutor::placeUpdatesInPlace() {
  stepAlias_ = stepUpdatesInPlace(stage_);
}

} // namespace cleave::runtime
