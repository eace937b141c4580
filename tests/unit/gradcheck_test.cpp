// Finite-difference checks of every gradient rule, end to end: a small f64
// graph around one forward op, loss = sum(y * R) for a fixed random R, the
// autodiff pass (and split-backward), the CPU backend for both the gradients
// and the central differences of the forward graph.
#include "interp/Interpreter.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "passes/Pass.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

namespace unit_gradcheck {

using namespace cleave;
using namespace cleave::ir;

namespace {

runtime::Backend &backend() {
  static auto b = runtime::createCpuBackend(2);
  return *b;
}

// Builds forward graphs with f64 parameters of random values.
class Builder {
public:
  explicit Builder(Graph &g) : g_(g), rng_(1234) {}

  Value *param(const std::string &name, Shape shape, double lo = -1,
               double hi = 1) {
    return g_.addParam(name, random(DType::F64, std::move(shape), lo, hi));
  }
  Value *constant(const std::string &name, Shape shape, double lo = -1,
                  double hi = 1) {
    return g_.addConst(name, random(DType::F64, std::move(shape), lo, hi));
  }
  Value *ints(const std::string &name, Shape shape,
              std::vector<int64_t> values) {
    return g_.addConst(name,
                       TensorData::fromInts(DType::I64, std::move(shape), values));
  }
  Value *bools(const std::string &name, Shape shape) {
    TensorType t(DType::Bool, shape);
    std::vector<int64_t> v(t.numElements());
    for (auto &x : v)
      x = rng_() % 2;
    return g_.addConst(name, TensorData::fromInts(DType::Bool, shape, v));
  }
  std::vector<Value *> opN(OpKind k, std::vector<Value *> operands,
                           AttrMap attrs, unsigned numResults) {
    std::vector<TensorType> in;
    for (Value *v : operands)
      in.push_back(v->type());
    auto types = inferResultTypes(k, in, attrs, numResults);
    if (!types) {
      ADD_FAILURE() << llvm::toString(types.takeError());
      return {};
    }
    Op *op = g_.appendOp(k, operands, *types, {}, std::move(attrs), "test");
    return {op->results().begin(), op->results().end()};
  }
  Value *op(OpKind k, std::vector<Value *> operands, AttrMap attrs = {}) {
    auto r = opN(k, std::move(operands), std::move(attrs), 1);
    return r.empty() ? nullptr : r[0];
  }
  // loss = sum(y * R), R fixed and random, so every element of y matters.
  void lossOf(Value *y) {
    Value *r = constant("loss.weights", y->type().shape);
    Value *p = op(OpKind::Mul, {y, r});
    Value *l = op(OpKind::ReduceSum, {p},
                  {{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t(0)}});
    g_.setOutputs({l});
  }

private:
  std::shared_ptr<TensorData> random(DType t, Shape shape, double lo,
                                     double hi) {
    TensorType type(t, shape);
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(type.numElements());
    for (double &x : v)
      x = u(rng_);
    return TensorData::fromDoubles(t, std::move(shape), v);
  }
  Graph &g_;
  std::mt19937_64 rng_;
};

using BuildFn = std::function<void(Builder &)>;

std::unique_ptr<Graph> build(const BuildFn &f) {
  auto g = std::make_unique<Graph>();
  Builder b(*g);
  f(b);
  return g;
}

double runLoss(const Graph &g) {
  auto in = interp::Interpreter::create(g, backend());
  if (!in) {
    ADD_FAILURE() << llvm::toString(in.takeError());
    return 0;
  }
  auto out = (*in)->run({});
  if (!out) {
    ADD_FAILURE() << llvm::toString(out.takeError());
    return 0;
  }
  return (*out)[0]->getDouble(0);
}

// Compares autodiff's gradients with central differences for every
// parameter element; also runs split-backward and requires the same bits.
void gradcheck(const BuildFn &f, double tol = 1e-6) {
  auto g = build(f);
  ASSERT_FALSE(bool(verifyGraph(*g))) << printGraph(*g);
  passes::PipelineOptions opts;
  if (auto e = passes::runPipeline(*g, {"autodiff"}, opts))
    FAIL() << llvm::toString(std::move(e));
  auto in = interp::Interpreter::create(*g, backend());
  ASSERT_TRUE(bool(in)) << llvm::toString(in.takeError());
  auto grads = (*in)->run({});
  ASSERT_TRUE(bool(grads)) << llvm::toString(grads.takeError());

  auto split = build(f);
  if (auto e = passes::runPipeline(
          *split, {"autodiff", "split-backward", "verify-2bp"}, opts))
    FAIL() << llvm::toString(std::move(e));
  auto in2 = interp::Interpreter::create(*split, backend());
  ASSERT_TRUE(bool(in2)) << llvm::toString(in2.takeError());
  auto grads2 = (*in2)->run({});
  ASSERT_TRUE(bool(grads2)) << llvm::toString(grads2.takeError());
  ASSERT_EQ(grads->size(), grads2->size());
  for (size_t i = 0; i < grads->size(); ++i)
    EXPECT_EQ((*grads)[i]->bytes(), (*grads2)[i]->bytes())
        << "split-backward changed output " << i;

  auto fwd = build(f);
  std::vector<Value *> params;
  for (Value *v : fwd->declared())
    if (v->kind() == ValueKind::Param)
      params.push_back(v);
  ASSERT_EQ(grads->size(), params.size() + 1);
  const double h = 1e-6;
  for (size_t p = 0; p < params.size(); ++p) {
    TensorData &d = *params[p]->data();
    double *x = reinterpret_cast<double *>(d.mutableBytes());
    const TensorData &got = *(*grads)[p + 1];
    for (int64_t i = 0; i < d.type().numElements(); ++i) {
      double keep = x[i];
      x[i] = keep + h;
      double up = runLoss(*fwd);
      x[i] = keep - h;
      double down = runLoss(*fwd);
      x[i] = keep;
      double fd = (up - down) / (2 * h);
      double an = got.getDouble(i);
      EXPECT_NEAR(an, fd, tol * std::max(1.0, std::abs(fd)))
          << "d loss / d " << params[p]->name() << "[" << i << "]";
    }
  }
}

AttrMap axes(std::vector<int64_t> a, int64_t keep) {
  return {{"axes", a}, {"keepdims", keep}};
}

TEST(Gradcheck, Unary) {
  struct U {
    OpKind k;
    double lo, hi;
    AttrMap attrs;
  };
  std::vector<U> cases = {
      {OpKind::Abs, -1, 1, {}},        {OpKind::Erf, -1, 1, {}},
      {OpKind::Exp, -1, 1, {}},        {OpKind::Log, 0.5, 2, {}},
      {OpKind::Reciprocal, 0.5, 2, {}}, {OpKind::Relu, -1, 1, {}},
      {OpKind::Sigmoid, -2, 2, {}},    {OpKind::Sqrt, 0.5, 2, {}},
      {OpKind::Silu, -4, 4, {}},
      {OpKind::Tanh, -2, 2, {}},       {OpKind::Neg, -1, 1, {}},
      {OpKind::Identity, -1, 1, {}},
      {OpKind::Sin, -2, 2, {}},        {OpKind::Cos, -2, 2, {}},
      {OpKind::Tan, -1, 1, {}},        {OpKind::Asin, -0.8, 0.8, {}},
      {OpKind::Acos, -0.8, 0.8, {}},   {OpKind::Atan, -2, 2, {}},
      {OpKind::Sinh, -2, 2, {}},       {OpKind::Cosh, -2, 2, {}},
      {OpKind::Asinh, -2, 2, {}},      {OpKind::Acosh, 1.2, 3, {}},
      {OpKind::Atanh, -0.8, 0.8, {}},
      {OpKind::Gelu, -2, 2, {}},
      {OpKind::Gelu, -2, 2, {{"approximate", std::string("tanh")}}},
      {OpKind::LeakyRelu, -1, 1, {{"alpha", 0.2f}}},
      {OpKind::Clip, -1, 1, {{"min", -0.5f}, {"max", 0.4f}}},
      {OpKind::HardSwish, -2.9, 2.9, {}},
      {OpKind::HardSigmoid, -2.9, 2.9, {{"alpha", 1.0f / 6.0f}, {"beta", 0.5f}}},
      {OpKind::HardSigmoid, -1, 1, {{"alpha", 0.4f}, {"beta", 0.3f}}},
  };
  for (const U &u : cases) {
    SCOPED_TRACE(std::string(opInfo(u.k).name));
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {3, 4}, u.lo, u.hi);
      b.lossOf(b.op(u.k, {x}, u.attrs));
    });
  }
}

TEST(Gradcheck, Trilu) {
  for (int64_t upper : {0, 1})
    for (int64_t k : {-1, 0, 2}) {
      SCOPED_TRACE("upper " + std::to_string(upper) + " k " + std::to_string(k));
      gradcheck([&](Builder &b) {
        Value *x = b.param("x", {2, 3, 4});
        b.lossOf(b.op(OpKind::Trilu, {x}, {{"upper", upper}, {"k", k}}));
      });
    }
}

TEST(Gradcheck, BroadcastingBinary) {
  for (OpKind k : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div}) {
    SCOPED_TRACE(std::string(opInfo(k).name));
    gradcheck([&](Builder &b) {
      Value *x = b.param("a", {2, 3, 4});
      Value *y = b.param("b", {3, 1}, 0.5, 2);
      b.lossOf(b.op(k, {x, y}));
    });
    gradcheck([&](Builder &b) { // the other operand broadcasts, scalar too
      Value *x = b.param("a", {}, 0.5, 2);
      Value *y = b.param("b", {2, 3}, 0.5, 2);
      b.lossOf(b.op(k, {y, x}));
    });
  }
}

TEST(Gradcheck, Pow) {
  gradcheck([](Builder &b) {
    Value *x = b.param("a", {2, 3}, 0.5, 2);
    Value *y = b.param("b", {3}, 0.5, 3);
    b.lossOf(b.op(OpKind::Pow, {x, y}));
  });
}

TEST(Gradcheck, MaxMinVariadic) {
  for (OpKind k : {OpKind::Max, OpKind::Min})
    gradcheck([&](Builder &b) {
      Value *x = b.param("a", {2, 3});
      Value *y = b.param("b", {3});
      Value *z = b.param("c", {2, 1});
      b.lossOf(b.op(k, {x, y, z}));
    });
}

TEST(Gradcheck, Where) {
  gradcheck([](Builder &b) {
    Value *c = b.bools("cond", {2, 3});
    Value *x = b.param("a", {2, 3});
    Value *y = b.param("b", {3});
    b.lossOf(b.op(OpKind::Where, {c, x, y}));
  });
}

TEST(Gradcheck, MatMul) {
  gradcheck([](Builder &b) {
    Value *x = b.param("a", {2, 3, 4});
    Value *w = b.param("w", {4, 5});
    b.lossOf(b.op(OpKind::MatMul, {x, w}));
  });
  gradcheck([](Builder &b) { // batch dims broadcast both ways
    Value *x = b.param("a", {2, 1, 3, 4});
    Value *w = b.param("w", {3, 4, 2});
    b.lossOf(b.op(OpKind::MatMul, {x, w}));
  });
  gradcheck([](Builder &b) { // only the weight trains
    Value *x = b.constant("a", {3, 4});
    Value *w = b.param("w", {4, 2});
    b.lossOf(b.op(OpKind::MatMul, {x, w}));
  });
  // 1-D operands: vector-matrix, batched matrix-vector, and a dot product
  // (a spectral norm's u^T W v).
  gradcheck([](Builder &b) {
    b.lossOf(b.op(OpKind::MatMul, {b.param("u", {4}), b.param("w", {2, 4, 3})}));
  });
  gradcheck([](Builder &b) {
    b.lossOf(b.op(OpKind::MatMul, {b.param("w", {2, 3, 4}), b.param("v", {4})}));
  });
  gradcheck([](Builder &b) {
    b.lossOf(b.op(OpKind::MatMul, {b.param("u", {5}), b.param("v", {5})}));
  });
}

TEST(Gradcheck, Gemm) {
  for (int64_t ta : {0, 1})
    for (int64_t tb : {0, 1}) {
      SCOPED_TRACE("transA " + std::to_string(ta) + " transB " +
                   std::to_string(tb));
      gradcheck([&](Builder &b) {
        Value *a = b.param("a", ta ? Shape{4, 3} : Shape{3, 4});
        Value *w = b.param("w", tb ? Shape{5, 4} : Shape{4, 5});
        Value *c = b.param("c", {5});
        b.lossOf(b.op(OpKind::Gemm, {a, w, c},
                      {{"transA", ta}, {"transB", tb}, {"alpha", 0.7f},
                       {"beta", 1.5f}}));
      });
    }
  gradcheck([](Builder &b) { // C as a column
    Value *a = b.param("a", {3, 4});
    Value *w = b.param("w", {4, 2});
    Value *c = b.param("c", {3, 1});
    b.lossOf(b.op(OpKind::Gemm, {a, w, c}));
  });
}

TEST(Gradcheck, Conv) {
  struct C {
    int64_t group, stride, pad, dil;
  };
  for (C c : {C{1, 1, 1, 1}, C{1, 2, 0, 1}, C{2, 1, 1, 2}, C{1, 2, 2, 1}}) {
    SCOPED_TRACE("group " + std::to_string(c.group) + " stride " +
                 std::to_string(c.stride) + " pad " + std::to_string(c.pad) +
                 " dilation " + std::to_string(c.dil));
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 4, 5, 6});
      Value *w = b.param("w", {4, 4 / c.group, 3, 2});
      Value *bias = b.param("bias", {4});
      b.lossOf(b.op(OpKind::Conv, {x, w, bias},
                    {{"group", c.group},
                     {"strides", std::vector<int64_t>{c.stride, c.stride}},
                     {"pads", std::vector<int64_t>{c.pad, c.pad, c.pad, c.pad}},
                     {"dilations", std::vector<int64_t>{c.dil, c.dil}}}));
    });
  }
}

// ConvTranspose (ConvGradData's arithmetic, forward): X [2, 4, 3, 4], W
// [4, 6 / group, 3, 2]; the result's spatial dims as ONNX gives them,
// stride (D - 1) + output_padding + (K - 1) dilation + 1 - pads.
TEST(Gradcheck, ConvTranspose) {
  struct C {
    int64_t group, stride, pad, dil, outPad;
  };
  for (C c : {C{1, 1, 0, 1, 0}, C{1, 2, 1, 1, 1}, C{2, 2, 0, 1, 0},
              C{2, 1, 1, 2, 0}}) {
    SCOPED_TRACE("group " + std::to_string(c.group) + " stride " +
                 std::to_string(c.stride) + " pad " + std::to_string(c.pad) +
                 " dilation " + std::to_string(c.dil) + " output_padding " +
                 std::to_string(c.outPad));
    auto out = [&](int64_t d, int64_t k) {
      return c.stride * (d - 1) + c.outPad + (k - 1) * c.dil + 1 - 2 * c.pad;
    };
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 4, 3, 4});
      Value *w = b.param("w", {4, 6 / c.group, 3, 2});
      b.lossOf(b.op(
          OpKind::ConvTranspose, {x, w},
          {{"group", c.group},
           {"strides", std::vector<int64_t>{c.stride, c.stride}},
           {"pads", std::vector<int64_t>{c.pad, c.pad, c.pad, c.pad}},
           {"dilations", std::vector<int64_t>{c.dil, c.dil}},
           {"shape", std::vector<int64_t>{2, 6, out(3, 3), out(4, 2)}}}));
    });
  }
}

TEST(Gradcheck, LayerNormalization) {
  for (int64_t axis : {-1, 1})
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 3, 4});
      Shape norm = axis == 1 ? Shape{3, 4} : Shape{4};
      Value *s = b.param("scale", norm);
      Value *bias = b.param("bias", norm);
      b.lossOf(b.op(OpKind::LayerNormalization, {x, s, bias},
                    {{"axis", axis}}));
    });
}

TEST(Gradcheck, RMSNormalization) {
  for (int64_t axis : {-1, 1})
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 3, 4});
      Shape norm = axis == 1 ? Shape{3, 4} : Shape{4};
      Value *s = b.param("scale", norm);
      b.lossOf(b.op(OpKind::RMSNormalization, {x, s}, {{"axis", axis}}));
    });
  // A scale broadcast over the normalized dims (its gradient is a SumTo);
  // a constant scale (only the data part).
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {2, 3, 4});
    Value *s = b.param("scale", {4});
    b.lossOf(b.op(OpKind::RMSNormalization, {x, s}, {{"axis", int64_t(1)}}));
  });
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {3, 5});
    Value *s = b.constant("scale", {5});
    b.lossOf(b.op(OpKind::RMSNormalization, {x, s}));
  });
  gradcheck([&](Builder &b) {
    Value *x = b.constant("x", {3, 5});
    Value *s = b.param("scale", {5});
    b.lossOf(b.op(OpKind::RMSNormalization, {x, s}));
  });
}

TEST(Gradcheck, BatchNormalization) {
  for (int64_t training : {1, 0})
    gradcheck([&](Builder &b) {
      SCOPED_TRACE("training_mode " + std::to_string(training));
      Value *x = b.param("x", {3, 2, 2, 2});
      Value *s = b.param("scale", {2});
      Value *bias = b.param("bias", {2});
      Value *mean = b.constant("mean", {2});
      Value *var = b.constant("var", {2}, 0.5, 1.5);
      unsigned n = training ? 3 : 1;
      auto r = b.opN(OpKind::BatchNormalization, {x, s, bias, mean, var},
                     {{"training_mode", training}}, n);
      b.lossOf(r[0]);
    });
}

TEST(Gradcheck, SoftmaxFamily) {
  for (OpKind k : {OpKind::Softmax, OpKind::LogSoftmax})
    for (int64_t axis : {-1, 0})
      gradcheck([&](Builder &b) {
        Value *x = b.param("x", {3, 4});
        b.lossOf(b.op(k, {x}, {{"axis", axis}}));
      });
}

TEST(Gradcheck, SoftmaxCrossEntropyLoss) {
  for (const char *red : {"mean", "sum", "none"})
    for (bool weighted : {false, true})
      for (bool ignore : {false, true}) {
        SCOPED_TRACE(std::string(red) + (weighted ? " weighted" : "") +
                     (ignore ? " ignore_index" : ""));
        gradcheck([&](Builder &b) {
          Value *x = b.param("scores", {4, 3, 2});
          Value *y = b.ints("labels", {4, 2}, {0, 2, 1, 1, 2, 0, 1, 2});
          std::vector<Value *> ops{x, y};
          if (weighted)
            ops.push_back(b.constant("w", {3}, 0.5, 2));
          AttrMap a{{"reduction", red}};
          if (ignore)
            a.emplace("ignore_index", int64_t(1));
          b.lossOf(b.op(OpKind::SoftmaxCrossEntropyLoss, ops, a));
        });
      }
}

TEST(Gradcheck, Dropout) {
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {4, 5});
    b.lossOf(b.op(OpKind::Dropout, {x},
                  {{"ratio", 0.3f}, {"training_mode", int64_t(1)}}));
  });
}

TEST(Gradcheck, Reductions) {
  for (OpKind k : {OpKind::ReduceSum, OpKind::ReduceMean, OpKind::ReduceMax})
    for (int64_t keep : {0, 1})
      for (std::vector<int64_t> ax :
           {std::vector<int64_t>{1}, std::vector<int64_t>{0, -1},
            std::vector<int64_t>{}}) {
        SCOPED_TRACE(std::string(opInfo(k).name) + " keepdims " +
                     std::to_string(keep) + " axes " +
                     std::to_string(ax.size()));
        gradcheck([&](Builder &b) {
          Value *x = b.param("x", {2, 3, 4});
          b.lossOf(b.op(k, {x}, axes(ax, keep)));
        });
      }
}

// CumSum inclusive and exclusive, forward and reversed, along an outer
// and the inner axis.
TEST(Gradcheck, CumSum) {
  for (int64_t axis : {0, -1})
    for (int64_t exclusive : {0, 1})
      for (int64_t reverse : {0, 1}) {
        SCOPED_TRACE("axis " + std::to_string(axis) + " exclusive " +
                     std::to_string(exclusive) + " reverse " +
                     std::to_string(reverse));
        gradcheck([&](Builder &b) {
          Value *x = b.param("x", {3, 4});
          b.lossOf(b.op(OpKind::CumSum, {x},
                        {{"axis", axis},
                         {"exclusive", exclusive},
                         {"reverse", reverse}}));
        });
      }
}

// ScatterElements, reductions none (a repeated index: the later write
// wins) and add (repeats add up), along both axes.
TEST(Gradcheck, ScatterElements) {
  for (const char *red : {"none", "add"})
    for (int64_t axis : {0, 1}) {
      SCOPED_TRACE(std::string(red) + " axis " + std::to_string(axis));
      gradcheck([&](Builder &b) {
        Value *x = b.param("x", {3, 4});
        Value *idx = b.ints("idx", {2, 3}, {1, 0, 2, 1, -1, 0});
        Value *u = b.param("u", {2, 3});
        b.lossOf(b.op(OpKind::ScatterElements, {x, idx, u},
                      {{"axis", axis}, {"reduction", std::string(red)}}));
      });
    }
}

// Floor, Ceil, Round and Sign pass no gradient (PyTorch's are zero): a
// parameter behind them gets zeros, the one beside them its gradient.
TEST(Gradcheck, FlatUnaryOpsPassNoGradient) {
  for (OpKind k : {OpKind::Floor, OpKind::Ceil, OpKind::Round, OpKind::Sign}) {
    SCOPED_TRACE(std::string(opInfo(k).name));
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {3, 4}, 0.1, 0.4); // clear of the steps
      Value *w = b.param("w", {3, 4});
      b.lossOf(b.op(OpKind::Mul, {b.op(k, {x}), w}));
    });
  }
}

// Resize: linear (half_pixel, align_corners, asymmetric, pytorch_half_pixel
// with a dim resized to 1, a downsample by scales), nearest, and cubic (up,
// with the edge reads; align_corners; a downsample by scales).
TEST(Gradcheck, Resize) {
  using Ints = std::vector<int64_t>;
  struct R {
    const char *mode, *coord;
    Ints sizes;
    std::vector<float> scales;
  };
  std::vector<R> cases = {
      {"linear", "half_pixel", {1, 2, 6, 5}, {}},
      {"linear", "align_corners", {1, 2, 5, 7}, {}},
      {"linear", "asymmetric", {1, 2, 6, 6}, {1, 1, 2, 2}},
      {"linear", "pytorch_half_pixel", {1, 2, 1, 4}, {}},
      {"linear", "half_pixel", {1, 2, 1, 2}, {1, 1, 0.6f, 0.6f}},
      {"nearest", "asymmetric", {1, 2, 6, 6}, {1, 1, 2, 2}},
      {"nearest", "half_pixel", {1, 2, 4, 5}, {}},
      {"cubic", "half_pixel", {1, 2, 5, 7}, {}},
      {"cubic", "align_corners", {1, 2, 6, 4}, {}},
      {"cubic", "half_pixel", {1, 2, 2, 2}, {1, 1, 0.7f, 0.7f}},
  };
  for (const R &r : cases) {
    SCOPED_TRACE(std::string(r.mode) + " " + r.coord);
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {1, 2, 3, 3});
      AttrMap attrs{{"mode", std::string(r.mode)},
                    {"coordinate_transformation_mode", std::string(r.coord)},
                    {"nearest_mode", std::string("floor")},
                    {"sizes", r.sizes}};
      if (!r.scales.empty())
        attrs.emplace("scales", r.scales);
      b.lossOf(b.op(OpKind::Resize, {x}, attrs));
    });
  }
}

// GridSample, linear: both gradients (the image's and the grid's) for each
// padding and corner rule, grid values in [-1.4, 1.4] (some points outside
// the image, some reflected); nearest: the image's gradient (its grid
// gradient is zero, as PyTorch's).
TEST(Gradcheck, GridSample) {
  struct G {
    const char *mode, *padding;
    int64_t align;
  };
  for (G g : {G{"linear", "zeros", 0}, G{"linear", "zeros", 1},
              G{"linear", "border", 0}, G{"linear", "border", 1},
              G{"linear", "reflection", 0}, G{"linear", "reflection", 1},
              G{"nearest", "zeros", 0}, G{"nearest", "reflection", 1}}) {
    SCOPED_TRACE(std::string(g.mode) + " " + g.padding +
                 (g.align ? " align_corners" : ""));
    bool linear = std::string(g.mode) == "linear";
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 2, 3, 4});
      Value *grid = linear ? b.param("grid", {2, 3, 2, 2}, -1.4, 1.4)
                           : b.constant("grid", {2, 3, 2, 2}, -1.4, 1.4);
      b.lossOf(b.op(OpKind::GridSample, {x, grid},
                    {{"mode", std::string(g.mode)},
                     {"padding_mode", std::string(g.padding)},
                     {"align_corners", g.align}}));
    });
  }
}

// Tile: the gradient sums over the tiles.
TEST(Gradcheck, Tile) {
  for (std::vector<int64_t> repeats :
       {std::vector<int64_t>{2, 1}, std::vector<int64_t>{3, 2},
        std::vector<int64_t>{1, 1}}) {
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 3});
      Value *y = b.param("y", {2, 3});
      Value *t = b.op(OpKind::Tile, {b.op(OpKind::Mul, {x, y})},
                      {{"repeats", repeats}});
      b.lossOf(t);
    });
  }
}

TEST(Gradcheck, DataMovement) {
  gradcheck([](Builder &b) {
    Value *x = b.param("a", {2, 3});
    Value *y = b.param("b", {2, 2});
    b.lossOf(b.op(OpKind::Concat, {x, y}, {{"axis", int64_t(-1)}}));
  });
  gradcheck([](Builder &b) { // one part unused: its gradient is zero
    Value *x = b.param("x", {2, 5});
    auto parts = b.opN(OpKind::Split, {x},
                       {{"axis", int64_t(1)},
                        {"split", std::vector<int64_t>{2, 3}}},
                       2);
    b.lossOf(parts[1]);
  });
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {4, 5});
    b.lossOf(b.op(OpKind::Slice, {x},
                  {{"starts", std::vector<int64_t>{3, 0}},
                   {"ends", std::vector<int64_t>{0, 5}},
                   {"axes", std::vector<int64_t>{0, 1}},
                   {"steps", std::vector<int64_t>{-1, 2}}}));
  });
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {2, 3});
    b.lossOf(b.op(OpKind::Pad, {x},
                  {{"pads", std::vector<int64_t>{1, 0, 0, 2}},
                   {"value", 0.5f}}));
  });
  // Negative pads crop (RWKV's time shift pads one side and crops the
  // other): the cropped elements get no gradient.
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {3, 4});
    b.lossOf(b.op(OpKind::Pad, {x},
                  {{"pads", std::vector<int64_t>{0, 1, -1, -1}},
                   {"value", 0.25f}}));
  });
  // Reflect, edge and wrap (ReflectionPad2d, ReplicationPad2d,
  // CircularPad2d, Conv2d's padding_mode): pads wider than an axis, one on
  // a single-element axis, and a crop beside a pad.
  for (const char *mode : {"reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {2, 3, 4});
      b.lossOf(b.op(OpKind::Pad, {x},
                    {{"mode", std::string(mode)},
                     {"pads", std::vector<int64_t>{0, 2, 1, 0, 1, 5}}}));
    });
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {1, 4});
      b.lossOf(b.op(OpKind::Pad, {x},
                    {{"mode", std::string(mode)},
                     {"pads", std::vector<int64_t>{2, -1, 1, 2}}}));
    });
  }
  for (int64_t axis : {0, 1})
    gradcheck([&](Builder &b) {
      Value *x = b.param("x", {4, 3});
      Value *idx = b.ints("idx", {2, 2}, {0, -1, 2, 0});
      b.lossOf(b.op(OpKind::Gather, {x, idx}, {{"axis", axis}}));
    });
  // ScatterND (reduction none): slices and elements, a repeated tuple (the
  // later one wins), a negative index.
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {4, 3});
    Value *idx = b.ints("idx", {3, 1}, {1, -1, 1});
    Value *u = b.param("u", {3, 3});
    b.lossOf(b.op(OpKind::ScatterND, {x, idx, u}));
  });
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {2, 3, 2});
    Value *idx = b.ints("idx", {2, 2, 3}, {0, 1, 1, 1, 2, 0, 0, 1, 1, -1, 0, 1});
    Value *u = b.param("u", {2, 2});
    b.lossOf(b.op(OpKind::ScatterND, {x, idx, u}));
  });
  // GatherElements: repeated and negative indices along axis 0 and -1.
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {3, 4});
    Value *idx = b.ints("idx", {4, 3}, {0, -1, 2, 2, 2, 1, 0, 0, -3, 1, 2, 2});
    b.lossOf(b.op(OpKind::GatherElements, {x, idx}, {{"axis", int64_t(0)}}));
  });
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {3, 4});
    Value *idx =
        b.ints("idx", {2, 6}, {3, -4, 0, 0, 1, 2, 2, 2, -1, 3, 0, 1});
    b.lossOf(b.op(OpKind::GatherElements, {x, idx}, {{"axis", int64_t(-1)}}));
  });
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {3, 1});
    b.lossOf(b.op(OpKind::Expand, {x},
                  {{"shape", std::vector<int64_t>{2, 3, 4}}}));
  });
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {2, 3, 4});
    b.lossOf(b.op(OpKind::Transpose, {x},
                  {{"perm", std::vector<int64_t>{1, 2, 0}}}));
  });
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {2, 3, 4});
    Value *r = b.op(OpKind::Reshape, {x},
                    {{"shape", std::vector<int64_t>{6, 4}}});
    Value *f = b.op(OpKind::Flatten, {r}, {{"axis", int64_t(0)}});
    Value *u = b.op(OpKind::Unsqueeze, {f},
                    {{"axes", std::vector<int64_t>{0}}});
    b.lossOf(b.op(OpKind::Squeeze, {u},
                  {{"axes", std::vector<int64_t>{0, 1}}}));
  });
}

TEST(Gradcheck, Pooling) {
  AttrMap geometry{{"kernel_shape", std::vector<int64_t>{2, 3}},
                   {"strides", std::vector<int64_t>{2, 1}},
                   {"pads", std::vector<int64_t>{1, 0, 0, 1}}};
  gradcheck([&](Builder &b) {
    Value *x = b.param("x", {2, 2, 5, 5});
    AttrMap a = geometry;
    a.emplace("dilations", std::vector<int64_t>{1, 1});
    b.lossOf(b.op(OpKind::MaxPool, {x}, a));
  });
  for (int64_t include : {0, 1})
    for (int64_t ceil : {0, 1})
      gradcheck([&](Builder &b) {
        Value *x = b.param("x", {2, 2, 5, 5});
        AttrMap a = geometry;
        a.emplace("count_include_pad", include);
        a.emplace("ceil_mode", ceil);
        b.lossOf(b.op(OpKind::AveragePool, {x}, a));
      });
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {2, 3, 4, 4});
    b.lossOf(b.op(OpKind::GlobalAveragePool, {x}));
  });
  // DFT forward and inverse (normalized) along a middle and a leading axis.
  for (int64_t inverse : {0, 1})
    for (int64_t axis : {0, 1})
      gradcheck([&](Builder &b) {
        Value *x = b.param("x", {3, 4, 2});
        b.lossOf(b.op(OpKind::DFT, {x},
                      {{"axis", axis},
                       {"inverse", inverse},
                       {"normalized", inverse}}));
      });
  // A ceil_mode window longer than the input (EfficientNet's pooler).
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {2, 2, 3, 2});
    b.lossOf(b.op(OpKind::AveragePool, {x},
                  {{"kernel_shape", std::vector<int64_t>{4, 4}},
                   {"strides", std::vector<int64_t>{4, 4}},
                   {"pads", std::vector<int64_t>{0, 0, 0, 0}},
                   {"ceil_mode", int64_t(1)},
                   {"count_include_pad", int64_t(1)}}));
  });
}

TEST(Gradcheck, WeightUsedTwiceAndFanOut) {
  gradcheck([](Builder &b) {
    Value *x = b.param("x", {3, 4});
    Value *w = b.param("w", {4, 4});
    Value *h = b.op(OpKind::MatMul, {x, w});
    Value *t = b.op(OpKind::Tanh, {h});
    Value *h2 = b.op(OpKind::MatMul, {t, w}); // w again
    b.lossOf(b.op(OpKind::Add, {h2, h}));      // h fans out
  });
}

} // namespace

} // namespace unit_gradcheck
