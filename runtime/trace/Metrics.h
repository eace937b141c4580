// cleave-run --log and --loss-curve: what each step reported (runtime/
// Trainer.h's StepReport, with its throughput), as JSON lines for scripts
// and as an SVG picture for a browser: the training loss and the
// validation loss against the step, the learning rate beneath.
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cleave::runtime {

struct StepMetrics {
  int64_t step = 0; // 1-based, as the progress lines count
  double loss = 0;
  std::optional<double> evalLoss, evalAccuracy, lr, gradNorm;
  double stepSeconds = 0;
  double samplesPerSecond = 0;
};

// One JSON object per line: {"step": 1, "loss": 2.31, "eval_loss": ...,
// "lr": ..., "grad_norm": ..., "step_ms": ..., "samples_per_s": ...}; the
// optional fields only where the step has them. Non-finite numbers are
// written as null.
std::string metricsJsonl(const std::vector<StepMetrics> &steps);
// Reads what metricsJsonl writes (null: NaN); one error naming the line.
llvm::Expected<std::vector<StepMetrics>>
parseMetricsJsonl(llvm::StringRef text);

// A self-contained SVG: the training loss (a line) and the validation loss
// (a line through dots) against the step on one chart, the learning rate
// (when there is one) on a narrower chart beneath on the same step axis;
// each axis labelled with its range. `title` heads it.
std::string lossCurveSvg(const std::vector<StepMetrics> &steps,
                         const std::string &title);

} // namespace cleave::runtime
