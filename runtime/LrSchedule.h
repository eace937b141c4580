// The learning rate of each step (cleave-run --lr, --warmup-steps,
// --lr-decay, --min-lr, --decay-steps): a linear warm-up from 0, then a
// cosine or linear decay to a floor, or a constant, the shapes of HF's
// get_{cosine,linear,constant}_schedule_with_warmup (the cosine with
// get_cosine_with_min_lr_schedule_with_warmup's floor) and of
// torch.optim.lr_scheduler's CosineAnnealingLR / LinearLR after the
// warm-up. For step s (0-based, the step whose update uses it), with peak
// lr L, warm-up W, decay end D, floor m:
//
//   s < W:  L * s / W
//   else:   p = min(1, (s - W) / max(1, D - W))
//           cosine: m + (L - m) * (1 + cos(pi * p)) / 2
//           linear: m + (L - m) * (1 - p)
//           none:   L
//
// computed in double on the host and rounded to float once (lrAt), so
// every stage and every process writes the same bits into optimizer.lr.
// The warm-up starts from 0 as HF's does: the first update of a run with
// a warm-up changes only what weight decay changes.
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>

namespace cleave::runtime {

struct LrSchedule {
  enum class Decay { None, Linear, Cosine };
  double peak = 0;      // L: the lr after the warm-up
  int64_t warmupSteps = 0;
  Decay decay = Decay::None;
  double minLr = 0;       // m: where the decay ends
  int64_t decaySteps = 0; // D: the step (from 0) at which the decay ends

  // The formula above, in double.
  double at(int64_t step) const;
  // What optimizer.lr holds during step `step`.
  float lrAt(int64_t step) const { return float(at(step)); }

  // One line for the run's header: "warm-up 100 steps to 0.001, cosine
  // decay to 1e-05 at step 5000".
  std::string describe() const;
  // The form a checkpoint stores ("cosine 0.001 100 1e-05 5000", every
  // number exact) and reads back; parse's error names what is wrong.
  std::string str() const;
  static llvm::Expected<LrSchedule> parse(llvm::StringRef text);
  bool operator==(const LrSchedule &o) const {
    return str() == o.str();
  }
};

llvm::StringRef decayName(LrSchedule::Decay d);

} // namespace cleave::runtime
