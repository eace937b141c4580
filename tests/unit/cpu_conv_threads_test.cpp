// The f32 convolution kernels on the layer shapes of real CNNs (torchvision
// ResNet-18, MobileNetV2 and EfficientNet-B0 at 32x32): forward, input
// gradient and filter gradient give the same bits on 1, 2 and 4 threads
// (training bits must not depend on --threads) and whatever the addresses
// of their operands (they must not depend on the run either), and the
// batch-folded path (ConvBatchFolded.h) agrees with the image-by-image one.
#include "CpuKernelTesting.h"
#include "TestSupport.h"

#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>

namespace unit_cpu_conv_threads {

using namespace cleave;
using namespace cleave::testsupport::typed;
using ir::OpKind;

namespace {

struct ConvShape {
  const char *name;
  Ints x, w;
  int64_t stride, pad, group;

  Ints y() const {
    Ints s{x[0], w[0]};
    for (size_t d = 2; d < x.size(); ++d)
      s.push_back((x[d] + 2 * pad - w[d]) / stride + 1);
    return s;
  }
  ir::AttrMap attrs() const {
    return {{"strides", Ints{stride, stride}},
            {"pads", Ints{pad, pad, pad, pad}},
            {"dilations", Ints{1, 1}},
            {"group", group}};
  }
};

const ConvShape kShapes[] = {
    {"resnet stem 7x7/2", {16, 3, 32, 32}, {64, 3, 7, 7}, 2, 3, 1},
    {"resnet layer1 3x3", {16, 64, 8, 8}, {64, 64, 3, 3}, 1, 1, 1},
    {"resnet strided 3x3", {16, 64, 8, 8}, {128, 64, 3, 3}, 2, 1, 1},
    {"resnet downsample 1x1/2", {16, 64, 8, 8}, {128, 64, 1, 1}, 2, 0, 1},
    {"resnet layer4 3x3 at 1x1", {16, 512, 1, 1}, {512, 512, 3, 3}, 1, 1, 1},
    {"mobilenet stem 3x3/2", {16, 3, 32, 32}, {32, 3, 3, 3}, 2, 1, 1},
    {"mobilenet depthwise 3x3", {16, 32, 16, 16}, {32, 1, 3, 3}, 1, 1, 32},
    {"mobilenet depthwise 3x3/2", {16, 96, 16, 16}, {96, 1, 3, 3}, 2, 1, 96},
    {"mobilenet pointwise", {16, 32, 16, 16}, {16, 32, 1, 1}, 1, 0, 1},
    {"large image 3x3", {4, 16, 40, 40}, {32, 16, 3, 3}, 1, 1, 1},
    // EfficientNet-B0's late blocks at 32x32, microbatch 4: depthwise
    // convs on 4x4 and 2x2 maps (the filter gradient whose bits once
    // depended on where its scratch landed) and the squeeze-excite 1x1s.
    {"efficientnet depthwise 3x3 at 2x2", {4, 480, 2, 2}, {480, 1, 3, 3}, 1,
     1, 480},
    {"efficientnet depthwise 5x5/2 at 8x8", {4, 144, 8, 8}, {144, 1, 5, 5}, 2,
     2, 144},
    {"efficientnet depthwise 5x5 at 2x2", {4, 672, 2, 2}, {672, 1, 5, 5}, 1,
     2, 672},
    {"efficientnet squeeze 1x1 at 1x1", {4, 480, 1, 1}, {20, 480, 1, 1}, 1, 0,
     1},
};

// Runs one conv kernel into a NaN-filled output of `shape`.
Host<float> runConv(OpKind op, const ir::AttrMap &attrs, Host<float> &a,
                    Host<float> &b, Ints shape) {
  Host<float> out(std::move(shape));
  std::fill(out.data.begin(), out.data.end(),
            std::numeric_limits<float>::quiet_NaN());
  if (llvm::Error e = run(op, attrs, {a.ref(), b.ref()}, {out.ref()}))
    ADD_FAILURE() << llvm::toString(std::move(e));
  return out;
}

// Forward, input gradient and filter gradient of `s`, one after another.
std::vector<Host<float>> allThree(const ConvShape &s, Host<float> &x,
                                  Host<float> &w, Host<float> &dy) {
  ir::AttrMap fwd = s.attrs(), data = s.attrs(), filter = s.attrs();
  data.insert_or_assign("shape", s.x);
  filter.insert_or_assign("shape", s.w);
  std::vector<Host<float>> r;
  r.push_back(runConv(OpKind::Conv, fwd, x, w, s.y()));
  r.push_back(runConv(OpKind::ConvGradData, data, dy, w, s.x));
  r.push_back(runConv(OpKind::ConvGradFilter, filter, x, dy, s.w));
  return r;
}

bool sameBits(const Host<float> &a, const Host<float> &b) {
  return a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(),
                     a.data.size() * sizeof(float)) == 0;
}

TEST(CpuConvThreads, CnnShapesGiveTheSameBitsOnOneTwoAndFourThreads) {
  const char *part[] = {"forward", "input gradient", "filter gradient"};
  for (const ConvShape &s : kShapes) {
    SCOPED_TRACE(s.name);
    Host<float> x = randomHost<float>(s.x, 1), w = randomHost<float>(s.w, 2),
                dy = randomHost<float>(s.y(), 3);
    std::vector<std::vector<Host<float>>> results;
    testsupport::cpu(); // first, so it does not reset the pool below
    for (int threads : {1, 2, 4}) {
      auto backend = runtime::createCpuBackend(threads);
      results.push_back(allThree(s, x, w, dy));
    }
    // The shared pool back at the 2 threads the other tests expect.
    auto restore = runtime::createCpuBackend(2);
    for (size_t t = 1; t < results.size(); ++t)
      for (size_t k = 0; k < 3; ++k)
        EXPECT_TRUE(sameBits(results[0][k], results[t][k]))
            << part[k] << " on " << (t == 1 ? 2 : 4) << " threads";
  }
}

// The same kernels with their operands and outputs moved by 1 to 15
// floats, and with the heap holding 0 to 7 more small blocks (so the
// scratch a kernel allocates lands elsewhere): the same bits every time.
// Vectorized loops peel and version by address, so an arithmetic
// difference between a loop's copies shows here.
TEST(CpuConvThreads, BitsDoNotDependOnAddresses) {
  const char *part[] = {"forward", "input gradient", "filter gradient"};
  auto shifted = [](const Host<float> &h, size_t offset,
                    std::vector<float> &store) {
    store.assign(h.data.size() + 16, 0.0f);
    std::copy(h.data.begin(), h.data.end(), store.begin() + offset);
    return TensorRef{ir::DType::F32, h.shape, store.data() + offset};
  };
  testsupport::cpu();
  auto backend = runtime::createCpuBackend(2);
  for (const ConvShape &s : kShapes) {
    SCOPED_TRACE(s.name);
    Host<float> x = randomHost<float>(s.x, 7), w = randomHost<float>(s.w, 8),
                dy = randomHost<float>(s.y(), 9);
    std::vector<Host<float>> want = allThree(s, x, w, dy);
    ir::AttrMap attrs[3] = {s.attrs(), s.attrs(), s.attrs()};
    attrs[1].insert_or_assign("shape", s.x);
    attrs[2].insert_or_assign("shape", s.w);
    OpKind ops[3] = {OpKind::Conv, OpKind::ConvGradData,
                     OpKind::ConvGradFilter};
    // Which thread runs which chunk, and so which heap its scratch comes
    // from, changes from call to call: several rounds (under a sanitizer,
    // one round of three offsets and two heaps: 178 s under TSan in full).
    const int rounds = testsupport::kSanitized ? 1 : 4;
    const size_t offsetStep = testsupport::kSanitized ? 6 : 3;
    const int heldStep = testsupport::kSanitized ? 5 : 1;
    for (int round = 0; round < rounds; ++round)
    for (size_t offset = 1; offset < 16; offset += offsetStep)
      for (int held = 0; held < 8; held += heldStep) {
      // Blocks in the size classes of the kernels' scratch, kept alive
      // across the call: its allocations come from other addresses.
      std::vector<std::unique_ptr<char[]>> blocks;
      for (int i = 0; i < held; ++i)
        for (size_t bytes : {32, 72, 96, 288, 1152, 4096})
          blocks.push_back(std::make_unique<char[]>(bytes));
      std::vector<float> xs, ws, dys, outs;
      TensorRef X = shifted(x, offset, xs), W = shifted(w, offset, ws),
                DY = shifted(dy, offset, dys);
      TensorRef in[3][2] = {{X, W}, {DY, W}, {X, DY}};
      for (size_t k = 0; k < 3; ++k) {
        TensorRef out = shifted(want[k], offset, outs);
        if (llvm::Error e = run(ops[k], attrs[k], {in[k][0], in[k][1]}, {out}))
          ADD_FAILURE() << llvm::toString(std::move(e));
        EXPECT_EQ(std::memcmp(out.as<float>(), want[k].data.data(),
                              want[k].data.size() * sizeof(float)),
                  0)
            << part[k] << " with operands moved by " << offset
            << " floats and " << held << " blocks held";
      }
    }
  }
}

// A batch of images goes batch-folded where the output is small; each
// image alone (batch 1) takes the image-by-image paths. Both agree to f32
// rounding, and the filter gradient is the sum over the images.
TEST(CpuConvThreads, BatchFoldedAgreesWithImageByImage) {
  for (const ConvShape &big : kShapes) {
    SCOPED_TRACE(big.name);
    ConvShape s = big;
    s.x[0] = 3;
    Host<float> x = randomHost<float>(s.x, 4), w = randomHost<float>(s.w, 5),
                dy = randomHost<float>(s.y(), 6);
    std::vector<Host<float>> batch = allThree(s, x, w, dy);
    ConvShape one = s;
    one.x[0] = 1;
    int64_t xs = numElements(one.x), ys = numElements(one.y());
    std::vector<double> wantY, wantDx, wantDw(size_t(numElements(s.w)), 0.0);
    for (int64_t i = 0; i < s.x[0]; ++i) {
      Host<float> xi(one.x,
                     {x.data.begin() + i * xs, x.data.begin() + (i + 1) * xs});
      Host<float> dyi(
          one.y(), {dy.data.begin() + i * ys, dy.data.begin() + (i + 1) * ys});
      std::vector<Host<float>> r = allThree(one, xi, w, dyi);
      wantY.insert(wantY.end(), r[0].data.begin(), r[0].data.end());
      wantDx.insert(wantDx.end(), r[1].data.begin(), r[1].data.end());
      for (size_t k = 0; k < wantDw.size(); ++k)
        wantDw[k] += r[2].data[k];
    }
    expectClose(batch[0].data, wantY, 1e-5);
    expectClose(batch[1].data, wantDx, 1e-5);
    expectClose(batch[2].data, wantDw, 1e-4);
  }
}

} // namespace

} // namespace unit_cpu_conv_threads
