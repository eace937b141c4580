// What a training run feeds its model: one interface over the sources
// cleave-run offers (--data):
//   DIR        one NAME.npy per model input, samples along the first axis
//   FILE.npz   the same arrays as members of one NumPy archive
//   text:FILE  byte-level language modelling: a model with two integer
//              inputs [B, T] gets windows of T bytes and the same windows
//              shifted by one byte
//   (none)     a deterministic synthetic stream: a hash of (seed, input,
//              sample, element), floats in [-1, 1], integer inputs below the
//              range the model indexes
// Every step takes microbatch-size x M x D samples in order (D replicas),
// wrapping around; replica r's microbatch m of a step is the step's
// microbatch r * M + m, so the threaded and the MPI run see the same data.
#pragma once

#include "ir/TensorData.h"
#include "runtime/Executor.h"
#include "runtime/Plan.h"

#include "llvm/Support/Error.h"

#include <map>
#include <memory>
#include <string>

namespace cleave::runtime {

class DataSource {
public:
  DataSource(const Plan &plan, uint64_t seed) : plan_(plan), seed_(seed) {}

  // Reads --data's argument (see above), checking every array against the
  // plan's inputs; errors name the file and the input.
  llvm::Error load(const std::string &spec);
  // The feed of one step for the executors of `replica`.
  DataFn forStep(int64_t step, int replica = 0) const;
  bool synthetic() const { return feeds_.empty(); }
  // Samples in the data (0 when synthetic).
  int64_t samples() const {
    return feeds_.empty() ? 0 : feeds_.begin()->second.rows;
  }
  // Copies microbatch `microbatch` of `step` (counted over all replicas) of
  // input `in` into `dst`, which holds `bytes` bytes.
  llvm::Error fill(int64_t step, int microbatch, const PlanInput &in,
                   void *dst, size_t bytes) const;

private:
  // Samples of one input, `rows` of them, `rowBytes` each.
  struct Feed {
    std::shared_ptr<ir::TensorData> data;
    int64_t rows = 0;
    int64_t rowBytes = 0;
  };

  const Plan &plan_;
  uint64_t seed_;
  std::map<std::string, Feed> feeds_;
};

} // namespace cleave::runtime
