#include "passes/schedule/Schedule.h"

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

void insertCommunication(Schedule &s) {
  int last = s.stages - 1;
  for (int st = 0; st < s.stages; ++st) {
    std::vector<Action> out;
    for (const Action &a : s.actions[st]) {
      bool fwd = a.kind == ActionKind::F;
      bool bwd = a.kind == ActionKind::B || a.kind == ActionKind::BW;
      auto message = [&](ActionKind kind) {
        out.push_back({kind, a.microbatch, messagePeer(st, kind)});
      };
      if (fwd && st > 0)
        message(ActionKind::RecvF);
      if (bwd && st < last)
        message(ActionKind::RecvB);
      out.push_back(a);
      if (fwd && st < last)
        message(ActionKind::SendF);
      if (bwd && st > 0)
        message(ActionKind::SendB);
    }
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
