// The CUDA backend on a GPU against the CPU backend, op by op: the same
// cases the host test of the lowering runs on the emulated backend
// (CudaOpCases.h), here through device memory, the kernels of
// CudaKernels.cu and cuBLAS. Where no GPU is visible, as on CI, the device
// tests skip saying why, and what is checked is that asking for the device
// fails with one clear line. tools/gpu-check.sh runs these on a GPU.
#ifdef CLEAVE_HAVE_CUDA
#include "CudaOpCases.h"
#include "runtime/cuda/CudaBackend.h"

#include <gtest/gtest.h>

#include <string>

using namespace cleave;
using namespace cleave::cudatest;

namespace {

std::unique_ptr<runtime::Backend> deviceOrSkipReason(std::string &why) {
  auto b = runtime::createCudaBackend(0);
  if (!b) {
    why = llvm::toString(b.takeError());
    return nullptr;
  }
  return std::move(*b);
}

void checkAll(const std::vector<Case> &cases) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  for (const Case &c : cases)
    check(c, *gpu);
}

} // namespace

TEST(CudaBackend, WithoutADeviceOneClearLine) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (gpu)
    GTEST_SKIP() << "a CUDA device is visible; this checks the no-device path";
  EXPECT_EQ(why.rfind("no usable CUDA device (", 0), 0u) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  EXPECT_FALSE(bool(runtime::cudaDeviceCount()));
}

TEST(CudaBackend, ElementwiseAndCasts) { checkAll(elementwiseCases()); }
TEST(CudaBackend, DataMovementIsBitExact) { checkAll(dataMovementCases()); }
TEST(CudaBackend, Reductions) { checkAll(reductionCases()); }
TEST(CudaBackend, ProductsThroughCublas) { checkAll(productCases()); }
TEST(CudaBackend, RowsColumnsGathersAndOptimizers) { checkAll(rowCases()); }
TEST(CudaBackend, ConvolutionPoolingAndBatchNorm) {
  checkAll(convPoolNormCases());
}

TEST(CudaBackend, EverythingElse) { checkAll(remainingCases()); }

TEST(CudaBackend, LacksWhatItLacks) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  // The device agrees with the lowering's list (CudaLowering.CoversEveryCpuOp).
  EXPECT_TRUE(gpu->supports(ir::OpKind::LogSoftmax, ir::DType::F32));
  EXPECT_FALSE(gpu->supports(ir::OpKind::CumSum, ir::DType::F32));
  EXPECT_FALSE(gpu->supports(ir::OpKind::MatMul, ir::DType::I64));
  EXPECT_TRUE(gpu->supports(ir::OpKind::MatMul, ir::DType::BF16));
}
#endif
