// The op table generated from Ops.def: every op is reachable by name, its
// attribute specs parse, and its declared defaults have the declared kind.
#include "ir/OpInfo.h"

#include <gtest/gtest.h>

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
      if (spec.defaultValue)
        EXPECT_EQ(spec.defaultValue->kind(), spec.kind)
            << info.name << "." << spec.name;
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
