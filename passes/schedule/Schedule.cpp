#include "passes/schedule/Schedule.h"

#include <algorithm>
#include <functional>

namespace cleave::passes::schedule {

bool isComm(ActionKind kind) {
  return kind == ActionKind::SendF || kind == ActionKind::RecvF ||
         kind == ActionKind::SendB || kind == ActionKind::RecvB;
}

bool isSend(ActionKind kind) {
  return kind == ActionKind::SendF || kind == ActionKind::SendB;
}

const char *kindName(ActionKind kind) {
  switch (kind) {
  case ActionKind::F: return "F";
  case ActionKind::B: return "B";
  case ActionKind::W: return "W";
  case ActionKind::BW: return "BW";
  case ActionKind::SendF: return "SEND_F";
  case ActionKind::RecvF: return "RECV_F";
  case ActionKind::SendB: return "SEND_B";
  case ActionKind::RecvB: return "RECV_B";
  case ActionKind::Step: return "STEP";
  }
  return "?";
}

std::string actionName(const Action &a) {
  std::string n = kindName(a.kind);
  if (a.microbatch >= 0)
    n += std::to_string(a.microbatch);
  return n;
}

int messagePeer(int stage, ActionKind kind) {
  bool toNext = kind == ActionKind::SendF || kind == ActionKind::RecvB;
  return toNext ? stage + 1 : stage - 1;
}

int rankCount(const Schedule &s) {
  if (s.rankOf.empty())
    return s.stages;
  int n = 0;
  for (int r : s.rankOf)
    n = std::max(n, r + 1);
  return n;
}

int rankOfStage(const Schedule &s, int stage) {
  return s.rankOf.empty() ? stage : s.rankOf[size_t(stage)];
}

bool sharesRanks(const Schedule &s) { return rankCount(s) != s.stages; }

std::vector<std::vector<RankAction>> rankPrograms(const Schedule &s) {
  std::vector<std::vector<RankAction>> out(size_t(rankCount(s)));
  if (s.order.empty()) {
    for (int st = 0; st < s.stages; ++st)
      for (size_t i = 0; i < s.actions[st].size(); ++i)
        out[size_t(rankOfStage(s, st))].push_back({st, i});
    return out;
  }
  std::vector<size_t> next(size_t(s.stages), 0);
  for (size_t r = 0; r < s.order.size() && r < out.size(); ++r)
    for (int st : s.order[r])
      if (st >= 0 && st < s.stages)
        out[r].push_back({st, next[size_t(st)]++});
  return out;
}

std::vector<std::vector<int>> stagesOfRanks(const Schedule &s) {
  std::vector<std::vector<int>> out(size_t(rankCount(s)));
  for (int st = 0; st < s.stages; ++st)
    out[size_t(rankOfStage(s, st))].push_back(st);
  return out;
}

Schedule scheduleFromPrograms(std::string name, int stages, int microbatches,
                              std::vector<int> rankOf,
                              const std::vector<std::vector<PlacedAction>> &programs) {
  Schedule s;
  s.name = std::move(name);
  s.stages = stages;
  s.microbatches = microbatches;
  s.actions.resize(size_t(std::max(stages, 0)));
  bool shared = !rankOf.empty();
  s.rankOf = std::move(rankOf);
  if (shared)
    s.order.resize(programs.size());
  for (size_t r = 0; r < programs.size(); ++r)
    for (const PlacedAction &p : programs[r]) {
      if (p.stage < 0 || p.stage >= stages)
        continue;
      s.actions[size_t(p.stage)].push_back(p.action);
      if (shared)
        s.order[r].push_back(p.stage);
    }
  return s;
}

llvm::Error checkPlacement(const Schedule &s) {
  auto bad = [](const std::string &msg) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
  };
  if (s.rankOf.empty()) {
    if (!s.order.empty())
      return bad("the schedule has rank programs but does not place its stages");
    return llvm::Error::success();
  }
  if (int(s.rankOf.size()) != s.stages)
    return bad("the schedule places " + std::to_string(s.rankOf.size()) +
               " stages on ranks, but has " + std::to_string(s.stages));
  int ranks = rankCount(s);
  std::vector<int> stagesOn(size_t(ranks), 0);
  for (int st = 0; st < s.stages; ++st) {
    if (s.rankOf[st] < 0)
      return bad("stage " + std::to_string(st) + " is placed on rank " +
                 std::to_string(s.rankOf[st]));
    ++stagesOn[size_t(s.rankOf[st])];
  }
  for (int r = 0; r < ranks; ++r)
    if (stagesOn[size_t(r)] == 0)
      return bad("rank " + std::to_string(r) + " runs no stage");
  if (int(s.order.size()) != ranks)
    return bad("the schedule has " + std::to_string(s.order.size()) +
               " rank programs for " + std::to_string(ranks) + " ranks");
  std::vector<size_t> count(size_t(s.stages), 0);
  for (int r = 0; r < ranks; ++r)
    for (int st : s.order[size_t(r)]) {
      if (st < 0 || st >= s.stages || s.rankOf[st] != r)
        return bad("rank " + std::to_string(r) + "'s program names stage " +
                   std::to_string(st) + ", which rank " +
                   (st < 0 || st >= s.stages ? std::string("none")
                                             : std::to_string(s.rankOf[st])) +
                   " runs");
      ++count[size_t(st)];
    }
  for (int st = 0; st < s.stages; ++st)
    if (count[size_t(st)] != s.actions[st].size())
      return bad("rank " + std::to_string(s.rankOf[st]) + "'s program runs " +
                 std::to_string(count[size_t(st)]) + " actions of stage " +
                 std::to_string(st) + ", which has " +
                 std::to_string(s.actions[st].size()));
  return llvm::Error::success();
}

namespace {

// `a` on stage `st` with the messages it implies around it.
void withMessages(int st, int last, const Action &a,
                  const std::function<void(const Action &)> &emit) {
  bool fwd = a.kind == ActionKind::F;
  bool bwd = a.kind == ActionKind::B || a.kind == ActionKind::BW;
  auto message = [&](ActionKind kind) {
    emit({kind, a.microbatch, messagePeer(st, kind)});
  };
  if (fwd && st > 0)
    message(ActionKind::RecvF);
  if (bwd && st < last)
    message(ActionKind::RecvB);
  emit(a);
  if (fwd && st < last)
    message(ActionKind::SendF);
  if (bwd && st > 0)
    message(ActionKind::SendB);
}

} // namespace

void insertCommunication(Schedule &s) {
  int last = s.stages - 1;
  if (!s.order.empty()) {
    std::vector<std::vector<PlacedAction>> programs;
    for (const auto &prog : rankPrograms(s)) {
      std::vector<PlacedAction> out;
      for (const RankAction &ra : prog)
        withMessages(ra.stage, last, s.actions[ra.stage][ra.index],
                     [&](const Action &a) { out.push_back({ra.stage, a}); });
      programs.push_back(std::move(out));
    }
    s = scheduleFromPrograms(s.name, s.stages, s.microbatches, s.rankOf,
                             programs);
    return;
  }
  for (int st = 0; st < s.stages; ++st) {
    std::vector<Action> out;
    for (const Action &a : s.actions[st])
      withMessages(st, last, a, [&](const Action &m) { out.push_back(m); });
    s.actions[st] = std::move(out);
  }
}

bool hasCommunication(const Schedule &s) {
  for (const auto &list : s.actions)
    for (const Action &a : list)
      if (isComm(a.kind))
        return true;
  return false;
}

} // namespace cleave::passes::schedule
