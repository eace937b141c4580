// CPU gradient and optimizer kernels (runtime/cpu/Gradients*.cpp,
// Optimizers.cpp).
//
// Every gradient op is checked in f64 against central finite differences of
// its forward op run on the same backend: for a random dY, the gradient of
// sum(dY * forward(x)) with respect to x, element by element (or along a
// random direction for large tensors, which take the threaded paths).
// Shapes include broadcasting and the attribute variants. Combined ops must
// equal their parts bit for bit, f32 must agree with f64, reductions must
// give the same bits on one thread and on two, and the optimizers must
// follow PyTorch's update formulas over three steps.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>

namespace unit_cpu_gradients {

using namespace cleave;
using namespace cleave::testsupport::typed;
using ir::AttrMap;
using ir::OpKind;
using runtime::TensorRef;

namespace {

using Tensor = Host<double>;
using Mask = Host<uint8_t>; // bool tensors, one byte per element
using Values = std::vector<double>;

std::string errorText(llvm::Error e) { return llvm::toString(std::move(e)); }

// `attrs` with one more attribute.
AttrMap with(AttrMap attrs, const std::string &name, ir::Attribute value) {
  attrs.insert_or_assign(name, std::move(value));
  return attrs;
}

// Result shapes of `op` on these operands, from its type rule.
std::vector<Ints> resultShapes(OpKind op, const std::vector<TensorRef> &ins,
                               const AttrMap &attrs, unsigned numResults) {
  std::vector<ir::TensorType> types;
  for (const TensorRef &t : ins)
    types.emplace_back(t.dtype, ir::Shape(t.shape.begin(), t.shape.end()));
  auto res = ir::inferResultTypes(op, types, attrs, numResults);
  if (!res) {
    ADD_FAILURE() << ir::opInfo(op).name << ": " << errorText(res.takeError());
    return {};
  }
  std::vector<Ints> shapes;
  for (const ir::TensorType &t : *res)
    shapes.emplace_back(t.shape.begin(), t.shape.end());
  return shapes;
}

// Runs `op` and returns its results, all of element type T. They start as
// NaN, so an element a kernel forgets to write shows up.
template <typename T = double>
std::vector<Host<T>> runOp(OpKind op, const AttrMap &attrs,
                           std::vector<TensorRef> ins, unsigned numResults = 1,
                           uint64_t seed = 0) {
  std::vector<Host<T>> outs;
  for (Ints &s : resultShapes(op, ins, attrs, numResults)) {
    outs.emplace_back(std::move(s));
    std::fill(outs.back().data.begin(), outs.back().data.end(),
              std::numeric_limits<T>::quiet_NaN());
  }
  std::vector<TensorRef> refs;
  for (Host<T> &o : outs)
    refs.push_back(o.ref());
  if (llvm::Error e = run(op, attrs, ins, refs, seed))
    ADD_FAILURE() << errorText(std::move(e));
  return outs;
}

// The first result of `op` as values.
Values forward(OpKind op, const AttrMap &attrs, std::vector<TensorRef> ins) {
  return runOp(op, attrs, std::move(ins))[0].data;
}

double dot(const Values &a, const Values &b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    s += a[i] * b[i];
  return s;
}

// Checks `grad`, a kernel's gradient of sum(dY * f()) with respect to x,
// against central differences, perturbing each element of x in turn.
void expectGradient(const Values &grad, Tensor &x, const Values &dY,
                    const std::function<Values()> &f, double tol = 1e-6) {
  ASSERT_EQ(grad.size(), x.data.size());
  const double h = 1e-6;
  for (size_t i = 0; i < x.data.size(); ++i) {
    double saved = x.data[i];
    x.data[i] = saved + h;
    double up = dot(dY, f());
    x.data[i] = saved - h;
    double down = dot(dY, f());
    x.data[i] = saved;
    double want = (up - down) / (2 * h);
    if (!(std::abs(grad[i] - want) <= tol * (1 + std::abs(want)))) {
      ADD_FAILURE() << "element " << i << ": gradient " << grad[i]
                    << ", finite difference " << want;
      return;
    }
  }
}

// For tensors too large to perturb one element at a time: the derivative
// along a random direction.
void expectDirectionalDerivative(const Values &grad, Tensor &x,
                                 const Values &dY,
                                 const std::function<Values()> &f,
                                 double tol = 1e-6) {
  ASSERT_EQ(grad.size(), x.data.size());
  const double h = 1e-6;
  Tensor v = randomHost<double>(x.shape, 99);
  Values saved = x.data;
  for (size_t i = 0; i < saved.size(); ++i)
    x.data[i] = saved[i] + h * v.data[i];
  double up = dot(dY, f());
  for (size_t i = 0; i < saved.size(); ++i)
    x.data[i] = saved[i] - h * v.data[i];
  double down = dot(dY, f());
  x.data = saved;
  double want = (up - down) / (2 * h);
  EXPECT_NEAR(dot(grad, v.data), want, tol * (1 + std::abs(want)));
}

// A random dY for the first result of `op` on these operands.
Tensor randomGradient(OpKind op, const AttrMap &attrs,
                      const std::vector<TensorRef> &ins, unsigned seed) {
  auto shapes = resultShapes(op, ins, attrs, 1);
  return randomHost<double>(shapes.empty() ? Ints{} : shapes[0], seed);
}

void expectBitIdentical(const Values &a, const Values &b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0);
}

// Runs `op` on f64 operands and on the same values in f32 and expects the
// results to agree to f32 precision. Operands in `fixed` (labels, indices,
// masks) are passed as they are at their positions; `floats` fill the rest
// in order.
void expectF32AgreesWithF64(OpKind op, const AttrMap &attrs,
                            std::vector<Tensor *> floats,
                            std::map<size_t, TensorRef> fixed = {},
                            unsigned numResults = 1) {
  std::vector<Host<float>> narrow;
  narrow.reserve(floats.size());
  std::vector<TensorRef> ins64, ins32;
  size_t next = 0;
  for (size_t i = 0; i < floats.size() + fixed.size(); ++i) {
    if (fixed.count(i)) {
      ins64.push_back(fixed.at(i));
      ins32.push_back(fixed.at(i));
      continue;
    }
    Tensor *t = floats[next++];
    narrow.emplace_back(t->shape,
                        std::vector<float>(t->data.begin(), t->data.end()));
    ins64.push_back(t->ref());
    ins32.push_back(narrow.back().ref());
  }
  auto wide = runOp<double>(op, attrs, ins64, numResults);
  auto single = runOp<float>(op, attrs, ins32, numResults);
  ASSERT_EQ(wide.size(), single.size());
  for (size_t r = 0; r < wide.size(); ++r)
    expectClose(single[r].data, wide[r].data, 1e-4);
}

// --- UnaryGrad ----------------------------------------------------------------

TEST(CpuGradients, UnaryGradMatchesFiniteDifferencesForEveryFn) {
  struct Case {
    const char *fn;
    OpKind op;
    AttrMap attrs;
    double lo, hi;
  };
  std::vector<Case> cases = {
      {"abs", OpKind::Abs, {}, -2, 2},
      {"clip", OpKind::Clip, {{"min", -0.5f}, {"max", 0.7f}}, -2, 2},
      {"clip", OpKind::Clip, {{"min", 0.2f}}, -2, 2}, // no upper bound
      {"erf", OpKind::Erf, {}, -2, 2},
      {"exp", OpKind::Exp, {}, -2, 2},
      {"leaky_relu", OpKind::LeakyRelu, {{"alpha", 0.2f}}, -2, 2},
      {"leaky_relu", OpKind::LeakyRelu, {}, -2, 2}, // default alpha
      {"log", OpKind::Log, {}, 0.2, 3},
      {"reciprocal", OpKind::Reciprocal, {}, -3, 3},
      {"relu", OpKind::Relu, {}, -2, 2},
      {"sigmoid", OpKind::Sigmoid, {}, -4, 4},
      {"sqrt", OpKind::Sqrt, {}, 0.2, 3},
      {"tanh", OpKind::Tanh, {}, -2, 2},
  };
  for (Case &c : cases) {
    SCOPED_TRACE(c.fn);
    Tensor x = randomHost<double>({3, 4, 5}, 11, c.lo, c.hi);
    // Stay clear of the kinks (0 and the clip bounds).
    for (double &v : x.data)
      for (double kink : {0.0, -0.5, 0.7, 0.2})
        if (std::abs(v - kink) < 0.02)
          v += 0.05;
    Tensor dY = randomHost<double>(x.shape, 12);
    Tensor dX = runOp(OpKind::UnaryGrad, with(c.attrs, "fn", c.fn),
                      {dY.ref(), x.ref()})[0];
    expectGradient(dX.data, x, dY.data,
                   [&] { return forward(c.op, c.attrs, {x.ref()}); });
  }
}

// PyTorch 2's hardswish and hardsigmoid backward at and around their kinks
// (float64 values from torch.autograd: hardswish' is 0 at -3 and 1 at 3,
// hardsigmoid' is 0 at both, and PyTorch's 1/6 is the float's).
TEST(CpuGradients, HardSwishAndHardSigmoidMatchPyTorchAtTheKinks) {
  Tensor dY({6}, {1, 1, 1, 1, 1, 1}), x({6}, {-3.5, -3, -1, 0, 3, 3.5});
  EXPECT_EQ(runOp(OpKind::UnaryGrad, {{"fn", "hard_swish"}},
                  {dY.ref(), x.ref()})[0]
                .data,
            (Values{0, 0, -1.0 / 3 + 0.5, 0.5, 1, 1}));
  AttrMap hs{{"fn", "hard_sigmoid"}, {"alpha", 1.0f / 6.0f}, {"beta", 0.5f}};
  double sixth = double(1.0f / 6.0f);
  EXPECT_EQ(runOp(OpKind::UnaryGrad, hs, {dY.ref(), x.ref()})[0].data,
            (Values{0, 0, sixth, sixth, 0, 0}));
  // Other constants: the slope inside (0, 1) of alpha x + beta.
  AttrMap onnx{{"fn", "hard_sigmoid"}, {"alpha", 0.5f}, {"beta", 0.5f}};
  EXPECT_EQ(runOp(OpKind::UnaryGrad, onnx, {dY.ref(), x.ref()})[0].data,
            (Values{0, 0, 0, 0.5, 0, 0}));
}

TEST(CpuGradients, UnaryGradMasksGiveZeroNotNaN) {
  Tensor dY({3}, {INFINITY, 2, INFINITY}), x({3}, {-1, 0, 5});
  EXPECT_EQ(runOp(OpKind::UnaryGrad, {{"fn", "relu"}}, {dY.ref(), x.ref()})[0]
                .data,
            (Values{0, 0, INFINITY})); // relu' is 0 at 0
  AttrMap clip{{"fn", "clip"}, {"min", 0.0f}, {"max", 4.0f}};
  EXPECT_EQ(runOp(OpKind::UnaryGrad, clip, {dY.ref(), x.ref()})[0].data,
            (Values{0, 2, 0})); // bounds included
}

// --- SumTo --------------------------------------------------------------------

TEST(CpuGradients, SumToMatchesFiniteDifferencesOfExpand) {
  std::vector<std::pair<Ints, Ints>> cases = {
      {{2, 3, 4}, {3, 1}},       {{2, 3, 4}, {4}},
      {{2, 3, 4}, {2, 1, 4}},    {{2, 3, 4}, {1}},
      {{2, 3, 4}, {}},           {{2, 3, 4}, {2, 3, 4}},
      {{2, 1, 3, 5}, {1, 1, 3, 1}}, {{3, 4, 5, 2}, {4, 1, 2}},
      {{4, 600}, {600}},         {{600, 3, 1}, {600, 1, 1}},
      {{2, 0, 3}, {1, 3}},
  };
  for (auto &[big, small] : cases) {
    SCOPED_TRACE(ir::shapeStr(big) + " -> " + ir::shapeStr(small));
    Tensor x = randomHost<double>(small, 1);
    AttrMap expand{{"shape", big}};
    Tensor dY = randomHost<double>(big, 2);
    Tensor dX = runOp(OpKind::SumTo, {{"shape", small}}, {dY.ref()})[0];
    expectGradient(dX.data, x, dY.data,
                   [&] { return forward(OpKind::Expand, expand, {x.ref()}); });
  }
}

// --- MatMul, Gemm -------------------------------------------------------------

// MatMulGradA and MatMulGradB of A x B against finite differences; large
// shapes are checked along a random direction.
void checkMatMulGrads(Ints a, Ints b, bool large) {
  SCOPED_TRACE(ir::shapeStr(a) + " x " + ir::shapeStr(b));
  Tensor A = randomHost<double>(a, 3), B = randomHost<double>(b, 4);
  auto fwd = [&] { return forward(OpKind::MatMul, {}, {A.ref(), B.ref()}); };
  Tensor dY = randomGradient(OpKind::MatMul, {}, {A.ref(), B.ref()}, 5);
  Tensor dA = runOp(OpKind::MatMulGradA, {{"shape", a}}, {dY.ref(), B.ref()})[0];
  Tensor dB = runOp(OpKind::MatMulGradB, {{"shape", b}}, {A.ref(), dY.ref()})[0];
  auto check = large ? expectDirectionalDerivative : expectGradient;
  check(dA.data, A, dY.data, fwd, 1e-6);
  check(dB.data, B, dY.data, fwd, 1e-6);
}

TEST(CpuGradients, MatMulGradsMatchFiniteDifferencesWithBroadcastBatches) {
  checkMatMulGrads({3, 4}, {4, 5}, false);
  checkMatMulGrads({2, 3, 4}, {4, 5}, false);       // B shared by the batch
  checkMatMulGrads({4, 3}, {2, 3, 5}, false);       // A shared by the batch
  checkMatMulGrads({2, 1, 3, 4}, {5, 4, 2}, false); // both broadcast
  checkMatMulGrads({1, 3, 4}, {2, 4, 2}, false);
  checkMatMulGrads({3, 1, 2, 3}, {1, 4, 3, 2}, false);
  checkMatMulGrads({2, 3, 4}, {4, 0}, false); // dA is an empty sum
  // Threaded GEMMs: one folded product, and batches of large products.
  checkMatMulGrads({4, 64, 96}, {96, 80}, true);
  checkMatMulGrads({2, 1, 72, 72}, {3, 72, 72}, true);
}

TEST(CpuGradients, GemmGradsMatchFiniteDifferencesForEveryTranspose) {
  const int64_t m = 3, n = 4, k = 5;
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1})
      for (float alpha : {1.0f, -1.5f}) {
        SCOPED_TRACE("transA " + std::to_string(ta) + " transB " +
                     std::to_string(tb) + " alpha " + std::to_string(alpha));
        Ints a = ta ? Ints{k, m} : Ints{m, k}, b = tb ? Ints{n, k} : Ints{k, n};
        Tensor A = randomHost<double>(a, 6), B = randomHost<double>(b, 7),
               C = randomHost<double>({n}, 8), dY = randomHost<double>({m, n}, 9);
        AttrMap attrs{{"alpha", alpha}, {"transA", ta}, {"transB", tb}};
        auto fwd = [&] {
          return forward(OpKind::Gemm, with(attrs, "beta", 0.5f),
                         {A.ref(), B.ref(), C.ref()});
        };
        Tensor dA = runOp(OpKind::GemmGradA, with(attrs, "shape", a),
                          {dY.ref(), B.ref()})[0];
        Tensor dB = runOp(OpKind::GemmGradB, with(attrs, "shape", b),
                          {A.ref(), dY.ref()})[0];
        expectGradient(dA.data, A, dY.data, fwd);
        expectGradient(dB.data, B, dY.data, fwd);
      }
}

// --- Conv -----------------------------------------------------------------------

struct ConvCase {
  Ints x, w, strides, pads, dilations;
  int64_t group;
  AttrMap attrs() const {
    return {{"strides", strides},
            {"pads", pads},
            {"dilations", dilations},
            {"group", group}};
  }
};

void checkConvGrads(const ConvCase &c, bool large) {
  SCOPED_TRACE(ir::shapeStr(c.x) + " * " + ir::shapeStr(c.w) + " group " +
               std::to_string(c.group));
  Tensor X = randomHost<double>(c.x, 10), W = randomHost<double>(c.w, 11);
  AttrMap attrs = c.attrs();
  auto fwd = [&] { return forward(OpKind::Conv, attrs, {X.ref(), W.ref()}); };
  Tensor dY = randomGradient(OpKind::Conv, attrs, {X.ref(), W.ref()}, 12);
  Tensor dX = runOp(OpKind::ConvGradData, with(attrs, "shape", c.x),
                    {dY.ref(), W.ref()})[0];
  Tensor dW = runOp(OpKind::ConvGradFilter, with(attrs, "shape", c.w),
                    {X.ref(), dY.ref()})[0];
  auto check = large ? expectDirectionalDerivative : expectGradient;
  check(dX.data, X, dY.data, fwd, 1e-6);
  check(dW.data, W, dY.data, fwd, 1e-6);
}

const std::vector<ConvCase> &convCases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 5, 5}, {4, 3, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {{1, 2, 7, 6}, {3, 2, 3, 2}, {2, 2}, {0, 1, 1, 0}, {1, 1}, 1},
      {{1, 2, 7, 7}, {2, 2, 3, 3}, {1, 2}, {2, 1, 0, 2}, {2, 2}, 1},
      {{2, 4, 5, 5}, {6, 2, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2},
      {{1, 4, 5, 4}, {4, 1, 3, 3}, {2, 1}, {1, 1, 1, 1}, {1, 1}, 4},
      // Depthwise (direct loops): stride 1 with dilation and uneven pads
      // (the padded-plane path), stride 2.
      {{2, 3, 6, 5}, {3, 1, 3, 3}, {1, 1}, {1, 0, 2, 1}, {2, 1}, 3},
      {{2, 4, 7, 7}, {4, 1, 3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 4},
      {{2, 3, 9}, {2, 3, 4}, {2}, {1, 2}, {1}, 1},
      {{1, 2, 4, 4, 3}, {2, 2, 2, 2, 2}, {1, 1, 1}, {0, 0, 1, 1, 1, 0},
       {1, 1, 1}, 1},
      {{2, 3, 4, 4}, {5, 3, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},
      {{2, 4, 4, 4}, {4, 2, 1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 2},
      {{2, 3, 5, 5}, {2, 3, 1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1},
      {{1, 1, 3, 3}, {1, 1, 2, 2}, {1, 1}, {0, 0, 1, 1}, {1, 1}, 1},
      // Tap by tap (2-D, stride 1, >= 8 channels): padded, uneven pads, a
      // 3x2 kernel, groups, no padding; then padding past the kernel and
      // dilation, which do not qualify.
      {{2, 8, 5, 6}, {8, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1},
      {{1, 8, 6, 5}, {9, 8, 3, 2}, {1, 1}, {0, 1, 2, 0}, {1, 1}, 1},
      {{2, 16, 4, 4}, {16, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2},
      {{1, 8, 5, 5}, {8, 8, 3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1},
      {{1, 8, 4, 4}, {8, 8, 3, 3}, {1, 1}, {3, 0, 0, 3}, {1, 1}, 1},
      {{1, 8, 6, 6}, {8, 8, 3, 3}, {1, 1}, {1, 1, 1, 1}, {2, 2}, 1},
  };
  return cases;
}

TEST(CpuGradients, ConvGradsMatchFiniteDifferences) {
  for (const ConvCase &c : convCases())
    checkConvGrads(c, false);
}

TEST(CpuGradients, LargeConvGradsUseThreadedGemms) {
  checkConvGrads({{4, 16, 20, 20}, {32, 16, 3, 3}, {1, 1}, {1, 1, 1, 1},
                  {1, 1}, 1},
                 true);
  checkConvGrads({{2, 64, 16, 16}, {64, 64, 1, 1}, {1, 1}, {0, 0, 0, 0},
                  {1, 1}, 1},
                 true);
}

// --- Pooling ------------------------------------------------------------------

struct PoolCase {
  Ints x, kernel, strides, pads, dilations;
  int64_t ceil, includePad;
};

TEST(CpuGradients, MaxPoolGradMatchesFiniteDifferences) {
  std::vector<PoolCase> cases = {
      {{2, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 0},
      {{1, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1, 0, 0}, {1, 1}, 1, 0},
      {{1, 2, 8, 8}, {2, 3}, {1, 2}, {0, 1, 0, 1}, {2, 2}, 0, 0},
      {{2, 3, 9}, {3}, {1}, {1, 1}, {1}, 0, 0}, // overlapping windows
      {{1, 1, 4, 4, 4}, {2, 2, 2}, {2, 2, 2}, {0, 0, 0, 0, 0, 0}, {1, 1, 1},
       0, 0},
  };
  for (const PoolCase &c : cases) {
    SCOPED_TRACE(ir::shapeStr(c.x) + " kernel " + ir::shapeStr(c.kernel));
    AttrMap attrs{{"kernel_shape", c.kernel}, {"strides", c.strides},
                  {"pads", c.pads},           {"dilations", c.dilations},
                  {"ceil_mode", c.ceil}};
    Tensor X = randomHost<double>(c.x, 13);
    Tensor dY = randomGradient(OpKind::MaxPool, attrs, {X.ref()}, 14);
    Tensor dX = runOp(OpKind::MaxPoolGrad, attrs, {dY.ref(), X.ref()})[0];
    expectGradient(dX.data, X, dY.data,
                   [&] { return forward(OpKind::MaxPool, attrs, {X.ref()}); });
  }
}

TEST(CpuGradients, MaxPoolGradRoutesTiesToTheFirstMaximum) {
  Tensor X({1, 1, 1, 4}, {1, 3, 3, 2}), dY({1, 1, 1, 3}, {1, 10, 100});
  AttrMap attrs{{"kernel_shape", Ints{1, 2}}, {"strides", Ints{1, 1}},
                {"pads", Ints{0, 0, 0, 0}},   {"dilations", Ints{1, 1}}};
  EXPECT_EQ(runOp(OpKind::MaxPoolGrad, attrs, {dY.ref(), X.ref()})[0].data,
            (Values{0, 1 + 10, 100, 0})); // windows (1,3) (3,3) (3,2)
}

// The tap MaxPool picks gets the gradient: with NaNs in a window, the last
// NaN (PyTorch's max_pool2d_with_indices rule), in 2-D and 1-D pooling.
TEST(CpuGradients, MaxPoolGradRoutesToTheLastNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  AttrMap attrs{{"kernel_shape", Ints{1, 3}}, {"strides", Ints{1, 3}},
                {"pads", Ints{0, 0, 0, 0}},   {"dilations", Ints{1, 1}}};
  Tensor X({1, 1, 1, 6}, {nan, 5, nan, 1, 7, 7}), dY({1, 1, 1, 2}, {1, 10});
  EXPECT_EQ(runOp(OpKind::MaxPoolGrad, attrs, {dY.ref(), X.ref()})[0].data,
            (Values{0, 0, 1, 0, 10, 0}));
  AttrMap line{{"kernel_shape", Ints{3}}, {"strides", Ints{3}},
               {"pads", Ints{0, 0}},      {"dilations", Ints{1}}};
  Tensor X1({1, 1, 6}, {nan, 5, nan, 1, 7, 7}), dY1({1, 1, 2}, {1, 10});
  EXPECT_EQ(runOp(OpKind::MaxPoolGrad, line, {dY1.ref(), X1.ref()})[0].data,
            (Values{0, 0, 1, 0, 10, 0}));
}

TEST(CpuGradients, AveragePoolGradMatchesFiniteDifferences) {
  std::vector<PoolCase> cases;
  for (int64_t include : {0, 1}) {
    cases.push_back({{2, 2, 5, 5}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {}, 0, include});
    cases.push_back({{1, 2, 6, 6}, {3, 3}, {2, 2}, {1, 1, 0, 0}, {}, 1, include});
    cases.push_back({{2, 3, 7}, {2}, {3}, {0, 1}, {}, 1, include});
    cases.push_back({{1, 1, 3, 4, 4}, {2, 2, 3}, {1, 2, 1},
                     {0, 0, 1, 1, 1, 1}, {}, 0, include});
  }
  for (const PoolCase &c : cases) {
    SCOPED_TRACE(ir::shapeStr(c.x) + " kernel " + ir::shapeStr(c.kernel) +
                 " ceil " + std::to_string(c.ceil) + " include_pad " +
                 std::to_string(c.includePad));
    AttrMap attrs{{"kernel_shape", c.kernel}, {"strides", c.strides},
                  {"pads", c.pads},           {"ceil_mode", c.ceil},
                  {"count_include_pad", c.includePad}};
    Tensor X = randomHost<double>(c.x, 15);
    Tensor dY = randomGradient(OpKind::AveragePool, attrs, {X.ref()}, 16);
    Tensor dX = runOp(OpKind::AveragePoolGrad, with(attrs, "shape", c.x),
                      {dY.ref()})[0];
    expectGradient(dX.data, X, dY.data, [&] {
      return forward(OpKind::AveragePool, attrs, {X.ref()});
    });
  }
}

// --- LayerNormalization, BatchNormalization -----------------------------------

TEST(CpuGradients, LayerNormGradsMatchFiniteDifferences) {
  struct Case {
    Ints x;
    int64_t axis;
    Ints scale; // the normalized shape, or a shape broadcast to it
  };
  std::vector<Case> cases = {{{2, 3, 4}, -1, {4}},
                             {{2, 3, 4}, 1, {3, 4}},
                             {{2, 3, 4}, 0, {2, 3, 4}},
                             {{2, 3, 4}, 1, {4}},
                             {{5, 6}, -1, {6}}};
  for (const Case &c : cases) {
    SCOPED_TRACE(ir::shapeStr(c.x) + " axis " + std::to_string(c.axis));
    AttrMap attrs{{"axis", c.axis}, {"epsilon", 1e-3f}};
    Tensor X = randomHost<double>(c.x, 17, -2, 3),
           scale = randomHost<double>(c.scale, 18),
           bias = randomHost<double>(c.scale, 19);
    auto fwd = [&] {
      return forward(OpKind::LayerNormalization, attrs,
                     {X.ref(), scale.ref(), bias.ref()});
    };
    Tensor dY = randomHost<double>(c.x, 20);
    Tensor dX = runOp(OpKind::LayerNormalizationGradData, attrs,
                      {dY.ref(), X.ref(), scale.ref()})[0];
    expectGradient(dX.data, X, dY.data, fwd);
    Tensor dScale =
        runOp(OpKind::LayerNormalizationGradParams, attrs, {dY.ref(), X.ref()})[0];
    // dscale has the normalized shape; a broadcast scale's gradient is its
    // SumTo, emitted by autodiff.
    if (numElements(c.scale) == numElements(dScale.shape))
      expectGradient(dScale.data, scale, dY.data, fwd);
  }
}

// Over many rows (a transformer's tokens) dscale is summed by pieces of
// rows in one pass: still sum over rows of dY * x̂, LayerNorm's and RMS
// norm's (x̂ = x * inv), against the sum in long double.
TEST(CpuGradients, NormScaleGradientOverManyRowsIsItsSum) {
  // 300 rows: pieces of 64; 40000: of 79 (at most 512 pieces).
  const std::pair<int64_t, int64_t> shapes[] = {{300, 40}, {40000, 3}};
  for (int c = 0; c < 4; ++c) {
    const auto [rows, size] = shapes[c / 2];
    const bool centered = c % 2 == 0;
    SCOPED_TRACE(centered ? "LayerNormalization" : "RMSNormalization");
    SCOPED_TRACE(rows);
    Tensor X = randomHost<double>({rows, size}, 61, -2, 3),
           dY = randomHost<double>({rows, size}, 62);
    AttrMap attrs{{"epsilon", 1e-3f}};
    Tensor got = runOp(centered ? OpKind::LayerNormalizationGradParams
                                : OpKind::RMSNormalizationGradParams,
                       attrs, {dY.ref(), X.ref()})[0];
    std::vector<long double> want(size, 0.0L);
    const long double eps = 0.001L; // f64 data: the decimal written
    for (int64_t r = 0; r < rows; ++r) {
      const double *x = X.data.data() + r * size;
      long double mean = 0, var = 0;
      if (centered) {
        for (int64_t j = 0; j < size; ++j)
          mean += x[j];
        mean /= size;
      }
      for (int64_t j = 0; j < size; ++j)
        var += (x[j] - mean) * (x[j] - mean);
      const long double inv = 1.0L / std::sqrt(var / size + eps);
      for (int64_t j = 0; j < size; ++j)
        want[size_t(j)] += dY.data[size_t(r * size + j)] * (x[j] - mean) * inv;
    }
    for (int64_t j = 0; j < size; ++j)
      EXPECT_NEAR(got.data[size_t(j)], double(want[size_t(j)]),
                  1e-12 * (1 + std::abs(double(want[size_t(j)]))))
          << j;
  }
}

TEST(CpuGradients, RMSNormGradsMatchFiniteDifferences) {
  struct Case {
    Ints x;
    int64_t axis;
    Ints scale; // the normalized shape, or a shape broadcast to it
  };
  std::vector<Case> cases = {{{2, 3, 4}, -1, {4}},
                             {{2, 3, 4}, 1, {3, 4}},
                             {{2, 3, 4}, 0, {2, 3, 4}},
                             {{2, 3, 4}, 1, {4}},
                             {{5, 6}, -1, {6}}};
  for (const Case &c : cases) {
    SCOPED_TRACE(ir::shapeStr(c.x) + " axis " + std::to_string(c.axis));
    AttrMap attrs{{"axis", c.axis}, {"epsilon", 1e-3f}};
    Tensor X = randomHost<double>(c.x, 117, -2, 3),
           scale = randomHost<double>(c.scale, 118);
    auto fwd = [&] {
      return forward(OpKind::RMSNormalization, attrs, {X.ref(), scale.ref()});
    };
    Tensor dY = randomHost<double>(c.x, 120);
    Tensor dX = runOp(OpKind::RMSNormalizationGradData, attrs,
                      {dY.ref(), X.ref(), scale.ref()})[0];
    expectGradient(dX.data, X, dY.data, fwd);
    Tensor dScale =
        runOp(OpKind::RMSNormalizationGradParams, attrs, {dY.ref(), X.ref()})[0];
    if (numElements(c.scale) == numElements(dScale.shape))
      expectGradient(dScale.data, scale, dY.data, fwd);
  }
}

TEST(CpuGradients, BatchNormGradsMatchFiniteDifferences) {
  for (Ints shape : {Ints{3, 2, 2, 3}, Ints{4, 3}, Ints{2, 3, 5}})
    for (int64_t training : {0, 1}) {
      SCOPED_TRACE(ir::shapeStr(shape) + " training " +
                   std::to_string(training));
      int64_t c = shape[1];
      AttrMap attrs{{"epsilon", 1e-2f}, {"training_mode", training}};
      Tensor X = randomHost<double>(shape, 21, -1, 4),
             scale = randomHost<double>({c}, 22),
             bias = randomHost<double>({c}, 23),
             mean = randomHost<double>({c}, 24),
             var = randomHost<double>({c}, 25, 0.5, 2);
      auto fwd = [&] {
        return forward(OpKind::BatchNormalization, attrs,
                       {X.ref(), scale.ref(), bias.ref(), mean.ref(),
                        var.ref()});
      };
      Tensor dY = randomHost<double>(shape, 26);
      Tensor dX = runOp(OpKind::BatchNormalizationGradData, attrs,
                        {dY.ref(), X.ref(), scale.ref(), mean.ref(),
                         var.ref()})[0];
      expectGradient(dX.data, X, dY.data, fwd);
      Tensor dScale = runOp(OpKind::BatchNormalizationGradParams, attrs,
                            {dY.ref(), X.ref(), mean.ref(), var.ref()})[0];
      expectGradient(dScale.data, scale, dY.data, fwd);
    }
}

// --- Softmax, LogSoftmax, SoftmaxCrossEntropyLoss -----------------------------

TEST(CpuGradients, SoftmaxGradsMatchFiniteDifferences) {
  for (bool log : {false, true})
    for (int64_t axis : {0, 1, 2, -1}) {
      SCOPED_TRACE(std::string(log ? "LogSoftmax" : "Softmax") + " axis " +
                   std::to_string(axis));
      OpKind op = log ? OpKind::LogSoftmax : OpKind::Softmax;
      OpKind gradOp = log ? OpKind::LogSoftmaxGrad : OpKind::SoftmaxGrad;
      AttrMap attrs{{"axis", axis}};
      Tensor X = randomHost<double>({3, 4, 5}, 27, -3, 3);
      Tensor Y = runOp(op, attrs, {X.ref()})[0];
      Tensor dY = randomHost<double>(X.shape, 28);
      Tensor dX = runOp(gradOp, attrs, {dY.ref(), Y.ref()})[0];
      expectGradient(dX.data, X, dY.data,
                     [&] { return forward(op, attrs, {X.ref()}); });
    }
}

TEST(CpuGradients, SoftmaxCrossEntropyLossGradMatchesFiniteDifferences) {
  struct Case {
    Ints scores;
    std::optional<int64_t> ignore;
  };
  std::vector<Case> cases = {{{5, 4}, std::nullopt},
                             {{5, 4}, 2},
                             {{3, 4, 2, 2}, std::nullopt},
                             {{3, 4, 2, 2}, -100}};
  for (const Case &c : cases)
    for (const char *reduction : {"none", "sum", "mean"})
      for (bool weighted : {false, true}) {
        SCOPED_TRACE(ir::shapeStr(c.scores) + " " + reduction +
                     (weighted ? " weighted" : "") +
                     (c.ignore ? " ignore " + std::to_string(*c.ignore) : ""));
        Ints labelShape = c.scores;
        labelShape.erase(labelShape.begin() + 1);
        int64_t classes = c.scores[1];
        Tensor S = randomHost<double>(c.scores, 29, -2, 2),
               w = randomHost<double>({classes}, 30, 0.2, 2);
        Host<int64_t> labels(labelShape);
        for (size_t i = 0; i < labels.data.size(); ++i)
          labels.data[i] = int64_t(i * 7 % classes);
        if (c.ignore) // two positions ignored
          labels.data[1] = labels.data[3] = *c.ignore;
        AttrMap attrs{{"reduction", reduction}};
        if (c.ignore)
          attrs = with(attrs, "ignore_index", *c.ignore);
        std::vector<TensorRef> ins{S.ref(), labels.ref()};
        if (weighted)
          ins.push_back(w.ref());
        Tensor dL = randomGradient(OpKind::SoftmaxCrossEntropyLoss, attrs, ins,
                                   31);
        std::vector<TensorRef> gradIns{dL.ref(), S.ref(), labels.ref()};
        if (weighted)
          gradIns.push_back(w.ref());
        Tensor dS =
            runOp(OpKind::SoftmaxCrossEntropyLossGrad, attrs, gradIns)[0];
        expectGradient(dS.data, S, dL.data, [&] {
          return forward(OpKind::SoftmaxCrossEntropyLoss, attrs, ins);
        });
      }
}

// --- Dropout, Gather, Slice ---------------------------------------------------

TEST(CpuGradients, DropoutGradMatchesFiniteDifferencesWithTheForwardMask) {
  for (float ratio : {0.3f, 0.0f}) {
    SCOPED_TRACE("ratio " + std::to_string(ratio));
    AttrMap attrs{{"ratio", ratio}, {"training_mode", int64_t(1)}};
    const uint64_t seed = 7;
    Tensor X = randomHost<double>({4, 5, 6}, 32), Y(X.shape);
    Mask mask(X.shape);
    ASSERT_FALSE(bool(run(OpKind::Dropout, attrs, {X.ref()},
                          {Y.ref(), mask.ref()}, seed)));
    Tensor dY = randomHost<double>(X.shape, 33);
    Tensor dX = runOp(OpKind::DropoutGrad, {{"ratio", ratio}},
                      {dY.ref(), mask.ref()})[0];
    expectGradient(dX.data, X, dY.data, [&] {
      return runOp(OpKind::Dropout, attrs, {X.ref()}, 1, seed)[0].data;
    });
  }
}

TEST(CpuGradients, GatherGradMatchesFiniteDifferences) {
  // Repeated and negative indices, i64 and i32, axis 0, 1 and -1.
  Tensor d0 = randomHost<double>({5, 3}, 34);
  Host<int64_t> i0({4}, {0, -1, 2, 0});
  Tensor d1 = randomHost<double>({3, 4, 2}, 35);
  Host<int32_t> i1({2, 3}, {1, -4, 3, 3, 3, 0});
  Tensor d2 = randomHost<double>({4, 5}, 36);
  Host<int64_t> i2({}, {-2});
  struct Case {
    Tensor *data;
    TensorRef indices;
    int64_t axis;
  };
  for (Case c : {Case{&d0, i0.ref(), 0}, Case{&d1, i1.ref(), 1},
                 Case{&d2, i2.ref(), -1}}) {
    SCOPED_TRACE(ir::shapeStr(c.data->shape) + " axis " +
                 std::to_string(c.axis));
    AttrMap attrs{{"axis", c.axis}};
    Tensor dY = randomGradient(OpKind::Gather, attrs,
                               {c.data->ref(), c.indices}, 37);
    Tensor dX = runOp(OpKind::GatherGrad,
                      with(attrs, "shape", c.data->shape),
                      {dY.ref(), c.indices})[0];
    expectGradient(dX.data, *c.data, dY.data, [&] {
      return forward(OpKind::Gather, attrs, {c.data->ref(), c.indices});
    });
  }
}

TEST(CpuGradients, GatherGradLeavesThePaddingRowZero) {
  // PyTorch's embedding(padding_idx=1): rows 0 and 2 sum their dY rows,
  // row 1 (gathered twice, once by a negative index) gets nothing.
  Host<float> dY({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Host<int64_t> ids({4}, {1, 0, -2, 0});
  AttrMap attrs{{"axis", int64_t(0)},
                {"padding_idx", int64_t(1)},
                {"shape", std::vector<int64_t>{3, 2}}};
  Host<float> dX({3, 2});
  ASSERT_FALSE(bool(run(OpKind::GatherGrad, attrs, {dY.ref(), ids.ref()},
                        {dX.ref()})));
  EXPECT_EQ(dX.data, (std::vector<float>{10, 12, 0, 0, 0, 0}));
}

TEST(CpuGradients, GatherElementsGradMatchesFiniteDifferences) {
  // Repeated and negative indices, i64 and i32, indices smaller than the
  // data in a dim other than the axis; axis 0, 1 and -1.
  Tensor d0 = randomHost<double>({3, 4}, 134);
  Host<int64_t> i0({4, 3}, {0, -1, 2, 0, 0, 1, 2, 2, -3, 1, 1, 1});
  Tensor d1 = randomHost<double>({2, 3, 4}, 135);
  Host<int32_t> i1({2, 5, 3}, {1, -3, 2, 2, 2, 0, 0, 0, 0, 1, 2, 1, -1, 1, 0,
                               2, 2, 2, 0, 1, 2, -2, -1, 0, 1, 1, 1, 0, 2, 0});
  Tensor d2 = randomHost<double>({4, 5}, 136);
  Host<int64_t> i2({3, 2}, {4, -5, 0, 0, 3, 3});
  struct Case {
    Tensor *data;
    TensorRef indices;
    int64_t axis;
  };
  for (Case c : {Case{&d0, i0.ref(), 0}, Case{&d1, i1.ref(), 1},
                 Case{&d2, i2.ref(), -1}}) {
    SCOPED_TRACE(ir::shapeStr(c.data->shape) + " axis " +
                 std::to_string(c.axis));
    AttrMap attrs{{"axis", c.axis}};
    Tensor dY = randomGradient(OpKind::GatherElements, attrs,
                               {c.data->ref(), c.indices}, 137);
    Tensor dX = runOp(OpKind::GatherElementsGrad,
                      with(attrs, "shape", c.data->shape),
                      {dY.ref(), c.indices})[0];
    expectGradient(dX.data, *c.data, dY.data, [&] {
      return forward(OpKind::GatherElements, attrs, {c.data->ref(), c.indices});
    });
  }
}

TEST(CpuGradients, ScatterNDGradsMatchFiniteDifferences) {
  // Slices with a repeated tuple; element tuples with i32 indices.
  Tensor d0 = randomHost<double>({4, 3}, 234), u0 = randomHost<double>({4, 3}, 235);
  Host<int64_t> i0({4, 1}, {2, 0, -2, 3});
  Tensor d1 = randomHost<double>({3, 2, 2}, 236), u1 = randomHost<double>({3}, 237);
  Host<int32_t> i1({3, 3}, {0, 1, 1, 2, 0, 0, 0, 1, 1});
  struct Case {
    Tensor *data, *updates;
    TensorRef indices;
  };
  for (Case c : {Case{&d0, &u0, i0.ref()}, Case{&d1, &u1, i1.ref()}}) {
    SCOPED_TRACE(ir::shapeStr(c.data->shape));
    auto fwd = [&] {
      return forward(OpKind::ScatterND, {},
                     {c.data->ref(), c.indices, c.updates->ref()});
    };
    Tensor dY = randomGradient(OpKind::ScatterND, {},
                               {c.data->ref(), c.indices, c.updates->ref()},
                               238);
    Tensor dX = runOp(OpKind::ScatterNDGradData, {}, {dY.ref(), c.indices})[0];
    expectGradient(dX.data, *c.data, dY.data, fwd);
    Tensor dU = runOp(OpKind::ScatterNDGradUpdates,
                      {{"shape", c.updates->shape}}, {dY.ref(), c.indices})[0];
    expectGradient(dU.data, *c.updates, dY.data, fwd);
  }
}

TEST(CpuGradients, SliceGradMatchesFiniteDifferences) {
  struct Case {
    Ints starts, ends, axes, steps;
  };
  std::vector<Case> cases = {
      {{1}, {4}, {0}, {1}},
      {{4, -1}, {0, -100}, {0, 2}, {-2, -1}},
      {{0, 5, 1}, {100, 0, 3}, {-3, -2, -1}, {3, -2, 1}},
      {{2}, {2}, {1}, {1}}, // empty
      {{0}, {6}, {1}, {2}}, // every other row of the last axis, whole
      {{-1, 1}, {-6, 3}, {1, 2}, {-2, 1}}, // rows backwards, a run of columns
  };
  for (const Case &c : cases) {
    SCOPED_TRACE("starts " + ir::shapeStr(c.starts) + " steps " +
                 ir::shapeStr(c.steps));
    AttrMap attrs{{"starts", c.starts},
                  {"ends", c.ends},
                  {"axes", c.axes},
                  {"steps", c.steps}};
    Tensor X = randomHost<double>({5, 6, 4}, 38);
    Tensor dY = randomGradient(OpKind::Slice, attrs, {X.ref()}, 39);
    Tensor dX = runOp(OpKind::SliceGrad, with(attrs, "shape", X.shape),
                      {dY.ref()})[0];
    expectGradient(dX.data, X, dY.data,
                   [&] { return forward(OpKind::Slice, attrs, {X.ref()}); });
  }
}

// GatherGrad and SliceGrad with a sum operand (Ops.def; autodiff's sums of
// a select's or slice's gradient): the result is the sum plus the plain
// gradient, the same bits when the sum has its own buffer and when it is
// the result's (the memory plan's in-place sums), f32 and f64, on the
// threaded paths too. A slice's is the Add of the two, bit for bit; a
// gather with repeated indices adds its rows to the sum one at a time, so
// it is the Add to rounding.
template <typename T> void expectSumOperandIsTheAdd() {
  Host<int64_t> idx({6}, {0, -1, 2, 0, 2, 2});
  struct Case {
    OpKind op;
    AttrMap attrs;
    Ints dyShape, shape;
    bool gather;
  };
  std::vector<Case> cases = {
      {OpKind::GatherGrad,
       {{"axis", int64_t(1)}, {"shape", Ints{4, 5, 70}}},
       {4, 6, 70},
       {4, 5, 70},
       true},
      {OpKind::SliceGrad,
       {{"starts", Ints{1, 0}},
        {"ends", Ints{4, 100}},
        {"axes", Ints{0, 2}},
        {"steps", Ints{1, 3}},
        {"shape", Ints{5, 6, 70}}},
       {3, 6, 24},
       {5, 6, 70},
       false},
      {OpKind::SliceGrad,
       {{"starts", Ints{2}},
        {"ends", Ints{5}},
        {"axes", Ints{1}},
        {"steps", Ints{1}},
        {"shape", Ints{5, 6, 70}}},
       {5, 3, 70},
       {5, 6, 70},
       false},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(std::string(ir::opInfo(c.op).name) + " " +
                 ir::shapeStr(c.dyShape));
    Host<T> dY = randomHost<T>(c.dyShape, 71);
    Host<T> sum = randomHost<T>(c.shape, 72);
    std::vector<TensorRef> plainIns = {dY.ref()};
    if (c.gather)
      plainIns.push_back(idx.ref());
    Host<T> plain = runOp<T>(c.op, c.attrs, plainIns)[0];
    std::vector<TensorRef> ins = plainIns;
    ins.push_back(sum.ref());
    Host<T> fused = runOp<T>(c.op, c.attrs, ins)[0];
    Host<T> inPlace = sum;
    ins.back() = inPlace.ref();
    ASSERT_FALSE(bool(run(c.op, c.attrs, ins, {inPlace.ref()})));
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
    for (size_t i = 0; i < plain.data.size(); ++i) {
      T want = T(sum.data[i] + plain.data[i]);
      if (c.gather)
        ASSERT_NEAR(fused.data[i], want, tol * 4) << "element " << i;
      else
        ASSERT_EQ(fused.data[i], want) << "element " << i;
      ASSERT_EQ(inPlace.data[i], fused.data[i]) << "element " << i
                                                << " in place";
    }
  }
}

TEST(CpuGradients, GatherGradAndSliceGradAddIntoTheirSumOperand) {
  expectSumOperandIsTheAdd<float>();
  expectSumOperandIsTheAdd<double>();
}

// --- Combined ops equal their parts -------------------------------------------

// LayerNorm's and RMSNorm's combined gradients (kept whole by
// split-backward) over 256 rows or more: one pass of 64-row pieces makes
// dX and dscale from each row's statistics computed once; the bits must be
// the parts' (which compute them once each), f32 and f64, with a short last
// piece, vector tails (37 columns) and pieces of more than 64 rows.
TEST(CpuGradients, NormalizationGradsOverManyRowsEqualTheirPartsBitForBit) {
  struct Case {
    OpKind whole, data, params;
  };
  for (Case c : {Case{OpKind::LayerNormalizationGrad,
                      OpKind::LayerNormalizationGradData,
                      OpKind::LayerNormalizationGradParams},
                 Case{OpKind::RMSNormalizationGrad,
                      OpKind::RMSNormalizationGradData,
                      OpKind::RMSNormalizationGradParams}})
    for (Ints shape : {Ints{300, 37}, Ints{8, 128, 256}, Ints{33000, 3}}) {
      SCOPED_TRACE(std::string(ir::opInfo(c.whole).name) + " over " +
                   ir::shapeStr(shape));
      AttrMap attrs{{"axis", int64_t(-1)}, {"epsilon", 1e-5f}};
      auto check = [&](auto tag) {
        using T = decltype(tag);
        Host<T> X = randomHost<T>(shape, 60, -2, 3),
                dY = randomHost<T>(shape, 61),
                scale = randomHost<T>({shape.back()}, 62);
        auto both = runOp<T>(c.whole, attrs, {dY.ref(), X.ref(), scale.ref()},
                             2);
        auto dX = runOp<T>(c.data, attrs, {dY.ref(), X.ref(), scale.ref()});
        auto dS = runOp<T>(c.params, attrs, {dY.ref(), X.ref()});
        for (auto [a, b] : {std::pair{&both[0], &dX[0]},
                            std::pair{&both[1], &dS[0]}}) {
          ASSERT_EQ(a->data.size(), b->data.size());
          EXPECT_EQ(std::memcmp(a->data.data(), b->data.data(),
                                a->data.size() * sizeof(T)),
                    0);
        }
      };
      check(float());
      check(double());
    }
}

TEST(CpuGradients, CombinedOpsEqualTheirPartsBitForBit) {
  {
    SCOPED_TRACE("MatMulGrad");
    for (auto [a, b] : {std::pair<Ints, Ints>{{2, 1, 3, 4}, {5, 4, 2}},
                        std::pair<Ints, Ints>{{4, 64, 96}, {96, 80}}}) {
      Tensor A = randomHost<double>(a, 40), B = randomHost<double>(b, 41);
      Tensor dY = randomGradient(OpKind::MatMul, {}, {A.ref(), B.ref()}, 42);
      auto both = runOp(OpKind::MatMulGrad, {}, {dY.ref(), A.ref(), B.ref()}, 2);
      expectBitIdentical(both[0].data,
                         runOp(OpKind::MatMulGradA, {{"shape", a}},
                               {dY.ref(), B.ref()})[0].data);
      expectBitIdentical(both[1].data,
                         runOp(OpKind::MatMulGradB, {{"shape", b}},
                               {A.ref(), dY.ref()})[0].data);
    }
  }
  {
    SCOPED_TRACE("GemmGrad");
    AttrMap attrs{{"alpha", 0.5f}, {"transA", int64_t(1)}, {"transB", int64_t(1)}};
    Tensor A = randomHost<double>({5, 3}, 43), B = randomHost<double>({4, 5}, 44),
           dY = randomHost<double>({3, 4}, 45);
    auto both = runOp(OpKind::GemmGrad, attrs, {dY.ref(), A.ref(), B.ref()}, 2);
    expectBitIdentical(both[0].data,
                       runOp(OpKind::GemmGradA, with(attrs, "shape", A.shape),
                             {dY.ref(), B.ref()})[0].data);
    expectBitIdentical(both[1].data,
                       runOp(OpKind::GemmGradB, with(attrs, "shape", B.shape),
                             {A.ref(), dY.ref()})[0].data);
  }
  {
    SCOPED_TRACE("ConvGrad");
    for (const ConvCase &c :
         {convCases()[3],
          ConvCase{{4, 16, 20, 20}, {32, 16, 3, 3}, {1, 1}, {1, 1, 1, 1},
                   {1, 1}, 1}}) {
      Tensor X = randomHost<double>(c.x, 46), W = randomHost<double>(c.w, 47);
      Tensor dY = randomGradient(OpKind::Conv, c.attrs(), {X.ref(), W.ref()}, 48);
      auto both =
          runOp(OpKind::ConvGrad, c.attrs(), {dY.ref(), X.ref(), W.ref()}, 2);
      expectBitIdentical(both[0].data,
                         runOp(OpKind::ConvGradData, with(c.attrs(), "shape", c.x),
                               {dY.ref(), W.ref()})[0].data);
      expectBitIdentical(both[1].data,
                         runOp(OpKind::ConvGradFilter,
                               with(c.attrs(), "shape", c.w),
                               {X.ref(), dY.ref()})[0].data);
    }
  }
  {
    SCOPED_TRACE("LayerNormalizationGrad");
    AttrMap attrs{{"axis", int64_t(1)}, {"epsilon", 1e-4f}};
    Tensor X = randomHost<double>({16, 8, 32}, 49),
           scale = randomHost<double>({8, 32}, 50),
           dY = randomHost<double>(X.shape, 51);
    auto both = runOp(OpKind::LayerNormalizationGrad, attrs,
                      {dY.ref(), X.ref(), scale.ref()}, 2);
    expectBitIdentical(both[0].data,
                       runOp(OpKind::LayerNormalizationGradData, attrs,
                             {dY.ref(), X.ref(), scale.ref()})[0].data);
    expectBitIdentical(both[1].data,
                       runOp(OpKind::LayerNormalizationGradParams, attrs,
                             {dY.ref(), X.ref()})[0].data);
  }
  {
    SCOPED_TRACE("RMSNormalizationGrad");
    AttrMap attrs{{"axis", int64_t(1)}, {"epsilon", 1e-4f}};
    Tensor X = randomHost<double>({16, 8, 32}, 149),
           scale = randomHost<double>({8, 32}, 150),
           dY = randomHost<double>(X.shape, 151);
    auto both = runOp(OpKind::RMSNormalizationGrad, attrs,
                      {dY.ref(), X.ref(), scale.ref()}, 2);
    expectBitIdentical(both[0].data,
                       runOp(OpKind::RMSNormalizationGradData, attrs,
                             {dY.ref(), X.ref(), scale.ref()})[0].data);
    expectBitIdentical(both[1].data,
                       runOp(OpKind::RMSNormalizationGradParams, attrs,
                             {dY.ref(), X.ref()})[0].data);
    // f32 too (the combined kernel is derived for every type).
    Host<float> Xf({4, 40}), Sf({40}), dYf({4, 40});
    for (size_t i = 0; i < Xf.data.size(); ++i) {
      Xf.data[i] = float(X.data[i]);
      dYf.data[i] = float(dY.data[i]);
    }
    for (size_t i = 0; i < Sf.data.size(); ++i)
      Sf.data[i] = float(scale.data[i]);
    AttrMap last{{"axis", int64_t(-1)}};
    auto bothF = runOp<float>(OpKind::RMSNormalizationGrad, last,
                              {dYf.ref(), Xf.ref(), Sf.ref()}, 2);
    auto sameBits = [](const std::vector<float> &a,
                       const std::vector<float> &b) {
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    };
    sameBits(bothF[0].data,
             runOp<float>(OpKind::RMSNormalizationGradData, last,
                          {dYf.ref(), Xf.ref(), Sf.ref()})[0].data);
    sameBits(bothF[1].data,
             runOp<float>(OpKind::RMSNormalizationGradParams, last,
                          {dYf.ref(), Xf.ref()})[0].data);
  }
  for (int64_t training : {0, 1}) {
    SCOPED_TRACE("BatchNormalizationGrad training " + std::to_string(training));
    AttrMap attrs{{"training_mode", training}};
    Tensor X = randomHost<double>({4, 6, 5, 5}, 52),
           scale = randomHost<double>({6}, 53), mean = randomHost<double>({6}, 54),
           var = randomHost<double>({6}, 55, 0.5, 2),
           dY = randomHost<double>(X.shape, 56);
    auto both = runOp(OpKind::BatchNormalizationGrad, attrs,
                      {dY.ref(), X.ref(), scale.ref(), mean.ref(), var.ref()}, 2);
    expectBitIdentical(both[0].data,
                       runOp(OpKind::BatchNormalizationGradData, attrs,
                             {dY.ref(), X.ref(), scale.ref(), mean.ref(),
                              var.ref()})[0].data);
    expectBitIdentical(both[1].data,
                       runOp(OpKind::BatchNormalizationGradParams, attrs,
                             {dY.ref(), X.ref(), mean.ref(), var.ref()})[0].data);
    // BatchNorm's combined op has a kernel of its own (one pass of sums;
    // split-backward keeps it whole): f32 too.
    auto narrow = [](const Tensor &t) {
      Host<float> f(t.shape);
      for (size_t i = 0; i < t.data.size(); ++i)
        f.data[i] = float(t.data[i]);
      return f;
    };
    Host<float> Xf = narrow(X), Sf = narrow(scale), Mf = narrow(mean),
                Vf = narrow(var), dYf = narrow(dY);
    auto bothF = runOp<float>(
        OpKind::BatchNormalizationGrad, attrs,
        {dYf.ref(), Xf.ref(), Sf.ref(), Mf.ref(), Vf.ref()}, 2);
    auto dXf = runOp<float>(OpKind::BatchNormalizationGradData, attrs,
                            {dYf.ref(), Xf.ref(), Sf.ref(), Mf.ref(),
                             Vf.ref()})[0];
    auto dSf = runOp<float>(OpKind::BatchNormalizationGradParams, attrs,
                            {dYf.ref(), Xf.ref(), Mf.ref(), Vf.ref()})[0];
    EXPECT_EQ(std::memcmp(bothF[0].data.data(), dXf.data.data(),
                          dXf.data.size() * sizeof(float)),
              0);
    EXPECT_EQ(std::memcmp(bothF[1].data.data(), dSf.data.data(),
                          dSf.data.size() * sizeof(float)),
              0);
  }
}

// --- Determinism --------------------------------------------------------------

// The first result of `op` computed with the backend's pool at 1 thread and
// at 2 (the pool is shared by every CPU backend in the process; it is left
// at 2, as the other tests expect).
std::pair<Values, Values> onOneAndTwoThreads(OpKind op, const AttrMap &attrs,
                                             std::vector<TensorRef> ins) {
  Values one, two;
  testsupport::cpu(); // created first, so it does not reset the pool below
  {
    auto backend = runtime::createCpuBackend(1);
    one = forward(op, attrs, ins);
  }
  {
    auto backend = runtime::createCpuBackend(2);
    two = forward(op, attrs, ins);
  }
  return {one, two};
}

TEST(CpuGradients, ReductionsGiveTheSameBitsOnOneAndTwoThreads) {
  Tensor big = randomHost<double>({4000, 64}, 57);
  auto [s1, s2] =
      onOneAndTwoThreads(OpKind::SumTo, {{"shape", Ints{64}}}, {big.ref()});
  expectBitIdentical(s1, s2);

  Host<int64_t> idx({3000});
  for (size_t i = 0; i < idx.data.size(); ++i)
    idx.data[i] = int64_t(i * 37 % 50) - 25; // repeats, negative ones too
  Tensor dY = randomHost<double>({3000, 300}, 58);
  auto [g1, g2] = onOneAndTwoThreads(
      OpKind::GatherGrad, {{"shape", Ints{50, 300}}}, {dY.ref(), idx.ref()});
  expectBitIdentical(g1, g2);

  Tensor x = randomHost<double>({512, 96}, 59), dy = randomHost<double>(x.shape, 60);
  auto [l1, l2] = onOneAndTwoThreads(OpKind::LayerNormalizationGradParams,
                                     {}, {dy.ref(), x.ref()});
  expectBitIdentical(l1, l2);

  auto [r1, r2] = onOneAndTwoThreads(OpKind::RMSNormalizationGradParams, {},
                                     {dy.ref(), x.ref()});
  expectBitIdentical(r1, r2);
  Tensor rs = randomHost<double>({96}, 157);
  auto [q1, q2] = onOneAndTwoThreads(OpKind::RMSNormalizationGradData, {},
                                     {dy.ref(), x.ref(), rs.ref()});
  expectBitIdentical(q1, q2);

  // GatherElementsGrad along axis 0 with many repeats per column.
  Host<int64_t> eidx({600, 200});
  for (size_t i = 0; i < eidx.data.size(); ++i)
    eidx.data[i] = int64_t(i * 31 % 17) - 8;
  Tensor edY = randomHost<double>({600, 200}, 158);
  auto [e1, e2] = onOneAndTwoThreads(OpKind::GatherElementsGrad,
                                     {{"shape", Ints{17, 200}}},
                                     {edY.ref(), eidx.ref()});
  expectBitIdentical(e1, e2);

  Tensor X = randomHost<double>({4, 16, 20, 20}, 61),
         dYc = randomHost<double>({4, 32, 20, 20}, 62);
  AttrMap conv{{"strides", Ints{1, 1}}, {"pads", Ints{1, 1, 1, 1}},
               {"dilations", Ints{1, 1}}, {"shape", Ints{32, 16, 3, 3}}};
  auto [c1, c2] =
      onOneAndTwoThreads(OpKind::ConvGradFilter, conv, {X.ref(), dYc.ref()});
  expectBitIdentical(c1, c2);
}

// --- f32 ----------------------------------------------------------------------

TEST(CpuGradients, F32AgreesWithF64) {
  Tensor x = randomHost<double>({4, 6}, 63, -2, 2),
         dy = randomHost<double>({4, 6}, 64);
  expectF32AgreesWithF64(OpKind::UnaryGrad, {{"fn", "sigmoid"}}, {&dy, &x});
  expectF32AgreesWithF64(OpKind::SumTo, {{"shape", Ints{6}}}, {&dy});
  expectF32AgreesWithF64(OpKind::SoftmaxGrad, {}, {&dy, &x});
  expectF32AgreesWithF64(OpKind::LogSoftmaxGrad, {{"axis", int64_t(0)}},
                         {&dy, &x});
  expectF32AgreesWithF64(OpKind::SliceGrad,
                         {{"starts", Ints{4}}, {"ends", Ints{0}},
                          {"axes", Ints{0}}, {"steps", Ints{-1}},
                          {"shape", Ints{5, 6}}},
                         {&dy});

  Tensor a = randomHost<double>({2, 4, 5}, 65), b = randomHost<double>({5, 6}, 66),
         mdy = randomHost<double>({2, 4, 6}, 82);
  expectF32AgreesWithF64(OpKind::MatMulGrad, {}, {&mdy, &a, &b}, {}, 2);
  Tensor ga = randomHost<double>({5, 4}, 67), gb = randomHost<double>({5, 6}, 68);
  expectF32AgreesWithF64(OpKind::GemmGrad, {{"transA", int64_t(1)}},
                         {&dy, &ga, &gb}, {}, 2);

  const ConvCase &c = convCases()[3];
  Tensor cx = randomHost<double>(c.x, 69), cw = randomHost<double>(c.w, 70),
         cdy = randomHost<double>({2, 6, 5, 5}, 71);
  expectF32AgreesWithF64(OpKind::ConvGrad, c.attrs(), {&cdy, &cx, &cw}, {}, 2);

  Tensor nx = randomHost<double>({3, 4, 5}, 72), ndy = randomHost<double>({3, 4, 5}, 73),
         scale = randomHost<double>({4}, 74), mean = randomHost<double>({4}, 75),
         var = randomHost<double>({4}, 76, 0.5, 2), lscale = randomHost<double>({5}, 77);
  expectF32AgreesWithF64(OpKind::LayerNormalizationGrad, {}, {&ndy, &nx, &lscale},
                         {}, 2);
  expectF32AgreesWithF64(OpKind::BatchNormalizationGrad,
                         {{"training_mode", int64_t(1)}},
                         {&ndy, &nx, &scale, &mean, &var}, {}, 2);

  AttrMap pool{{"kernel_shape", Ints{2, 2}}, {"strides", Ints{1, 1}},
               {"pads", Ints{0, 0, 1, 1}},   {"dilations", Ints{1, 1}}};
  Tensor px = randomHost<double>({1, 3, 4, 5}, 78),
         pdy = randomHost<double>({1, 3, 4, 5}, 79);
  expectF32AgreesWithF64(OpKind::MaxPoolGrad, pool, {&pdy, &px});
  expectF32AgreesWithF64(OpKind::AveragePoolGrad,
                         {{"kernel_shape", Ints{2, 2}}, {"strides", Ints{1, 1}},
                          {"pads", Ints{0, 0, 1, 1}}, {"shape", px.shape}},
                         {&pdy});

  Tensor scalar({}, {0.7}), s = randomHost<double>({4, 6}, 80);
  Host<int64_t> labels({4}, {1, 0, 5, 2});
  expectF32AgreesWithF64(OpKind::SoftmaxCrossEntropyLossGrad, {}, {&scalar, &s},
                         {{2, labels.ref()}});
  Mask mask({4, 6});
  for (size_t i = 0; i < mask.data.size(); ++i)
    mask.data[i] = i % 3 != 0;
  expectF32AgreesWithF64(OpKind::DropoutGrad, {}, {&dy}, {{1, mask.ref()}});
  Host<int64_t> idx({3}, {1, -1, 1});
  Tensor gdy = randomHost<double>({3, 6}, 81);
  expectF32AgreesWithF64(OpKind::GatherGrad, {{"shape", Ints{4, 6}}}, {&gdy},
                         {{1, idx.ref()}});
}

// --- Errors -------------------------------------------------------------------

TEST(CpuGradients, BadOperandsAreKernelErrors) {
  auto expectError = [](OpKind op, const AttrMap &attrs,
                        std::vector<TensorRef> ins, std::vector<TensorRef> outs,
                        const std::string &text) {
    llvm::Error e = run(op, attrs, ins, outs);
    ASSERT_TRUE(bool(e)) << ir::opInfo(op).name;
    std::string msg = errorText(std::move(e));
    EXPECT_NE(msg.find(ir::opInfo(op).name), std::string::npos) << msg;
    EXPECT_NE(msg.find(text), std::string::npos) << msg;
  };
  Tensor dY({2, 3}), out23({2, 3}), out3({3}), b1({3});
  Host<int64_t> idx({2}, {0, 3});
  expectError(OpKind::GatherGrad, {{"shape", Ints{3, 3}}}, {dY.ref(), idx.ref()},
              {Tensor({3, 3}).ref()}, "index 3 (at position 1) is out of range");
  expectError(OpKind::MatMulGradA, {{"shape", Ints{2, 3}}}, {dY.ref(), b1.ref()},
              {out23.ref()}, "1-D MatMul operands are not supported");
  expectError(OpKind::UnaryGrad, {{"fn", "cbrt"}}, {dY.ref(), out23.ref()},
              {out23.ref()}, "unknown fn 'cbrt'");
  Tensor dL({}, {1});
  Host<int64_t> labels({2}, {0, 7});
  expectError(OpKind::SoftmaxCrossEntropyLossGrad, {},
              {dL.ref(), dY.ref(), labels.ref()}, {out23.ref()},
              "label 7 at position 1 is out of range");
  Tensor lr({}, {0.1});
  expectError(OpKind::SGD, {{"momentum", 0.9f}},
              {out3.ref(), out3.ref(), lr.ref()}, {out3.ref()},
              "needs a velocity operand");
  Mask shortMask({3});
  expectError(OpKind::DropoutGrad, {}, {dY.ref(), shortMask.ref()},
              {out23.ref()}, "the mask must be bool and shaped like");
  expectError(OpKind::SliceGrad,
              {{"starts", Ints{0}}, {"ends", Ints{1}}, {"axes", Ints{0}},
               {"steps", Ints{1}}, {"shape", Ints{2, 3}}},
              {dY.ref()}, {out23.ref()}, "does not match the slice");
}

// --- Optimizers ---------------------------------------------------------------

TEST(CpuOptimizers, SgdFollowsPyTorchOverThreeSteps) {
  // Float64 parameters: torch.optim.SGD with the hyperparameters as written
  // (the attributes hold them in float32).
  struct Case {
    double momentum;
    int64_t nesterov;
    double decay, scale;
  };
  for (Case c : {Case{0, 0, 0, 1}, Case{0, 0, 0.1, 0.5}, Case{0.9, 0, 0, 1},
                 Case{0.9, 1, 0.01, 0.25}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " nesterov " +
                 std::to_string(c.nesterov) + " decay " +
                 std::to_string(c.decay));
    AttrMap attrs{{"momentum", float(c.momentum)},
                  {"nesterov", c.nesterov},
                  {"weight_decay", float(c.decay)},
                  {"grad_scale", float(c.scale)}};
    bool velocity = c.momentum != 0;
    Tensor p = randomHost<double>({10}, 82), v({10}), lr({}, {0.1});
    Values refP = p.data, buf(10);
    for (int step = 0; step < 3; ++step) {
      Tensor g = randomHost<double>({10}, 83 + step);
      std::vector<TensorRef> ins{p.ref(), g.ref(), lr.ref()};
      if (velocity)
        ins.push_back(v.ref());
      auto out = runOp(OpKind::SGD, attrs, ins, velocity ? 2 : 1);
      p = out[0];
      if (velocity)
        v = out[1];
      // torch.optim.SGD (dampening 0), with the gradient scaled first.
      for (size_t i = 0; i < 10; ++i) {
        double d = g.data[i] * double(c.scale) + double(c.decay) * refP[i];
        if (velocity) {
          double mom = c.momentum;
          buf[i] = step == 0 ? d : mom * buf[i] + d;
          d = c.nesterov ? d + mom * buf[i] : buf[i];
        }
        refP[i] -= 0.1 * d;
      }
      expectClose(p.data, refP, 1e-14);
      if (velocity)
        expectClose(v.data, buf, 1e-14);
    }
  }
}

// f32 SGD runs eight elements at a time in vector lanes where the CPU has
// AVX2: the same bits as the per-element formula in double, rounded once,
// for every element (the lanes and the tail), in place (the executor
// writes the new parameter into its own bytes) and not.
TEST(CpuOptimizers, F32SgdLanesGiveTheFormulasBitsInPlaceOrNot) {
  auto backend = runtime::createCpuBackend(2);
  const int64_t n = 100003; // several blocks of the pool, an odd tail
  std::vector<float> p0(n), g(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = float(std::sin(0.001 * double(i)) * 3);
    g[i] = float(std::cos(0.0007 * double(i) + 1));
    v0[i] = float(std::sin(0.0003 * double(i) + 2));
  }
  float lr = 0.0375f;
  for (bool momentum : {false, true})
    for (bool inPlace : {false, true}) {
      SCOPED_TRACE(std::string(momentum ? "momentum" : "plain") +
                   (inPlace ? ", in place" : ""));
      AttrMap attrs{{"momentum", momentum ? 0.9f : 0.0f},
                    {"nesterov", int64_t(momentum)},
                    {"weight_decay", 0.01f},
                    {"grad_scale", 0.25f}};
      std::vector<float> p = p0, v = v0, pNew(n), vNew(n);
      std::vector<int64_t> shape{n}, scalar{};
      std::vector<TensorRef> ins{{ir::DType::F32, shape, p.data()},
                                 {ir::DType::F32, shape, g.data()},
                                 {ir::DType::F32, scalar, &lr}};
      float *pOut = inPlace ? p.data() : pNew.data();
      float *vOut = inPlace ? v.data() : vNew.data();
      std::vector<TensorRef> outs{{ir::DType::F32, shape, pOut}};
      if (momentum) {
        ins.push_back({ir::DType::F32, shape, v.data()});
        outs.push_back({ir::DType::F32, shape, vOut});
      }
      runtime::KernelCall call{OpKind::SGD, attrs, ins, outs, 0};
      ASSERT_FALSE(bool(backend->run(call)));
      double mom = double(0.9f), decay = double(0.01f), scale = 0.25;
      for (int64_t i = 0; i < n; ++i) {
        double param = p0[i], d = g[i] * scale + decay * param;
        if (momentum) {
          double b = mom * v0[i] + d;
          ASSERT_EQ(vOut[i], float(b)) << i;
          d = d + mom * b;
        }
        ASSERT_EQ(pOut[i], float(param - double(lr) * d)) << i;
      }
    }
}

TEST(CpuOptimizers, AdamWFollowsPyTorchOverThreeSteps) {
  for (AttrMap attrs : {AttrMap{},
                        AttrMap{{"beta1", 0.8f}, {"beta2", 0.95f},
                                {"epsilon", 1e-6f}, {"weight_decay", 0.1f},
                                {"grad_scale", 0.5f}}}) {
    // Float64 parameters: the decimals the attributes were written as.
    auto get = [&](const char *name) {
      return ir::decimalWidened(
          ir::attrOrDefault(ir::opInfo(OpKind::AdamW), attrs, name).getFloat());
    };
    double beta1 = get("beta1"), beta2 = get("beta2"), eps = get("epsilon"),
           decay = get("weight_decay"), scale = get("grad_scale"), lr = 0.01;
    Tensor p = randomHost<double>({10}, 86), m({10}), v({10}), lrT({}, {lr});
    Values refP = p.data, refM(10), refV(10);
    for (int64_t step = 0; step < 3; ++step) {
      Tensor g = randomHost<double>({10}, 87 + step);
      Host<int64_t> stepT({}, {step});
      auto out = runOp(OpKind::AdamW, attrs,
                       {p.ref(), g.ref(), lrT.ref(), stepT.ref(), m.ref(),
                        v.ref()},
                       3);
      p = out[0];
      m = out[1];
      v = out[2];
      // torch.optim.AdamW (single-tensor path), with the gradient scaled.
      double t = double(step + 1);
      double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
      for (size_t i = 0; i < 10; ++i) {
        double gi = g.data[i] * scale;
        refP[i] *= 1 - lr * decay;
        refM[i] += (gi - refM[i]) * (1 - beta1);
        refV[i] = refV[i] * beta2 + (1 - beta2) * gi * gi;
        double denom = std::sqrt(refV[i]) / std::sqrt(bc2) + eps;
        refP[i] -= lr / bc1 * refM[i] / denom;
      }
      expectClose(p.data, refP, 1e-12);
      expectClose(m.data, refM, 1e-12);
      expectClose(v.data, refV, 1e-12);
    }
  }
}

TEST(CpuOptimizers, F32AgreesWithF64) {
  Tensor p = randomHost<double>({7}, 90), g = randomHost<double>({7}, 91),
         v = randomHost<double>({7}, 92), m = randomHost<double>({7}, 93),
         sq = randomHost<double>({7}, 94, 0, 1), lr({}, {0.05});
  Host<int64_t> step({}, {4});
  expectF32AgreesWithF64(OpKind::SGD,
                         {{"momentum", 0.9f}, {"nesterov", int64_t(1)}},
                         {&p, &g, &lr, &v}, {}, 2);
  expectF32AgreesWithF64(OpKind::AdamW, {}, {&p, &g, &lr, &m, &sq},
                         {{3, step.ref()}}, 3);
}

} // namespace

} // namespace unit_cpu_gradients
