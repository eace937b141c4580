// The `--emit=summary` text: byte counts and the per-graph summary.
#include "ir/Summary.h"

#include "frontend/OnnxImporter.h"
#include "passes/Pass.h"

#include <algorithm>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace unit_summary {

using namespace cleave;
using namespace cleave::ir;
using ::testing::HasSubstr;

TEST(Summary, FormatBytes) {
  EXPECT_EQ(formatBytes(0), "0 B");
  EXPECT_EQ(formatBytes(1023), "1023 B");
  EXPECT_EQ(formatBytes(1024), "1.00 KiB");
  EXPECT_EQ(formatBytes(1536 * 1024), "1.50 MiB");
  EXPECT_EQ(formatBytes(int64_t(3) << 40), "3.00 TiB");
}

TEST(Summary, FormatBytesJustBelowAUnit) {
  // The unit is chosen after rounding to two decimals: one byte short of
  // 1 MiB is "1.00 MiB", not "1024.00 KiB".
  EXPECT_EQ(formatBytes((1 << 20) - 1), "1.00 MiB");
}

TEST(Summary, CountsParametersAndOps) {
  auto g = frontend::importOnnxFile(std::string(CLEAVE_SOURCE_DIR) +
                                    "/tests/models/mlp_infer.onnx");
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
  std::string s = summarizeGraph(**g);
  EXPECT_THAT(s, HasSubstr("inputs:\n  x      f32[4,16]\n"));
  EXPECT_THAT(s, HasSubstr("outputs:\n  logits f32[4,10]\n"));
  // 32*16+32 + 3*(32*32+32) + 10*32+10 weights in 10 tensors.
  EXPECT_THAT(s, HasSubstr("parameters: 4,042 elements, 15.79 KiB in 10 "
                           "tensors\n"));
  EXPECT_THAT(s, HasSubstr("buffers: 0 elements, 0 B in 0 tensors\n"));
  EXPECT_THAT(s, HasSubstr("ops: " + std::to_string((*g)->ops().size())));
  EXPECT_THAT(s, ::testing::ContainsRegex("\n  Gemm +5\n"));
}

TEST(Summary, ShortCountsGradientsAndUpdatesAndHistogramOnOneLine) {
  auto g = frontend::importOnnxFile(std::string(CLEAVE_SOURCE_DIR) +
                                    "/tests/models/training/mlp/model.onnx");
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
  passes::PipelineOptions pipe;
  ASSERT_FALSE(bool(passes::runPipeline(
      **g, {"autodiff", "split-backward", "optimizer"}, pipe)));
  std::string full = summarizeGraph(**g, SummaryDetail::Full);
  std::string brief = summarizeGraph(**g, SummaryDetail::Short);
  EXPECT_THAT(full, HasSubstr("grad."));
  EXPECT_THAT(brief, ::testing::Not(HasSubstr("\n  grad.")));
  EXPECT_THAT(brief, ::testing::ContainsRegex(
                         "outputs:\n  loss +f32\\[\\]\n  and 10 gradients "
                         "\\(grad\\.\\*\\), 10 updated states \\(\\.next\\)"));
  EXPECT_THAT(brief, ::testing::ContainsRegex("\nops: [0-9]+ \\(SGD 10, "));
  EXPECT_LT(std::count(brief.begin(), brief.end(), '\n'),
            std::count(full.begin(), full.end(), '\n') - 20);
}

} // namespace unit_summary
