// The CUDA backend against the CPU backend, op by op (docs/design/cuda.md).
// Where no GPU is visible, as on CI, the device tests skip saying why, and
// what is checked is that asking for the device fails with one clear line.
// tools/gpu-check.sh runs these on a machine with a GPU.
#ifdef CLEAVE_HAVE_CUDA
#include "runtime/cuda/CudaBackend.h"

#include "runtime/Kernel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

using namespace cleave;
using runtime::Backend;
using runtime::KernelCall;
using runtime::TensorRef;

namespace {

std::unique_ptr<Backend> deviceOrSkipReason(std::string &why) {
  auto b = runtime::createCudaBackend(0);
  if (!b) {
    why = llvm::toString(b.takeError());
    return nullptr;
  }
  return std::move(*b);
}

std::vector<float> randomValues(size_t n, unsigned seed, float lo = -2,
                                float hi = 2) {
  std::vector<float> v(n);
  uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (float &x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = lo + (hi - lo) * float((s >> 40) & 0xffffff) / float(0xffffff);
  }
  return v;
}

struct Operand {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Runs `op` on both backends and returns (cpu, cuda) outputs.
std::pair<std::vector<float>, std::vector<float>>
runBoth(Backend &gpu, ir::OpKind op, const std::vector<Operand> &ins,
        const std::vector<int64_t> &outShape) {
  auto cpu = runtime::createCpuBackend(1);
  ir::AttrMap attrs;
  int64_t outN = 1;
  for (int64_t d : outShape)
    outN *= d;
  std::vector<float> cpuOut(static_cast<size_t>(outN)),
      gpuOut(static_cast<size_t>(outN));
  std::vector<TensorRef> cpuIns, gpuIns;
  std::vector<void *> gpuBuffers;
  for (const Operand &o : ins) {
    cpuIns.push_back({ir::DType::F32, o.shape,
                      const_cast<float *>(o.values.data())});
    void *p = gpu.allocate(o.values.size() * sizeof(float));
    gpu.copyToDevice(p, o.values.data(), o.values.size() * sizeof(float));
    gpuBuffers.push_back(p);
    gpuIns.push_back({ir::DType::F32, o.shape, p});
  }
  void *gpuOutBuf = gpu.allocate(size_t(outN) * sizeof(float));
  TensorRef cpuOutRef{ir::DType::F32, outShape, cpuOut.data()};
  TensorRef gpuOutRef{ir::DType::F32, outShape, gpuOutBuf};
  EXPECT_FALSE(bool(cpu->run(KernelCall{op, attrs, cpuIns, cpuOutRef, 0})));
  llvm::Error e = gpu.run(KernelCall{op, attrs, gpuIns, gpuOutRef, 0});
  EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
  gpu.copyToHost(gpuOut.data(), gpuOutBuf, gpuOut.size() * sizeof(float));
  for (void *p : gpuBuffers)
    gpu.release(p);
  gpu.release(gpuOutBuf);
  return {cpuOut, gpuOut};
}

void expectClose(const std::vector<float> &want, const std::vector<float> &got,
                 double rtol, double atol) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_LE(std::abs(double(got[i]) - want[i]),
              atol + rtol * std::abs(double(want[i])))
        << "at " << i;
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

TEST(CudaBackend, ElementwiseOpsMatchTheCpu) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  std::vector<int64_t> shape{3, 1000};
  std::vector<float> x = randomValues(3000, 1), y = randomValues(3000, 2),
                     positive = randomValues(3000, 3, 0.01f, 4);
  for (ir::OpKind op : {ir::OpKind::Relu, ir::OpKind::Neg, ir::OpKind::Abs,
                        ir::OpKind::Exp, ir::OpKind::Tanh, ir::OpKind::Erf,
                        ir::OpKind::Sigmoid}) {
    SCOPED_TRACE(ir::opInfo(op).name);
    auto [want, got] = runBoth(*gpu, op, {{shape, x}}, shape);
    expectClose(want, got, 1e-6, 1e-6);
  }
  for (ir::OpKind op : {ir::OpKind::Log, ir::OpKind::Sqrt}) {
    SCOPED_TRACE(ir::opInfo(op).name);
    auto [want, got] = runBoth(*gpu, op, {{shape, positive}}, shape);
    expectClose(want, got, 1e-6, 1e-6);
  }
  for (ir::OpKind op : {ir::OpKind::Add, ir::OpKind::Sub, ir::OpKind::Mul,
                        ir::OpKind::Div}) {
    SCOPED_TRACE(ir::opInfo(op).name);
    auto [want, got] = runBoth(*gpu, op, {{shape, x}, {shape, positive}}, shape);
    expectClose(want, got, 1e-6, 1e-6);
    auto [want2, got2] =
        runBoth(*gpu, op, {{shape, x}, {{}, {1.5f}}}, shape); // scalar
    expectClose(want2, got2, 1e-6, 1e-6);
  }
}

TEST(CudaBackend, MatMulMatchesTheCpu) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  // [B, T, C] x [C, D] (weights), and batched [B, M, K] x [B, K, N].
  auto [w1, g1] = runBoth(*gpu, ir::OpKind::MatMul,
                          {{{4, 16, 32}, randomValues(4 * 16 * 32, 4)},
                           {{32, 24}, randomValues(32 * 24, 5)}},
                          {4, 16, 24});
  expectClose(w1, g1, 1e-4, 1e-4);
  auto [w2, g2] = runBoth(*gpu, ir::OpKind::MatMul,
                          {{{3, 8, 5}, randomValues(3 * 8 * 5, 6)},
                           {{3, 5, 7}, randomValues(3 * 5 * 7, 7)}},
                          {3, 8, 7});
  expectClose(w2, g2, 1e-4, 1e-4);
}

TEST(CudaBackend, LacksWhatItLacks) {
  std::string why;
  auto gpu = deviceOrSkipReason(why);
  if (!gpu)
    GTEST_SKIP() << why;
  EXPECT_FALSE(gpu->supports(ir::OpKind::Conv, ir::DType::F32));
  EXPECT_FALSE(gpu->supports(ir::OpKind::Add, ir::DType::F64));
  EXPECT_TRUE(gpu->supports(ir::OpKind::MatMul, ir::DType::F32));
}
#endif
