// Measures the figures of the analytic cost model's `cpu` device profile
// (passes/Cost.cpp, docs/design/partition.md) on this machine:
//   peak FLOP/s    the runtime's own f32 GEMM (OpenBLAS split over the
//                  backend's thread pool) on 1024 x 1024 x 1024;
//   bandwidth      a STREAM-like triad a[i] = b[i] + s·c[i] over 64 MiB
//                  arrays, split over the same number of threads, counting
//                  3 arrays of traffic (2 read, 1 written);
// best of 5 runs each, so a busy neighbour lowers the figures less.
//   build/tests/cleave-bench-device-profile [THREADS]
#include "runtime/Kernel.h"
#include "runtime/cpu/Blas.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

using namespace cleave::runtime::cpu;
using Clock = std::chrono::steady_clock;

template <typename F> static double bestSeconds(int runs, F &&work) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    auto start = Clock::now();
    work();
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

static double gemmFlops() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n, 0.0f);
  double s = bestSeconds(5, [&] {
    parallelGemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n,
                        0.0f, c.data(), n);
  });
  return 2.0 * n * n * n / s;
}

static double triadBandwidth(int threads) {
  const size_t n = (64u << 20) / sizeof(float);
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  auto triad = [&] {
    std::vector<std::thread> workers;
    size_t chunk = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        size_t lo = t * chunk, hi = std::min(n, lo + chunk);
        for (size_t i = lo; i < hi; ++i)
          a[i] = b[i] + 3.0f * c[i];
      });
    for (std::thread &w : workers)
      w.join();
  };
  triad(); // touch the pages once
  double s = bestSeconds(5, triad);
  return 3.0 * double(n) * sizeof(float) / s;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1])
                         : int(std::thread::hardware_concurrency());
  std::printf("threads            %d\n", threads);
  // The backend sizes the pool parallelGemm splits over; without one the
  // product ran on the calling thread alone (the figure of one thread).
  auto backend = cleave::runtime::createCpuBackend(threads);
  std::printf("sgemm 1024^3       %.3g FLOP/s\n", gemmFlops());
  std::printf("triad 64 MiB       %.3g bytes/s\n", triadBandwidth(threads));
  return 0;
}
