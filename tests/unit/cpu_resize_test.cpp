// CPU Resize and ResizeGrad against the ONNX backend tests' expected
// values (nearest and linear, each coordinate transformation PyTorch's
// exporters write, downsampling by scales), and Tile.
#include "CpuKernelTesting.h"

#include "runtime/Kernel.h"

#include <gtest/gtest.h>

namespace unit_cpu_resize {

using namespace cleave;
using namespace cleave::testsupport::typed;
using ir::OpKind;

namespace {

ir::AttrMap resizeAttrs(const char *mode, const char *coord, Ints sizes,
                        std::vector<float> scales = {},
                        const char *nearest = "round_prefer_floor") {
  ir::AttrMap a{{"mode", std::string(mode)},
                {"coordinate_transformation_mode", std::string(coord)},
                {"nearest_mode", std::string(nearest)},
                {"sizes", sizes}};
  if (!scales.empty())
    a.emplace("scales", scales);
  return a;
}

std::vector<float> resize(Host<float> &x, const ir::AttrMap &attrs) {
  Host<float> y(attrs.at("sizes").getInts());
  if (llvm::Error e = run(OpKind::Resize, attrs, {x.ref()}, {y.ref()}))
    ADD_FAILURE() << llvm::toString(std::move(e));
  return y.data;
}

TEST(CpuResize, Nearest) {
  Host<float> x({1, 1, 2, 2}, {1, 2, 3, 4});
  // test_resize_upsample_scales_nearest: half_pixel, round_prefer_floor.
  EXPECT_EQ(resize(x, resizeAttrs("nearest", "half_pixel", {1, 1, 4, 6},
                                  {1, 1, 2, 3})),
            (std::vector<float>{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2,
                                3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4}));
  // PyTorch's F.interpolate(mode="nearest"): asymmetric, floor.
  EXPECT_EQ(resize(x, resizeAttrs("nearest", "asymmetric", {1, 1, 3, 4}, {},
                                  "floor")),
            (std::vector<float>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4}));
  // test_resize_downsample_scales_nearest: scales 0.6 (the coordinate
  // uses the scale, not 1 / 2).
  Host<float> y({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(resize(y, resizeAttrs("nearest", "half_pixel", {1, 1, 1, 2},
                                  {1, 1, 0.6f, 0.6f})),
            (std::vector<float>{1, 3}));
}

TEST(CpuResize, Linear) {
  Host<float> x({1, 1, 2, 2}, {1, 2, 3, 4});
  // test_resize_upsample_scales_linear (half_pixel; PyTorch's bilinear).
  expectClose(resize(x, resizeAttrs("linear", "half_pixel", {1, 1, 4, 4})),
              {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5,
               3, 3.25, 3.75, 4},
              1e-6);
  // test_resize_upsample_scales_linear_align_corners.
  double t = 1.0 / 3;
  expectClose(resize(x, resizeAttrs("linear", "align_corners", {1, 1, 4, 4})),
              {1, 1 + t, 1 + 2 * t, 2, 1 + 2 * t, 2, 2 + t, 2 + 2 * t,
               2 + t, 2 + 2 * t, 3, 3 + t, 3, 3 + t, 3 + 2 * t, 4},
              1e-6);
  // test_resize_downsample_scales_linear: scales 0.6.
  Host<float> y({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  expectClose(resize(y, resizeAttrs("linear", "half_pixel", {1, 1, 1, 2},
                                    {1, 1, 0.6f, 0.6f})),
              {2.6666665, 4.3333331}, 1e-6);
  // test_resize_downsample_sizes_linear_pytorch_half_pixel: a dim resized
  // to 1 reads index 0.
  Host<float> z({1, 1, 4, 4});
  for (int i = 0; i < 16; ++i)
    z.data[i] = float(i + 1);
  expectClose(resize(z, resizeAttrs("linear", "pytorch_half_pixel",
                                    {1, 1, 3, 1})),
              {1.6666666, 7, 12.333333}, 1e-6);
}

// The gradient of nearest upsampling by 2 sums each 2x2 block; linear's
// weights of one input element add up to the ratio of the sizes.
TEST(CpuResize, GradientSumsWhatEachInputGave) {
  Host<float> dy({1, 2, 4, 4});
  for (int i = 0; i < 32; ++i)
    dy.data[i] = float(i);
  ir::AttrMap nearest = resizeAttrs("nearest", "asymmetric", {1, 2, 4, 4},
                                    {1, 1, 2, 2}, "floor");
  nearest.erase("sizes");
  nearest.emplace("shape", Ints{1, 2, 2, 2});
  Host<float> dx({1, 2, 2, 2});
  ASSERT_FALSE(bool(run(OpKind::ResizeGrad, nearest, {dy.ref()}, {dx.ref()})));
  EXPECT_EQ(dx.data, (std::vector<float>{10, 18, 42, 50, 74, 82, 106, 114}));
  ir::AttrMap linear = resizeAttrs("linear", "half_pixel", {});
  linear.erase("sizes");
  linear.emplace("shape", Ints{1, 2, 2, 2});
  std::fill(dy.data.begin(), dy.data.end(), 1.0f);
  ASSERT_FALSE(bool(run(OpKind::ResizeGrad, linear, {dy.ref()}, {dx.ref()})));
  expectClose(dx.data, std::vector<double>(8, 4.0), 1e-6);
}

TEST(CpuTile, RepeatsEachDim) {
  Host<int64_t> x({2, 3}, {1, 2, 3, 4, 5, 6});
  Host<int64_t> y({4, 6});
  ASSERT_FALSE(bool(run(OpKind::Tile, {{"repeats", Ints{2, 2}}}, {x.ref()},
                        {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<int64_t>{1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6,
                                          1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5,
                                          6}));
  Host<float> w({1, 6});
  Host<float> v2({1, 3}, {1, 2, 3});
  ASSERT_FALSE(bool(run(OpKind::Tile, {{"repeats", Ints{1, 2}}}, {v2.ref()},
                        {w.ref()})));
  EXPECT_EQ(w.data, (std::vector<float>{1, 2, 3, 1, 2, 3}));
}

} // namespace

} // namespace unit_cpu_resize
