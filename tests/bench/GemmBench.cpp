// f32 GEMM rates on the products cleave's training steps run, four ways in
// interleaved rounds (median of 15 after 3, GFLOP/s of the whole product):
//   cleave/openblas  parallelGemm, OpenBLAS calls on the backend's pool
//   cleave/onednn    parallelGemm, oneDNN sgemm calls on the pool (the
//                    CLEAVE_GEMM=onednn choice, auto's on AVX-512 CPUs;
//                    without AVX-512, transposed-A products stay on
//                    OpenBLAS)
//   onednn xT        one oneDNN call on T OpenMP threads (what PyTorch's
//                    CPU matmuls are like: one library call, its threads)
//   openblas xT      one OpenBLAS call on its own T threads, timed after
//                    the others (its idle threads spin for a while after a
//                    call, and interleaved they took the pool's cores)
// and whether each cleave path gives the same bits on 1 and T threads.
// Run with OMP_WAIT_POLICY=PASSIVE, so oneDNN's idle threads sleep too.
//   build/tests/cleave-bench-gemm [THREADS]
#include "runtime/Kernel.h"
#include "runtime/cpu/Blas.h"

#include <dnnl.h>
#include <omp.h>

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
using namespace cleave::runtime::cpu;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape {
  const char *name;
  bool ta, tb;
  int64_t m, n, k;
};

// The tests' GPT and the corpus transformers (d 256, 4d MLP, T 128, batch 8:
// 1024 rows) forward, B and W, and two batch-folded convolutions.
const Shape kShapes[] = {
    {"qkv fwd 1024x768x256", false, false, 1024, 768, 256},
    {"mlp-in fwd 1024x1024x256", false, false, 1024, 1024, 256},
    {"mlp-out fwd 1024x256x1024", false, false, 1024, 256, 1024},
    {"mlp-in B 1024x256x1024 (NT)", false, true, 1024, 256, 1024},
    {"qkv B 1024x256x768 (NT)", false, true, 1024, 256, 768},
    {"mlp-in W 256x1024x1024 (TN)", true, false, 256, 1024, 1024},
    {"mlp-out W 1024x256x1024 (TN)", true, false, 1024, 256, 1024},
    // BERT's and ViT's separate query, key and value projections.
    {"q fwd 1024x256x256", false, false, 1024, 256, 256},
    {"q B 1024x256x256 (NT)", false, true, 1024, 256, 256},
    {"q W 256x256x1024 (TN)", true, false, 256, 256, 1024},
    {"conv fold 64x1024x576", false, false, 64, 1024, 576},
    {"conv fold 256x64x2304", false, false, 256, 64, 2304},
    {"square 1024", false, false, 1024, 1024, 1024},
    // ViT at 32 x 32 in patches of 4 (65 tokens, batch 16: 1040 rows).
    {"vit qkv fwd 1040x768x256", false, false, 1040, 768, 256},
    {"vit mlp-in fwd 1040x1024x256", false, false, 1040, 1024, 256},
    {"vit mlp-out fwd 1040x256x1024", false, false, 1040, 256, 1024},
    {"vit mlp-in B 1040x256x1024 (NT)", false, true, 1040, 256, 1024},
    {"vit mlp-out B 1040x1024x256 (NT)", false, true, 1040, 1024, 256},
    // T 1024, batch 2 (2048 rows): the W products of the long-sequence
    // benchmarks.
    {"mlp-in fwd 2048x1024x256", false, false, 2048, 1024, 256},
    {"mlp-in W 256x1024x2048 (TN)", true, false, 256, 1024, 2048},
    {"mlp-out W 1024x256x2048 (TN)", true, false, 1024, 256, 2048},
};

std::vector<float> random(size_t n, unsigned seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float &x : v)
    x = u(rng);
  return v;
}

double seconds(const std::function<void()> &f) {
  auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  auto backend = runtime::createCpuBackend(threads);
  bool haveOneDnn = setGemmLibrary(GemmLibrary::OneDnn);
  setGemmLibrary(GemmLibrary::OpenBlas);
  std::printf("threads %d; OpenBLAS core %s; oneDNN %s; default %s\n",
              threads, blas().coreName(),
              haveOneDnn ? "loaded" : "not installed",
              gemmLibraryName(defaultGemmLibrary()));
  std::printf("%-30s %16s %14s %11s %12s   bits 1 vs %d threads "
              "(openblas/onednn)\n",
              "GFLOP/s", "cleave/openblas", "cleave/onednn", "onednn x",
              "openblas x", threads);
  for (const Shape &s : kShapes) {
    int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
    std::vector<float> a = random(size_t(s.m * s.k), 1),
                       b = random(size_t(s.k * s.n), 2),
                       c(size_t(s.m * s.n));
    auto cleaveGemm = [&](GemmLibrary lib) {
      setGemmLibrary(lib);
      parallelGemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda,
                          b.data(), ldb, 0.0f, c.data(), s.n);
      setGemmLibrary(GemmLibrary::OpenBlas);
    };
    auto openblasThreaded = [&] {
      blas().setThreads(threads);
      blas().sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans,
                   s.tb ? CblasTrans : CblasNoTrans, int(s.m), int(s.n),
                   int(s.k), 1.0f, a.data(), int(lda), b.data(), int(ldb),
                   0.0f, c.data(), int(s.n));
      blas().setThreads(1);
    };
    auto oneDnnThreaded = [&] {
      omp_set_num_threads(threads);
      dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.m, s.n, s.k, 1.0f,
                 a.data(), lda, b.data(), ldb, 0.0f, c.data(), s.n);
      omp_set_num_threads(1);
    };
    std::vector<std::function<void()>> ways = {
        [&] { cleaveGemm(GemmLibrary::OpenBlas); },
        [&] { cleaveGemm(GemmLibrary::OneDnn); }, oneDnnThreaded};
    if (!haveOneDnn)
      ways.resize(1);
    std::vector<std::vector<double>> times(ways.size());
    for (int round = 0; round < 18; ++round)
      for (size_t w = 0; w < ways.size(); ++w) {
        double t = seconds(ways[w]);
        if (round >= 3)
          times[w].push_back(t);
      }
    if (!haveOneDnn)
      times.resize(3);
    times.emplace_back();
    for (int round = 0; round < 18; ++round) {
      double t = seconds(openblasThreaded);
      if (round >= 3)
        times.back().push_back(t);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    std::printf("%-30s", s.name);
    const int widths[] = {16, 14, 11, 12};
    for (size_t w = 0; w < 4; ++w) {
      if (!times[w].empty())
        std::printf(" %*.1f", widths[w], flop / median(times[w]) / 1e9);
      else
        std::printf(" %*s", widths[w], "-");
    }
    // The cleave paths on 1 thread and on `threads`.
    std::string bits;
    for (GemmLibrary lib : {GemmLibrary::OpenBlas, GemmLibrary::OneDnn}) {
      if (lib == GemmLibrary::OneDnn && !haveOneDnn)
        break;
      cleaveGemm(lib);
      std::vector<float> many = c;
      auto one = runtime::createCpuBackend(1);
      cleaveGemm(lib);
      bool same = std::memcmp(many.data(), c.data(), c.size() * 4) == 0;
      backend = runtime::createCpuBackend(threads);
      bits += std::string(bits.empty() ? "" : "/") + (same ? "same" : "DIFFER");
    }
    std::printf("   %s\n", bits.c_str());
  }
  return 0;
}
