#include "passes/schedule/Simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace cleave::passes::schedule {

namespace {

llvm::Error simError(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

// Identifies a message: its direction (the SEND kind), microbatch, sender
// and receiver; or, with receiver -1, the value a SEND of that kind sends.
// Hashed flat (a schedule of 2^20 microbatches holds millions of them).
struct MessageKey {
  ActionKind kind;
  int microbatch, from, to;
  bool operator==(const MessageKey &) const = default;
};
struct MessageKeyHash {
  size_t operator()(const MessageKey &k) const {
    uint64_t h = (uint64_t(uint32_t(k.microbatch)) << 32) ^
                 (uint64_t(uint32_t(k.from)) << 12) ^ uint64_t(uint32_t(k.to)) ^
                 (uint64_t(k.kind) << 58);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return size_t(h);
  }
};

ActionKind matchingSend(ActionKind recv) {
  return recv == ActionKind::RecvF ? ActionKind::SendF : ActionKind::SendB;
}

MessageKey keyOfRecv(int stage, const Action &recv) {
  return {matchingSend(recv.kind), recv.microbatch, recv.peer, stage};
}

std::string where(int stage, size_t index, const Action &a) {
  return "stage " + std::to_string(stage) + ", action " +
         std::to_string(index) + " (" + actionName(a) + ")";
}

// Runs the ranks in dataflow order. Because SENDs never block, the times
// do not depend on the order the ranks are visited in.
class StepSimulator {
public:
  StepSimulator(const Schedule &s, const PipelineCosts &costs)
      : s_(s), costs_(costs), programs_(rankPrograms(s)),
        cursor_(programs_.size(), 0), clock_(programs_.size(), 0),
        heldBytes_(programs_.size(), 0), heldCount_(programs_.size(), 0),
        held_(s.stages, 0),
        started_(s.stages, false), rankStarted_(programs_.size(), false) {
    result_.stages.resize(s.stages);
    result_.ranks.resize(programs_.size());
    result_.spans.resize(s.stages);
    for (int st = 0; st < s.stages; ++st)
      result_.spans[st].resize(s.actions[st].size());
  }

  llvm::Expected<SimResult> run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (size_t r = 0; r < programs_.size(); ++r)
        progress |= advance(r);
    }
    for (size_t r = 0; r < programs_.size(); ++r)
      if (cursor_[r] < programs_[r].size())
        return explainStall(r);
    summarize();
    return std::move(result_);
  }

  // The ranks share `cores` (< ranks) cores: the same actions in the same
  // order, but time advances for all ranks together, and while k of them
  // compute each runs at min(1, cores / k) of its speed.
  llvm::Expected<SimResult> runShared(double cores) {
    size_t n = programs_.size();
    computing_.assign(n, Work{});
    recvSince_.assign(n, -1);
    double t = 0;
    while (true) {
      bool progress = true;
      while (progress) {
        progress = false;
        for (size_t r = 0; r < n; ++r)
          if (!computing_[r].active)
            progress |= proceed(r, t);
      }
      size_t busy = 0;
      for (const Work &w : computing_)
        busy += w.active;
      // The next message one of the blocked ranks waits for.
      std::optional<double> arrival;
      for (size_t r = 0; r < n; ++r)
        if (!computing_[r].active && cursor_[r] < programs_[r].size()) {
          const Action &a = actionAt(r);
          int st = programs_[r][cursor_[r]].stage;
          if (std::optional<double> at = peekMessage(keyOfRecv(st, a)))
            if (*at > t)
              arrival = arrival ? std::min(*arrival, *at) : *at;
        }
      if (busy == 0) {
        if (!arrival)
          break; // done, or stalled: run() below tells which
        t = *arrival;
        continue;
      }
      double rate = std::min(1.0, cores / double(busy));
      double dt = arrival ? *arrival - t : INFINITY;
      for (const Work &w : computing_)
        if (w.active)
          dt = std::min(dt, (w.remaining - std::max(0.0, w.sendAt)) / rate);
      t += dt;
      for (size_t r = 0; r < n; ++r) {
        Work &w = computing_[r];
        if (!w.active)
          continue;
        w.remaining -= dt * rate;
        const double eps = 1e-12 * std::max(1.0, t);
        if (w.sendAt > 0 && w.remaining <= w.sendAt + eps) {
          setMade(ActionKind::SendB, w.stage, w.microbatch, t);
          w.sendAt = -1;
          w.sent = true;
          postEarly(r, t);
        }
        if (w.remaining <= eps)
          finishShared(r, t);
      }
    }
    for (size_t r = 0; r < n; ++r)
      if (cursor_[r] < programs_[r].size())
        return explainStall(r);
    summarize();
    return std::move(result_);
  }

private:
  // A compute action under way on a rank of a shared run.
  struct Work {
    bool active = false;
    double remaining = 0; // of its cost, at full speed
    double sendAt = -1;   // BW: the remaining work at which its B part ends
    int stage = 0, microbatch = 0;
    bool sent = false;    // its B part's gradient is made (sendAt passed)
  };
  std::vector<Work> computing_; // by rank
  std::vector<double> recvSince_; // by rank: when it began waiting, or -1
  std::set<std::pair<int, size_t>> posted_; // SENDs posted by postEarly

  // Runs rank `r`'s messages at time `t` until it blocks or starts a
  // compute action; true if it moved.
  bool proceed(size_t r, double t) {
    bool moved = false;
    const auto &prog = programs_[r];
    while (cursor_[r] < prog.size()) {
      int st = prog[cursor_[r]].stage;
      const Action &a = actionAt(r);
      Span &span = result_.spans[st][prog[cursor_[r]].index];
      if (a.kind == ActionKind::RecvF || a.kind == ActionKind::RecvB) {
        std::optional<double> at = peekMessage(keyOfRecv(st, a));
        if (!at || *at > t) {
          if (recvSince_[r] < 0)
            recvSince_[r] = t;
          return moved;
        }
        takeMessage(keyOfRecv(st, a));
        span.start = recvSince_[r] >= 0 ? recvSince_[r] : t;
        span.end = t;
        recvSince_[r] = -1;
      } else if (isSend(a.kind)) {
        if (!posted_.count({st, prog[cursor_[r]].index}))
          post(r, st, a, span, t);
      } else {
        double cost = computeCost(costs_, st, a.kind);
        if (a.kind == ActionKind::Step && cost <= 0) {
          span.start = t;
          ++cursor_[r];
          moved = true;
          continue;
        }
        span.start = t;
        noteStart(r, st, t);
        const StageCost &c = costs_.stages[st];
        Work &w = computing_[r];
        w = Work{true, cost, -1, st, a.microbatch, false};
        if (a.kind == ActionKind::BW && costs_.bwSendsAfterB && c.w > 0)
          w.sendAt = c.w;
        if (cost <= 0)
          finishShared(r, t);
        return true;
      }
      ++cursor_[r];
      moved = true;
    }
    return moved;
  }

  // Posts rank `r`'s SEND `a` of `st` at time `t` (or when its value was
  // made, if earlier).
  void post(size_t r, int st, const Action &a, Span &span, double t) {
    std::optional<double> made = madeAt(a.kind, st, a.microbatch);
    span.start = made ? std::min(*made, t) : t;
    bool local = a.peer >= 0 && a.peer < s_.stages &&
                 rankOfStage(s_, a.peer) == int(r);
    span.end =
        span.start + (local ? 0 : transferTime(costs_, st, a.peer, a.kind));
    putMessage(MessageKey{a.kind, a.microbatch, st, a.peer}, span.end);
  }

  // A BW's input gradient exists before the action ends: its SEND, among
  // the sends that follow the BW in the rank's program, leaves now, as the
  // runtime sends it (a later rank may be waiting for it meanwhile).
  void postEarly(size_t r, double t) {
    const auto &prog = programs_[r];
    const Work &w = computing_[r];
    for (size_t k = cursor_[r] + 1; k < prog.size(); ++k) {
      const Action &a = s_.actions[prog[k].stage][prog[k].index];
      if (!isSend(a.kind))
        return;
      if (a.kind == ActionKind::SendB && prog[k].stage == w.stage &&
          a.microbatch == w.microbatch) {
        post(r, prog[k].stage, a, result_.spans[prog[k].stage][prog[k].index], t);
        posted_.insert({prog[k].stage, prog[k].index});
        return;
      }
    }
  }

  // Rank `r`'s compute action ends at `t`.
  void finishShared(size_t r, double t) {
    Work &w = computing_[r];
    w.active = false;
    const RankAction &ra = programs_[r][cursor_[r]];
    const Action &a = s_.actions[ra.stage][ra.index];
    Span &span = result_.spans[ra.stage][ra.index];
    int st = ra.stage;
    if (a.kind == ActionKind::F)
      setMade(ActionKind::SendF, st, a.microbatch, t);
    else if (a.kind == ActionKind::B || (a.kind == ActionKind::BW && !w.sent))
      setMade(ActionKind::SendB, st, a.microbatch, t);
    span.end = t;
    StageStats &stats = result_.stages[st];
    RankStats &rank = result_.ranks[r];
    stats.busy += t - span.start;
    stats.finish = t;
    rank.busy += t - span.start;
    rank.finish = t;
    holdOrRelease(r, st, a.kind);
    ++cursor_[r];
  }

  const Action &actionAt(size_t r) const {
    const RankAction &ra = programs_[r][cursor_[r]];
    return s_.actions[ra.stage][ra.index];
  }

  // Runs rank `r` until it finishes or blocks; true if it moved.
  bool advance(size_t r) {
    bool moved = false;
    const auto &prog = programs_[r];
    while (cursor_[r] < prog.size()) {
      int st = prog[cursor_[r]].stage;
      const Action &a = actionAt(r);
      Span &span = result_.spans[st][prog[cursor_[r]].index];
      span.start = clock_[r];
      if (a.kind == ActionKind::RecvF || a.kind == ActionKind::RecvB) {
        std::optional<double> arrival = takeMessage(keyOfRecv(st, a));
        if (!arrival)
          return moved;
        clock_[r] = std::max(clock_[r], *arrival);
        span.end = clock_[r];
      } else if (isSend(a.kind)) {
        // The message leaves when its value exists, which inside a BW can
        // be before the action (and so this SEND) ends.
        post(r, st, a, span, clock_[r]);
      } else {
        runCompute(r, st, a, span);
      }
      ++cursor_[r];
      moved = true;
    }
    return moved;
  }

  void runCompute(size_t r, int st, const Action &a, Span &span) {
    StageStats &stats = result_.stages[st];
    RankStats &rank = result_.ranks[r];
    double cost = computeCost(costs_, st, a.kind);
    if (a.kind == ActionKind::Step && cost <= 0)
      return;
    noteStart(r, st, clock_[r]);
    const StageCost &c = costs_.stages[st];
    if (a.kind == ActionKind::F)
      setMade(ActionKind::SendF, st, a.microbatch, clock_[r] + c.f);
    else if (a.kind == ActionKind::B || a.kind == ActionKind::BW)
      setMade(ActionKind::SendB, st, a.microbatch,
          clock_[r] + (a.kind == ActionKind::BW && !costs_.bwSendsAfterB
                           ? c.b + c.w
                           : c.b));
    clock_[r] += cost;
    span.end = clock_[r];
    stats.busy += cost;
    stats.finish = clock_[r];
    rank.busy += cost;
    rank.finish = clock_[r];
    holdOrRelease(r, st, a.kind);
  }

  // Stage `st` (on rank `r`) computes at `t`: the first time, its start.
  void noteStart(size_t r, int st, double t) {
    if (!started_[st]) {
      started_[st] = true;
      result_.stages[st].start = t;
    }
    if (!rankStarted_[r]) {
      rankStarted_[r] = true;
      result_.ranks[r].start = t;
    }
  }

  // An F adds a microbatch of activations to its stage, a W or BW frees it.
  void holdOrRelease(size_t r, int st, ActionKind kind) {
    StageStats &stats = result_.stages[st];
    RankStats &rank = result_.ranks[r];
    const StageCost &c = costs_.stages[st];
    if (kind == ActionKind::F) {
      stats.peakActivationMicrobatches =
          std::max(stats.peakActivationMicrobatches, ++held_[st]);
      heldBytes_[r] += c.activationBytes;
      rank.peakActivationMicrobatches =
          std::max(rank.peakActivationMicrobatches, ++heldCount_[r]);
      rank.peakBytes = std::max(rank.peakBytes, heldBytes_[r]);
    }
    if (kind == ActionKind::W || kind == ActionKind::BW) {
      --held_[st];
      heldBytes_[r] -= c.activationBytes;
      --heldCount_[r];
    }
  }

  // Every unfinished rank waits on a RECV. Follow who waits for whom from
  // rank `r`: either a stage whose SEND will never come, or a cycle.
  llvm::Error explainStall(size_t r) {
    std::vector<size_t> chain;
    std::vector<bool> seen(programs_.size(), false);
    while (!seen[r]) {
      seen[r] = true;
      chain.push_back(r);
      const RankAction &ra = programs_[r][cursor_[r]];
      const Action &a = actionAt(r);
      int peer = a.peer;
      bool peerBlocked = false;
      size_t peerRank = 0;
      if (peer >= 0 && peer < s_.stages) {
        peerRank = size_t(rankOfStage(s_, peer));
        peerBlocked = peerRank != r && cursor_[peerRank] < programs_[peerRank].size();
      }
      if (!peerBlocked)
        return simError(where(ra.stage, ra.index, a) + ": its " +
                        kindName(matchingSend(a.kind)) +
                        std::to_string(a.microbatch) + " from stage " +
                        std::to_string(peer) + " never comes");
      r = peerRank;
    }
    std::string msg = "deadlock under blocking point-to-point: ";
    auto from = std::find(chain.begin(), chain.end(), r);
    for (auto it = from; it != chain.end(); ++it) {
      const RankAction &ra = programs_[*it][cursor_[*it]];
      const Action &a = s_.actions[ra.stage][ra.index];
      msg += where(ra.stage, ra.index, a) + " waits for stage " +
             std::to_string(a.peer) + "; ";
    }
    msg.resize(msg.size() - 2);
    return simError(msg);
  }

  void summarize() {
    for (const RankStats &rk : result_.ranks) {
      result_.stepTime = std::max(result_.stepTime, rk.finish - rk.start);
      result_.makespan = std::max(result_.makespan, rk.finish);
    }
    // Busy time summed in a different order than the step time can exceed
    // it by a rounding error; a bubble is never negative.
    auto bubbleOf = [&](double busy) {
      return result_.stepTime > 0
                 ? std::max(0.0, (result_.stepTime - busy) / result_.stepTime)
                 : 0;
    };
    for (RankStats &rk : result_.ranks)
      rk.bubble = bubbleOf(rk.busy);
    for (int st = 0; st < s_.stages; ++st) {
      StageStats &stats = result_.stages[st];
      RankStats &rk = result_.ranks[size_t(rankOfStage(s_, st))];
      stats.bubble = rk.bubble;
      const StageCost &c = costs_.stages[st];
      stats.peakBytes =
          c.activationBytes * stats.peakActivationMicrobatches + c.staticBytes;
      rk.peakBytes += c.staticBytes;
    }
  }

  const Schedule &s_;
  const PipelineCosts &costs_;
  std::vector<std::vector<RankAction>> programs_;
  std::vector<size_t> cursor_; // by rank
  std::vector<double> clock_;  // by rank
  std::vector<int64_t> heldBytes_; // by rank: activation bytes held now
  std::vector<int> heldCount_;     // by rank: microbatches held now
  std::vector<int> held_;      // by stage
  std::vector<bool> started_;  // by stage: has it begun computing
  std::vector<bool> rankStarted_;
  // Messages and the times values exist, in flat tables indexed by
  // (direction, stage, microbatch) for the microbatches the schedule
  // declares (one message per index: a sender's only receiver for it),
  // and in hash maps for anything else (an index out of range, a second
  // message on one index).
  size_t flatIndex(ActionKind send, int stage, int microbatch) const {
    if (stage < 0 || stage >= s_.stages || microbatch < 0 ||
        microbatch >= s_.microbatches)
      return SIZE_MAX;
    return (size_t(send == ActionKind::SendB) * size_t(s_.stages) +
            size_t(stage)) * size_t(s_.microbatches) + size_t(microbatch);
  }
  struct Slot {
    double time = 0;
    int to = -1;
    bool full = false;
  };
  void setMade(ActionKind send, int stage, int microbatch, double t) {
    size_t i = flatIndex(send, stage, microbatch);
    if (i == SIZE_MAX) {
      made_[{send, microbatch, stage, -1}] = t;
      return;
    }
    if (madeFlat_.empty())
      madeFlat_.assign(size_t(2 * s_.stages) * size_t(s_.microbatches), Slot{});
    madeFlat_[i] = Slot{t, -1, true};
  }
  std::optional<double> madeAt(ActionKind send, int stage, int microbatch) {
    size_t i = flatIndex(send, stage, microbatch);
    if (i != SIZE_MAX) {
      if (i < madeFlat_.size() && madeFlat_[i].full)
        return madeFlat_[i].time;
      return std::nullopt;
    }
    auto it = made_.find({send, microbatch, stage, -1});
    return it == made_.end() ? std::nullopt : std::optional(it->second);
  }
  void putMessage(const MessageKey &k, double arrival) {
    size_t i = flatIndex(k.kind, k.from, k.microbatch);
    if (i != SIZE_MAX) {
      if (flight_.empty())
        flight_.assign(size_t(2 * s_.stages) * size_t(s_.microbatches), Slot{});
      if (!flight_[i].full && inFlight_.find(k) == inFlight_.end()) {
        flight_[i] = Slot{arrival, k.to, true};
        return;
      }
    }
    inFlight_[k].push_back(arrival);
  }
  // The arrival of the first message under `k`, left in place.
  std::optional<double> peekMessage(const MessageKey &k) const {
    size_t i = flatIndex(k.kind, k.from, k.microbatch);
    if (i != SIZE_MAX && i < flight_.size() && flight_[i].full &&
        flight_[i].to == k.to)
      return flight_[i].time;
    auto it = inFlight_.find(k);
    if (it == inFlight_.end() || it->second.empty())
      return std::nullopt;
    return it->second.front();
  }
  // The first message under `k`, taken; none yet: nullopt.
  std::optional<double> takeMessage(const MessageKey &k) {
    size_t i = flatIndex(k.kind, k.from, k.microbatch);
    if (i != SIZE_MAX && i < flight_.size() && flight_[i].full &&
        flight_[i].to == k.to) {
      double t = flight_[i].time;
      flight_[i].full = false;
      // A later message on the same key waited in the map: it moves up.
      auto it = inFlight_.find(k);
      if (it != inFlight_.end()) {
        flight_[i] = Slot{it->second.front(), k.to, true};
        it->second.erase(it->second.begin());
        if (it->second.empty())
          inFlight_.erase(it);
      }
      return t;
    }
    auto it = inFlight_.find(k);
    if (it == inFlight_.end())
      return std::nullopt;
    double t = it->second.front();
    it->second.erase(it->second.begin());
    if (it->second.empty())
      inFlight_.erase(it);
    return t;
  }
  std::vector<Slot> madeFlat_, flight_;
  std::unordered_map<MessageKey, std::vector<double>, MessageKeyHash>
      inFlight_; // arrival times
  std::unordered_map<MessageKey, double, MessageKeyHash> made_;
  SimResult result_;
};

} // namespace

double computeCost(const PipelineCosts &costs, int stage, ActionKind kind) {
  const StageCost &c = costs.stages[stage];
  switch (kind) {
  case ActionKind::F: return c.f;
  case ActionKind::B: return c.b;
  case ActionKind::W: return c.w;
  case ActionKind::BW: return c.b + c.w;
  case ActionKind::Step: return c.step;
  default: return 0;
  }
}

double transferTime(const PipelineCosts &costs, int from, int to,
                    ActionKind send) {
  const StageCost &c = costs.stages[from];
  // A gradient sent upstream has the size of this stage's input.
  int64_t bytes = send == ActionKind::SendF ? c.sendBytes : c.recvBytes;
  double wire = costs.linkBytesPerUnit > 0 ? bytes / costs.linkBytesPerUnit : 0;
  double arrive = to >= 0 && size_t(to) < costs.stages.size()
                      ? costs.stages[size_t(to)].recvLatency
                      : 0;
  return costs.linkLatency + wire + arrive;
}

llvm::Expected<SimResult> simulate(const Schedule &s,
                                   const PipelineCosts &costs) {
  if (int(costs.stages.size()) != s.stages || int(s.actions.size()) != s.stages)
    return simError("the costs have " + std::to_string(costs.stages.size()) +
                    " stages, the schedule " + std::to_string(s.stages));
  if (auto e = checkPlacement(s))
    return e;
  if (costs.sharedCores > 0 && costs.sharedCores < double(rankCount(s))) {
    auto one = StepSimulator(s, costs).runShared(costs.sharedCores);
    if (!one)
      return one;
    // On shared cores a rank's span in one step is no period: steps that
    // overlap keep more ranks computing at once than one step alone does,
    // and each then runs slower. The period is what two more steps add to
    // one, each rank going on to its next step as soon as its own part is
    // done (the steps' programs one after another, their microbatches
    // numbered on).
    Schedule three = s;
    three.microbatches = 3 * s.microbatches;
    for (size_t st = 0; st < s.actions.size(); ++st)
      for (int k = 1; k < 3; ++k)
        for (const Action &a : s.actions[st]) {
          Action next = a;
          if (next.microbatch >= 0)
            next.microbatch += k * s.microbatches;
          three.actions[st].push_back(next);
        }
    for (size_t r = 0; r < s.order.size(); ++r)
      for (int k = 1; k < 3; ++k)
        three.order[r].insert(three.order[r].end(), s.order[r].begin(),
                              s.order[r].end());
    auto more = StepSimulator(three, costs).runShared(costs.sharedCores);
    if (more && more->makespan > one->makespan)
      one->stepTime = (more->makespan - one->makespan) / 2;
    else if (!more)
      llvm::consumeError(more.takeError());
    return one;
  }
  return StepSimulator(s, costs).run();
}

} // namespace cleave::passes::schedule
