// The kernels a transformer step spends its time in give the same bits on
// 1, 2 and 4 threads, at the corpus benchmark's sizes: the per-head
// batched products of attention (run one per task) and their gradients,
// a bias gradient's SumTo (cut into fixed pieces of rows), Gelu and its
// gradient and softmax (float lanes); and the SumTo pieces add up to the
// plain sum.
#include "CpuKernelTesting.h"
#include "ir/OpInfo.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>

namespace unit_cpu_transformer_threads {

using namespace cleave;
using namespace cleave::testsupport::typed;
using ir::OpKind;

namespace {

Host<float> runOne(OpKind op, const ir::AttrMap &attrs,
                   std::vector<Host<float> *> ins, Ints shape) {
  Host<float> out(std::move(shape));
  std::fill(out.data.begin(), out.data.end(),
            std::numeric_limits<float>::quiet_NaN());
  std::vector<runtime::TensorRef> refs;
  for (Host<float> *h : ins)
    refs.push_back(h->ref());
  if (llvm::Error e = run(op, attrs, refs, {out.ref()}))
    ADD_FAILURE() << llvm::toString(std::move(e));
  return out;
}

bool sameBits(const Host<float> &a, const Host<float> &b) {
  return a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(),
                     a.data.size() * sizeof(float)) == 0;
}

// f's result on 1 thread, checked against 2 and 4.
void expectThreadIndependent(const std::string &what,
                             const std::function<Host<float>()> &f) {
  SCOPED_TRACE(what);
  testsupport::cpu(); // first, so it does not reset the pool below
  std::vector<Host<float>> results;
  for (int threads : {1, 2, 4}) {
    auto backend = runtime::createCpuBackend(threads);
    results.push_back(f());
  }
  auto restore = runtime::createCpuBackend(2); // what the other tests expect
  EXPECT_TRUE(sameBits(results[0], results[1])) << "2 threads";
  EXPECT_TRUE(sameBits(results[0], results[2])) << "4 threads";
}

} // namespace

TEST(CpuTransformerThreads, KernelsGiveTheSameBitsOnOneTwoAndFourThreads) {
  Host<float> q = randomHost<float>({8, 4, 128, 64}, 1),
              kt = randomHost<float>({8, 4, 64, 128}, 2),
              dy = randomHost<float>({8, 4, 128, 128}, 3);
  expectThreadIndependent("attention scores", [&] {
    return runOne(OpKind::MatMul, {}, {&q, &kt}, {8, 4, 128, 128});
  });
  expectThreadIndependent("scores' gradient A", [&] {
    return runOne(OpKind::MatMulGradA, {{"shape", Ints{8, 4, 128, 64}}},
                  {&dy, &kt}, {8, 4, 128, 64});
  });
  expectThreadIndependent("scores' gradient B", [&] {
    return runOne(OpKind::MatMulGradB, {{"shape", Ints{8, 4, 64, 128}}},
                  {&q, &dy}, {8, 4, 64, 128});
  });
  Host<float> g = randomHost<float>({1024, 256}, 4, -3, 3);
  expectThreadIndependent("bias gradient", [&] {
    return runOne(OpKind::SumTo, {{"shape", Ints{256}}}, {&g}, {256});
  });
  Host<float> h = randomHost<float>({8, 128, 1024}, 5, -6, 6),
              dh = randomHost<float>({8, 128, 1024}, 6);
  for (const char *form : {"none", "tanh"}) {
    expectThreadIndependent(std::string("gelu ") + form, [&] {
      return runOne(OpKind::Gelu, {{"approximate", std::string(form)}}, {&h},
                    {8, 128, 1024});
    });
    std::string fn = std::string(form) == "tanh" ? "gelu_tanh" : "gelu";
    expectThreadIndependent("gradient of gelu " + std::string(form), [&] {
      return runOne(OpKind::UnaryGrad, {{"fn", fn}}, {&dh, &h}, {8, 128, 1024});
    });
  }
  expectThreadIndependent("softmax", [&] {
    return runOne(OpKind::Softmax, {{"axis", int64_t(-1)}}, {&dy},
                  {8, 4, 128, 128});
  });
}

TEST(CpuTransformerThreads, BiasGradientPiecesAddUpToTheSum) {
  for (Ints shape : {Ints{1024, 256}, Ints{1000, 300}, Ints{8, 128, 768}}) {
    Host<float> x = randomHost<float>(shape, 7, -2, 2);
    int64_t n = shape.back(), rows = int64_t(x.data.size()) / n;
    Host<float> y = runOne(OpKind::SumTo, {{"shape", Ints{n}}}, {&x}, {n});
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t r = 0; r < rows; ++r)
        want += x.data[size_t(r * n + j)];
      EXPECT_NEAR(y.data[size_t(j)], want, 1e-5 * (1 + std::abs(want)))
          << "column " << j;
    }
  }
}

} // namespace unit_cpu_transformer_threads
