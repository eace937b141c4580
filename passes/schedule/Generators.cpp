#include "passes/schedule/Generators.h"

#include "passes/schedule/Simulator.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cassert>
#include <climits>
#include <deque>
#include <limits>

namespace cleave::passes::schedule {

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

llvm::Error genError(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

using StageOrder = std::vector<std::vector<Action>>; // [stage] -> F/B/BW

// GPipe: every forward, then every backward, microbatches in order.
StageOrder gpipeOrder(int P, int M, ActionKind backward) {
  StageOrder order(P);
  for (int s = 0; s < P; ++s) {
    for (int mb = 0; mb < M; ++mb)
      order[s].push_back(compute(ActionKind::F, mb));
    for (int mb = 0; mb < M; ++mb)
      order[s].push_back(compute(backward, mb));
  }
  return order;
}

// 1F1B: stage s runs P-s-1 warm-up forwards, then alternates one forward
// and one backward, then drains the remaining backwards. It holds at most
// min(P-s, M) microbatches.
StageOrder oneFOneBOrder(int P, int M, ActionKind backward) {
  StageOrder order(P);
  for (int s = 0; s < P; ++s) {
    int warmup = std::min(P - s - 1, M);
    for (int mb = 0; mb < warmup; ++mb)
      order[s].push_back(compute(ActionKind::F, mb));
    for (int k = 0; k + warmup < M; ++k) {
      order[s].push_back(compute(ActionKind::F, warmup + k));
      order[s].push_back(compute(backward, k));
    }
    for (int k = std::max(M - warmup, 0); k < M; ++k)
      order[s].push_back(compute(backward, k));
  }
  return order;
}

// Places the F, B and W actions of a 2BP schedule by timing the stages as
// the simulator would. Each stage either follows a prescribed F/B order or,
// without one, picks greedily: a ready B first (B is on the critical path
// up the pipeline), else a ready F. Either way an F waits while `limit`
// microbatches are held, and when nothing else can run the stage runs a
// pending W — so W fills the time a stage would otherwise idle, and
// whatever W is left runs at the end.
class WeightFillingBuilder {
public:
  WeightFillingBuilder(int P, int M, const PipelineCosts &costs,
                       StageOrder prescribed, int limit)
      : P_(P), M_(M), costs_(costs), prescribed_(std::move(prescribed)),
        limit_(limit), stages_(P), fEnd_(P, std::vector<double>(M, kNever)),
        bEnd_(P, std::vector<double>(M, kNever)) {}

  StageOrder build() && {
    while (true) {
      double now = earliestUnfinished();
      if (now == kNever)
        break;
      if (!commitOneAt(now))
        advanceWaitingStages(now);
    }
    StageOrder out(P_);
    for (int s = 0; s < P_; ++s)
      out[s] = std::move(stages_[s].order);
    return out;
  }

private:
  struct StageState {
    double clock = 0;
    size_t nextPrescribed = 0;
    int nextF = 0, nextB = 0, held = 0;
    std::deque<int> pendingW; // microbatches whose B ran, W not yet
    std::vector<Action> order;
  };

  bool finished(int s) const {
    const StageState &st = stages_[s];
    bool fbDone = prescribed_.empty()
                      ? st.nextF == M_ && st.nextB == M_
                      : st.nextPrescribed == prescribed_[s].size();
    return fbDone && st.pendingW.empty();
  }

  double earliestUnfinished() const {
    double t = kNever;
    for (int s = 0; s < P_; ++s)
      if (!finished(s))
        t = std::min(t, stages_[s].clock);
    return t;
  }

  // When the inputs of F(mb) / B(mb) on stage s are there (kNever: not yet
  // known, because the action they come from has not been placed).
  double readyF(int s, int mb) const {
    if (s == 0)
      return 0;
    double end = fEnd_[s - 1][mb];
    return end == kNever ? kNever
                         : end + transferTime(costs_, s - 1, ActionKind::SendF);
  }
  double readyB(int s, int mb) const {
    if (s == P_ - 1)
      return fEnd_[s][mb];
    double end = bEnd_[s + 1][mb];
    return end == kNever ? kNever
                         : end + transferTime(costs_, s + 1, ActionKind::SendB);
  }
  double ready(int s, const Action &a) const {
    return a.kind == ActionKind::F ? readyF(s, a.microbatch)
                                   : readyB(s, a.microbatch);
  }

  // The F or B actions stage s may run next, in order of preference: the
  // prescribed one, or a B and then an F; an F only while fewer than the
  // limit are held.
  llvm::SmallVector<Action, 2> candidates(int s) const {
    const StageState &st = stages_[s];
    llvm::SmallVector<Action, 2> out;
    if (!prescribed_.empty()) {
      if (st.nextPrescribed == prescribed_[s].size())
        return out;
      const Action &next = prescribed_[s][st.nextPrescribed];
      if (next.kind != ActionKind::F || st.held < limit_)
        out.push_back(next);
      return out;
    }
    if (st.nextB < st.nextF)
      out.push_back(compute(ActionKind::B, st.nextB));
    if (st.nextF < M_ && st.held < limit_)
      out.push_back(compute(ActionKind::F, st.nextF));
    return out;
  }

  // Places one action on a stage whose clock is `now`; false if none can
  // start now.
  bool commitOneAt(double now) {
    for (int s = 0; s < P_; ++s) {
      StageState &st = stages_[s];
      if (finished(s) || st.clock != now)
        continue;
      for (const Action &a : candidates(s))
        if (ready(s, a) <= now) {
          place(s, a);
          return true;
        }
      if (!st.pendingW.empty()) {
        place(s, compute(ActionKind::W, st.pendingW.front()));
        return true;
      }
    }
    return false;
  }

  void place(int s, const Action &a) {
    StageState &st = stages_[s];
    st.clock += computeCost(costs_, s, a.kind);
    st.order.push_back(a);
    switch (a.kind) {
    case ActionKind::F:
      fEnd_[s][a.microbatch] = st.clock;
      ++st.held;
      ++st.nextF;
      break;
    case ActionKind::B:
      bEnd_[s][a.microbatch] = st.clock;
      ++st.nextB;
      st.pendingW.push_back(a.microbatch);
      break;
    case ActionKind::W:
      st.pendingW.pop_front();
      --st.held;
      break;
    default:
      assert(false && "the builder places only F, B and W");
    }
    if (a.kind != ActionKind::W && !prescribed_.empty())
      ++st.nextPrescribed;
  }

  // No stage at `now` can start anything: move them to the next moment
  // something may change — an input they wait for arrives, or another
  // stage finishes its current action.
  void advanceWaitingStages(double now) {
    double next = kNever;
    for (int s = 0; s < P_; ++s) {
      if (finished(s))
        continue;
      if (stages_[s].clock > now)
        next = std::min(next, stages_[s].clock);
      else
        for (const Action &a : candidates(s))
          if (double r = ready(s, a); r > now)
            next = std::min(next, r);
    }
    assert(next != kNever && "schedule builder stalled");
    if (next == kNever)
      next = now + 1; // unreachable with positive F and B costs
    for (StageState &st : stages_)
      st.clock = std::max(st.clock, next);
  }

  int P_, M_;
  const PipelineCosts &costs_;
  StageOrder prescribed_; // empty: choose greedily
  int limit_;
  std::vector<StageState> stages_;
  std::vector<std::vector<double>> fEnd_, bEnd_; // kNever until placed
};

Schedule finish(const std::string &name, int P, int M, StageOrder order) {
  Schedule s{name, P, M, std::move(order)};
  insertCommunication(s);
  for (auto &list : s.actions)
    list.push_back(Action{ActionKind::Step, -1, -1});
  return s;
}

int peakActivations(const SimResult &r) {
  int peak = 0;
  for (const StageStats &st : r.stages)
    peak = std::max(peak, st.peakActivationMicrobatches);
  return peak;
}

// `auto`: every named schedule, simulated; the fastest whose peak fits the
// cap on every stage (ties: less memory, then the earlier name).
llvm::Expected<Schedule> pickFastest(int P, int M, const PipelineCosts &costs,
                                     const HeldCap &cap) {
  std::optional<Schedule> best;
  double bestTime = kNever;
  int bestPeak = INT_MAX, leastPeak = INT_MAX;
  std::string leastName;
  for (const std::string &name : scheduleNames()) {
    if (name == "auto")
      continue;
    auto s = makeSchedule(name, P, M, costs);
    if (!s)
      return s.takeError();
    auto r = simulate(*s, costs);
    if (!r)
      return r.takeError();
    int peak = peakActivations(*r);
    if (peak < leastPeak)
      leastPeak = peak, leastName = name;
    bool fits = true;
    for (size_t st = 0; st < r->stages.size() && st < cap.size(); ++st)
      fits = fits && r->stages[st].peakActivationMicrobatches <= cap[st];
    if (!fits)
      continue;
    if (r->stepTime < bestTime || (r->stepTime == bestTime && peak < bestPeak)) {
      best = std::move(*s);
      bestTime = r->stepTime;
      bestPeak = peak;
    }
  }
  if (!best) {
    bool uniform = std::all_of(cap.begin(), cap.end(),
                               [&](int c) { return c == cap[0]; });
    std::string limit =
        uniform ? "a memory cap of " + std::to_string(cap[0]) +
                      " microbatches per stage"
                : "the memory cap (" + std::to_string(
                      *std::min_element(cap.begin(), cap.end())) +
                      " microbatches on its tightest stage)";
    return genError("no schedule fits " + limit + "; the least any needs is " +
                    std::to_string(leastPeak) + " (" + leastName + ")");
  }
  return std::move(*best);
}

llvm::Error checkRequest(int P, int M, const PipelineCosts &costs) {
  if (P < 1 || M < 1)
    return genError("a schedule needs at least 1 stage and 1 microbatch, not " +
                    std::to_string(P) + " and " + std::to_string(M));
  if (int(costs.stages.size()) != P)
    return genError("the costs are for " + std::to_string(costs.stages.size()) +
                    " stages, the schedule has " + std::to_string(P));
  for (int s = 0; s < P; ++s) {
    const StageCost &c = costs.stages[s];
    if (!(c.f > 0) || !(c.b > 0) || !(c.w >= 0))
      return genError("stage " + std::to_string(s) +
                      ": F and B must take positive time and W no negative "
                      "time");
  }
  return llvm::Error::success();
}

} // namespace

const std::vector<std::string> &scheduleNames() {
  static const std::vector<std::string> names = {
      "gpipe", "1f1b", "gpipe-2bp", "1f1b-2bp", "zb-h1", "zb-h2", "auto"};
  return names;
}

llvm::Error checkScheduleName(const std::string &name) {
  if (std::find(scheduleNames().begin(), scheduleNames().end(), name) !=
      scheduleNames().end())
    return llvm::Error::success();
  std::string known;
  for (const std::string &n : scheduleNames())
    known += (known.empty() ? "" : ", ") + n;
  return genError("unknown schedule '" + name + "' (known: " + known +
                  ", csv:FILE)");
}

HeldCap heldCapFor(const PipelineCosts &costs, int64_t capBytes) {
  HeldCap out;
  for (const StageCost &c : costs.stages)
    out.push_back(c.activationBytes > 0
                      ? int(std::clamp<int64_t>(
                            (capBytes - c.staticBytes) / c.activationBytes, 0,
                            INT_MAX))
                      : INT_MAX);
  return out;
}

llvm::Expected<Schedule> makeSchedule(const std::string &name, int P, int M,
                                      const PipelineCosts &costs,
                                      std::optional<int> memCap) {
  return makeSchedule(name, P, M, costs,
                      memCap ? HeldCap(size_t(std::max(P, 0)), *memCap)
                             : HeldCap());
}

llvm::Expected<Schedule> makeSchedule(const std::string &name, int P, int M,
                                      const PipelineCosts &costs,
                                      const HeldCap &memCap) {
  if (auto e = checkScheduleName(name))
    return std::move(e);
  if (auto e = checkRequest(P, M, costs))
    return std::move(e);
  auto placeW = [&](StageOrder prescribed, int limit) {
    return WeightFillingBuilder(P, M, costs, std::move(prescribed), limit)
        .build();
  };
  if (name == "gpipe")
    return finish(name, P, M, gpipeOrder(P, M, ActionKind::BW));
  if (name == "1f1b")
    return finish(name, P, M, oneFOneBOrder(P, M, ActionKind::BW));
  if (name == "gpipe-2bp")
    return finish(name, P, M,
                  placeW(gpipeOrder(P, M, ActionKind::B), INT_MAX));
  if (name == "1f1b-2bp")
    return finish(name, P, M,
                  placeW(oneFOneBOrder(P, M, ActionKind::B), INT_MAX));
  if (name == "zb-h1")
    return finish(name, P, M,
                  placeW(oneFOneBOrder(P, M, ActionKind::B),
                                std::min(P, M)));
  if (name == "zb-h2")
    return finish(name, P, M, placeW({}, std::min(2 * P - 1, M)));
  // checkScheduleName left only `auto`.
  if (memCap.empty())
    return pickFastest(P, M, costs, HeldCap(size_t(P), INT_MAX));
  return pickFastest(P, M, costs, memCap);
}

} // namespace cleave::passes::schedule
