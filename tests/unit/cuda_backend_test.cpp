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

#include <limits>
#include <string>
#include <vector>

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
TEST(CudaBackend, IndexOpsTileAndMod) { checkAll(indexCases()); }
TEST(CudaBackend, ResizeAndItsGradient) { checkAll(resizeCases()); }
TEST(CudaBackend, GridSampleAndItsGradients) { checkAll(gridSampleCases()); }

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

// The step's non-finite check runs on the GPU: a NaN or an infinity
// anywhere in an f32 or f64 buffer is found, finite values pass (the
// largest finite ones too).
TEST(CudaBackend, NonFiniteCheckOnTheDevice) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  const int64_t n = 3'000'001; // several blocks' grid-stride loops
  auto check = [&](auto fill, ir::DType dtype, int64_t at, auto bad) {
    using T = decltype(fill);
    std::vector<T> host(size_t(n), fill);
    host.back() = std::numeric_limits<T>::max();
    void *dev = gpu->allocate(host.size() * sizeof(T));
    ASSERT_NE(dev, nullptr);
    gpu->copyToDevice(dev, host.data(), host.size() * sizeof(T));
    EXPECT_TRUE(gpu->allFinite(dtype, dev, n));
    host[size_t(at)] = bad;
    gpu->copyToDevice(dev, host.data(), host.size() * sizeof(T));
    EXPECT_FALSE(gpu->allFinite(dtype, dev, n)) << "at " << at;
    EXPECT_TRUE(gpu->allFinite(dtype, dev, at)) << "before " << at;
    gpu->release(dev);
  };
  check(1.5f, ir::DType::F32, n - 1, std::numeric_limits<float>::quiet_NaN());
  check(-2.0f, ir::DType::F32, 12345, -std::numeric_limits<float>::infinity());
  check(0.25, ir::DType::F64, 777777, std::numeric_limits<double>::infinity());
}
#endif
