// The message order of a plan's rank pairs (runtime/comm/MessageOrder.h).
#include "runtime/comm/MessageOrder.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <tuple>

namespace cleave::runtime {

RankPairOrder rankPairOrder(const Plan &plan, Channel channel,
                            bool tagOrder) {
  RankPairOrder out;
  int ranks = rankCount(plan);
  int stages = int(plan.stages.size());
  bool byStage = channel == Channel::StagePair;
  int ends = byStage ? stages : ranks;
  out.ranks = ends;
  out.sends.assign(size_t(ends) * ends, {});
  out.recvs.assign(size_t(ends) * ends, {});
  // One action's messages (all its programs'), appended at its end per
  // pair in tag order: how an order-matching transport posts them.
  std::vector<std::pair<size_t, PairMessage>> actionSends, actionRecvs;
  auto flush = [&] {
    for (auto *list : {&actionSends, &actionRecvs}) {
      if (tagOrder)
        std::stable_sort(list->begin(), list->end(),
                         [](const auto &a, const auto &b) {
                           return std::tie(a.first, a.second.tag) <
                                  std::tie(b.first, b.second.tag);
                         });
      for (const auto &[pair, m] : *list)
        (list == &actionSends ? out.sends : out.recvs)[pair].push_back(m);
      list->clear();
    }
  };
  auto record = [&](int stage, const StagePlan &s, Phase phase,
                    int microbatch) {
    int me = rankOfStage(plan, stage);
    for (const Instr &in : s.programs[int(phase)]) {
      if (in.kind == InstrKind::Kernel || in.peer < 0 || in.peer >= stages)
        continue;
      int peer = rankOfStage(plan, in.peer);
      if (peer == me)
        continue; // a copy on the rank, not a message
      bool send = in.kind == InstrKind::Send;
      int slot = send ? in.inputs.at(0) : in.outputs.at(0);
      PairMessage m{send ? stage : in.peer, send ? in.peer : stage, in.tag,
                    phase == Phase::Step ? -1 : microbatch,
                    s.slots[size_t(slot)].bytes};
      size_t from = byStage ? size_t(m.fromStage) : size_t(send ? me : peer);
      size_t to = byStage ? size_t(m.toStage) : size_t(send ? peer : me);
      (send ? actionSends : actionRecvs).push_back({from * ends + to, m});
    }
  };
  std::vector<size_t> next(size_t(stages), 0);
  for (int r = 0; r < ranks; ++r) {
    std::vector<int> program;
    if (size_t(r) < plan.rankPrograms.size()) {
      program = plan.rankPrograms[size_t(r)];
    } else {
      for (const Action &a : plan.stages[size_t(r)].actions)
        if (a.kind != ActionKind::Step)
          program.push_back(r);
    }
    for (int st : program) {
      const StagePlan &s = plan.stages[size_t(st)];
      size_t &i = next[size_t(st)];
      while (i < s.actions.size() && s.actions[i].kind == ActionKind::Step)
        ++i;
      if (i == s.actions.size())
        continue;
      const Action &a = s.actions[i++];
      for (Phase ph : phasesOf(a.kind))
        record(st, s, ph, a.microbatch);
      flush();
    }
    for (int st = 0; st < stages; ++st)
      if (rankOfStage(plan, st) == r) {
        record(st, plan.stages[size_t(st)], Phase::Step, -1);
        flush();
      }
  }
  return out;
}

static std::string describe(const PairMessage &m) {
  return llvm::formatv("stage {0} to stage {1}, tag {2}, {3}, {4} bytes",
                       m.fromStage, m.toStage, m.tag,
                       m.microbatch < 0
                           ? std::string("the step")
                           : "microbatch " + std::to_string(m.microbatch),
                       m.bytes)
      .str();
}

llvm::Error checkMessagesInOrder(const Plan &plan, Channel channel) {
  RankPairOrder o = rankPairOrder(plan, channel);
  const char *end = channel == Channel::StagePair ? "stage" : "rank";
  for (int a = 0; a < o.ranks; ++a)
    for (int b = 0; b < o.ranks; ++b) {
      const auto &s = o.sends[size_t(a) * o.ranks + b];
      const auto &r = o.recvs[size_t(a) * o.ranks + b];
      size_t n = std::min(s.size(), r.size());
      for (size_t k = 0; k < n; ++k)
        if (!(s[k] == r[k]))
          return llvm::createStringError(
              llvm::inconvertibleErrorCode(),
              llvm::formatv("{5} {0} sends to {5} {1} out of the order it "
                            "receives: message {2} sent is {3}, received "
                            "{4}",
                            a, b, k, describe(s[k]), describe(r[k]), end));
      if (s.size() != r.size())
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            llvm::formatv("{4} {0} sends {1} message(s) to {4} {2}, which "
                          "receives {3}",
                          a, s.size(), b, r.size(), end));
    }
  return llvm::Error::success();
}

} // namespace cleave::runtime
