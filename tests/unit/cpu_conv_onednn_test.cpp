// The f32 convolutions oneDNN runs (runtime/cpu/ConvOneDnn.h): which convs
// it takes, and on those the forward, input gradient and filter gradient
// against the f64 result of cleave's own kernels, as close as cleave's own
// f32 kernels come; the same bits on 1, 2 and 3 threads (the chunks are
// cut by the shape). Skipped where libdnnl.so.2 does not load. (The CNN
// layer shapes of cpu_conv_threads_test.cpp run on the default library,
// oneDNN on AVX-512 CPUs, for their bits on 1, 2 and 4 threads and any
// operand address.)
#include "CpuKernelTesting.h"

#include "runtime/cpu/ConvOneDnn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace unit_cpu_conv_onednn {

using namespace cleave;
using namespace cleave::testsupport::typed;
using namespace cleave::runtime::cpu;
using ir::OpKind;

namespace {

struct Shape {
  const char *name;
  Ints x, w;
  Ints strides, pads, dilations;
  int64_t group = 1;

  Ints y() const {
    Ints s{x[0], w[0]};
    for (size_t d = 0; d < 2; ++d) {
      int64_t span = (w[d + 2] - 1) * dilations[d] + 1;
      s.push_back((x[d + 2] + pads[d] + pads[d + 2] - span) / strides[d] + 1);
    }
    return s;
  }
  ir::AttrMap attrs() const {
    return {{"strides", strides},
            {"pads", pads},
            {"dilations", dilations},
            {"group", group}};
  }
  ConvDims dims() const {
    ir::AttrMap a = attrs();
    runtime::KernelCall call{OpKind::Conv, a, {}, {}, 0};
    return convDimsOf(call, x, w, y());
  }
};

// Taken by oneDNN: 2-D, one group, every tap live, 16 or more outputs.
const Shape kTaken[] = {
    {"stem 7x7/2 pad 3", {4, 3, 32, 32}, {16, 3, 7, 7}, {2, 2}, {3, 3, 3, 3},
     {1, 1}},
    {"3x3 pad 1, batch 6", {6, 16, 8, 8}, {24, 16, 3, 3}, {1, 1}, {1, 1, 1, 1},
     {1, 1}},
    {"3x3/2 to 4x4", {16, 8, 8, 8}, {16, 8, 3, 3}, {2, 2}, {1, 1, 1, 1},
     {1, 1}},
    {"1x1", {5, 12, 6, 6}, {20, 12, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}},
    {"dilated 3x3", {2, 4, 12, 12}, {6, 4, 3, 3}, {1, 1}, {2, 2, 2, 2},
     {2, 2}},
    {"uneven pads and strides", {3, 5, 11, 9}, {7, 5, 3, 2}, {2, 1},
     {0, 1, 2, 0}, {1, 1}},
};

Host<double> widened(const Host<float> &h) {
  Host<double> d(h.shape);
  for (size_t i = 0; i < h.data.size(); ++i)
    d.data[i] = h.data[i];
  return d;
}

template <typename T>
Host<T> runOne(OpKind op, const ir::AttrMap &attrs,
               std::initializer_list<TensorRef> in, Ints shape) {
  Host<T> out(std::move(shape));
  std::fill(out.data.begin(), out.data.end(),
            std::numeric_limits<T>::quiet_NaN());
  if (llvm::Error e = run(op, attrs, in, {out.ref()}))
    ADD_FAILURE() << llvm::toString(std::move(e));
  return out;
}

// Forward (with a bias), input gradient and filter gradient.
template <typename T>
std::vector<Host<T>> allThree(const Shape &s, Host<T> &x, Host<T> &w,
                              Host<T> &b, Host<T> &dy) {
  ir::AttrMap data = s.attrs(), filter = s.attrs();
  data.insert_or_assign("shape", s.x);
  filter.insert_or_assign("shape", s.w);
  return {runOne<T>(OpKind::Conv, s.attrs(), {x.ref(), w.ref(), b.ref()},
                    s.y()),
          runOne<T>(OpKind::ConvGradData, data, {dy.ref(), w.ref()}, s.x),
          runOne<T>(OpKind::ConvGradFilter, filter, {x.ref(), dy.ref()}, s.w)};
}

double maxError(const Host<float> &got, const Host<double> &want) {
  double worst = 0;
  for (size_t i = 0; i < got.data.size(); ++i)
    worst = std::max(worst, std::fabs(double(got.data[i]) - want.data[i]));
  return worst;
}

struct LibraryScope {
  ConvLibrary previous = convLibrary();
  ~LibraryScope() { setConvLibrary(previous); }
};

TEST(CpuConvOneDnn, TakesTwoDimensionalSingleGroupConvsWithEveryTapLive) {
  LibraryScope scope;
  if (!setConvLibrary(ConvLibrary::OneDnn))
    GTEST_SKIP() << "libdnnl.so.2 does not load here";
  for (const Shape &s : kTaken)
    EXPECT_TRUE(oneDnnTakesConv(s.dims())) << s.name;
  const Shape notTaken[] = {
      // Depthwise: cleave's direct loops.
      {"depthwise", {4, 8, 8, 8}, {8, 1, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1},
       8},
      // 3x3 on 1x1 maps: only the centre tap reads the input.
      {"3x3 at 1x1", {4, 32, 1, 1}, {32, 32, 3, 3}, {1, 1}, {1, 1, 1, 1},
       {1, 1}},
      // 2x2 outputs: the batch-folded GEMMs win there.
      {"3x3 at 2x2", {4, 32, 2, 2}, {32, 32, 3, 3}, {1, 1}, {1, 1, 1, 1},
       {1, 1}},
  };
  for (const Shape &s : notTaken)
    EXPECT_FALSE(oneDnnTakesConv(s.dims())) << s.name;
  setConvLibrary(ConvLibrary::Own);
  EXPECT_FALSE(oneDnnTakesConv(kTaken[0].dims()));
}

TEST(CpuConvOneDnn, AgreesWithTheOwnKernelsToF32Rounding) {
  LibraryScope scope;
  if (!setConvLibrary(ConvLibrary::OneDnn))
    GTEST_SKIP() << "libdnnl.so.2 does not load here";
  const char *part[] = {"forward", "input gradient", "filter gradient"};
  for (const Shape &s : kTaken) {
    SCOPED_TRACE(s.name);
    Host<float> x = randomHost<float>(s.x, 11), w = randomHost<float>(s.w, 12),
                b = randomHost<float>({s.w[0]}, 13),
                dy = randomHost<float>(s.y(), 14);
    Host<double> x64 = widened(x), w64 = widened(w), b64 = widened(b),
                 dy64 = widened(dy);
    std::vector<Host<double>> want = allThree(s, x64, w64, b64, dy64);
    setConvLibrary(ConvLibrary::OneDnn);
    std::vector<Host<float>> dnnl = allThree(s, x, w, b, dy);
    setConvLibrary(ConvLibrary::Own);
    std::vector<Host<float>> own = allThree(s, x, w, b, dy);
    for (size_t k = 0; k < 3; ++k) {
      double scale = 0;
      for (double v : want[k].data)
        scale = std::max(scale, std::fabs(v));
      // Both f32 results within a few roundings of the largest value; the
      // sums' orders differ, so the bound is not the own kernels' error.
      double ownError = maxError(own[k], want[k]);
      double dnnlError = maxError(dnnl[k], want[k]);
      EXPECT_LE(dnnlError, 1e-5 * scale)
          << part[k] << ": oneDNN off by " << dnnlError << " (own "
          << ownError << ", largest value " << scale << ")";
      EXPECT_LE(ownError, 1e-5 * scale) << part[k];
    }
  }
}

TEST(CpuConvOneDnn, SameBitsOnOneTwoAndThreeThreads) {
  LibraryScope scope;
  if (!setConvLibrary(ConvLibrary::OneDnn))
    GTEST_SKIP() << "libdnnl.so.2 does not load here";
  const char *part[] = {"forward", "input gradient", "filter gradient"};
  testsupport::cpu(); // first, so it does not reset the pool below
  for (const Shape &s : kTaken) {
    SCOPED_TRACE(s.name);
    Host<float> x = randomHost<float>(s.x, 21), w = randomHost<float>(s.w, 22),
                b = randomHost<float>({s.w[0]}, 23),
                dy = randomHost<float>(s.y(), 24);
    std::vector<std::vector<Host<float>>> results;
    for (int threads : {1, 2, 3}) {
      auto backend = runtime::createCpuBackend(threads);
      results.push_back(allThree(s, x, w, b, dy));
    }
    auto restore = runtime::createCpuBackend(2);
    for (size_t t = 1; t < results.size(); ++t)
      for (size_t k = 0; k < 3; ++k)
        EXPECT_EQ(std::memcmp(results[0][k].data.data(),
                              results[t][k].data.data(),
                              results[0][k].data.size() * sizeof(float)),
                  0)
            << part[k] << " on " << t + 1 << " threads";
  }
}

} // namespace

} // namespace unit_cpu_conv_onednn
