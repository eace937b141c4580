// A pipeline schedule: for each of P stages, the ordered list of actions it
// runs for one training step of M microbatches. Generators (Generators.h)
// make one, the validator (Validator.h) checks one, the simulator
// (Simulator.h) times one, and ScheduleCsv.h reads and writes PyTorch's
// notation. Stage s runs on rank s; activations flow s -> s+1, gradients
// s+1 -> s. docs/schedules.md describes the schedules.
#pragma once

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
  int stages = 0;       // P
  int microbatches = 0; // M
  std::vector<std::vector<Action>> actions; // [stage] -> in program order

  bool operator==(const Schedule &) const = default;
};

// The stage a SEND/RECV on `stage` talks to: activations go to the next
// stage, gradients to the previous one.
int messagePeer(int stage, ActionKind kind);

// Adds the point-to-point messages a compute-only schedule implies: each F
// on a stage after the first gets RECV_F right before it, each F before the
// last stage gets SEND_F right after it, and the same for the gradient of
// each B (or BW) in the other direction. Sends are eager (Simulator.h), so
// a RECV placed right before its use never costs time it need not.
void insertCommunication(Schedule &s);

// True when the schedule has any SEND or RECV.
bool hasCommunication(const Schedule &s);

} // namespace cleave::passes::schedule
