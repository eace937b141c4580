// A pipeline schedule: for each of P stages, the ordered list of actions it
// runs for one training step of M microbatches. Generators (Generators.h)
// make one, the validator (Validator.h) checks one, the simulator
// (Simulator.h) times one, and ScheduleCsv.h reads and writes PyTorch's
// notation. Activations flow s -> s+1, gradients s+1 -> s. A rank (a
// device, a process) runs one stage, or several (interleaved, looping and
// V-shaped schedules): then `rankOf` places each stage and `order` says in
// which order each rank interleaves its stages' actions. docs/schedules.md
// describes the schedules.
#pragma once

#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cleave::passes::schedule {

enum class ActionKind {
  F,      // forward of one microbatch
  B,      // input-gradient half of its backward (2BP backward-p1)
  W,      // weight-gradient half (2BP backward-p2)
  BW,     // the whole backward at once (B then W), for schedules without 2BP
  SendF,  // send activations to stage s+1
  RecvF,  // receive activations from stage s-1
  SendB,  // send the input gradient to stage s-1
  RecvB,  // receive the output gradient from stage s+1
  Step,   // the optimizer update, once per step after all backward work
};

struct Action {
  ActionKind kind;
  int microbatch = -1; // -1 for Step
  int peer = -1;       // the other stage of a SEND/RECV, else -1

  bool operator==(const Action &) const = default;
};

inline Action compute(ActionKind kind, int microbatch) {
  return Action{kind, microbatch, -1};
}

bool isComm(ActionKind kind);
bool isSend(ActionKind kind);
// The kind's name as cleave prints it: F, B, W, BW, SEND_F, ..., STEP.
const char *kindName(ActionKind kind);
// An action as errors and timelines name it: `F3`, `SEND_B3`, `STEP`.
std::string actionName(const Action &a);

// The most microbatches of activations each stage may hold (index: stage),
// from a memory cap in bytes by heldCapFor: what the partitioner counts
// (static bytes + held x activation bytes <= cap) is what the generators and
// the validator count.
using HeldCap = std::vector<int>;

struct Schedule {
  std::string name;
  int stages = 0;       // S: P ranks x v stages per rank
  int microbatches = 0; // M
  std::vector<std::vector<Action>> actions; // [stage] -> in program order
  // Several stages per rank. rankOf[stage] is the rank running it (empty:
  // stage s alone on rank s). order[r] is rank r's program: entry k names
  // the stage whose next action (in actions[stage]) the rank runs k-th, so
  // it names each of its stages once per action (empty: one stage per
  // rank, whose list is the program).
  std::vector<int> rankOf{};
  std::vector<std::vector<int>> order{};

  bool operator==(const Schedule &) const = default;
};

// One action of a rank's program: actions[stage][index].
struct RankAction {
  int stage = 0;
  size_t index = 0;
};

// The ranks the schedule runs on (stages when each has its own).
int rankCount(const Schedule &s);
// The rank running `stage`.
int rankOfStage(const Schedule &s, int stage);
// True when some rank runs more than one stage.
bool sharesRanks(const Schedule &s);
// Each rank's program, in order (for one stage per rank: its list).
std::vector<std::vector<RankAction>> rankPrograms(const Schedule &s);
// The stages of each rank, in increasing order.
std::vector<std::vector<int>> stagesOfRanks(const Schedule &s);

// Fails (one line) unless rankOf places every stage on a rank 0..R-1, each
// rank has a stage, and order[r] names only rank r's stages, each exactly
// as often as it has actions. The simulator and the validator check it.
llvm::Error checkPlacement(const Schedule &s);

// A (stage, action) of a rank's program, as generators and the CSV reader
// build one.
struct PlacedAction {
  int stage = 0;
  Action action;
};
// The schedule whose rank r runs programs[r] in that order; stage `st` is
// on rank rankOf[st] (empty: stage s on rank s, one program per stage).
// Nothing is checked here (validateSchedule does).
Schedule scheduleFromPrograms(std::string name, int stages, int microbatches,
                              std::vector<int> rankOf,
                              const std::vector<std::vector<PlacedAction>> &programs);

// The stage a SEND/RECV on `stage` talks to: activations go to the next
// stage, gradients to the previous one.
int messagePeer(int stage, ActionKind kind);

// Adds the point-to-point messages a compute-only schedule implies: each F
// on a stage after the first gets RECV_F right before it, each F before the
// last stage gets SEND_F right after it, and the same for the gradient of
// each B (or BW) in the other direction; in a rank's program too, around
// the same action. Sends are eager (Simulator.h), so a RECV placed right
// before its use never costs time it need not.
void insertCommunication(Schedule &s);

// True when the schedule has any SEND or RECV.
bool hasCommunication(const Schedule &s);

} // namespace cleave::passes::schedule
