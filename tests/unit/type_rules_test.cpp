// Result type rules, exercised through ir::inferResultTypes as the verifier
// and the frontend call it: shapes that work, and the errors for operands,
// attributes and counts that do not.
#include "ir/OpInfo.h"
#include "ir/TypeRules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>

namespace unit_type_rules {

using namespace cleave::ir;

namespace {

using Ints = std::vector<int64_t>;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TensorType f32(Shape s) { return TensorType(DType::F32, std::move(s)); }
TensorType i64(Shape s) { return TensorType(DType::I64, std::move(s)); }
TensorType i32(Shape s) { return TensorType(DType::I32, std::move(s)); }

// Result types as strings ("f32[2,3]"), or "error: <message>".
std::vector<std::string> infer(OpKind kind, std::vector<TensorType> operands,
                               const AttrMap &attrs = {},
                               unsigned numResults = 1) {
  auto types = inferResultTypes(kind, operands, attrs, numResults);
  if (!types)
    return {"error: " + llvm::toString(types.takeError())};
  std::vector<std::string> out;
  for (const TensorType &t : *types)
    out.push_back(t.str());
  return out;
}

using Strings = std::vector<std::string>;

// The one error message of an inference that must fail.
std::string inferError(OpKind kind, std::vector<TensorType> operands,
                       const AttrMap &attrs = {}, unsigned numResults = 1) {
  Strings r = infer(kind, std::move(operands), attrs, numResults);
  if (r.size() != 1 || r[0].rfind("error: ", 0) != 0)
    return "<no error>";
  return r[0].substr(7);
}

AttrMap sliceAttrs(Ints starts, Ints ends, Ints axes, Ints steps) {
  return {{"starts", starts}, {"ends", ends}, {"axes", axes}, {"steps", steps}};
}

} // namespace

using ::testing::HasSubstr;

// --- broadcasting -----------------------------------------------------------

TEST(TypeRules, BroadcastingFollowsNumPy) {
  EXPECT_EQ(infer(OpKind::Add, {f32({2, 1, 4}), f32({3, 1})}),
            Strings{"f32[2,3,4]"});
  EXPECT_EQ(infer(OpKind::Mul, {f32({}), f32({5})}), Strings{"f32[5]"});
  EXPECT_EQ(infer(OpKind::Sub, {f32({0, 3}), f32({1, 3})}),
            Strings{"f32[0,3]"});
  EXPECT_EQ(infer(OpKind::Max, {f32({4, 1}), f32({1, 5}), f32({5})}),
            Strings{"f32[4,5]"});
  EXPECT_EQ(infer(OpKind::Greater, {f32({2, 3}), f32({3})}),
            Strings{"bool[2,3]"});
  // Bitwise on integers keeps their type; logical on bool.
  EXPECT_EQ(infer(OpKind::Or, {i32({2, 3}), i32({3})}), Strings{"i32[2,3]"});
  EXPECT_EQ(infer(OpKind::Not, {i64({4})}), Strings{"i64[4]"});
}

TEST(TypeRules, BroadcastingErrors) {
  EXPECT_THAT(inferError(OpKind::Add, {f32({2, 3}), f32({4, 3})}),
              HasSubstr("shapes [2,3] and [4,3] do not broadcast"));
  EXPECT_THAT(inferError(OpKind::Add, {f32({2}), i64({2})}),
              HasSubstr("operand 1 is i64 but operand 0 is f32"));
  EXPECT_THAT(inferError(OpKind::And, {f32({2}), f32({2})}),
              HasSubstr("must be bool or an integer type"));
  EXPECT_THAT(inferError(OpKind::Xor, {i32({2}), i64({2})}),
              HasSubstr("operand 1 is i64 but operand 0 is i32"));
  EXPECT_THAT(inferError(OpKind::Not, {f32({2})}),
              HasSubstr("must be bool or an integer type"));
  EXPECT_THAT(inferError(OpKind::Where, {f32({2}), f32({2}), f32({2})}),
              HasSubstr("condition must be bool"));
}

TEST(TypeRules, BroadcastShapesAndNormalizeAxisDirectly) {
  auto s = broadcastShapes(Ints{7, 1, 3}, Ints{5, 1});
  ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
  EXPECT_EQ(*s, (Shape{7, 5, 3}));
  EXPECT_EQ(*normalizeAxis(-1, 3), 2);
  EXPECT_EQ(*normalizeAxis(-3, 3), 0);
  auto bad = normalizeAxis(3, 3);
  ASSERT_FALSE(bool(bad));
  EXPECT_EQ(llvm::toString(bad.takeError()),
            "axis 3 is out of range for rank 3");
  llvm::consumeError(normalizeAxis(-4, 3).takeError());
}

// --- linear algebra ---------------------------------------------------------

TEST(TypeRules, MatMulVectorsAndBatches) {
  EXPECT_EQ(infer(OpKind::MatMul, {f32({3}), f32({3})}), Strings{"f32[]"});
  EXPECT_EQ(infer(OpKind::MatMul, {f32({3}), f32({3, 4})}), Strings{"f32[4]"});
  EXPECT_EQ(infer(OpKind::MatMul, {f32({2, 3}), f32({3})}), Strings{"f32[2]"});
  EXPECT_EQ(infer(OpKind::MatMul, {f32({5, 1, 2, 3}), f32({4, 3, 6})}),
            Strings{"f32[5,4,2,6]"});
  EXPECT_EQ(infer(OpKind::MatMul, {f32({7, 2, 3}), f32({3, 6})}),
            Strings{"f32[7,2,6]"});
}

TEST(TypeRules, MatMulErrors) {
  EXPECT_THAT(inferError(OpKind::MatMul, {f32({2, 3}), f32({4, 5})}),
              HasSubstr("inner dimensions differ: [2,3] x [4,5]"));
  EXPECT_THAT(inferError(OpKind::MatMul, {f32({2, 2, 3}), f32({3, 3, 4})}),
              HasSubstr("do not broadcast"));
  EXPECT_THAT(inferError(OpKind::MatMul, {f32({}), f32({3})}),
              HasSubstr("rank >= 1"));
}

TEST(TypeRules, GemmTransposesAndBroadcastsC) {
  AttrMap trans{{"transA", int64_t(1)}, {"transB", int64_t(1)}};
  // A^T is [4,3], B^T is [3,5].
  EXPECT_EQ(infer(OpKind::Gemm, {f32({3, 4}), f32({5, 3})}, trans),
            Strings{"f32[4,5]"});
  EXPECT_EQ(infer(OpKind::Gemm, {f32({3, 4}), f32({5, 3}), f32({5})}, trans),
            Strings{"f32[4,5]"});
  EXPECT_EQ(infer(OpKind::Gemm, {f32({3, 4}), f32({5, 3}), f32({4, 1})}, trans),
            Strings{"f32[4,5]"});
  EXPECT_EQ(infer(OpKind::Gemm, {f32({3, 4}), f32({5, 3}), f32({})}, trans),
            Strings{"f32[4,5]"});
}

TEST(TypeRules, GemmErrors) {
  EXPECT_THAT(inferError(OpKind::Gemm, {f32({3, 4}), f32({5, 3})}),
              HasSubstr("inner dimensions differ"));
  AttrMap transB{{"transB", int64_t(1)}};
  EXPECT_THAT(
      inferError(OpKind::Gemm, {f32({2, 3}), f32({4, 3}), f32({2})}, transB),
      HasSubstr("C [2] does not broadcast to [2,4]"));
  // C may not make the result bigger.
  EXPECT_THAT(inferError(OpKind::Gemm,
                         {f32({2, 3}), f32({4, 3}), f32({3, 2, 4})}, transB),
              HasSubstr("does not broadcast to [2,4]"));
  EXPECT_THAT(inferError(OpKind::Gemm, {f32({2, 3, 1}), f32({3, 4})}),
              HasSubstr("must be 2-D"));
}

// --- convolution and pooling ------------------------------------------------

TEST(TypeRules, ConvOutputSizeWithPadsStridesDilationsAndGroups) {
  // H: (10 + 1 + 1 - 3) / 2 + 1 = 5.  W: span (3-1)*2+1 = 5,
  // (12 + 0 + 2 - 5) / 1 + 1 = 10.  Groups 2: W has 4/2 input channels.
  AttrMap a{{"strides", Ints{2, 1}},
            {"pads", Ints{1, 0, 1, 2}},
            {"dilations", Ints{1, 2}},
            {"group", int64_t(2)}};
  EXPECT_EQ(infer(OpKind::Conv, {f32({1, 4, 10, 12}), f32({6, 2, 3, 3})}, a),
            Strings{"f32[1,6,5,10]"});
  EXPECT_EQ(infer(OpKind::Conv,
                  {f32({1, 4, 10, 12}), f32({6, 2, 3, 3}), f32({6})}, a),
            Strings{"f32[1,6,5,10]"});
}

TEST(TypeRules, ConvErrors) {
  AttrMap a{{"strides", Ints{1, 1}},
            {"pads", Ints{0, 0, 0, 0}},
            {"dilations", Ints{1, 1}}};
  EXPECT_THAT(
      inferError(OpKind::Conv, {f32({1, 4, 8, 8}), f32({6, 3, 3, 3})}, a),
      HasSubstr("channels do not match"));
  EXPECT_THAT(inferError(OpKind::Conv,
                         {f32({1, 3, 8, 8}), f32({6, 3, 3, 3}), f32({3})}, a),
              HasSubstr("bias must have shape [6]"));
  EXPECT_THAT(
      inferError(OpKind::Conv, {f32({1, 3, 2, 2}), f32({6, 3, 3, 3})}, a),
      HasSubstr("window 3 is larger than the padded input 2"));
  AttrMap shortPads = a;
  shortPads.insert_or_assign("pads", Ints{0, 0});
  EXPECT_THAT(inferError(OpKind::Conv, {f32({1, 3, 8, 8}), f32({6, 3, 3, 3})},
                         shortPads),
              HasSubstr("'pads' has 2 entries, expected 4"));
  AttrMap zeroStride = a;
  zeroStride.insert_or_assign("strides", Ints{0, 1});
  EXPECT_THAT(inferError(OpKind::Conv, {f32({1, 3, 8, 8}), f32({6, 3, 3, 3})},
                         zeroStride),
              HasSubstr("must be positive"));
}

// Found by fuzz_onnx_import (tests/fuzz/regressions/onnx-pad-overflow.onnx):
// pads, dilations and strides from a model summed or multiplied past int64
// (undefined behaviour; the sanitizer build aborts). They are errors now.
TEST(TypeRules, HugePadsDilationsAndStridesAreErrorsNotOverflow) {
  EXPECT_THAT(inferError(OpKind::Pad, {f32({2, 3})},
                         {{"pads", Ints{kMax, 0, kMax, 0}},
                          {"mode", std::string("constant")}}),
              HasSubstr("are out of range for axis 0"));
  EXPECT_THAT(inferError(OpKind::Pad, {f32({2, 3})},
                         {{"pads", Ints{kMin, 0, kMin, 0}},
                          {"mode", std::string("constant")}}),
              HasSubstr("are out of range for axis 0"));
  AttrMap a{{"strides", Ints{1, 1}},
            {"pads", Ints{0, 0, 0, 0}},
            {"dilations", Ints{kMax, 1}}};
  EXPECT_THAT(
      inferError(OpKind::Conv, {f32({1, 3, 8, 8}), f32({6, 3, 3, 3})}, a),
      HasSubstr("are too large"));
  a.insert_or_assign("dilations", Ints{1, 1});
  a.insert_or_assign("pads", Ints{kMax, 0, kMax, 0});
  EXPECT_THAT(
      inferError(OpKind::Conv, {f32({1, 3, 8, 8}), f32({6, 3, 3, 3})}, a),
      HasSubstr("are too large"));
  // A huge stride with ceil mode: one window, no overflow.
  AttrMap p{{"kernel_shape", Ints{2}},
            {"strides", Ints{kMax}},
            {"dilations", Ints{1}},
            {"pads", Ints{0, 1}},
            {"ceil_mode", int64_t(1)}};
  EXPECT_EQ(infer(OpKind::MaxPool, {f32({1, 1, 5})}, p),
            Strings{"f32[1,1,1]"});
}

// A ceil_mode window longer than the (padded) input by less than a stride
// still gives one output (PyTorch's AvgPool2d(k, ceil_mode=True) over a
// smaller map); by a stride or more, or without ceil_mode, it is an error.
TEST(TypeRules, PoolWindowLongerThanInputWithCeilMode) {
  AttrMap a{{"kernel_shape", Ints{7, 7}},
            {"strides", Ints{7, 7}},
            {"pads", Ints{0, 0, 0, 0}},
            {"ceil_mode", int64_t(1)}};
  EXPECT_EQ(infer(OpKind::AveragePool, {f32({2, 3, 2, 1})}, a),
            Strings{"f32[2,3,1,1]"});
  a.insert_or_assign("strides", Ints{1, 1});
  EXPECT_THAT(inferError(OpKind::AveragePool, {f32({2, 3, 2, 1})}, a),
              HasSubstr("window 7 is larger than the padded input 2"));
  a.insert_or_assign("strides", Ints{7, 7});
  a.insert_or_assign("ceil_mode", int64_t(0));
  EXPECT_THAT(inferError(OpKind::AveragePool, {f32({2, 3, 2, 1})}, a),
              HasSubstr("window 7 is larger than the padded input 2"));
}

TEST(TypeRules, MaxPoolCeilMode) {
  AttrMap a{{"kernel_shape", Ints{2, 2}},
            {"strides", Ints{2, 2}},
            {"pads", Ints{0, 0, 0, 0}},
            {"dilations", Ints{1, 1}}};
  EXPECT_EQ(infer(OpKind::MaxPool, {f32({1, 1, 5, 5})}, a),
            Strings{"f32[1,1,2,2]"});
  a.insert_or_assign("ceil_mode", int64_t(1));
  EXPECT_EQ(infer(OpKind::MaxPool, {f32({1, 1, 5, 5})}, a),
            Strings{"f32[1,1,3,3]"});
  EXPECT_EQ(infer(OpKind::MaxPool, {f32({1, 1, 5, 5})}, a, 2),
            (Strings{"f32[1,1,3,3]", "i64[1,1,3,3]"}));
  // With one pad on each side, ceil mode would start a fourth window at 6,
  // inside the end padding; like PyTorch, that window is dropped.
  a.insert_or_assign("pads", Ints{1, 1, 1, 1});
  EXPECT_EQ(infer(OpKind::MaxPool, {f32({1, 1, 5, 5})}, a),
            Strings{"f32[1,1,3,3]"});
}

TEST(TypeRules, AveragePoolAndGlobalPool) {
  AttrMap a{
      {"kernel_shape", Ints{3}}, {"strides", Ints{1}}, {"pads", Ints{1, 1}}};
  EXPECT_EQ(infer(OpKind::AveragePool, {f32({2, 3, 7})}, a),
            Strings{"f32[2,3,7]"});
  EXPECT_THAT(inferError(OpKind::AveragePool, {f32({2, 3, 7})},
                         {{"kernel_shape", Ints{3, 3}},
                          {"strides", Ints{1}},
                          {"pads", Ints{1, 1}}}),
              HasSubstr("'kernel_shape' has 2 entries, expected 1"));
  EXPECT_EQ(infer(OpKind::GlobalAveragePool, {f32({2, 3, 7, 9})}),
            Strings{"f32[2,3,1,1]"});
  EXPECT_THAT(inferError(OpKind::GlobalAveragePool, {f32({2, 3})}),
              HasSubstr("rank >= 3"));
}

// --- Slice ------------------------------------------------------------------

TEST(TypeRules, SliceClampsLikeOnnx) {
  auto len = [](int64_t start, int64_t end, int64_t step) {
    return sliceLength(10, start, end, step);
  };
  EXPECT_EQ(len(2, 5, 1), 3);
  EXPECT_EQ(len(-3, kMax, 1), 3);     // last three
  EXPECT_EQ(len(0, -1, 1), 9);        // all but the last
  EXPECT_EQ(len(-100, 100, 1), 10);   // clamped on both sides
  EXPECT_EQ(len(20, 30, 1), 0);       // starts past the end
  EXPECT_EQ(len(5, 2, 1), 0);         // empty, not negative
  EXPECT_EQ(len(0, 10, 3), 4);        // 0 3 6 9
  EXPECT_EQ(len(kMax, kMin, -1), 10); // reversed
  EXPECT_EQ(len(-1, -11, -1), 10);    // end -11 clamps to "before 0"
  EXPECT_EQ(len(8, 2, -2), 3);        // 8 6 4
  EXPECT_EQ(len(2, 8, -1), 0);
  EXPECT_EQ(len(100, 0, -3), 3); // start clamps to 9: 9 6 3
  int64_t start = 0;
  sliceLength(10, 100, 0, -3, &start);
  EXPECT_EQ(start, 9);
  sliceLength(10, -4, 10, 1, &start);
  EXPECT_EQ(start, 6);
}

TEST(TypeRules, SliceWithHugeStepsTakesOneElement) {
  // ONNX allows any non-zero step; x[0:10:INT64_MAX] has one element, and
  // the arithmetic must not overflow (UBSan checks it in the sanitizer run).
  EXPECT_EQ(sliceLength(10, 0, 10, kMax), 1);
  // end -1 means dim - 1 after ONNX adjusts it; INT64_MIN means "past the
  // front", so this slice takes element 9 only.
  EXPECT_EQ(sliceLength(10, 9, -1, kMin), 0);
  EXPECT_EQ(sliceLength(10, 9, kMin, kMin), 1);
}

TEST(TypeRules, SliceOnSeveralAxes) {
  EXPECT_EQ(infer(OpKind::Slice, {f32({4, 10, 6})},
                  sliceAttrs({1, -2}, {kMax, 0}, {0, -1}, {2, -1})),
            Strings{"f32[2,10,4]"});
  EXPECT_EQ(infer(OpKind::Slice, {f32({4})}, sliceAttrs({}, {}, {}, {})),
            Strings{"f32[4]"});
}

TEST(TypeRules, SliceErrors) {
  EXPECT_THAT(
      inferError(OpKind::Slice, {f32({4})}, sliceAttrs({0}, {2}, {0}, {0})),
      HasSubstr("step for axis 0 is 0"));
  EXPECT_THAT(inferError(OpKind::Slice, {f32({4, 4})},
                         sliceAttrs({0, 0}, {2, 2}, {1, -1}, {1, 1})),
              HasSubstr("axis -1 is sliced twice"));
  EXPECT_THAT(
      inferError(OpKind::Slice, {f32({4})}, sliceAttrs({0}, {2}, {1}, {1})),
      HasSubstr("out of range"));
  EXPECT_THAT(
      inferError(OpKind::Slice, {f32({4})}, sliceAttrs({0, 1}, {2}, {0}, {1})),
      HasSubstr("equal lengths"));
}

// --- data movement ----------------------------------------------------------

TEST(TypeRules, SplitSizesMustSumToTheAxis) {
  AttrMap a{{"axis", int64_t(1)}, {"split", Ints{2, 3}}};
  EXPECT_EQ(infer(OpKind::Split, {f32({4, 5})}, a, 2),
            (Strings{"f32[4,2]", "f32[4,3]"}));
  a.insert_or_assign("split", Ints{2, 2});
  EXPECT_THAT(inferError(OpKind::Split, {f32({4, 5})}, a, 2),
              HasSubstr("split sizes sum to 4 but axis 1 has size 5"));
  a.insert_or_assign("split", Ints{2, 3});
  EXPECT_THAT(inferError(OpKind::Split, {f32({4, 5})}, a, 3),
              HasSubstr("'split' has 2 sizes but the op has 3 results"));
  a.insert_or_assign("split", Ints{6, -1});
  EXPECT_THAT(inferError(OpKind::Split, {f32({4, 5})}, a, 2),
              HasSubstr("split size -1 is negative"));
}

TEST(TypeRules, SqueezeAndUnsqueeze) {
  EXPECT_EQ(infer(OpKind::Squeeze, {f32({1, 3, 1})}, {{"axes", Ints{0, -1}}}),
            Strings{"f32[3]"});
  EXPECT_THAT(
      inferError(OpKind::Squeeze, {f32({1, 3, 1})}, {{"axes", Ints{1}}}),
      HasSubstr("cannot squeeze axis 1 of size 3"));
  EXPECT_EQ(infer(OpKind::Unsqueeze, {f32({3, 4})}, {{"axes", Ints{0, -1}}}),
            Strings{"f32[1,3,4,1]"});
  EXPECT_EQ(infer(OpKind::Unsqueeze, {f32({})}, {{"axes", Ints{0}}}),
            Strings{"f32[1]"});
  EXPECT_THAT(
      inferError(OpKind::Unsqueeze, {f32({3})}, {{"axes", Ints{0, -3}}}),
      HasSubstr("appears twice"));
  EXPECT_THAT(inferError(OpKind::Unsqueeze, {f32({3})}, {{"axes", Ints{2}}}),
              HasSubstr("out of range"));
}

TEST(TypeRules, Transpose) {
  EXPECT_EQ(
      infer(OpKind::Transpose, {f32({2, 3, 4})}, {{"perm", Ints{2, 0, 1}}}),
      Strings{"f32[4,2,3]"});
  EXPECT_THAT(inferError(OpKind::Transpose, {f32({2, 3, 4})},
                         {{"perm", Ints{0, 0, 1}}}),
              HasSubstr("perm [0,0,1] is not a permutation of 0..2"));
  EXPECT_THAT(inferError(OpKind::Transpose, {f32({2, 3, 4})},
                         {{"perm", Ints{0, 1, 3}}}),
              HasSubstr("not a permutation"));
  EXPECT_THAT(
      inferError(OpKind::Transpose, {f32({2, 3, 4})}, {{"perm", Ints{1, 0}}}),
      HasSubstr("perm has 2 entries for rank 3"));
}

TEST(TypeRules, Reshape) {
  EXPECT_EQ(infer(OpKind::Reshape, {f32({2, 3, 4})}, {{"shape", Ints{6, 4}}}),
            Strings{"f32[6,4]"});
  EXPECT_EQ(infer(OpKind::Reshape, {f32({1})}, {{"shape", Ints{}}}),
            Strings{"f32[]"});
  EXPECT_THAT(
      inferError(OpKind::Reshape, {f32({2, 3, 4})}, {{"shape", Ints{5, 5}}}),
      HasSubstr("cannot reshape f32[2,3,4] to [5,5]: element counts "
                "differ"));
  // The frontend resolves -1 and 0; in the IR they are just bad dims.
  EXPECT_THAT(
      inferError(OpKind::Reshape, {f32({2, 3, 4})}, {{"shape", Ints{-1, 4}}}),
      HasSubstr("negative"));
}

TEST(TypeRules, Gather) {
  EXPECT_EQ(infer(OpKind::Gather, {f32({5, 6, 7}), i64({2, 3})},
                  {{"axis", int64_t(1)}}),
            Strings{"f32[5,2,3,7]"});
  EXPECT_EQ(infer(OpKind::Gather, {f32({5, 6}), i64({})}), Strings{"f32[6]"});
  EXPECT_EQ(infer(OpKind::Gather, {f32({5, 6}), TensorType(DType::I32, {4})},
                  {{"axis", int64_t(-1)}}),
            Strings{"f32[5,4]"});
  EXPECT_THAT(inferError(OpKind::Gather, {f32({5, 6}), f32({2})}),
              HasSubstr("indices must be i64 or i32"));
  EXPECT_THAT(inferError(OpKind::Gather, {f32({5, 6}), i64({2})},
                         {{"axis", int64_t(2)}}),
              HasSubstr("out of range"));
}

TEST(TypeRules, GatherElementsAndScatterND) {
  EXPECT_EQ(infer(OpKind::GatherElements, {f32({3, 4}), i64({7, 2})}),
            Strings{"f32[7,2]"});
  EXPECT_EQ(infer(OpKind::GatherElements, {i64({3, 4}), i64({2, 9})},
                  {{"axis", int64_t(-1)}}),
            Strings{"i64[2,9]"});
  EXPECT_THAT(inferError(OpKind::GatherElements, {f32({3, 4}), i64({4, 4})},
                         {{"axis", int64_t(1)}}),
              HasSubstr("larger than data"));
  EXPECT_THAT(inferError(OpKind::GatherElements, {f32({3, 4}), i64({4})}),
              HasSubstr("rank of data"));
  EXPECT_EQ(infer(OpKind::ScatterND, {f32({4, 5, 6}), i64({2, 3, 2}),
                                      f32({2, 3, 6})}),
            Strings{"f32[4,5,6]"});
  EXPECT_THAT(inferError(OpKind::ScatterND,
                         {f32({4, 5}), i64({2, 1}), f32({2, 4})}),
              HasSubstr("updates f32[2,4] must have shape [2,5]"));
  EXPECT_THAT(inferError(OpKind::ScatterND,
                         {f32({4, 5}), i64({2, 3}), f32({2})}),
              HasSubstr("last dim of indices"));
  EXPECT_THAT(inferError(OpKind::ScatterND,
                         {f32({4}), i64({2, 1}), f32({2})},
                         {{"reduction", std::string("sum")}}),
              HasSubstr("unknown reduction 'sum'"));
}

TEST(TypeRules, ScatterElementsCumSumTile) {
  EXPECT_EQ(infer(OpKind::ScatterElements,
                  {f32({3, 4}), i64({2, 4}), f32({2, 4})}),
            Strings{"f32[3,4]"});
  EXPECT_THAT(inferError(OpKind::ScatterElements,
                         {f32({3, 4}), i64({2, 4}), f32({2, 3})}),
              HasSubstr("must have the shape of indices"));
  EXPECT_THAT(inferError(OpKind::ScatterElements,
                         {f32({3, 4}), i64({2, 5}), f32({2, 5})},
                         {{"axis", int64_t(0)}}),
              HasSubstr("larger than data"));
  EXPECT_EQ(infer(OpKind::CumSum, {i64({2, 7})}, {{"axis", int64_t(-1)}}),
            Strings{"i64[2,7]"});
  EXPECT_THAT(inferError(OpKind::CumSum, {f32({2, 7})}),
              HasSubstr("missing required attribute 'axis'"));
  EXPECT_THAT(inferError(OpKind::CumSum, {f32({2, 7})}, {{"axis", int64_t(2)}}),
              HasSubstr("out of range"));
  EXPECT_EQ(infer(OpKind::Tile, {f32({2, 3})},
                  {{"repeats", std::vector<int64_t>{3, 2}}}),
            Strings{"f32[6,6]"});
  EXPECT_THAT(inferError(OpKind::Tile, {f32({2, 3})},
                         {{"repeats", std::vector<int64_t>{3}}}),
              HasSubstr("one count per dim"));
}

TEST(TypeRules, Resize) {
  AttrMap up{{"mode", std::string("linear")},
             {"sizes", std::vector<int64_t>{1, 3, 8, 10}}};
  EXPECT_EQ(infer(OpKind::Resize, {f32({1, 3, 4, 5})}, up),
            Strings{"f32[1,3,8,10]"});
  EXPECT_THAT(inferError(OpKind::Resize, {i64({1, 3, 4, 5})}, up),
              HasSubstr("mode linear needs a float tensor"));
  AttrMap cubic = up;
  cubic.insert_or_assign("mode", std::string("cubic"));
  EXPECT_EQ(infer(OpKind::Resize, {f32({1, 3, 4, 5})}, cubic),
            Strings{"f32[1,3,8,10]"});
  cubic.emplace("exclude_outside", int64_t(1));
  EXPECT_THAT(inferError(OpKind::Resize, {f32({1, 3, 4, 5})}, cubic),
              HasSubstr("cubic with exclude_outside is not supported"));
  AttrMap area = up;
  area.insert_or_assign("mode", std::string("area"));
  EXPECT_THAT(inferError(OpKind::Resize, {f32({1, 3, 4, 5})}, area),
              HasSubstr("mode 'area' is not supported"));
  AttrMap scales = up;
  scales.emplace("scales", std::vector<float>{1, 1, 2});
  EXPECT_THAT(inferError(OpKind::Resize, {f32({1, 3, 4, 5})}, scales),
              HasSubstr("one scale per dim"));
  EXPECT_THAT(inferError(OpKind::Resize, {f32({1, 3, 4, 5})}),
              HasSubstr("missing required attribute 'sizes'"));
}

TEST(TypeRules, Concat) {
  EXPECT_EQ(infer(OpKind::Concat, {f32({2, 3}), f32({2, 5}), f32({2, 1})},
                  {{"axis", int64_t(-1)}}),
            Strings{"f32[2,9]"});
  EXPECT_THAT(inferError(OpKind::Concat, {f32({2, 3}), f32({3, 5})},
                         {{"axis", int64_t(1)}}),
              HasSubstr("operand 1 [3,5] differs from operand 0 [2,3] outside "
                        "the concatenation axis"));
  EXPECT_THAT(inferError(OpKind::Concat, {f32({2, 3}), f32({2, 3, 1})},
                         {{"axis", int64_t(0)}}),
              HasSubstr("operand 1 has rank 3, operand 0 has rank 2"));
}

TEST(TypeRules, ReduceExpandPadFlattenCast) {
  EXPECT_EQ(infer(OpKind::ReduceSum, {f32({2, 3, 4})},
                  {{"axes", Ints{-1, 0}}, {"keepdims", int64_t(0)}}),
            Strings{"f32[3]"});
  EXPECT_EQ(infer(OpKind::ReduceMean, {f32({2, 3})}), Strings{"f32[1,1]"});
  EXPECT_THAT(
      inferError(OpKind::ReduceMax, {f32({2, 3})}, {{"axes", Ints{1, -1}}}),
      HasSubstr("appears twice"));
  EXPECT_EQ(infer(OpKind::Expand, {f32({3, 1})}, {{"shape", Ints{2, 1, 4}}}),
            Strings{"f32[2,3,4]"});
  EXPECT_EQ(infer(OpKind::Pad, {f32({2, 3})}, {{"pads", Ints{1, 0, 1, -1}}}),
            Strings{"f32[4,2]"});
  EXPECT_THAT(
      inferError(OpKind::Pad, {f32({2, 3})}, {{"pads", Ints{0, -4, 0, 0}}}),
      HasSubstr("remove more than axis 1 holds"));
  EXPECT_EQ(infer(OpKind::Flatten, {f32({2, 3, 4})}, {{"axis", int64_t(3)}}),
            Strings{"f32[24,1]"});
  EXPECT_EQ(infer(OpKind::Flatten, {f32({2, 3, 4})}, {{"axis", int64_t(0)}}),
            Strings{"f32[1,24]"});
  EXPECT_EQ(infer(OpKind::Cast, {f32({2})}, {{"to", "bf16"}}),
            Strings{"bf16[2]"});
  EXPECT_THAT(inferError(OpKind::Cast, {f32({2})}, {{"to", "float"}}),
              HasSubstr("unknown element type 'float'"));
}

// --- normalization and loss -------------------------------------------------

TEST(TypeRules, LayerNormalizationStatOutputs) {
  EXPECT_EQ(infer(OpKind::LayerNormalization,
                  {f32({2, 3, 4}), f32({4}), f32({4})}, {}, 3),
            (Strings{"f32[2,3,4]", "f32[2,3,1]", "f32[2,3,1]"}));
  EXPECT_EQ(infer(OpKind::LayerNormalization, {f32({2, 3, 4}), f32({3, 4})},
                  {{"axis", int64_t(1)}}, 2),
            (Strings{"f32[2,3,4]", "f32[2,1,1]"}));
  EXPECT_THAT(
      inferError(OpKind::LayerNormalization, {f32({2, 3, 4}), f32({3})}),
      HasSubstr("does not broadcast to the normalized shape [4]"));
  EXPECT_THAT(inferError(OpKind::LayerNormalization, {i64({2, 3}), i64({3})}),
              HasSubstr("must be a float tensor"));
}

TEST(TypeRules, RMSNormalization) {
  EXPECT_EQ(infer(OpKind::RMSNormalization, {f32({2, 3, 4}), f32({3, 4})},
                  {{"axis", int64_t(1)}}),
            Strings{"f32[2,3,4]"});
  EXPECT_THAT(inferError(OpKind::RMSNormalization, {f32({2, 3, 4}), f32({3})}),
              HasSubstr("does not broadcast to the normalized shape [4]"));
}

TEST(TypeRules, BatchNormalizationOutputs) {
  std::vector<TensorType> ops{f32({2, 8, 5, 5}), f32({8}), f32({8}), f32({8}),
                              f32({8})};
  EXPECT_EQ(infer(OpKind::BatchNormalization, ops, {}, 3),
            (Strings{"f32[2,8,5,5]", "f32[8]", "f32[8]"}));
  ops[3] = f32({4});
  EXPECT_THAT(inferError(OpKind::BatchNormalization, ops),
              HasSubstr("operand 3 must have shape [8]"));
}

TEST(TypeRules, SoftmaxCrossEntropyLoss) {
  EXPECT_EQ(infer(OpKind::SoftmaxCrossEntropyLoss, {f32({4, 10}), i64({4})}),
            Strings{"f32[]"});
  EXPECT_EQ(infer(OpKind::SoftmaxCrossEntropyLoss, {f32({4, 10}), i64({4})},
                  {{"reduction", "none"}}, 2),
            (Strings{"f32[4]", "f32[4,10]"}));
  // [N, C, d1] scores take [N, d1] labels.
  EXPECT_EQ(infer(OpKind::SoftmaxCrossEntropyLoss,
                  {f32({2, 5, 7}), i64({2, 7})}, {{"reduction", "none"}}),
            Strings{"f32[2,7]"});
  EXPECT_EQ(infer(OpKind::SoftmaxCrossEntropyLoss,
                  {f32({4, 10}), i64({4}), f32({10})},
                  {{"ignore_index", int64_t(-100)}}),
            Strings{"f32[]"});
}

TEST(TypeRules, SoftmaxCrossEntropyLossErrors) {
  EXPECT_THAT(
      inferError(OpKind::SoftmaxCrossEntropyLoss, {f32({4, 10}), i64({4, 1})}),
      HasSubstr("labels have shape [4,1], expected [4] for scores "
                "[4,10]"));
  EXPECT_THAT(
      inferError(OpKind::SoftmaxCrossEntropyLoss, {f32({4, 10}), f32({4})}),
      HasSubstr("labels must be an integer tensor"));
  EXPECT_THAT(inferError(OpKind::SoftmaxCrossEntropyLoss,
                         {f32({4, 10}), i64({4})}, {{"reduction", "avg"}}),
              HasSubstr("reduction must be mean, sum or none, not 'avg'"));
  EXPECT_THAT(inferError(OpKind::SoftmaxCrossEntropyLoss,
                         {f32({4, 10}), i64({4}), f32({4})}),
              HasSubstr("weights must have shape [10]"));
  EXPECT_THAT(inferError(OpKind::SoftmaxCrossEntropyLoss, {f32({4}), i64({4})}),
              HasSubstr("rank >= 2"));
}

TEST(TypeRules, DropoutRatioAndMask) {
  EXPECT_EQ(infer(OpKind::Dropout, {f32({3})}, {}, 2),
            (Strings{"f32[3]", "bool[3]"}));
  EXPECT_THAT(inferError(OpKind::Dropout, {f32({3})}, {{"ratio", 1.0f}}),
              HasSubstr("ratio must be in [0, 1)"));
}

// --- attributes and counts --------------------------------------------------

TEST(TypeRules, AttributeErrors) {
  EXPECT_EQ(inferError(OpKind::Concat, {f32({2})}),
            "missing required attribute 'axis'");
  EXPECT_EQ(inferError(OpKind::Relu, {f32({2})}, {{"alpha", 0.5f}}),
            "unknown attribute 'alpha'");
  EXPECT_EQ(inferError(OpKind::Concat, {f32({2})}, {{"axis", 0.0f}}),
            "attribute 'axis' must be of kind i, not f");
  EXPECT_EQ(inferError(OpKind::Transpose, {f32({2})}, {{"perm", int64_t(0)}}),
            "attribute 'perm' must be of kind ints, not i");
}

TEST(TypeRules, OperandAndResultCountErrors) {
  EXPECT_EQ(inferError(OpKind::Add, {f32({2})}), "has 1 operands, expected 2");
  EXPECT_EQ(inferError(OpKind::Max, {}), "has 0 operands, expected at least 1");
  EXPECT_EQ(
      inferError(OpKind::Gemm, {f32({2, 2}), f32({2, 2}), f32({2}), f32({2})}),
      "has 4 operands, expected 2 to 3");
  EXPECT_EQ(inferError(OpKind::Relu, {f32({2})}, {}, 2),
            "has 2 results, expected 1");
  EXPECT_EQ(inferError(OpKind::Relu, {f32({2})}, {}, 0),
            "has 0 results, expected 1");
}

// --- checkShape -------------------------------------------------------------

TEST(TypeRules, CheckShapeRejectsNegativeDimsAndOverflow) {
  EXPECT_FALSE(bool(checkShape(Ints{})));
  EXPECT_FALSE(bool(checkShape(Ints{0, 5})));
  EXPECT_FALSE(bool(checkShape(Ints{1 << 24, 1 << 24}))); // 2^48: the limit
  EXPECT_EQ(llvm::toString(checkShape(Ints{2, -3})),
            "dimension 1 is negative (-3)");
  EXPECT_THAT(llvm::toString(checkShape(Ints{1 << 24, 1 << 24, 2})),
              HasSubstr("has too many elements"));
  // Would wrap around int64 if multiplied naively.
  EXPECT_THAT(llvm::toString(checkShape(Ints{1ll << 32, 1ll << 32, 4})),
              HasSubstr("has too many elements"));
  EXPECT_THAT(llvm::toString(checkShape(Ints{kMax})),
              HasSubstr("has too many elements"));
}

} // namespace unit_type_rules
