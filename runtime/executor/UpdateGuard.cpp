// The executor's update (runtime/Executor.h): the non-finite vote every
// rank takes before it updates, naming what went non-finite, and gradient
// clipping by the global norm.
#include "runtime/ExecutorSupport.h"

namespace cleave::runtime {

using namespace detail;

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
  // The backend checks every gradient in place, in one call (a copy per
  // step of every gradient into fresh pages, scanned on one thread, took a
  // fifth of a ResNet-18 step); only a stage with a finding looks at each
  // one and copies it out to name the element.
  std::vector<Backend::FiniteCheck> all;
  std::vector<size_t> slotOf; // all[k] is slot slotOf[k]
  for (size_t s = 0; s < stage_.slots.size(); ++s) {
    const Slot &a = stage_.slots[s];
    if (a.kind == SlotKind::Accum && ir::isFloat(a.dtype)) {
      all.push_back({a.dtype, persistent_[s],
                     a.bytes / int64_t(ir::dtypeSize(a.dtype))});
      slotOf.push_back(s);
    }
  }
  if (backend_.allBuffersFinite(all))
    return "";
  std::vector<uint8_t> staging;
  for (size_t k = 0; k < all.size(); ++k) {
    size_t s = slotOf[k];
    const Slot &a = stage_.slots[s];
    int64_t n = all[k].count;
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
  if (profiling_)
    ++actionOverhead_[size_t(ActionKind::Step)].calls;
  if (!update_.voting)
    return llvm::Error::success();
  auto checked = Clock::now();
  nonFiniteReport_ = describeNonFinite();
  if (profiling_)
    actionOverhead_[size_t(ActionKind::Step)].seconds += secondsSince(checked);
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
      backend_.synchronize(); // a device's kernel ends after its launch
      InstrProfile &p = profile_[{instrKey(in), Phase::Step}];
      p.seconds += secondsSince(t0);
      ++p.calls;
    }
    if (e)
      return stepError(std::move(e));
  }
  auto copied = Clock::now();
  for (const StateUpdate &u : stage_.stepUpdates)
    if (auto e = copySlot(u.state, nullptr, u.value, nullptr))
      return stepError(std::move(e));
  if (profiling_)
    actionOverhead_[size_t(ActionKind::Step)].seconds += secondsSince(copied);
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

} // namespace cleave::runtime
