#include "passes/schedule/Simulator.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

namespace cleave::passes::schedule {

namespace {

llvm::Error simError(const std::string &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

// Identifies a message: its direction (the SEND kind), microbatch, sender
// and receiver.
using MessageKey = std::tuple<ActionKind, int, int, int>;

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

// Runs the stages in dataflow order. Because SENDs never block, the times
// do not depend on the order the stages are visited in.
class StepSimulator {
public:
  StepSimulator(const Schedule &s, const PipelineCosts &costs)
      : s_(s), costs_(costs), cursor_(s.stages, 0), clock_(s.stages, 0),
        held_(s.stages, 0), started_(s.stages, false) {
    result_.stages.resize(s.stages);
    result_.spans.resize(s.stages);
    for (int st = 0; st < s.stages; ++st)
      result_.spans[st].resize(s.actions[st].size());
  }

  llvm::Expected<SimResult> run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int st = 0; st < s_.stages; ++st)
        progress |= advance(st);
    }
    for (int st = 0; st < s_.stages; ++st)
      if (cursor_[st] < s_.actions[st].size())
        return explainStall(st);
    summarize();
    return std::move(result_);
  }

private:
  // Runs stage `st` until it finishes or blocks; true if it moved.
  bool advance(int st) {
    bool moved = false;
    const auto &list = s_.actions[st];
    while (cursor_[st] < list.size()) {
      const Action &a = list[cursor_[st]];
      Span &span = result_.spans[st][cursor_[st]];
      span.start = clock_[st];
      if (a.kind == ActionKind::RecvF || a.kind == ActionKind::RecvB) {
        auto it = inFlight_.find(keyOfRecv(st, a));
        if (it == inFlight_.end() || it->second.empty())
          return moved;
        clock_[st] = std::max(clock_[st], it->second.front());
        it->second.pop_front();
        span.end = clock_[st];
      } else if (isSend(a.kind)) {
        // The message leaves when its value exists, which inside a BW can
        // be before the action (and so this SEND) ends.
        auto made = made_.find({a.kind, st, a.microbatch});
        span.start = made == made_.end() ? clock_[st] : made->second;
        span.end = span.start + transferTime(costs_, st, a.kind);
        inFlight_[{a.kind, a.microbatch, st, a.peer}].push_back(span.end);
      } else {
        runCompute(st, a, span);
      }
      ++cursor_[st];
      moved = true;
    }
    return moved;
  }

  void runCompute(int st, const Action &a, Span &span) {
    StageStats &stats = result_.stages[st];
    double cost = computeCost(costs_, st, a.kind);
    if (!started_[st]) {
      started_[st] = true;
      stats.start = clock_[st];
    }
    const StageCost &c = costs_.stages[st];
    if (a.kind == ActionKind::F)
      made_[{ActionKind::SendF, st, a.microbatch}] = clock_[st] + c.f;
    else if (a.kind == ActionKind::B || a.kind == ActionKind::BW)
      made_[{ActionKind::SendB, st, a.microbatch}] =
          clock_[st] + (a.kind == ActionKind::BW && !costs_.bwSendsAfterB
                            ? c.b + c.w
                            : c.b);
    clock_[st] += cost;
    span.end = clock_[st];
    stats.busy += cost;
    stats.finish = clock_[st];
    if (a.kind == ActionKind::F)
      stats.peakActivationMicrobatches =
          std::max(stats.peakActivationMicrobatches, ++held_[st]);
    if (a.kind == ActionKind::W || a.kind == ActionKind::BW)
      --held_[st];
  }

  // Every unfinished stage waits on a RECV. Follow who waits for whom from
  // `st`: either a stage whose SEND will never come, or a cycle.
  llvm::Error explainStall(int st) {
    std::vector<int> chain;
    std::vector<bool> seen(s_.stages, false);
    while (!seen[st]) {
      seen[st] = true;
      chain.push_back(st);
      const Action &a = s_.actions[st][cursor_[st]];
      int peer = a.peer;
      bool peerBlocked = peer >= 0 && peer < s_.stages &&
                         cursor_[peer] < s_.actions[peer].size();
      if (!peerBlocked)
        return simError(where(st, cursor_[st], a) + ": its " +
                        kindName(matchingSend(a.kind)) +
                        std::to_string(a.microbatch) + " from stage " +
                        std::to_string(peer) + " never comes");
      st = peer;
    }
    std::string msg = "deadlock under blocking point-to-point: ";
    auto from = std::find(chain.begin(), chain.end(), st);
    for (auto it = from; it != chain.end(); ++it) {
      const Action &a = s_.actions[*it][cursor_[*it]];
      msg += where(*it, cursor_[*it], a) + " waits for stage " +
             std::to_string(a.peer) + "; ";
    }
    msg.resize(msg.size() - 2);
    return simError(msg);
  }

  void summarize() {
    for (const StageStats &st : result_.stages) {
      result_.stepTime = std::max(result_.stepTime, st.finish - st.start);
      result_.makespan = std::max(result_.makespan, st.finish);
    }
    for (int st = 0; st < s_.stages; ++st) {
      StageStats &stats = result_.stages[st];
      // Busy time summed in a different order than the step time can exceed
      // it by a rounding error; a bubble is never negative.
      stats.bubble = result_.stepTime > 0
                         ? std::max(0.0, (result_.stepTime - stats.busy) /
                                             result_.stepTime)
                         : 0;
      const StageCost &c = costs_.stages[st];
      stats.peakBytes =
          c.activationBytes * stats.peakActivationMicrobatches + c.staticBytes;
    }
  }

  const Schedule &s_;
  const PipelineCosts &costs_;
  std::vector<size_t> cursor_;
  std::vector<double> clock_;
  std::vector<int> held_;
  std::vector<bool> started_; // has the stage begun computing
  std::map<MessageKey, std::deque<double>> inFlight_; // arrival times
  // (SEND kind, stage, microbatch) -> when the value to send exists.
  std::map<std::tuple<ActionKind, int, int>, double> made_;
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
  default: return 0;
  }
}

double transferTime(const PipelineCosts &costs, int stage, ActionKind send) {
  const StageCost &c = costs.stages[stage];
  // A gradient sent upstream has the size of this stage's input.
  int64_t bytes = send == ActionKind::SendF ? c.sendBytes : c.recvBytes;
  double wire = costs.linkBytesPerUnit > 0 ? bytes / costs.linkBytesPerUnit : 0;
  return costs.linkLatency + wire;
}

llvm::Expected<SimResult> simulate(const Schedule &s,
                                   const PipelineCosts &costs) {
  if (int(costs.stages.size()) != s.stages || int(s.actions.size()) != s.stages)
    return simError("the costs have " + std::to_string(costs.stages.size()) +
                    " stages, the schedule " + std::to_string(s.stages));
  return StepSimulator(s, costs).run();
}

} // namespace cleave::passes::schedule
