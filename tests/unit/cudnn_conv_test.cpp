// cuDNN's view of convolution calls (runtime/cuda/CudnnConv.h), on the
// host: the descriptors' numbers for the forward and both gradient parts
// (1-D promoted to 2-D, 3-D, groups, strides, dilations, padding, bias),
// and the calls cuDNN does not take, each with its reason, which the CUDA
// backend then runs as im2col and GEMMs.
#include "runtime/cuda/CudnnConv.h"

#include <gtest/gtest.h>

namespace unit_cudnn_conv {

using namespace cleave;
using namespace cleave::runtime;
using cleave::runtime::cuda::cudnnConvShape;

namespace {

struct Call {
  ir::OpKind op;
  ir::AttrMap attrs;
  std::vector<std::vector<int64_t>> inShapes, outShapes;
  ir::DType dtype = ir::DType::F32;
  std::vector<TensorRef> ins, outs;
  char dummy = 0;
  KernelCall make() {
    ins.clear();
    outs.clear();
    for (auto &s : inShapes)
      ins.push_back({dtype, s, &dummy});
    for (auto &s : outShapes)
      outs.push_back({dtype, s, &dummy});
    return KernelCall{op, attrs, ins, outs, 0};
  }
};

ir::AttrMap convAttrs(std::vector<int64_t> pads, std::vector<int64_t> strides,
                      std::vector<int64_t> dil, int64_t group = 1) {
  return {{"pads", pads}, {"strides", strides}, {"dilations", dil},
          {"group", group}};
}

} // namespace

TEST(CudnnConv, ForwardWithBiasGroupsStridesDilations) {
  // X [2, 4, 9, 9], W [6, 2, 3, 3], group 2, stride 2, dilation 2, pad 2:
  // out (9 + 4 - 4 - 1) / 2 + 1 = 5.
  Call c{ir::OpKind::Conv, convAttrs({2, 2, 2, 2}, {2, 2}, {2, 2}, 2),
         {{2, 4, 9, 9}, {6, 2, 3, 3}, {6}}, {{2, 6, 5, 5}}};
  auto s = cudnnConvShape(c.make());
  ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
  EXPECT_EQ(s->x, (std::vector<int>{2, 4, 9, 9}));
  EXPECT_EQ(s->w, (std::vector<int>{6, 2, 3, 3}));
  EXPECT_EQ(s->y, (std::vector<int>{2, 6, 5, 5}));
  EXPECT_EQ(s->pads, (std::vector<int>{2, 2}));
  EXPECT_EQ(s->strides, (std::vector<int>{2, 2}));
  EXPECT_EQ(s->dilations, (std::vector<int>{2, 2}));
  EXPECT_EQ(s->groups, 2);
  EXPECT_TRUE(s->bias);
  EXPECT_FALSE(s->bf16);
}

TEST(CudnnConv, GradientPartsNameTheForwardsOperands) {
  // ConvGradData(dY, W) -> dX and ConvGradFilter(X, dY) -> dW describe
  // the same forward convolution.
  ir::AttrMap a = convAttrs({1, 1, 1, 1}, {1, 1}, {1, 1});
  a.insert_or_assign("shape", ir::Attribute(std::vector<int64_t>{2, 3, 8, 8}));
  Call data{ir::OpKind::ConvGradData, a, {{2, 5, 8, 8}, {5, 3, 3, 3}},
            {{2, 3, 8, 8}}, ir::DType::BF16};
  auto d = cudnnConvShape(data.make());
  ASSERT_TRUE(bool(d)) << llvm::toString(d.takeError());
  EXPECT_EQ(d->x, (std::vector<int>{2, 3, 8, 8}));
  EXPECT_EQ(d->w, (std::vector<int>{5, 3, 3, 3}));
  EXPECT_EQ(d->y, (std::vector<int>{2, 5, 8, 8}));
  EXPECT_TRUE(d->bf16);
  a.insert_or_assign("shape", ir::Attribute(std::vector<int64_t>{5, 3, 3, 3}));
  Call filter{ir::OpKind::ConvGradFilter, a, {{2, 3, 8, 8}, {2, 5, 8, 8}},
              {{5, 3, 3, 3}}};
  auto f = cudnnConvShape(filter.make());
  ASSERT_TRUE(bool(f)) << llvm::toString(f.takeError());
  EXPECT_EQ(f->x, d->x);
  EXPECT_EQ(f->w, d->w);
  EXPECT_EQ(f->y, d->y);
  EXPECT_FALSE(f->bias);
}

TEST(CudnnConv, OneDimensionIsTwoWithHeightOneAndThreeStayThree) {
  Call c1{ir::OpKind::Conv, convAttrs({1, 1}, {2}, {1}),
          {{1, 2, 10}, {4, 2, 3}}, {{1, 4, 5}}};
  auto s = cudnnConvShape(c1.make());
  ASSERT_TRUE(bool(s)) << llvm::toString(s.takeError());
  EXPECT_EQ(s->x, (std::vector<int>{1, 2, 1, 10}));
  EXPECT_EQ(s->w, (std::vector<int>{4, 2, 1, 3}));
  EXPECT_EQ(s->y, (std::vector<int>{1, 4, 1, 5}));
  EXPECT_EQ(s->pads, (std::vector<int>{0, 1}));
  EXPECT_EQ(s->strides, (std::vector<int>{1, 2}));
  Call c3{ir::OpKind::Conv, convAttrs({0, 0, 0, 0, 0, 0}, {1, 1, 1}, {1, 1, 1}),
          {{1, 2, 4, 5, 6}, {3, 2, 2, 2, 2}}, {{1, 3, 3, 4, 5}}};
  auto t = cudnnConvShape(c3.make());
  ASSERT_TRUE(bool(t)) << llvm::toString(t.takeError());
  EXPECT_EQ(t->y, (std::vector<int>{1, 3, 3, 4, 5}));
  EXPECT_EQ(t->pads.size(), 3u);
}

TEST(CudnnConv, WhatCudnnDoesNotTakeSaysWhy) {
  auto why = [](Call c) {
    auto s = cudnnConvShape(c.make());
    EXPECT_FALSE(bool(s));
    return s ? std::string() : llvm::toString(s.takeError());
  };
  EXPECT_NE(why({ir::OpKind::Conv, convAttrs({0, 0, 1, 1}, {1, 1}, {1, 1}),
                 {{1, 2, 6, 6}, {3, 2, 3, 3}}, {{1, 3, 5, 5}}})
                .find("asymmetric padding"),
            std::string::npos);
  EXPECT_NE(why({ir::OpKind::Conv, convAttrs({0, 0, 0, 0}, {1, 1}, {1, 1}),
                 {{1, 2, 6, 6}, {3, 2, 3, 3}}, {{1, 3, 5, 5}}})
                .find("output dim 0 is 5, the window gives 4"),
            std::string::npos);
  EXPECT_NE(why({ir::OpKind::Conv, convAttrs({0, 0, 0, 0}, {1, 1}, {1, 1}, 2),
                 {{1, 3, 6, 6}, {4, 1, 3, 3}}, {{1, 4, 4, 4}}})
                .find("do not fit group 2"),
            std::string::npos);
  Call ints{ir::OpKind::Conv, convAttrs({0, 0, 0, 0}, {1, 1}, {1, 1}),
            {{1, 2, 6, 6}, {3, 2, 3, 3}}, {{1, 3, 4, 4}}, ir::DType::I64};
  EXPECT_NE(why(ints).find("element types"), std::string::npos);
  Call four{ir::OpKind::Conv,
            convAttrs({0, 0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1}, {1, 1, 1, 1}),
            {{1, 1, 2, 2, 2, 2}, {1, 1, 1, 1, 1, 1}}, {{1, 1, 2, 2, 2, 2}}};
  EXPECT_NE(why(four).find("rank 6"), std::string::npos);
}

} // namespace unit_cudnn_conv
