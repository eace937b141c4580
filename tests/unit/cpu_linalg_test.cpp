// CPU MatMul and Gemm kernels: hand-computed products, and NumPy-style
// batched / broadcast / 1-D products against a naive double reference.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <cmath>
#include <limits>
#include <random>

namespace unit_cpu_linalg {

using namespace cleave;
using runtime::TensorRef;
using namespace cleave::testsupport::typed;

namespace {

// NumPy matmul in double, the slow obvious way.
std::vector<double> referenceMatMul(Ints sa, const std::vector<double> &a,
                                    Ints sb, const std::vector<double> &b) {
  if (sa.size() == 1)
    sa.insert(sa.begin(), 1);
  if (sb.size() == 1)
    sb.push_back(1);
  int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  size_t r = std::max(sa.size(), sb.size()) - 2;
  Ints ba(r, 1), bb(r, 1), batch(r);
  for (size_t i = 0; i < r; ++i) {
    if (i + sa.size() - 2 >= r)
      ba[i] = sa[i + sa.size() - 2 - r];
    if (i + sb.size() - 2 >= r)
      bb[i] = sb[i + sb.size() - 2 - r];
    batch[i] = std::max(ba[i], bb[i]);
  }
  int64_t count = numElements(batch);
  std::vector<double> out(count * m * n, 0.0);
  for (int64_t bi = 0; bi < count; ++bi) {
    int64_t rest = bi, ia = 0, ib = 0, mulA = 1, mulB = 1;
    for (size_t d = r; d-- > 0;) {
      int64_t c = rest % batch[d];
      rest /= batch[d];
      ia += (ba[d] == 1 ? 0 : c) * mulA;
      ib += (bb[d] == 1 ? 0 : c) * mulB;
      mulA *= ba[d];
      mulB *= bb[d];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += a[ia * m * k + i * k + p] * b[ib * k * n + p * n + j];
        out[bi * m * n + i * n + j] = acc;
      }
  }
  return out;
}

Ints matMulShape(const Ints &a, const Ints &b) {
  auto types = ir::inferResultTypes(
      ir::OpKind::MatMul,
      {ir::TensorType(ir::DType::F32, ir::Shape(a.begin(), a.end())),
       ir::TensorType(ir::DType::F32, ir::Shape(b.begin(), b.end()))},
      {}, 1);
  EXPECT_TRUE(bool(types)) << llvm::toString(types.takeError());
  return Ints((*types)[0].shape.begin(), (*types)[0].shape.end());
}

template <typename T> void checkMatMul(Ints sa, Ints sb, unsigned seed) {
  SCOPED_TRACE(ir::shapeStr(sa) + " x " + ir::shapeStr(sb));
  Host<T> a = randomHost<T>(sa, seed), b = randomHost<T>(sb, seed + 1);
  Host<T> y(matMulShape(sa, sb));
  ASSERT_FALSE(
      bool(run(ir::OpKind::MatMul, {}, {a.ref(), b.ref()}, {y.ref()})));
  double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  expectClose(y.data, referenceMatMul(sa, a.asDouble(), sb, b.asDouble()), tol);
}

ir::AttrMap gemmAttrs(float alpha, float beta, int64_t ta, int64_t tb) {
  return {{"alpha", alpha}, {"beta", beta}, {"transA", ta}, {"transB", tb}};
}

// Gemm in double: alpha * op(A) op(B) + beta * C broadcast to [M, N].
std::vector<double> referenceGemm(const Ints &sa, const std::vector<double> &a,
                                  const Ints &sb, const std::vector<double> &b,
                                  const Ints *sc, const std::vector<double> *c,
                                  double alpha, double beta, bool ta, bool tb) {
  int64_t m = ta ? sa[1] : sa[0], k = ta ? sa[0] : sa[1],
          n = tb ? sb[0] : sb[1];
  std::vector<double> out(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc += (ta ? a[p * m + i] : a[i * k + p]) *
               (tb ? b[j * k + p] : b[p * n + j]);
      double cv = 0;
      if (c) {
        int64_t cm = sc->size() == 2 ? (*sc)[0] : 1;
        int64_t cn = sc->empty() ? 1 : sc->back();
        cv = (*c)[(cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j)];
      }
      out[i * n + j] = alpha * acc + beta * cv;
    }
  return out;
}

} // namespace

// --- MatMul --------------------------------------------------------------

TEST(CpuMatMul, HandComputed2D) {
  Host<float> a({2, 3}, {1, 2, 3, 4, 5, 6}), b({3, 2}, {7, 8, 9, 10, 11, 12});
  Host<float> y({2, 2});
  ASSERT_FALSE(
      bool(run(ir::OpKind::MatMul, {}, {a.ref(), b.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<float>{58, 64, 139, 154}));
}

TEST(CpuMatMul, BatchedBroadcastMatchesReference) {
  checkMatMul<float>({2, 1, 3, 4}, {3, 4, 5}, 1);
  checkMatMul<double>({2, 1, 3, 4}, {3, 4, 5}, 2);
  checkMatMul<float>({3, 4}, {2, 4, 5}, 3); // A broadcast over B's batch
  checkMatMul<float>({1, 3, 4}, {2, 1, 4, 5}, 4);
  checkMatMul<float>({2, 3, 4}, {2, 4, 5}, 5); // batch on both, no broadcast
}

TEST(CpuMatMul, BatchFoldsIntoRows) {
  checkMatMul<float>({2, 3, 4}, {4, 5}, 6);
  checkMatMul<double>({2, 3, 7, 4}, {1, 4, 5}, 7);
}

TEST(CpuMatMul, OneDimensionalOperands) {
  checkMatMul<float>({4}, {2, 4, 3}, 8);
  checkMatMul<float>({2, 3, 4}, {4}, 9);
  checkMatMul<double>({4}, {4}, 10);
  checkMatMul<float>({4}, {4, 6}, 11);
}

TEST(CpuMatMul, LargeBatchedProductsUseThreadedGemm) {
  // 70^3 multiply-adds per batch entry is past the small-GEMM threshold.
  checkMatMul<float>({3, 70, 70}, {3, 70, 70}, 12);
  checkMatMul<float>({64, 8, 16}, {64, 16, 8}, 13); // many small ones
}

TEST(CpuMatMul, IntegerTypes) {
  checkMatMul<int64_t>({2, 3, 4}, {4, 5}, 14);
  checkMatMul<int32_t>({2, 1, 3, 4}, {3, 4, 2}, 15);
  Host<int8_t> a({1, 2}, {100, 100}), b({2, 1}, {1, 1}), y({1, 1});
  ASSERT_FALSE(
      bool(run(ir::OpKind::MatMul, {}, {a.ref(), b.ref()}, {y.ref()})));
  EXPECT_EQ(y.data[0], int8_t(200)); // wraps like the int8 result type does
}

TEST(CpuMatMul, EmptyInnerDimensionGivesZeros) {
  Host<float> a({2, 0}), b({0, 3}), y({2, 3}, std::vector<float>(6, 7.0f));
  ASSERT_FALSE(
      bool(run(ir::OpKind::MatMul, {}, {a.ref(), b.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, std::vector<float>(6, 0.0f));
}

TEST(CpuMatMul, UnsupportedElementTypeIsAnError) {
  Host<uint8_t> a({2, 2}), b({2, 2}), y({2, 2});
  llvm::Error e = run(ir::OpKind::MatMul, {}, {a.ref(), b.ref()}, {y.ref()});
  ASSERT_TRUE(bool(e));
  EXPECT_THAT(llvm::toString(std::move(e)),
              ::testing::AllOf(::testing::HasSubstr("MatMul"),
                               ::testing::HasSubstr("bool")));
  EXPECT_FALSE(cpu().supports(ir::OpKind::MatMul, ir::DType::Bool));
  EXPECT_TRUE(cpu().supports(ir::OpKind::MatMul, ir::DType::I8));
}

// --- Gemm ----------------------------------------------------------------

template <typename T>
void checkGemm(bool ta, bool tb, Ints sc, float alpha, float beta,
               unsigned seed) {
  SCOPED_TRACE(::testing::Message() << "transA " << ta << " transB " << tb
                                    << " C " << ir::shapeStr(sc));
  int64_t m = 3, k = 4, n = 5;
  Ints sa = ta ? Ints{k, m} : Ints{m, k}, sb = tb ? Ints{n, k} : Ints{k, n};
  Host<T> a = randomHost<T>(sa, seed), b = randomHost<T>(sb, seed + 1);
  Host<T> c = randomHost<T>(sc, seed + 2), y({m, n});
  ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(alpha, beta, ta, tb),
                        {a.ref(), b.ref(), c.ref()}, {y.ref()})));
  std::vector<double> cd = c.asDouble();
  double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  expectClose(y.data,
              referenceGemm(sa, a.asDouble(), sb, b.asDouble(), &sc, &cd, alpha,
                            beta, ta, tb),
              tol);
}

TEST(CpuGemm, TransposesAndBroadcastBias) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (Ints sc : {Ints{}, Ints{5}, Ints{1, 5}, Ints{3, 1}, Ints{3, 5}}) {
        checkGemm<float>(ta, tb, sc, 0.5f, 2.0f, 20);
        checkGemm<double>(ta, tb, sc, 1.5f, -1.0f, 21);
      }
}

// Products large enough to be split into blocks over the threads, by rows
// (M >= N) and by columns: each block's share of C is written by the
// thread that multiplies into it, right before its product. Every bias
// form gives the reference's values and the same bits on 1 and 2 threads.
TEST(CpuGemm, BlockedProductsWriteTheirBiasBlocks) {
  testsupport::cpu(); // created first, so it does not reset the pools below
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{512, 256, 128}, Shape{96, 1024, 128}})
    for (bool tb : {false, true})
      for (Ints sc : {Ints{}, Ints{s.n}, Ints{s.m, 1}, Ints{s.m, s.n}}) {
        SCOPED_TRACE(::testing::Message()
                     << s.m << " x " << s.n << " x " << s.k << " transB "
                     << tb << " C " << ir::shapeStr(sc));
        Ints sa{s.m, s.k}, sb = tb ? Ints{s.n, s.k} : Ints{s.k, s.n};
        Host<float> a = randomHost<float>(sa, 40), b = randomHost<float>(sb, 41),
                    c = randomHost<float>(sc, 42);
        std::vector<Host<float>> ys;
        for (int threads : {1, 2}) {
          ys.emplace_back(Ints{s.m, s.n},
                          std::vector<float>(size_t(s.m * s.n), 7.0f));
          auto backend = runtime::createCpuBackend(threads);
          std::vector<TensorRef> in{a.ref(), b.ref(), c.ref()},
              out{ys.back().ref()};
          ASSERT_FALSE(bool(backend->run(runtime::KernelCall{
              ir::OpKind::Gemm, gemmAttrs(1.0f, 1.0f, 0, tb), in, out})));
        }
        std::vector<double> cd = c.asDouble();
        expectClose(ys[0].data,
                    referenceGemm(sa, a.asDouble(), sb, b.asDouble(), &sc, &cd,
                                  1.0f, 1.0f, false, tb),
                    1e-4);
        EXPECT_EQ(std::memcmp(ys[0].data.data(), ys[1].data.data(),
                              ys[0].data.size() * sizeof(float)),
                  0);
      }
}

TEST(CpuGemm, IntegerGemm) {
  checkGemm<int32_t>(true, false, {5}, 1.0f, 1.0f, 22);
  checkGemm<int64_t>(false, true, {3, 5}, 2.0f, 3.0f, 23);
}

TEST(CpuGemm, WithoutCAndBetaZeroIgnoresC) {
  Host<float> a({1, 2}, {1, 2}), b({2, 2}, {3, 4, 5, 6}), y({1, 2});
  ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(2.0f, 1.0f, 0, 0),
                        {a.ref(), b.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<float>{26, 32}));
  Host<float> c({2}, {std::numeric_limits<float>::quiet_NaN(), 1});
  ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(1.0f, 0.0f, 0, 0),
                        {a.ref(), b.ref(), c.ref()}, {y.ref()})));
  EXPECT_EQ(y.data, (std::vector<float>{13, 16}));
}

// Without C, Y is not cleared before the product: whatever Y held (an
// arena's earlier values, here NaN) must not reach the result, for one
// BLAS call and for the threaded blocks of a large product, and an empty
// inner dimension gives zeros (or beta x C).
TEST(CpuGemm, WithoutCOverwritesWhatYHeld) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t size : {4, 384}) {
    SCOPED_TRACE(size);
    Host<float> a = randomHost<float>({size, size}, 31),
                b = randomHost<float>({size, size}, 32);
    Host<float> y({size, size}, std::vector<float>(size * size, nan)),
        clean({size, size});
    ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(1.0f, 1.0f, 0, 1),
                          {a.ref(), b.ref()}, {y.ref()})));
    ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(1.0f, 1.0f, 0, 1),
                          {a.ref(), b.ref()}, {clean.ref()})));
    EXPECT_EQ(std::memcmp(y.data.data(), clean.data.data(),
                          y.data.size() * sizeof(float)),
              0);
    for (float v : y.data)
      ASSERT_FALSE(std::isnan(v));
  }
  Host<float> a0({2, 0}), b0({0, 3}), c({3}, {1, 2, 3});
  Host<float> y0({2, 3}, std::vector<float>(6, nan));
  ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(1.0f, 1.0f, 0, 0),
                        {a0.ref(), b0.ref()}, {y0.ref()})));
  EXPECT_EQ(y0.data, std::vector<float>(6, 0.0f));
  ASSERT_FALSE(bool(run(ir::OpKind::Gemm, gemmAttrs(1.0f, 2.0f, 0, 0),
                        {a0.ref(), b0.ref(), c.ref()}, {y0.ref()})));
  EXPECT_EQ(y0.data, (std::vector<float>{2, 4, 6, 2, 4, 6}));
}

// --- 16-bit floats through f32 kernels ------------------------------------

// A bf16 MatMul (what --precision bf16 makes of a product) has no kernel of
// its own on the CPU: the backend widens the operands to f32, runs the f32
// kernel and rounds the result once. So it must equal, bit for bit, the
// f32 product of the same values rounded to bf16; the MatMul-gradient
// parts (B and W) and a Conv go the same way.
TEST(CpuWidened, Bf16ProductsEqualTheF32ProductRoundedOnce) {
  auto bf16Host = [](const std::vector<float> &f) {
    std::vector<uint16_t> h(f.size());
    for (size_t i = 0; i < f.size(); ++i)
      h[i] = ir::floatToBf16(f[i]);
    return h;
  };
  auto widened = [](const std::vector<uint16_t> &h) {
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i)
      f[i] = ir::bf16ToFloat(h[i]);
    return f;
  };
  struct Case {
    ir::OpKind op;
    Ints a, b, y;
    ir::AttrMap attrs;
  };
  std::vector<Case> cases = {
      {ir::OpKind::MatMul, {3, 5, 7}, {7, 4}, {3, 5, 4}, {}},
      {ir::OpKind::MatMulGradA, {6, 4}, {7, 4}, {6, 7},
       {{"shape", std::vector<int64_t>{6, 7}}}},
      {ir::OpKind::MatMulGradB, {6, 7}, {6, 4}, {7, 4},
       {{"shape", std::vector<int64_t>{7, 4}}}},
      {ir::OpKind::Conv, {2, 3, 6, 6}, {4, 3, 3, 3}, {2, 4, 4, 4},
       {{"pads", std::vector<int64_t>{0, 0, 0, 0}},
        {"strides", std::vector<int64_t>{1, 1}},
        {"dilations", std::vector<int64_t>{1, 1}},
        {"group", int64_t(1)}}},
  };
  unsigned seed = 40;
  for (const Case &c : cases) {
    SCOPED_TRACE(std::string(ir::opInfo(c.op).name));
    Host<float> a = randomHost<float>(c.a, seed++),
                b = randomHost<float>(c.b, seed++);
    std::vector<uint16_t> a16 = bf16Host(a.data), b16 = bf16Host(b.data);
    std::vector<uint16_t> y16(numElements(c.y), 0xffff);
    ASSERT_FALSE(bool(run(c.op, c.attrs,
                          {TensorRef{ir::DType::BF16, c.a, a16.data()},
                           TensorRef{ir::DType::BF16, c.b, b16.data()}},
                          {TensorRef{ir::DType::BF16, c.y, y16.data()}})));
    std::vector<float> aw = widened(a16), bw = widened(b16);
    std::vector<float> y32(y16.size());
    ASSERT_FALSE(bool(run(c.op, c.attrs,
                          {TensorRef{ir::DType::F32, c.a, aw.data()},
                           TensorRef{ir::DType::F32, c.b, bw.data()}},
                          {TensorRef{ir::DType::F32, c.y, y32.data()}})));
    EXPECT_EQ(y16, bf16Host(y32));
    EXPECT_NE(widened(y16), y32) << "no element was rounded";
  }
  EXPECT_TRUE(cpu().supports(ir::OpKind::MatMul, ir::DType::BF16));
  EXPECT_TRUE(cpu().supports(ir::OpKind::ConvGradFilter, ir::DType::F16));
  EXPECT_FALSE(cpu().supports(ir::OpKind::MatMul, ir::DType::Bool));
}

} // namespace unit_cpu_linalg
