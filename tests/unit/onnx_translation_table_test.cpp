// The ONNX translation table (frontend/translate/Translation.h): every IR op
// that models an ONNX op has an entry at every supported opset, no op has
// two entries for one opset, `cleavec --list-ops` is the table, and ONNX's
// Gradient op imports through the autodiff its caller gives the importer.
#include "frontend/OnnxImporter.h"

// The onnx targets' interface definitions do not reach this binary (the
// frontend links onnx privately), so the one that selects the generated
// header is set here.
#ifndef ONNX_ML
#define ONNX_ML 1
#endif
#include "frontend/translate/Translation.h"
#include "ir/OpInfo.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"

#include "llvm/Support/FileSystem.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

namespace unit_onnx_translation_table {

using namespace cleave;
using ::testing::Contains;
using ::testing::HasSubstr;

namespace {

TEST(TranslationTable, EveryForwardIrOpHasAnEntryAtEveryOpset) {
  for (const ir::OpInfo &info : ir::allOps()) {
    // Pipeline messages are made by split-stages, offload copies by the
    // offload policy, FusedAttention by recognize-attention, Silu by
    // recognize-silu, TopKIndices by TopK's translation, StopGradient by
    // Identity's (a detach()); ONNX has no such ops.
    if (ir::isTrainingOp(info.kind) || info.kind == ir::OpKind::Send ||
        info.kind == ir::OpKind::Recv || info.kind == ir::OpKind::Offload ||
        info.kind == ir::OpKind::Fetch ||
        info.kind == ir::OpKind::FusedAttention ||
        info.kind == ir::OpKind::Silu || info.kind == ir::OpKind::TopKIndices ||
        info.kind == ir::OpKind::StopGradient)
      continue;
    std::string name(info.name);
    for (int64_t opset = frontend::kMinOpset; opset <= frontend::kMaxOpset;
         ++opset)
      EXPECT_NE(frontend::findTranslation("", name, opset), nullptr)
          << name << " at opset " << opset;
  }
}

TEST(TranslationTable, OpsetRangesOfOneOpDoNotOverlap) {
  auto table = frontend::allTranslations();
  for (size_t i = 0; i < table.size(); ++i)
    for (size_t j = i + 1; j < table.size(); ++j) {
      const auto &a = table[i], &b = table[j];
      if (a.onnxName != b.onnxName || a.domain != b.domain)
        continue;
      EXPECT_TRUE(a.maxOpset < b.minOpset || b.maxOpset < a.minOpset)
          << a.onnxName;
    }
}

TEST(TranslationTable, VersionedFormsPickTheirEntry) {
  const auto *old = frontend::findTranslation("", "Softmax", 12);
  const auto *now = frontend::findTranslation("ai.onnx", "Softmax", 13);
  ASSERT_TRUE(old && now);
  EXPECT_NE(old->translate, now->translate);
  EXPECT_EQ(frontend::findTranslation("", "NoSuchOp", 17), nullptr);
  EXPECT_NE(
      frontend::findTranslation("ai.onnx.preview.training", "Gradient", 1),
      nullptr);
  EXPECT_TRUE(frontend::consumesAttr("Conv", "auto_pad"));
  EXPECT_FALSE(frontend::consumesAttr("Conv", "strides"));
}

TEST(TranslationTable, SupportedOpsAreTheTable) {
  std::vector<std::string> folded, expanded;
  auto ops = frontend::supportedOnnxOps(&folded, &expanded);
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
  EXPECT_TRUE(std::adjacent_find(ops.begin(), ops.end()) == ops.end());
  for (const auto &t : frontend::allTranslations()) {
    if (t.domain.empty()) {
      EXPECT_THAT(ops, Contains(t.onnxName));
    }
  }
  EXPECT_THAT(ops, Contains("Gradient (ai.onnx.preview.training)"));
  EXPECT_THAT(ops, Contains("CastLike"));
  EXPECT_THAT(ops, Contains("SequenceAt"));
  EXPECT_EQ(folded, (std::vector<std::string>{"Constant", "ConstantOfShape",
                                              "EyeLike", "Range", "Shape",
                                              "Size"}));
  EXPECT_THAT(expanded, Contains("Attention"));
}

// ONNX's own Gradient test model: d = (a + b) * a, Gradient(xs=[a, b], y=d).
const char kGradientModel[] =
    "/usr/share/libonnx-testdata/data/simple/test_gradient_of_add_and_mul/"
    "model.onnx";

TEST(TranslationTable, GradientNeedsAutodiffFromTheCaller) {
  if (!llvm::sys::fs::exists(kGradientModel))
    GTEST_SKIP() << "libonnx-testdata is not installed";
  auto refused = frontend::importOnnxFile(kGradientModel);
  ASSERT_FALSE(bool(refused));
  EXPECT_THAT(llvm::toString(refused.takeError()),
              HasSubstr("Gradient node 'my_gradient': importing ONNX's "
                        "Gradient op needs autodiff"));
  frontend::ImportOptions opts;
  opts.differentiate = passes::differentiate;
  auto g = frontend::importOnnxFile(kGradientModel, opts);
  ASSERT_TRUE(bool(g)) << llvm::toString(g.takeError());
  if (llvm::Error e = ir::verifyGraph(**g))
    ADD_FAILURE() << llvm::toString(std::move(e));
  EXPECT_TRUE((*g)->isTraining()); // the backward ops are tagged B
  EXPECT_EQ((*g)->outputs().size(), 3u);
}

} // namespace

} // namespace unit_onnx_translation_table
