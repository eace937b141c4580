// CPU data movement kernels: the reshape family, Concat and Split, Transpose
// (tiled 2-D, batched, general N-D, every element width), Slice with ONNX
// clamping and negative steps, Gather with negative and out-of-range
// indices, Expand, and Pad in constant / reflect / edge modes with negative
// pads.
#include "CpuKernelTesting.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <numeric>

namespace unit_cpu_data_movement {

using namespace cleave;
using namespace cleave::testsupport::untyped;

namespace {

using I = std::vector<int64_t>;

// An i64 tensor holding 0, 1, 2, ...
Host iota(std::vector<int64_t> shape) {
  Host h = empty(DType::I64, shape);
  I v(h.numElements());
  std::iota(v.begin(), v.end(), 0);
  return make(DType::I64, std::move(shape), v);
}

llvm::Error run(OpKind op, std::vector<const Host *> ins,
                std::vector<Host *> outs, const ir::AttrMap &attrs) {
  std::vector<TensorRef> in, out;
  for (const Host *h : ins)
    in.push_back(h->ref());
  for (Host *h : outs)
    out.push_back(h->ref());
  return backend().run(runtime::KernelCall{op, attrs, in, out});
}

Host eval(OpKind op, std::vector<const Host *> ins, std::vector<int64_t> shape,
          const ir::AttrMap &attrs = {}) {
  Host out = empty(ins[0]->dtype, std::move(shape));
  llvm::Error e = run(op, ins, {&out}, attrs);
  EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
  return out;
}

// out[idx] = in[sum(idx[j] * strides[j])] for every output index: the
// reference for transposes.
template <typename V>
std::vector<V> gatherStrided(const std::vector<V> &in, const I &outShape,
                             const I &strides) {
  int64_t n = 1;
  for (int64_t d : outShape)
    n *= d;
  std::vector<V> out(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = 0;
    for (int64_t d = outShape.size() - 1; d >= 0; --d) {
      off += (rem % outShape[d]) * strides[d];
      rem /= outShape[d];
    }
    out[i] = in[off];
  }
  return out;
}

} // namespace

TEST(CpuDataMovement, ReshapeFamilyCopies) {
  Host x = iota({2, 3});
  EXPECT_EQ(eval(OpKind::Reshape, {&x}, {3, 2}, {{"shape", I{3, 2}}})
                .values<int64_t>(),
            x.values<int64_t>());
  EXPECT_EQ(eval(OpKind::Flatten, {&x}, {1, 6}, {{"axis", int64_t(0)}})
                .values<int64_t>(),
            x.values<int64_t>());
  EXPECT_EQ(eval(OpKind::Unsqueeze, {&x}, {2, 1, 3}, {{"axes", I{-2}}})
                .values<int64_t>(),
            x.values<int64_t>());
  Host y = iota({1, 4, 1});
  EXPECT_EQ(eval(OpKind::Squeeze, {&y}, {4}, {{"axes", I{0, 2}}})
                .values<int64_t>(),
            y.values<int64_t>());
}

TEST(CpuDataMovement, ConcatAndSplit) {
  Host a = iota({2, 1}), b = make<int64_t>(DType::I64, {2, 2}, {10, 11, 12, 13});
  Host c = eval(OpKind::Concat, {&a, &b}, {2, 3}, {{"axis", int64_t(-1)}});
  EXPECT_EQ(c.values<int64_t>(), (I{0, 10, 11, 1, 12, 13}));
  EXPECT_EQ(eval(OpKind::Concat, {&b, &b}, {4, 2}, {{"axis", int64_t(0)}})
                .values<int64_t>(),
            (I{10, 11, 12, 13, 10, 11, 12, 13}));
  Host flags = make<uint8_t>(DType::Bool, {2}, {1, 0});
  Host one = make<uint8_t>(DType::Bool, {1}, {1});
  EXPECT_EQ(eval(OpKind::Concat, {&flags, &one}, {3}, {{"axis", int64_t(0)}})
                .values<uint8_t>(),
            (std::vector<uint8_t>{1, 0, 1}));

  Host s0 = empty(DType::I64, {2, 1}), s1 = empty(DType::I64, {2, 2});
  ir::AttrMap attrs = {{"axis", int64_t(-1)}, {"split", I{1, 2}}};
  llvm::Error e = run(OpKind::Split, {&c}, {&s0, &s1}, attrs);
  ASSERT_FALSE(bool(e)) << llvm::toString(std::move(e));
  EXPECT_EQ(s0.values<int64_t>(), (I{0, 1}));
  EXPECT_EQ(s1.values<int64_t>(), (I{10, 11, 12, 13}));
}

TEST(CpuDataMovement, TransposeSmall) {
  Host x = iota({2, 3});
  EXPECT_EQ(eval(OpKind::Transpose, {&x}, {3, 2}, {{"perm", I{1, 0}}})
                .values<int64_t>(),
            (I{0, 3, 1, 4, 2, 5}));
  Host y = iota({2, 2, 3});
  EXPECT_EQ(eval(OpKind::Transpose, {&y}, {2, 2, 3}, {{"perm", I{1, 0, 2}}})
                .values<int64_t>(),
            (I{0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11}));
  EXPECT_EQ(eval(OpKind::Transpose, {&y}, {2, 3, 2}, {{"perm", I{0, 2, 1}}})
                .values<int64_t>(),
            (I{0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11}));
  EXPECT_EQ(eval(OpKind::Transpose, {&y}, {3, 2, 2}, {{"perm", I{2, 1, 0}}})
                .values<int64_t>(),
            (I{0, 6, 3, 9, 1, 7, 4, 10, 2, 8, 5, 11}));
}

// Shapes that are not multiples of the tile, every element width, and
// permutations that keep or move the last axis.
TEST(CpuDataMovement, TransposeMatchesReference) {
  struct Case {
    I shape, perm;
  };
  const Case cases[] = {
      {{67, 131}, {1, 0}},           {{3, 45, 70}, {0, 2, 1}},
      {{4, 5, 6, 7}, {0, 2, 1, 3}},  {{4, 5, 6, 7}, {3, 1, 2, 0}},
      {{2, 3, 33, 34}, {0, 1, 3, 2}}, {{6, 1, 40}, {2, 1, 0}},
  };
  for (const Case &c : cases) {
    Host x = iota(c.shape);
    I outShape, strides;
    I inStrides(c.shape.size(), 1);
    for (int64_t d = c.shape.size() - 1; d > 0; --d)
      inStrides[d - 1] = inStrides[d] * c.shape[d];
    for (int64_t p : c.perm) {
      outShape.push_back(c.shape[p]);
      strides.push_back(inStrides[p]);
    }
    I want = gatherStrided(x.values<int64_t>(), outShape, strides);
    EXPECT_EQ(eval(OpKind::Transpose, {&x}, outShape, {{"perm", c.perm}})
                  .values<int64_t>(),
              want);
    // The same permutation on 1-, 2- and 4-byte elements.
    I vals = x.values<int64_t>();
    std::vector<int8_t> v8(vals.begin(), vals.end());
    std::vector<uint16_t> v16(vals.begin(), vals.end());
    std::vector<int32_t> v32(vals.begin(), vals.end());
    Host x8 = make(DType::I8, c.shape, v8);
    Host x16 = make(DType::F16, c.shape, v16);
    Host x32 = make(DType::I32, c.shape, v32);
    EXPECT_EQ(eval(OpKind::Transpose, {&x8}, outShape, {{"perm", c.perm}})
                  .values<int8_t>(),
              gatherStrided(v8, outShape, strides));
    EXPECT_EQ(eval(OpKind::Transpose, {&x16}, outShape, {{"perm", c.perm}})
                  .values<uint16_t>(),
              gatherStrided(v16, outShape, strides));
    EXPECT_EQ(eval(OpKind::Transpose, {&x32}, outShape, {{"perm", c.perm}})
                  .values<int32_t>(),
              gatherStrided(v32, outShape, strides));
  }
}

TEST(CpuDataMovement, SliceClampsAndSteps) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  const int64_t small = std::numeric_limits<int64_t>::min();
  Host x = iota({3, 4});
  auto slice = [&](I starts, I ends, I axes, I steps, I shape) {
    return eval(OpKind::Slice, {&x}, shape,
                {{"starts", starts},
                 {"ends", ends},
                 {"axes", axes},
                 {"steps", steps}})
        .values<int64_t>();
  };
  EXPECT_EQ(slice({1}, {big}, {1}, {1}, {3, 3}),
            (I{1, 2, 3, 5, 6, 7, 9, 10, 11}));
  EXPECT_EQ(slice({0, 1}, {2, -1}, {0, 1}, {1, 1}, {2, 2}), (I{1, 2, 5, 6}));
  EXPECT_EQ(slice({0}, {big}, {-1}, {2}, {3, 2}), (I{0, 2, 4, 6, 8, 10}));
  // Reverse both axes.
  EXPECT_EQ(slice({-1, -1}, {small, small}, {0, 1}, {-1, -1}, {3, 4}),
            (I{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));
  // Clamped start past the end, negative step of 2.
  EXPECT_EQ(slice({10}, {0}, {1}, {-2}, {3, 2}), (I{3, 1, 7, 5, 11, 9}));
  // Empty result.
  EXPECT_TRUE(slice({2}, {1}, {0}, {1}, {0, 4}).empty());
}

TEST(CpuDataMovement, Gather) {
  Host data = iota({3, 2});
  Host idx = make<int64_t>(DType::I64, {2, 2}, {2, -3, 1, -1});
  EXPECT_EQ(eval(OpKind::Gather, {&data, &idx}, {2, 2, 2}).values<int64_t>(),
            (I{4, 5, 0, 1, 2, 3, 4, 5}));
  Host idx32 = make<int32_t>(DType::I32, {3}, {1, 0, -1});
  EXPECT_EQ(eval(OpKind::Gather, {&data, &idx32}, {3, 3},
                 {{"axis", int64_t(-1)}})
                .values<int64_t>(),
            (I{1, 0, 1, 3, 2, 3, 5, 4, 5}));
  // A scalar index drops the axis.
  Host scalar = make<int64_t>(DType::I64, {}, {1});
  EXPECT_EQ(eval(OpKind::Gather, {&data, &scalar}, {2}).values<int64_t>(),
            (I{2, 3}));
  EXPECT_EQ(eval(OpKind::Gather, {&data, &scalar}, {3},
                 {{"axis", int64_t(1)}})
                .values<int64_t>(),
            (I{1, 3, 5}));
}

// --- GatherElements, ScatterND ----------------------------------------------

TEST(CpuDataMovement, GatherElements) {
  // The ONNX examples: axis 1 and axis 0, negative indices wrapping.
  Host data = make<int64_t>(DType::I64, {2, 2}, {1, 2, 3, 4});
  Host idx = make<int64_t>(DType::I64, {2, 2}, {0, 0, 1, 0});
  EXPECT_EQ(eval(OpKind::GatherElements, {&data, &idx}, {2, 2},
                 {{"axis", int64_t(1)}})
                .values<int64_t>(),
            (I{1, 1, 4, 3}));
  Host data3 = make<float>(DType::F32, {3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Host idx3 = make<int32_t>(DType::I32, {2, 3}, {1, 2, 0, 2, 0, -3});
  EXPECT_EQ(eval(OpKind::GatherElements, {&data3, &idx3}, {2, 3})
                .values<float>(),
            (std::vector<float>{4, 8, 3, 7, 2, 3}));
  // Indices smaller than data in a dim other than the axis; a 3-D axis.
  Host cube = iota({2, 3, 4});
  Host idxc = make<int64_t>(DType::I64, {1, 2, 2}, {3, -1, 0, 2});
  EXPECT_EQ(eval(OpKind::GatherElements, {&cube, &idxc}, {1, 2, 2},
                 {{"axis", int64_t(-1)}})
                .values<int64_t>(),
            (I{3, 3, 4, 6}));
  Host idxm = make<int64_t>(DType::I64, {1, 2, 2}, {2, 0, -1, 1});
  EXPECT_EQ(eval(OpKind::GatherElements, {&cube, &idxm}, {1, 2, 2},
                 {{"axis", int64_t(1)}})
                .values<int64_t>(),
            (I{8, 1, 8, 5}));
  Host bad = make<int64_t>(DType::I64, {2, 2}, {0, 2, 1, 0});
  Host out = empty(DType::I64, {2, 2});
  llvm::Error e = run(OpKind::GatherElements, {&data, &bad}, {&out},
                      {{"axis", int64_t(1)}});
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("out of range"),
            std::string::npos);
}

TEST(CpuDataMovement, ScatterND) {
  // ONNX's 1-D example: data [8], indices [4, 1].
  Host data = make<float>(DType::F32, {8}, {1, 2, 3, 4, 5, 6, 7, 8});
  Host idx = make<int64_t>(DType::I64, {4, 1}, {4, 3, 1, 7});
  Host upd = make<float>(DType::F32, {4}, {9, 10, 11, 12});
  EXPECT_EQ(eval(OpKind::ScatterND, {&data, &idx, &upd}, {8}).values<float>(),
            (std::vector<float>{1, 11, 3, 10, 9, 6, 7, 12}));
  // Slices of a [2, 2, 2] int64 tensor, a negative index; element tuples.
  Host cube = iota({2, 2, 2});
  Host sidx = make<int64_t>(DType::I64, {1, 1}, {-1});
  Host supd = make<int64_t>(DType::I64, {1, 2, 2}, {10, 11, 12, 13});
  EXPECT_EQ(eval(OpKind::ScatterND, {&cube, &sidx, &supd}, {2, 2, 2})
                .values<int64_t>(),
            (I{0, 1, 2, 3, 10, 11, 12, 13}));
  Host eidx = make<int32_t>(DType::I32, {2, 3}, {0, 1, 0, 1, 0, 1});
  Host eupd = make<int64_t>(DType::I64, {2}, {-7, -8});
  EXPECT_EQ(eval(OpKind::ScatterND, {&cube, &eidx, &eupd}, {2, 2, 2})
                .values<int64_t>(),
            (I{0, 1, -7, 3, 4, -8, 6, 7}));
  // Reductions combine repeated tuples in order.
  Host ridx = make<int64_t>(DType::I64, {3, 1}, {1, 1, 0});
  Host rupd = make<float>(DType::F32, {3}, {5, 7, -1});
  Host small = make<float>(DType::F32, {2}, {2, 3});
  EXPECT_EQ(eval(OpKind::ScatterND, {&small, &ridx, &rupd}, {2},
                 {{"reduction", std::string("add")}})
                .values<float>(),
            (std::vector<float>{1, 15}));
  EXPECT_EQ(eval(OpKind::ScatterND, {&small, &ridx, &rupd}, {2},
                 {{"reduction", std::string("mul")}})
                .values<float>(),
            (std::vector<float>{-2, 105}));
  EXPECT_EQ(eval(OpKind::ScatterND, {&small, &ridx, &rupd}, {2},
                 {{"reduction", std::string("max")}})
                .values<float>(),
            (std::vector<float>{2, 7}));
  Host oob = make<int64_t>(DType::I64, {1, 1}, {8});
  Host one = make<float>(DType::F32, {1}, {0});
  Host out = empty(DType::F32, {8});
  llvm::Error e = run(OpKind::ScatterND, {&data, &oob, &one}, {&out},
                      {{"reduction", std::string("none")}});
  ASSERT_TRUE(bool(e));
  EXPECT_NE(llvm::toString(std::move(e)).find("out of range"),
            std::string::npos);
}

TEST(CpuDataMovement, GatherOutOfRangeIsAnError) {
  Host data = iota({3, 2});
  for (int64_t bad : {int64_t(3), int64_t(-4)}) {
    Host idx = make<int64_t>(DType::I64, {2}, {0, bad});
    Host out = empty(DType::I64, {2, 2});
    llvm::Error e = run(OpKind::Gather, {&data, &idx}, {&out}, {});
    ASSERT_TRUE(bool(e));
    std::string msg = llvm::toString(std::move(e));
    EXPECT_NE(msg.find("Gather"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  }
}

TEST(CpuDataMovement, Expand) {
  Host x = make<int64_t>(DType::I64, {3, 1}, {1, 2, 3});
  EXPECT_EQ(eval(OpKind::Expand, {&x}, {2, 3, 2}, {{"shape", I{2, 1, 2}}})
                .values<int64_t>(),
            (I{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  Host row = make<float>(DType::F32, {3}, {1.5f, 2.5f, 3.5f});
  EXPECT_EQ(eval(OpKind::Expand, {&row}, {2, 3}, {{"shape", I{2, 1}}})
                .values<float>(),
            (std::vector<float>{1.5f, 2.5f, 3.5f, 1.5f, 2.5f, 3.5f}));
  Host s = make<float>(DType::F32, {}, {7.0f});
  EXPECT_EQ(eval(OpKind::Expand, {&s}, {3}, {{"shape", I{3}}})
                .values<float>(),
            (std::vector<float>{7, 7, 7}));
}

TEST(CpuDataMovement, PadModes) {
  Host x = make<float>(DType::F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  using F = std::vector<float>;
  auto pad = [&](const char *mode, I pads, I shape) {
    return eval(OpKind::Pad, {&x}, shape,
                {{"mode", mode}, {"pads", pads}, {"value", 9.0f}})
        .values<float>();
  };
  EXPECT_EQ(pad("constant", {1, 0, 0, 1}, {3, 4}),
            (F{9, 9, 9, 9, 1, 2, 3, 9, 4, 5, 6, 9}));
  EXPECT_EQ(pad("reflect", {0, 2, 0, 1}, {2, 6}),
            (F{3, 2, 1, 2, 3, 2, 6, 5, 4, 5, 6, 5}));
  EXPECT_EQ(pad("edge", {1, 1, 0, 0}, {3, 4}),
            (F{1, 1, 2, 3, 1, 1, 2, 3, 4, 4, 5, 6}));
  // Negative pads crop.
  EXPECT_EQ(pad("constant", {0, -1, -1, 1}, {1, 3}), (F{2, 3, 9}));
  EXPECT_EQ(pad("constant", {0, 0, 0, 0}, {2, 3}), x.values<float>());

  Host n = make<int64_t>(DType::I64, {2}, {5, 6});
  EXPECT_EQ(eval(OpKind::Pad, {&n}, {5},
                 {{"pads", I{2, 1}}, {"value", -3.0f}})
                .values<int64_t>(),
            (I{-3, -3, 5, 6, -3}));
  // Reflection wider than the axis bounces back and forth.
  Host r = make<int64_t>(DType::I64, {3}, {1, 2, 3});
  EXPECT_EQ(eval(OpKind::Pad, {&r}, {9},
                 {{"mode", "reflect"}, {"pads", I{3, 3}}})
                .values<int64_t>(),
            (I{2, 3, 2, 1, 2, 3, 2, 1, 2}));
}

} // namespace unit_cpu_data_movement
