// The op table generated from Ops.def: every op is reachable by name, its
// attribute specs parse, and its declared defaults have the declared kind.
#include "ir/OpInfo.h"

#include <gtest/gtest.h>

namespace unit_op_table {

using namespace cleave::ir;

TEST(OpTable, EveryOpIsFoundByItsName) {
  ASSERT_FALSE(allOps().empty());
  for (const OpInfo &info : allOps()) {
    auto kind = lookupOp(info.name);
    ASSERT_TRUE(kind.has_value()) << info.name;
    EXPECT_EQ(&opInfo(*kind), &info);
  }
  EXPECT_FALSE(lookupOp("NoSuchOp").has_value());
}

TEST(OpTable, DefaultsHaveTheDeclaredKind) {
  for (const OpInfo &info : allOps())
    for (const AttrSpec &spec : info.attrs) {
      if (spec.defaultValue) {
        EXPECT_EQ(spec.defaultValue->kind(), spec.kind)
            << info.name << "." << spec.name;
      }
      EXPECT_FALSE(spec.required() && spec.optional);
    }
}

TEST(OpTable, AttributeSpecsAreSortedAndUnique) {
  for (const OpInfo &info : allOps())
    for (size_t i = 1; i < info.attrs.size(); ++i)
      EXPECT_LT(info.attrs[i - 1].name, info.attrs[i].name) << info.name;
}

TEST(OpTable, DifferentiableOperandsFollowTheDeclaration) {
  const OpInfo &bn = opInfo(OpKind::BatchNormalization);
  EXPECT_TRUE(bn.isDifferentiableOperand(0));
  EXPECT_TRUE(bn.isDifferentiableOperand(2));
  EXPECT_FALSE(bn.isDifferentiableOperand(3)); // running mean
  const OpInfo &gather = opInfo(OpKind::Gather);
  EXPECT_TRUE(gather.isDifferentiableOperand(0));
  EXPECT_FALSE(gather.isDifferentiableOperand(1)); // indices
  const OpInfo &concat = opInfo(OpKind::Concat);
  EXPECT_TRUE(concat.isDifferentiableOperand(7)); // variadic: last repeats
}

TEST(OpTable, OptionalAttributeWithoutDefault) {
  const AttrSpec *ignore =
      opInfo(OpKind::SoftmaxCrossEntropyLoss).findAttr("ignore_index");
  ASSERT_NE(ignore, nullptr);
  EXPECT_TRUE(ignore->optional);
  EXPECT_FALSE(ignore->defaultValue.has_value());
  EXPECT_FALSE(ignore->required());
}

// The op record's split of a combined gradient op: two one-result parts
// that point back at it, each taking operands the combined op has.
TEST(OpTable, GradientSplitsNameTheirParts) {
  int combined = 0;
  for (const OpInfo &info : allOps()) {
    if (!info.split)
      continue;
    ++combined;
    EXPECT_EQ(gradientSplit(info.kind), &*info.split);
    EXPECT_EQ(info.minResults, 2) << info.name;
    for (unsigned r = 0; r < 2; ++r) {
      const GradientPart &p = info.split->part(r);
      const OpInfo &part = opInfo(p.kind);
      EXPECT_EQ(part.partOf, info.kind) << part.name;
      EXPECT_EQ(part.maxResults, 1) << part.name;
      EXPECT_TRUE(part.has(optrait::Gradient)) << part.name;
      for (unsigned k : p.operands)
        EXPECT_LT(int(k), info.minOperands) << part.name;
      EXPECT_LT(p.shapeOf, info.minOperands) << part.name;
    }
  }
  EXPECT_EQ(combined, 6);
  EXPECT_EQ(gradientSplit(OpKind::MatMul), nullptr);
  const GradientSplit &ln = *opInfo(OpKind::LayerNormalizationGrad).split;
  EXPECT_EQ(ln.data.kind, OpKind::LayerNormalizationGradData);
  EXPECT_EQ(ln.weight.operands, (std::vector<unsigned>{0, 1}));
  const GradientSplit &rms = *opInfo(OpKind::RMSNormalizationGrad).split;
  EXPECT_EQ(rms.data.kind, OpKind::RMSNormalizationGradData);
  EXPECT_EQ(rms.weight.kind, OpKind::RMSNormalizationGradParams);
  EXPECT_EQ(rms.data.operands, (std::vector<unsigned>{0, 1, 2}));
  EXPECT_EQ(rms.weight.operands, (std::vector<unsigned>{0, 1}));
}

TEST(OpTable, TraitsAndCostClasses) {
  EXPECT_TRUE(opInfo(OpKind::Reshape).has(optrait::LayoutOnly));
  EXPECT_FALSE(opInfo(OpKind::Transpose).has(optrait::LayoutOnly));
  EXPECT_TRUE(opInfo(OpKind::LayerNormalization).has(optrait::AuxResults));
  EXPECT_EQ(opInfo(OpKind::MatMulGradB).cost, CostClass::Product);
  EXPECT_EQ(opInfo(OpKind::Transpose).cost, CostClass::Free);
  EXPECT_EQ(opInfo(OpKind::AdamW).cost, CostClass::AdamUpdate);
  for (const OpInfo &info : allOps()) {
    // Layout-only ops move no numbers: they cost nothing but their bytes.
    if (info.has(optrait::LayoutOnly)) {
      EXPECT_EQ(info.cost, CostClass::Free) << info.name;
    }
    EXPECT_EQ(isTrainingOp(info.kind),
              info.has(optrait::Gradient) || info.has(optrait::Optimizer))
        << info.name;
  }
}

} // namespace unit_op_table
