// OpenBLAS is loaded with a kernel family that matches the CPU: on a machine
// with AVX2 it must not fall back to the SSE3 ("Prescott") kernels; the
// oneDNN GEMM choice keeps the thread-count promise.
#include "runtime/cpu/Blas.h"
#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace unit_cpu_blas {

using namespace cleave::runtime::cpu;

TEST(CpuBlas, UsesVectorKernelsTheCpuSupports) {
  std::string core = blas().coreName();
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2"))
    GTEST_SKIP() << "no AVX2 on this CPU; OpenBLAS chose " << core;
  EXPECT_NE(core, "Prescott");
  EXPECT_NE(core, "Core2");
}

TEST(CpuBlas, SgemmComputesAProduct) {
  const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
  float c[4] = {0, 0, 0, 0};
  blas().sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2,
               b, 2, 0.0f, c, 2);
  EXPECT_EQ(c[0], 19);
  EXPECT_EQ(c[1], 22);
  EXPECT_EQ(c[2], 43);
  EXPECT_EQ(c[3], 50);
}

// CLEAVE_GEMM=onednn keeps the promise OpenBLAS keeps: parallelGemm's
// blocks are fixed by the shape and each is one call on one thread, so 1,
// 2 and 4 threads give the same bits; and the products agree with
// OpenBLAS's to float rounding.
TEST(CpuBlas, OneDnnGemmBitsDoNotDependOnTheThreadCount) {
  if (!setGemmLibrary(GemmLibrary::OneDnn))
    GTEST_SKIP() << "libdnnl is not installed";
  struct Shape {
    bool ta, tb;
    int64_t m, n, k;
  };
  const Shape shapes[] = {{false, false, 1024, 256, 512},
                          {false, true, 512, 768, 256},
                          {true, false, 256, 1024, 384},
                          {false, false, 64, 1024, 576}};
  for (const Shape &s : shapes) {
    int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    std::vector<float> a(size_t(s.m * s.k)), b(size_t(s.k * s.n));
    for (size_t i = 0; i < a.size(); ++i)
      a[i] = float(int(i * 7919 % 201) - 100) / 64.0f;
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = float(int(i * 104729 % 199) - 99) / 128.0f;
    auto product = [&](GemmLibrary lib, int threads) {
      auto backend = cleave::runtime::createCpuBackend(threads);
      setGemmLibrary(lib);
      std::vector<float> c(size_t(s.m * s.n));
      parallelGemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda,
                          b.data(), ldb, 0.0f, c.data(), s.n);
      return c;
    };
    std::vector<float> one = product(GemmLibrary::OneDnn, 1);
    EXPECT_EQ(product(GemmLibrary::OneDnn, 2), one) << s.m << "x" << s.n;
    EXPECT_EQ(product(GemmLibrary::OneDnn, 4), one) << s.m << "x" << s.n;
    std::vector<float> ref = product(GemmLibrary::OpenBlas, 2);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_NEAR(one[i], ref[i], 1e-3f * (1.0f + std::abs(ref[i]))) << i;
  }
  setGemmLibrary(defaultGemmLibrary());
}

} // namespace unit_cpu_blas
