// The CPU's fused attention kernels (runtime/cpu/Attention.cpp) alone, at
// the shapes of the training benchmarks, and the pieces a tile is made of
// on one thread: GFLOP/s forward and backward (2 products forward, 7
// backward, of 2 Tq Tk D each, the causal rule's hidden half not counted),
// best of 5 after one warm-up, beside the runtime's sgemm on 1024^3 on the
// same threads; the operands in [B, H, T, D] and in the two layouts the
// exporters give (seq_major [B, T, H, D], time_major [T, B, H, D]).
// CLEAVE_BENCH_COLD=1 sweeps the caches before every timed call, as a
// training step finds its operands.
//   build/tests/cleave-bench-attention [THREADS]
#include "runtime/FusedAttentionCall.h"
#include "runtime/Kernel.h"
#include "runtime/cpu/Blas.h"
#include "runtime/cpu/VectorMath.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

using namespace cleave;
namespace dev = cleave::runtime::cuda;
using Clock = std::chrono::steady_clock;

namespace {

// With CLEAVE_BENCH_COLD set, the caches are swept (64 MB written) before
// each timed call, as a training step finds its operands.
double bestSeconds(int runs, const std::function<void()> &f) {
  f();
  double best = 1e30;
  static const bool cold = std::getenv("CLEAVE_BENCH_COLD") != nullptr;
  static std::vector<char> sweep(cold ? 64 << 20 : 0);
  for (int r = 0; r < runs; ++r) {
    if (cold)
      std::memset(sweep.data(), r, sweep.size());
    auto t0 = Clock::now();
    f();
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Case {
  int64_t batch, heads, len, dim;
  bool causal;
  // The operands' layout: [B, H, T, D] (0), as exported by the models that
  // keep the heads beside each other, [B, T, H, D] (1, BERT, GPT-2), or
  // [T, B, H, D] (2, nn.MultiheadAttention: ViT).
  int layout = 0;
  // The lower triangle as a boolean [1, 1, T, T] mask, causal off: a
  // triangle held in a buffer and tested through Equal (nanoGPT, the tests'
  // GPT), which recognize-attention cannot prove to be the rule.
  bool tril = false;
};

void runCase(const Case &c) {
  const int64_t n = c.batch * c.heads * c.len * c.dim;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto random = [&] {
    std::vector<float> x(static_cast<size_t>(n));
    for (float &e : x)
      e = dist(rng);
    return x;
  };
  std::vector<float> q = random(), k = random(), v = random(), dout = random(),
                     o(n), dq(n), dk(n), dv(n), lse(n / c.dim);
  std::vector<double> delta(n / c.dim);
  auto strides = [&](auto &x) {
    const int64_t h = c.heads, t = c.len, d = c.dim, b = c.batch;
    x.strides[3] = 1;
    if (c.layout == 0)
      x.strides[0] = h * t * d, x.strides[1] = t * d, x.strides[2] = d;
    else if (c.layout == 1)
      x.strides[0] = t * h * d, x.strides[1] = d, x.strides[2] = h * d;
    else
      x.strides[0] = h * d, x.strides[1] = d, x.strides[2] = b * h * d;
  };
  auto input = [&](const std::vector<float> &x) {
    dev::AttnInput in;
    in.data = x.data();
    strides(in);
    return in;
  };
  auto output = [&](std::vector<float> &x) {
    dev::AttnOutput out;
    out.data = x.data();
    strides(out);
    return out;
  };
  dev::AttentionOperands a;
  a.batch = c.batch, a.queryHeads = a.kvHeads = c.heads;
  a.queryLen = a.keyLen = c.len, a.headDim = c.dim;
  a.scale = dev::defaultAttentionScale(c.dim);
  a.causal = c.causal;
  a.q = input(q), a.k = input(k), a.v = input(v);
  std::vector<uint8_t> keep;
  if (c.tril) {
    keep.resize(size_t(c.len * c.len));
    for (int64_t i = 0; i < c.len; ++i)
      for (int64_t j = 0; j <= i; ++j)
        keep[size_t(i * c.len + j)] = 1;
    a.keep.data = keep.data();
    a.keep.strides[0] = a.keep.strides[1] = 0;
    a.keep.strides[2] = c.len, a.keep.strides[3] = 1;
  }
  dev::AttentionStep fwd;
  fwd.in = a, fwd.out = output(o), fwd.lse = lse.data();
  dev::AttentionGradStep bwd;
  bwd.in = a, bwd.out = input(o), bwd.dOut = input(dout);
  bwd.lse = lse.data(), bwd.delta = delta.data();
  bwd.dq = output(dq), bwd.dk = output(dk), bwd.dv = output(dv);
  double product = 2.0 * c.batch * c.heads * c.len * c.len * c.dim;
  if (c.causal || c.tril)
    product *= 0.5;
  double f = bestSeconds(5, [&] { runtime::runAttentionForwardOnCpu(fwd); });
  double b = bestSeconds(5, [&] { runtime::runAttentionBackwardOnCpu(bwd); });
  const char *layouts[] = {"BHTD", "BTHD", "TBHD"};
  std::printf("%3lld x %lld heads x T %5lld x D %lld %-7s %s  fwd %7.2f ms %6.1f "
              "GFLOP/s   bwd %7.2f ms %6.1f GFLOP/s\n",
              (long long)c.batch, (long long)c.heads, (long long)c.len,
              (long long)c.dim,
              c.causal ? "causal" : c.tril ? "tril" : "full", layouts[c.layout],
              f * 1e3,
              2 * product / f * 1e-9, b * 1e3, 7 * product / b * 1e-9);
}

// The pieces of a 128-query x 128-key tile with head size 64, on the
// calling thread: its products and its exp over the scores.
void pieces() {
  const int64_t r = 128, d = 64;
  std::vector<float> a(r * r, 0.5f), b(r * r, 0.25f), c(r * r);
  auto rate = [&](bool ta, bool tb, int64_t m, int64_t nn, int64_t kk) {
    const int reps = 200;
    double s = bestSeconds(5, [&] {
      for (int i = 0; i < reps; ++i)
        runtime::cpu::gemm<float>(ta, tb, m, nn, kk, 1.0f, a.data(),
                                  ta ? m : kk, b.data(), tb ? kk : nn, 0.0f,
                                  c.data(), nn);
    });
    return 2.0 * m * nn * kk * reps / s * 1e-9;
  };
  std::printf("one thread: S = Q K^T (128x128x64, NT) %.1f GFLOP/s, "
              "P V (128x64x128, NN) %.1f, dS^T Q (TN) %.1f, sgemm 512^3 "
              "%.1f\n",
              rate(false, true, r, r, d), rate(false, false, r, d, r),
              rate(true, false, r, d, r), [&] {
                std::vector<float> x(512 * 512, 0.5f), y(512 * 512, 0.25f),
                    z(512 * 512);
                double s = bestSeconds(5, [&] {
                  runtime::cpu::gemm<float>(false, false, 512, 512, 512, 1.0f,
                                            x.data(), 512, y.data(), 512, 0.0f,
                                            z.data(), 512);
                });
                return 2.0 * 512 * 512 * 512 / s * 1e-9;
              }());
  std::vector<float> s(r * r, -1.0f);
  const int reps = 200;
  double t = bestSeconds(5, [&] {
    for (int i = 0; i < reps; ++i)
      for (int64_t row = 0; row < r; ++row)
        runtime::cpu::expShiftedSum(s.data() + row * r, r, 0.5, c.data());
  });
  double t2 = bestSeconds(5, [&] {
    for (int i = 0; i < reps; ++i)
      for (int64_t row = 0; row < r; ++row)
        runtime::cpu::expShifted(s.data() + row * r, r, 0.5, 1.0,
                                 c.data() + row * r);
  });
  std::printf("one thread: exp and sum over a 128x128 tile %.2f us (%.2f ns "
              "a score), exp alone %.2f us; the tile's products take %.2f "
              "us at 100 GFLOP/s\n",
              t / reps * 1e6, t / reps / (r * r) * 1e9, t2 / reps * 1e6,
              2.0 * 2 * r * r * d / 100e9 * 1e6);
}

} // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1])
                         : int(std::thread::hardware_concurrency());
  std::printf("threads %d, GEMM library %s\n", threads,
              runtime::cpu::gemmLibraryName(runtime::cpu::gemmLibrary()));
  pieces();
  auto backend = runtime::createCpuBackend(threads);
  const Case cases[] = {{2, 4, 512, 64, true},  {2, 4, 1024, 64, true},
                        {1, 4, 2048, 64, true}, {2, 4, 1024, 64, false},
                        {8, 4, 128, 64, true},  {8, 4, 128, 64, false},
                        {8, 4, 128, 64, true, 1}, {8, 4, 128, 64, false, 1},
                        {4, 4, 256, 64, true},  {4, 4, 256, 64, true, 1},
                        {8, 4, 128, 64, false, 1, true},
                        {16, 4, 65, 64, false},  {16, 4, 65, 64, false, 2}};
  for (const Case &c : cases)
    runCase(c);
  return 0;
}
