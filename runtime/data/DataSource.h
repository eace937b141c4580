// What a training run feeds its model: one interface over the sources
// cleave-run offers (--data):
//   DIR        one NAME.npy per model input, samples along the first axis
//   FILE.npz   the same arrays as members of one NumPy archive
//   text:FILE  byte-level language modelling: windows of T bytes, filled
//              into the inputs as for tokens: (windowFills)
//   tokens:FILE, tokens32:FILE
//              a pre-tokenized corpus: a flat little-endian stream of
//              uint16 (tokens:) or uint32 (tokens32:) token ids,
//              memory-mapped; a model whose inputs are integer [B, T]
//              reads window w as token ids [w*T, w*T+T), next-token
//              targets one token later (windowFills says which input
//              gets what), as nanoGPT and Megatron's indexed datasets
//              do. Sample k is window k mod W
//              (W = (count - 1) / T windows) in order, or, shuffled
//              (setShuffle), window perm_e(k mod W) of epoch e = k / W: a
//              seeded permutation of the W windows per epoch, a function of
//              (seed, e, k mod W) alone, so a resumed run reads what an
//              unbroken one reads
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
#include "llvm/Support/MemoryBuffer.h"

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace cleave::runtime {

// What window data (text:, tokens:) puts in each of the plan's inputs, in
// their order: the window of T tokens at offset 0 (token ids, or targets
// the model shifts itself, as HF's labels= does), at offset 1 (next-token
// targets), or kFillOnes (an input that neither indexes a table nor reaches
// the loss: an attention mask, all positions attended). Read from how the
// model uses each input (PlanInput::indexes, labels, labelShift); a plan
// without that analysis: two inputs, tokens then next-token targets. One
// error line where the model's inputs do not fit (`flag` names the source).
constexpr int kFillOnes = -1;
llvm::Expected<std::vector<int>> windowFills(const Plan &plan,
                                             const std::string &flag);
// "'input_ids' the window, 'labels' the next tokens (targets), ...".
std::string describeWindowFills(const Plan &plan,
                                const std::vector<int> &fill);

class DataSource {
public:
  DataSource(const Plan &plan, uint64_t seed) : plan_(plan), seed_(seed) {}

  // Reads --data's argument (see above), checking every array against the
  // plan's inputs; errors name the file and the input.
  llvm::Error load(const std::string &spec);
  // The feed of one step for the executors of `replica`.
  DataFn forStep(int64_t step, int replica = 0) const;
  bool synthetic() const { return feeds_.empty() && !tokens_; }
  // Samples in the data (0 when synthetic); windows of a token file.
  int64_t samples() const {
    if (tokens_)
      return tokens_->windows;
    return feeds_.empty() ? 0 : feeds_.begin()->second.rows;
  }
  // Token files: windows in a seeded order, a new permutation each epoch
  // (seed: the constructor's).
  void setShuffle(bool on) { shuffle_ = on; }
  // The window sample `sample` reads (tokens: files; see above).
  int64_t tokenWindow(int64_t sample) const;
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

  // A token file: its mapped bytes, token width (2 or 4), token count,
  // windows of T tokens, and what each input gets (windowFills).
  struct Tokens {
    std::shared_ptr<llvm::MemoryBuffer> file;
    int width = 2;
    int64_t count = 0, windows = 0, t = 0;
    std::map<std::string, int> fill;
  };
  llvm::Error loadTokens(const std::string &file, int width);
  llvm::Error fillTokens(int64_t first, const PlanInput &in, void *dst,
                         size_t bytes) const;

  const Plan &plan_;
  uint64_t seed_;
  std::map<std::string, Feed> feeds_;
  std::optional<Tokens> tokens_;
  bool shuffle_ = false;
};

} // namespace cleave::runtime
