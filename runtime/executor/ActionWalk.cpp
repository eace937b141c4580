// The executor's action walk (runtime/Executor.h): one instruction, one
// program, the actions of a step in the schedule's order, W batching, and
// the loss and accuracy a step records.
#include "runtime/ExecutorSupport.h"
#include "support/CpuShare.h"

namespace cleave::runtime {

using namespace detail;

std::string StageExecutor::instrKey(const Instr &in) const {
  // Recomputed ops (passes/Recompute.h) apart from the backward ops at
  // their location: the cost model times them by this key.
  if (!in.loc.empty()) {
    if (in.kind == InstrKind::Kernel && in.op == ir::OpKind::Offload)
      return in.loc + " (offload)";
    if (in.kind == InstrKind::Kernel && in.op == ir::OpKind::Fetch)
      return in.loc + " (fetch)";
    return in.attrs.count(ir::kRecomputeOfAttr) ? in.loc + " (recompute)"
                                                 : in.loc;
  }
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

std::string StageExecutor::instrWhere(const Instr &in, size_t index,
                                      Phase phase) const {
  std::string w = llvm::formatv("{0} instr {1}", phaseName(phase), index);
  if (in.kind == InstrKind::Kernel)
    w += " (" + std::string(ir::opInfo(in.op).name) +
         (in.loc.empty() ? "" : " '" + in.loc + "'") + ")";
  else
    w += in.kind == InstrKind::Send ? " (send" : " (recv";
  if (in.kind != InstrKind::Kernel)
    w += llvm::formatv(" '{0}' {1} stage {2}, tag {3})",
                       stage_.slots[in.kind == InstrKind::Send ? in.inputs[0]
                                                               : in.outputs[0]]
                           .name,
                       in.kind == InstrKind::Send ? "to" : "from", in.peer,
                       in.tag)
             .str();
  return w;
}

bool StageExecutor::kernelTensors(const Instr &in, int microbatch,
                                  void *frame,
                                  llvm::SmallVectorImpl<TensorRef> &ins,
                                  llvm::SmallVectorImpl<TensorRef> &outs) {
  // A reshape-like op whose result codegen placed on its operand's bytes
  // (Plan.h) has nothing to do.
  if (ir::opInfo(in.op).has(ir::optrait::LayoutOnly) &&
      in.inputs.size() == 1 && in.outputs.size() == 1 &&
      slotData(in.inputs[0], frame) == slotData(in.outputs[0], frame))
    return false;
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
  return true;
}

llvm::Error StageExecutor::runInstr(const Instr &in, size_t index, Phase phase,
                                    int64_t step, int microbatch,
                                    void *frame) {
  auto where = [&] { return instrWhere(in, index, phase); };
  if (in.waitCopies)
    backend_.waitForCopies();
  switch (in.kind) {
  case InstrKind::Kernel: {
    // Activation offload: copies between the frame and its host frame, on
    // the backend's copy queue (Backend::offload).
    if (in.op == ir::OpKind::Offload || in.op == ir::OpKind::Fetch) {
      size_t bytes = size_t(stage_.slots[in.inputs[0]].bytes);
      void *dst = slotData(in.outputs[0], frame);
      const void *src = slotData(in.inputs[0], frame);
      if (in.op == ir::OpKind::Offload)
        backend_.offload(dst, src, bytes);
      else
        backend_.fetch(dst, src, bytes);
      return llvm::Error::success();
    }
    llvm::SmallVector<TensorRef, 6> ins, outs;
    if (!kernelTensors(in, microbatch, frame, ins, outs))
      return llvm::Error::success();
    KernelCall call{in.op, in.attrs, ins, outs,
                    kernelSeed(step, microbatch, in.seedSalt)};
    return wrap(backend_.run(call), where);
  }
  case InstrKind::Send: {
    const Slot &sl = stage_.slots[in.inputs[0]];
    void *p = slotData(in.inputs[0], frame);
    if (!hostMemory_ && !comm_.direct(in.peer, in.tag, true)) {
      staging_.resize(size_t(sl.bytes));
      backend_.copyToHost(staging_.data(), p, size_t(sl.bytes));
      p = staging_.data();
    }
    if (!profiling_)
      return wrap(comm_.send(in.peer, in.tag, microbatch, p, size_t(sl.bytes)),
                  where);
    // A send wakes its receiver, which may take this thread's core.
    double coreBefore = support::threadCoreWaitSeconds().value_or(0);
    llvm::Error e = comm_.send(in.peer, in.tag, microbatch, p, size_t(sl.bytes));
    sendCoreWait_ += std::max(
        0.0, support::threadCoreWaitSeconds().value_or(0) - coreBefore);
    return wrap(std::move(e), where);
  }
  case InstrKind::Recv: {
    const Slot &sl = stage_.slots[in.outputs[0]];
    void *dst = slotData(in.outputs[0], frame);
    void *p = dst;
    bool staged = !hostMemory_ && !comm_.direct(in.peer, in.tag, false);
    if (staged) {
      staging_.resize(size_t(sl.bytes));
      p = staging_.data();
    }
    double coreBefore =
        profiling_ ? support::threadCoreWaitSeconds().value_or(0) : 0;
    auto t0 = Clock::now();
    llvm::Error e =
        comm_.recv(in.peer, in.tag, microbatch, p, size_t(sl.bytes));
    double waited = secondsSince(t0);
    if (profiling_)
      recvCoreWait_ += std::max(
          0.0, support::threadCoreWaitSeconds().value_or(0) - coreBefore);
    stats_.recvWaitSeconds += waited;
    if (waited > 1e-6)
      stats_.spans.push_back({"RECV", microbatch, clockSeconds(t0),
                              clockSeconds(t0) + waited});
    if (e)
      return wrap(nameTimeout(std::move(e), "stage " + std::to_string(in.peer),
                              messageText(phase, sl.name, microbatch), in.tag),
                  where);
    if (staged)
      backend_.copyToDevice(dst, p, size_t(sl.bytes));
    return llvm::Error::success();
  }
  }
  return llvm::Error::success();
}

llvm::Error StageExecutor::setGraphs(bool on) {
  if (on && !backend_.graphs())
    return fail("--cuda-graphs: the " + std::string(backend_.name()) +
                " backend has no graphs (run with --device cuda)");
  graphs_ = on;
  return llvm::Error::success();
}

// What a graph may hold: kernels whose work is the same whenever their
// tensors are (no message, offload copy, wait for copies, or random draw:
// Dropout is the one op whose kernels read the call's seed, which changes
// every step).
bool StageExecutor::graphable(const Instr &in) const {
  return in.kind == InstrKind::Kernel && in.op != ir::OpKind::Offload &&
         in.op != ir::OpKind::Fetch && in.op != ir::OpKind::Dropout &&
         !in.waitCopies;
}

// Instructions [first, end) of a program, all graphable: run as usual the
// first time their tensors are these, recorded as a graph the second time
// (the first run grew the backend's scratch memory), launched after.
llvm::Error StageExecutor::runGraphed(Phase phase, size_t first, size_t end,
                                      int64_t step, int microbatch,
                                      void *frame) {
  const auto &prog = stage_.programs[int(phase)];
  struct Call {
    size_t index;
    llvm::SmallVector<TensorRef, 6> ins, outs;
  };
  std::vector<Call> calls;
  std::vector<void *> tensors;
  for (size_t i = first; i < end; ++i) {
    Call c{i, {}, {}};
    if (!kernelTensors(prog[i], microbatch, frame, c.ins, c.outs))
      continue;
    for (const auto *list : {&c.ins, &c.outs})
      for (const TensorRef &t : *list)
        tensors.push_back(t.data);
    tensors.push_back(nullptr); // between calls
    calls.push_back(std::move(c));
  }
  auto runAll = [&]() -> llvm::Error {
    for (const Call &c : calls) {
      const Instr &in = prog[c.index];
      KernelCall call{in.op, in.attrs, c.ins, c.outs,
                      kernelSeed(step, microbatch, in.seedSalt)};
      if (auto e = backend_.run(call))
        return wrap(std::move(e),
                    [&] { return instrWhere(in, c.index, phase); });
    }
    return llvm::Error::success();
  };
  auto &runs = graphRuns_[{int(phase), first}];
  GraphRun *g = nullptr;
  for (GraphRun &r : runs)
    if (r.tensors == tensors)
      g = &r;
  if (!g) {
    runs.push_back(GraphRun{tensors, 0, 0, 0});
    g = &runs.back();
  }
  if (g->id) {
    auto launched = backend_.launchGraph(g->id);
    if (!launched)
      return wrap(launched.takeError(), [&] {
        return instrWhere(prog[first], first, phase) + " (a graph)";
      });
    if (*launched) {
      ++graphLaunches_;
      return llvm::Error::success();
    }
    g->id = 0; // the backend dropped it: run, and record it again
    g->seen = 0;
  }
  if (g->seen < 1 || g->failed >= 2) {
    ++g->seen;
    return runAll();
  }
  backend_.beginGraph();
  llvm::Error e = runAll();
  uint64_t id = nextGraph_++;
  bool kept = backend_.endGraph(id);
  if (e || !kept) {
    // Nothing of it ran: the calls run as usual, and say what is wrong if
    // anything is (a spoiled capture fails its later launches too).
    llvm::consumeError(std::move(e));
    ++g->failed;
    return runAll();
  }
  g->id = id;
  ++graphsRecorded_;
  auto launched = backend_.launchGraph(id);
  if (!launched)
    return launched.takeError();
  if (!*launched)
    return runAll();
  ++graphLaunches_;
  return llvm::Error::success();
}

llvm::Error StageExecutor::runProgram(Phase phase, int64_t step,
                                      int microbatch, void *frame) {
  if (!profiling_ || phase == Phase::Step)
    return runProgramOn(phase, step, microbatch, frame);
  // The kernels' wait for a core: the program's less its messages'.
  double before = support::threadCoreWaitSeconds().value_or(0);
  double messages = recvCoreWait_ + sendCoreWait_;
  llvm::Error e = runProgramOn(phase, step, microbatch, frame);
  double waited = support::threadCoreWaitSeconds().value_or(0) - before -
                  (recvCoreWait_ + sendCoreWait_ - messages);
  kernelCoreWait_[size_t(phase)] += std::max(0.0, waited);
  return e;
}

llvm::Error StageExecutor::runProgramOn(Phase phase, int64_t step,
                                        int microbatch, void *frame) {
  const auto &prog = stage_.programs[int(phase)];
  bool graphs = graphs_ && phase != Phase::Step && !profiling_;
  for (size_t i = 0; i < prog.size(); ++i) {
    if (graphs && graphable(prog[i])) {
      size_t end = i + 1;
      while (end < prog.size() && graphable(prog[end]))
        ++end;
      if (end - i >= 2) {
        if (auto e = runGraphed(phase, i, end, step, microbatch, frame))
          return e;
        i = end - 1;
        continue;
      }
    }
    // Profiles time kernels only: a message's time is mostly waiting for
    // the other stage, which the cost model's link and schedule account for.
    if (!profiling_ || prog[i].kind != InstrKind::Kernel) {
      if (auto e = runInstr(prog[i], i, phase, step, microbatch, frame))
        return e;
      continue;
    }
    auto t0 = Clock::now();
    llvm::Error e = runInstr(prog[i], i, phase, step, microbatch, frame);
    // A device backend's kernels run after their launch returns: wait for
    // each, so that the profile holds its time and not the launch's.
    backend_.synchronize();
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
    double coreBefore =
        profiling_ ? support::threadCoreWaitSeconds().value_or(0) : 0;
    double recvCoreBefore = recvCoreWait_;
    double kernelCoreBefore =
        kernelCoreWait_[0] + kernelCoreWait_[1] + kernelCoreWait_[2];
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
      // Each program's sums right after it: the memory plan keeps a summed
      // value to the end of the program that made it, so in a BW action W
      // may reuse the bytes of what B summed (BatchNorm's scale gradient,
      // made in B).
      for (Phase p : phasesOf(a.kind)) {
        if (auto e = runProgram(p, step, mb, frame))
          return e;
        if (p != Phase::F)
          if (auto e = accumulate(p, mb, frame))
            return e;
      }
      if (a.kind == ActionKind::F) {
        for (const StateUpdate &u : stage_.fwdUpdates)
          if (auto e = copySlot(u.state, nullptr, u.value, frame))
            return e;
        if (stage_.lossSlot >= 0)
          if (auto e = recordLoss(frame))
            return e;
        if (auto e = accumulate(Phase::F, mb, frame))
          return e;
      }
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
      double overhead = std::max(0.0, took - actionKernelSeconds_ -
                                          (stats_.recvWaitSeconds - waitedBefore));
      o.seconds += overhead;
      ++o.calls;
      // The wait for a core outside the receives and the kernels (after
      // a send woke its receiver onto this core, mostly).
      double core = support::threadCoreWaitSeconds().value_or(0) - coreBefore -
                    (recvCoreWait_ - recvCoreBefore) -
                    (kernelCoreWait_[0] + kernelCoreWait_[1] +
                     kernelCoreWait_[2] - kernelCoreBefore);
      actionCoreWait_[size_t(a.kind)] += std::clamp(core, 0.0, overhead);
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
      backend_.synchronize();
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

} // namespace cleave::runtime
