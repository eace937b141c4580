// OpenBLAS is loaded with a kernel family that matches the CPU: on a machine
// with AVX2 it must not fall back to the SSE3 ("Prescott") kernels.
#include "runtime/cpu/Blas.h"

#include <gtest/gtest.h>

#include <string>

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
