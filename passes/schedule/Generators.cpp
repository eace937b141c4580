#include "passes/schedule/Generators.h"

#include "passes/schedule/Simulator.h"

#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <array>
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
using RankOrder = std::vector<std::vector<PlacedAction>>; // [rank] -> F/B/BW

// Where each stage runs and how many ranks there are.
struct Placement {
  int ranks = 0;
  std::vector<int> rankOf; // [stage]
  // One stage per rank (rank s runs stage s): the schedule keeps no
  // placement.
  bool trivial() const { return int(rankOf.size()) == ranks; }
};

Placement onePerRank(int P) {
  Placement p{P, {}};
  for (int s = 0; s < P; ++s)
    p.rankOf.push_back(s);
  return p;
}

// v stages per rank, round-robin: stage c * P + r on rank r (interleaved,
// looping).
Placement roundRobin(int P, int v) {
  Placement p{P, {}};
  for (int c = 0; c < v; ++c)
    for (int r = 0; r < P; ++r)
      p.rankOf.push_back(r);
  return p;
}

// Two stages per rank in a V: rank r runs stages r and 2P-1-r.
Placement vShape(int P) {
  Placement p{P, std::vector<int>(size_t(2 * P))};
  for (int r = 0; r < P; ++r)
    p.rankOf[size_t(r)] = p.rankOf[size_t(2 * P - 1 - r)] = r;
  return p;
}

RankOrder asRankOrder(const StageOrder &order) {
  RankOrder out(order.size());
  for (size_t s = 0; s < order.size(); ++s)
    for (const Action &a : order[s])
      out[s].push_back({int(s), a});
  return out;
}

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

// Interleaved 1F1B (Megatron-LM) on P ranks with v stages each, placed
// round-robin. The rank's k-th forward is of stage ((k mod Pv) / P) P + r,
// microbatch (k / Pv) P + k mod P: P microbatches through one of its
// stages, then through the next. Its backwards go the same way through
// the stages in reverse. Rank r warms up with 2(P-r-1) + (v-1)P forwards,
// then alternates one forward and one backward. Needs M a multiple of P.
RankOrder interleavedOrder(int P, int v, int M, ActionKind backward) {
  RankOrder order(P);
  int total = v * M;
  auto stageOf = [&](int r, int k, bool fwd) {
    int c = (k % (P * v)) / P;
    return (fwd ? c : v - 1 - c) * P + r;
  };
  auto mbOf = [&](int k) { return (k / (P * v)) * P + k % P; };
  for (int r = 0; r < P; ++r) {
    int warmup = std::min(2 * (P - r - 1) + (v - 1) * P, total);
    auto fwd = [&](int k) {
      order[r].push_back({stageOf(r, k, true), compute(ActionKind::F, mbOf(k))});
    };
    auto bwd = [&](int k) {
      order[r].push_back({stageOf(r, k, false), compute(backward, mbOf(k))});
    };
    for (int k = 0; k < warmup; ++k)
      fwd(k);
    for (int k = 0; k + warmup < total; ++k) {
      fwd(warmup + k);
      bwd(k);
    }
    for (int k = std::max(total - warmup, 0); k < total; ++k)
      bwd(k);
  }
  return order;
}

// Looped BFS (breadth-first pipeline parallelism): each rank runs every
// microbatch's forward through its first stage, then through its next, and
// the backwards through its stages in reverse, all microbatches each.
RankOrder loopedOrder(int P, int v, int M, ActionKind backward) {
  RankOrder order(P);
  for (int r = 0; r < P; ++r) {
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < M; ++mb)
        order[r].push_back({c * P + r, compute(ActionKind::F, mb)});
    for (int c = v - 1; c >= 0; --c)
      for (int mb = 0; mb < M; ++mb)
        order[r].push_back({c * P + r, compute(backward, mb)});
  }
  return order;
}

// DualPipeV (DeepSeek's DualPipe cut in half): the V placement (rank r runs
// stage r, "chunk 0", and stage 2P-1-r, "chunk 1"), M >= 2P, and rank r's
// program in eight phases, with F&B (one microbatch's forward beside
// another's full backward, which DualPipe overlaps with their messages)
// as the two actions one after the other:
//   1. 2(P-r-1) F of chunk 0            5. P-r-1 x (BW 1, F 1 & BW 0)
//   2. r+1 x (F 0, F 1)                 6. r+1 x (B 1, B 0), from the
//   3. P-r-1 x (B 1, W 1, F 1)             middle on with W deferred
//   4. M-2P+r+1 x (F 0 & BW 1,          7. P-r-1 x (a deferred W, B 0
//                  F 1 & BW 0)             with its W deferred)
//                                       8. r+1 deferred W
// A deferred W runs in the order its B ran. Every chunk gets M forwards
// and M backwards; P W are deferred and P run in phases 7 and 8.
RankOrder dualPipeVOrder(int P, int M) {
  RankOrder order(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    std::vector<PlacedAction> &prog = order[size_t(r)];
    const int stage[2] = {r, 2 * P - 1 - r};
    int nextF[2] = {0, 0}, nextB[2] = {0, 0};
    std::deque<PlacedAction> deferred;
    auto fwd = [&](int c) {
      prog.push_back({stage[c], compute(ActionKind::F, nextF[c]++)});
    };
    auto bwd = [&](int c, bool deferW) {
      int mb = nextB[c]++;
      if (!deferW) {
        prog.push_back({stage[c], compute(ActionKind::BW, mb)});
        return;
      }
      prog.push_back({stage[c], compute(ActionKind::B, mb)});
      deferred.push_back({stage[c], compute(ActionKind::W, mb)});
    };
    auto weight = [&] {
      prog.push_back(deferred.front());
      deferred.pop_front();
    };
    for (int i = 0; i < 2 * (P - r - 1); ++i)
      fwd(0);
    for (int i = 0; i < r + 1; ++i) {
      fwd(0);
      fwd(1);
    }
    for (int i = 0; i < P - r - 1; ++i) {
      bwd(1, true);
      weight();
      fwd(1);
    }
    for (int i = 0; i < M - 2 * P + r + 1; ++i) {
      fwd(0);
      bwd(1, false);
      fwd(1);
      bwd(0, false);
    }
    for (int i = 0; i < P - r - 1; ++i) {
      bwd(1, false);
      fwd(1);
      bwd(0, false);
    }
    // Phase 6 starts deferring W halfway, on odd ranks before chunk 1's B
    // and on even ranks after it.
    bool deferW = false;
    for (int i = 0; i < r + 1; ++i) {
      if (i == (r + 1) / 2 && r % 2 == 1)
        deferW = true;
      bwd(1, deferW);
      if (i == (r + 1) / 2 && r % 2 == 0)
        deferW = true;
      bwd(0, deferW);
    }
    for (int i = 0; i < P - r - 1; ++i) {
      weight();
      bwd(0, true);
    }
    for (int i = 0; i < r + 1; ++i)
      weight();
    assert(deferred.empty() && nextF[0] == M && nextF[1] == M &&
           nextB[0] == M && nextB[1] == M);
  }
  return order;
}

// V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory"): a
// schedule is one building block — where one microbatch's six actions on
// each rank (F, B, W of its two stages) fall in time — repeated every
// microbatch, and a rank holds a microbatch from its F to its W, so the
// block's lifespans decide the memory. V-Min is the tightest V block: at
// equal costs (each action one slot of a half-size stage) every action
// follows the one it depends on as soon as the rank has a free slot, and a
// rank's six actions fall in six different slots modulo the period of 6,
// so the repeated blocks never collide and the steady state has no idle
// time. Built greedily along the microbatch's path — F down the V (stages
// 0 .. 2P-1), B back up (2P-1 .. 0), each at the first slot after its
// predecessor whose residue is free on its rank — then each rank's two W
// take its two free residues, in whichever assignment holds less. The
// lifespans add up to about 4P slots per rank, so a rank holds about
// P/3 + 1 microbatches of its share (2P/3 + 2 half-size ones) where 1F1B's
// first stage holds P: at equal costs the published (P+4)/3, rounded down
// (checked for P = 2 .. 12). Each rank's program is its actions sorted by
// block time (block time + 6 x microbatch); run as soon as they can, the
// warm-up and cool-down squeeze together. The order is fixed, so other
// costs change the timing but neither the memory nor the validity.
RankOrder vMinOrder(int P, int M) {
  constexpr int kPeriod = 6;
  struct Slot {
    int stage;
    ActionKind kind;
    int time;
  };
  std::vector<std::array<bool, kPeriod>> taken(size_t(P),
                                               std::array<bool, kPeriod>{});
  std::vector<std::vector<Slot>> block(static_cast<size_t>(P));
  auto firstFree = [&](int rank, int from) {
    int t = from;
    while (taken[size_t(rank)][size_t(t % kPeriod)])
      ++t;
    taken[size_t(rank)][size_t(t % kPeriod)] = true;
    return t;
  };
  auto rankOfStage = [&](int s) { return s < P ? s : 2 * P - 1 - s; };
  int t = -1;
  std::vector<int> bTime(size_t(2 * P)), fTime(size_t(2 * P));
  for (int s = 0; s < 2 * P; ++s) {
    t = fTime[size_t(s)] = firstFree(rankOfStage(s), t + 1);
    block[size_t(rankOfStage(s))].push_back({s, ActionKind::F, t});
  }
  for (int s = 2 * P - 1; s >= 0; --s) {
    t = bTime[size_t(s)] = firstFree(rankOfStage(s), t + 1);
    block[size_t(rankOfStage(s))].push_back({s, ActionKind::B, t});
  }
  for (int r = 0; r < P; ++r) {
    int freeResidue[2], n = 0;
    for (int k = 0; k < kPeriod; ++k)
      if (!taken[size_t(r)][size_t(k)])
        freeResidue[n++] = k;
    assert(n == 2);
    const int stage[2] = {r, 2 * P - 1 - r};
    // The first slot after `after` with residue `residue`.
    auto next = [](int after, int residue) {
      return after + 1 +
             ((residue - (after + 1)) % kPeriod + kPeriod) % kPeriod;
    };
    auto held = [&](int w0, int w1) {
      return (w0 + 1 - fTime[size_t(stage[0])]) +
             (w1 + 1 - fTime[size_t(stage[1])]);
    };
    int a0 = next(bTime[size_t(stage[0])], freeResidue[0]),
        a1 = next(bTime[size_t(stage[1])], freeResidue[1]);
    int b0 = next(bTime[size_t(stage[0])], freeResidue[1]),
        b1 = next(bTime[size_t(stage[1])], freeResidue[0]);
    bool swap = held(b0, b1) < held(a0, a1);
    block[size_t(r)].push_back({stage[0], ActionKind::W, swap ? b0 : a0});
    block[size_t(r)].push_back({stage[1], ActionKind::W, swap ? b1 : a1});
  }
  RankOrder order(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    std::vector<std::pair<int, PlacedAction>> timed;
    for (int mb = 0; mb < M; ++mb)
      for (const Slot &sl : block[size_t(r)])
        timed.push_back(
            {sl.time + kPeriod * mb, {sl.stage, compute(sl.kind, mb)}});
    std::sort(timed.begin(), timed.end(),
              [](const auto &a, const auto &b) { return a.first < b.first; });
    for (const auto &entry : timed)
      order[size_t(r)].push_back(entry.second);
  }
  return order;
}

// Places the F, B and W actions of a 2BP schedule by timing the ranks as
// the simulator would. Each rank either follows a prescribed F/B order or,
// without one, picks greedily among its stages: a ready B first (B is on
// the critical path up the pipeline; the lowest microbatch, then the later
// stage), else a ready F (the later stage first: it brings a microbatch
// nearer its backward). Either way an F of the rank's first stage — new
// work entering the rank — waits while `limit` microbatches are held on
// the rank, and when nothing else can run the rank runs its oldest pending
// W — so W fills the time a rank would otherwise idle, and whatever W is
// left runs at the end. With one stage per rank this is the zero-bubble
// paper's H1 and H2 construction.
class WeightFillingBuilder {
public:
  WeightFillingBuilder(const Placement &place, int M, const PipelineCosts &costs,
                       RankOrder prescribed, int limit)
      : S_(int(place.rankOf.size())), M_(M), place_(place), costs_(costs),
        prescribed_(std::move(prescribed)), limit_(limit),
        ranks_(place.ranks),
        nextF_(S_, 0), nextB_(S_, 0), fEnd_(S_, std::vector<double>(M, kNever)),
        bEnd_(S_, std::vector<double>(M, kNever)) {
    for (int s = 0; s < S_; ++s)
      ranks_[size_t(place.rankOf[s])].stages.push_back(s);
  }

  RankOrder build() && {
    while (true) {
      double now = earliestUnfinished();
      if (now == kNever)
        break;
      if (!commitOneAt(now))
        advanceWaitingRanks(now);
    }
    RankOrder out(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r)
      out[r] = std::move(ranks_[r].order);
    return out;
  }

private:
  struct RankState {
    std::vector<int> stages; // increasing
    double clock = 0;
    size_t nextPrescribed = 0;
    int held = 0;
    int entered = 0, forwards = 0; // F's of its first stage, of all stages
    std::deque<std::pair<int, int>> pendingW; // (stage, microbatch): B ran
    std::vector<PlacedAction> order;
  };

  bool finished(size_t r) const {
    const RankState &rk = ranks_[r];
    bool fbDone = true;
    if (!prescribed_.empty())
      fbDone = rk.nextPrescribed == prescribed_[r].size();
    else
      for (int s : rk.stages)
        fbDone = fbDone && nextF_[s] == M_ && nextB_[s] == M_;
    return fbDone && rk.pendingW.empty();
  }

  double earliestUnfinished() const {
    double t = kNever;
    for (size_t r = 0; r < ranks_.size(); ++r)
      if (!finished(r))
        t = std::min(t, ranks_[r].clock);
    return t;
  }

  double transfer(int from, int to, ActionKind send) const {
    return place_.rankOf[from] == place_.rankOf[to]
               ? 0
               : transferTime(costs_, from, to, send);
  }

  // When the inputs of F(mb) / B(mb) on stage s are there (kNever: not yet
  // known, because the action they come from has not been placed).
  double readyF(int s, int mb) const {
    if (s == 0)
      return 0;
    double end = fEnd_[s - 1][mb];
    return end == kNever ? kNever : end + transfer(s - 1, s, ActionKind::SendF);
  }
  double readyB(int s, int mb) const {
    if (s == S_ - 1)
      return fEnd_[s][mb];
    double end = bEnd_[s + 1][mb];
    return end == kNever ? kNever : end + transfer(s + 1, s, ActionKind::SendB);
  }
  double ready(const PlacedAction &a) const {
    return a.action.kind == ActionKind::F ? readyF(a.stage, a.action.microbatch)
                                          : readyB(a.stage, a.action.microbatch);
  }

  // The F or B actions rank r may run next, in order of preference.
  llvm::SmallVector<PlacedAction, 4> candidates(size_t r) const {
    const RankState &rk = ranks_[r];
    llvm::SmallVector<PlacedAction, 4> out;
    // An F of the rank's first stage takes in a microbatch that will hold
    // a slot on each of the rank's stages before any of them is freed, so
    // it waits unless all of them fit under the limit; the rank's later
    // F's use slots reserved so.
    auto mayRunF = [&](int s) {
      int local = int(rk.stages.size());
      int reserved = rk.entered * local - rk.forwards;
      return s != rk.stages.front() ||
             int64_t(rk.held) + reserved + local <= int64_t(limit_);
    };
    if (!prescribed_.empty()) {
      if (rk.nextPrescribed == prescribed_[r].size())
        return out;
      const PlacedAction &next = prescribed_[r][rk.nextPrescribed];
      if (next.action.kind != ActionKind::F || mayRunF(next.stage))
        out.push_back(next);
      return out;
    }
    llvm::SmallVector<PlacedAction, 4> bs, fs;
    for (int s : rk.stages) {
      if (nextB_[s] < nextF_[s])
        bs.push_back({s, compute(ActionKind::B, nextB_[s])});
      if (nextF_[s] < M_ && mayRunF(s))
        fs.push_back({s, compute(ActionKind::F, nextF_[s])});
    }
    std::stable_sort(bs.begin(), bs.end(), [](const PlacedAction &a, const PlacedAction &b) {
      return a.action.microbatch != b.action.microbatch
                 ? a.action.microbatch < b.action.microbatch
                 : a.stage > b.stage;
    });
    out.append(bs.begin(), bs.end());
    out.append(fs.rbegin(), fs.rend());
    return out;
  }

  // Places one action on a rank whose clock is `now`; false if none can
  // start now.
  bool commitOneAt(double now) {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      RankState &rk = ranks_[r];
      if (finished(r) || rk.clock != now)
        continue;
      for (const PlacedAction &a : candidates(r))
        if (ready(a) <= now) {
          place(r, a);
          return true;
        }
      if (!rk.pendingW.empty()) {
        auto [s, mb] = rk.pendingW.front();
        place(r, {s, compute(ActionKind::W, mb)});
        return true;
      }
    }
    return false;
  }

  void place(size_t r, const PlacedAction &pa) {
    RankState &rk = ranks_[r];
    const Action &a = pa.action;
    int s = pa.stage;
    rk.clock += computeCost(costs_, s, a.kind);
    rk.order.push_back(pa);
    switch (a.kind) {
    case ActionKind::F:
      fEnd_[s][a.microbatch] = rk.clock;
      ++rk.held;
      ++rk.forwards;
      rk.entered += s == rk.stages.front();
      ++nextF_[s];
      break;
    case ActionKind::B:
      bEnd_[s][a.microbatch] = rk.clock;
      ++nextB_[s];
      rk.pendingW.push_back({s, a.microbatch});
      break;
    case ActionKind::W:
      rk.pendingW.pop_front();
      --rk.held;
      break;
    default:
      assert(false && "the builder places only F, B and W");
    }
    if (a.kind != ActionKind::W && !prescribed_.empty())
      ++rk.nextPrescribed;
  }

  // No rank at `now` can start anything: move them to the next moment
  // something may change — an input they wait for arrives, or another
  // rank finishes its current action.
  void advanceWaitingRanks(double now) {
    double next = kNever;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      if (finished(r))
        continue;
      if (ranks_[r].clock > now)
        next = std::min(next, ranks_[r].clock);
      else
        for (const PlacedAction &a : candidates(r))
          if (double t = ready(a); t > now)
            next = std::min(next, t);
    }
    assert(next != kNever && "schedule builder stalled");
    if (next == kNever)
      next = now + 1; // unreachable with positive F and B costs
    for (RankState &rk : ranks_)
      rk.clock = std::max(rk.clock, next);
  }

  int S_, M_;
  const Placement &place_;
  const PipelineCosts &costs_;
  RankOrder prescribed_; // empty: choose greedily
  int limit_;
  std::vector<RankState> ranks_;
  std::vector<int> nextF_, nextB_; // by stage
  std::vector<std::vector<double>> fEnd_, bEnd_; // kNever until placed
};

// The finished schedule: messages inserted, and each stage's STEP last, the
// rank's stages in increasing order.
Schedule finish(const std::string &name, int M, const Placement &place,
                RankOrder order) {
  int S = int(place.rankOf.size());
  for (size_t r = 0; r < order.size(); ++r)
    for (int s = 0; s < S; ++s)
      if (place.rankOf[s] == int(r))
        order[r].push_back({s, Action{ActionKind::Step, -1, -1}});
  Schedule s = scheduleFromPrograms(name, S, M,
                                    place.trivial() ? std::vector<int>()
                                                    : place.rankOf,
                                    order);
  insertCommunication(s);
  return s;
}

Schedule finish(const std::string &name, int P, int M, StageOrder order) {
  return finish(name, M, onePerRank(P), asRankOrder(order));
}

int peakActivations(const SimResult &r) {
  int peak = 0;
  for (const StageStats &st : r.stages)
    peak = std::max(peak, st.peakActivationMicrobatches);
  return peak;
}

// `auto`: every named schedule, simulated; the fastest whose peak fits the
// cap on every stage (ties: less memory, then the earlier name).
// With several stages per rank, among the schedules that run `chunks`.
llvm::Expected<Schedule> pickFastest(int P, int M, const PipelineCosts &costs,
                                     const HeldCap &cap, int chunks) {
  std::optional<Schedule> best;
  double bestTime = kNever;
  int bestPeak = INT_MAX, leastPeak = INT_MAX;
  std::string leastName;
  for (const std::string &name :
       chunks == 1 ? scheduleNames() : chunkedScheduleNames()) {
    if (name == "auto")
      continue;
    if (llvm::Error e = checkChunks(name, P, M, chunks)) {
      llvm::consumeError(std::move(e));
      continue;
    }
    auto s = makeSchedule(name, P, M, costs, HeldCap(), chunks);
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
  if (!best && leastName.empty())
    return genError("no schedule runs " + std::to_string(chunks) +
                    " stages per rank with " + std::to_string(M) +
                    " microbatches");
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

llvm::Error checkRequest(int S, int M, const PipelineCosts &costs) {
  if (S < 1 || M < 1)
    return genError("a schedule needs at least 1 stage and 1 microbatch, not " +
                    std::to_string(S) + " and " + std::to_string(M));
  if (int(costs.stages.size()) != S)
    return genError("the costs are for " + std::to_string(costs.stages.size()) +
                    " stages, the schedule has " + std::to_string(S));
  for (int s = 0; s < S; ++s) {
    const StageCost &c = costs.stages[s];
    if (!(c.f > 0) || !(c.b > 0) || !(c.w >= 0))
      return genError("stage " + std::to_string(s) +
                      ": F and B must take positive time and W no negative "
                      "time");
  }
  return llvm::Error::success();
}

bool isVShaped(const std::string &name) {
  return name == "zb-v" || name == "v-half" || name == "v-min" ||
         name == "dualpipe-v";
}

} // namespace

const std::vector<std::string> &scheduleNames() {
  static const std::vector<std::string> names = {
      "gpipe", "1f1b", "gpipe-2bp", "1f1b-2bp", "zb-h1", "zb-h2", "auto"};
  return names;
}

const std::vector<std::string> &chunkedScheduleNames() {
  static const std::vector<std::string> names = {
      "interleaved-1f1b", "interleaved-1f1b-2bp", "looped-bfs",
      "looped-bfs-2bp",   "zb-v",                 "v-half",
      "v-min",            "dualpipe-v"};
  return names;
}

bool isChunkedSchedule(const std::string &name) {
  const auto &n = chunkedScheduleNames();
  return std::find(n.begin(), n.end(), name) != n.end();
}

int defaultChunks(const std::string &name) {
  return isChunkedSchedule(name) ? 2 : 1;
}

llvm::Error checkScheduleName(const std::string &name) {
  if (std::find(scheduleNames().begin(), scheduleNames().end(), name) !=
          scheduleNames().end() ||
      isChunkedSchedule(name))
    return llvm::Error::success();
  std::string known;
  for (const auto *list : {&scheduleNames(), &chunkedScheduleNames()})
    for (const std::string &n : *list)
      known += (known.empty() ? "" : ", ") + n;
  return genError("unknown schedule '" + name + "' (known: " + known +
                  ", csv:FILE)");
}

llvm::Error checkChunks(const std::string &name, int stages, int microbatches,
                        int chunks) {
  if (chunks < 1)
    return genError("--chunks must be at least 1, not " + std::to_string(chunks));
  if (name == "auto") {
    if (stages % chunks != 0)
      return genError(std::to_string(stages) + " stages do not split into " +
                      std::to_string(chunks) + " per rank");
    return llvm::Error::success();
  }
  if (!isChunkedSchedule(name)) {
    if (chunks != 1)
      return genError("schedule '" + name + "' runs one stage per rank; "
                      "--chunks " + std::to_string(chunks) +
                      " needs one of " + [] {
                        std::string n;
                        for (const std::string &c : chunkedScheduleNames())
                          n += (n.empty() ? "" : ", ") + c;
                        return n;
                      }());
    return llvm::Error::success();
  }
  if (isVShaped(name) && chunks != 2)
    return genError("schedule '" + name + "' runs 2 stages per rank in a V, "
                    "not " + std::to_string(chunks));
  if (stages % chunks != 0)
    return genError(std::to_string(stages) + " stages do not split into " +
                    std::to_string(chunks) + " per rank");
  int ranks = stages / chunks;
  if (name == "dualpipe-v" && microbatches < 2 * ranks)
    return genError("schedule 'dualpipe-v' needs at least twice as many "
                    "microbatches as ranks (" + std::to_string(2 * ranks) +
                    "), not " + std::to_string(microbatches));
  if (name.rfind("interleaved-1f1b", 0) == 0 && microbatches % ranks != 0)
    return genError("schedule '" + name + "' needs the microbatches (" +
                    std::to_string(microbatches) + ") to be a multiple of the "
                    "ranks (" + std::to_string(ranks) + ")");
  return llvm::Error::success();
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
  return makeSchedule(name, P, M, costs, memCap, 1);
}

llvm::Expected<Schedule> makeSchedule(const std::string &name, int S, int M,
                                      const PipelineCosts &costs,
                                      const HeldCap &memCap, int chunks) {
  if (auto e = checkScheduleName(name))
    return std::move(e);
  if (auto e = checkRequest(S, M, costs))
    return std::move(e);
  if (auto e = checkChunks(name, S, M, chunks))
    return std::move(e);
  int P = S / chunks; // ranks
  auto placeW = [&](const Placement &place, RankOrder prescribed, int limit) {
    return WeightFillingBuilder(place, M, costs, std::move(prescribed), limit)
        .build();
  };
  auto placeOne = [&](StageOrder prescribed, int limit) {
    return placeW(onePerRank(S), asRankOrder(prescribed), limit);
  };
  if (name == "gpipe")
    return finish(name, S, M, gpipeOrder(S, M, ActionKind::BW));
  if (name == "1f1b")
    return finish(name, S, M, oneFOneBOrder(S, M, ActionKind::BW));
  if (name == "gpipe-2bp")
    return finish(name, M, onePerRank(S),
                  placeOne(gpipeOrder(S, M, ActionKind::B), INT_MAX));
  if (name == "1f1b-2bp")
    return finish(name, M, onePerRank(S),
                  placeOne(oneFOneBOrder(S, M, ActionKind::B), INT_MAX));
  if (name == "zb-h1")
    return finish(name, M, onePerRank(S),
                  placeOne(oneFOneBOrder(S, M, ActionKind::B), std::min(S, M)));
  if (name == "zb-h2")
    return finish(name, M, onePerRank(S),
                  placeOne({}, std::min(2 * S - 1, M)));
  Placement rr = roundRobin(P, chunks);
  if (name == "interleaved-1f1b")
    return finish(name, M, rr, interleavedOrder(P, chunks, M, ActionKind::BW));
  if (name == "interleaved-1f1b-2bp")
    return finish(name, M, rr,
                  placeW(rr, interleavedOrder(P, chunks, M, ActionKind::B),
                         INT_MAX));
  if (name == "looped-bfs")
    return finish(name, M, rr, loopedOrder(P, chunks, M, ActionKind::BW));
  if (name == "looped-bfs-2bp")
    return finish(name, M, rr,
                  placeW(rr, loopedOrder(P, chunks, M, ActionKind::B), INT_MAX));
  Placement v = vShape(P);
  // ZB-V: 1F1B's activation memory, 2P microbatches of a half-size stage
  // on each rank; V-Half: half of it and one microbatch more (P + 2).
  if (name == "zb-v")
    return finish(name, M, v, placeW(v, {}, 2 * P));
  if (name == "v-half")
    return finish(name, M, v, placeW(v, {}, P + 2));
  if (name == "dualpipe-v")
    return finish(name, M, v, dualPipeVOrder(P, M));
  if (name == "v-min")
    return finish(name, M, v, vMinOrder(P, M));
  // checkScheduleName left only `auto`.
  if (memCap.empty())
    return pickFastest(S, M, costs, HeldCap(size_t(S), INT_MAX), chunks);
  return pickFastest(S, M, costs, memCap, chunks);
}

} // namespace cleave::passes::schedule
