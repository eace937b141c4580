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

namespace unit_cuda_backend {

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

// A step's gradients checked in one call (one flag, one synchronization):
// the same answer as each buffer alone, whichever buffer holds the bad
// value; empty and unchecked buffers pass.
TEST(CudaBackend, NonFiniteCheckOfManyBuffersOnTheDevice) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  std::vector<float> a(100003, 0.5f), b(7, -3.0f);
  std::vector<double> d(4099, 2.0);
  std::vector<uint16_t> h(8, 0x7fc0); // bf16 NaNs: not checked
  auto upload = [&](const void *host, size_t bytes) {
    void *dev = gpu->allocate(bytes);
    EXPECT_NE(dev, nullptr);
    gpu->copyToDevice(dev, host, bytes);
    return dev;
  };
  void *da = upload(a.data(), a.size() * 4), *db = upload(b.data(), 28),
       *dd = upload(d.data(), d.size() * 8), *dh = upload(h.data(), 16);
  using Check = runtime::Backend::FiniteCheck;
  std::vector<Check> all = {{ir::DType::F32, da, int64_t(a.size())},
                            {ir::DType::F32, db, 0},
                            {ir::DType::BF16, dh, 8},
                            {ir::DType::F64, dd, int64_t(d.size())},
                            {ir::DType::F32, db, int64_t(b.size())}};
  EXPECT_TRUE(gpu->allBuffersFinite(all));
  float nan = std::numeric_limits<float>::quiet_NaN();
  gpu->copyToDevice(static_cast<float *>(da) + 100002, &nan, 4);
  EXPECT_FALSE(gpu->allBuffersFinite(all));
  gpu->copyToDevice(da, a.data(), a.size() * 4);
  double inf = std::numeric_limits<double>::infinity();
  gpu->copyToDevice(static_cast<double *>(dd) + 17, &inf, 8);
  EXPECT_FALSE(gpu->allBuffersFinite(all));
  gpu->copyToDevice(dd, d.data(), d.size() * 8);
  gpu->copyToDevice(static_cast<float *>(db) + 6, &nan, 4);
  EXPECT_FALSE(gpu->allBuffersFinite(all));
  EXPECT_TRUE(gpu->allBuffersFinite({}));
  for (void *p : {da, db, dd, dh})
    gpu->release(p);
}

} // namespace unit_cuda_backend
#endif
