// The f32 activations of runtime/cpu/VectorMath.h (the build the CPU
// picks: AVX-512, AVX2 + FMA or the baseline), one thread, ns an element:
// the fastest of many passes over an array that stays in L1 (4096
// elements, the default) or one that does not (a larger N).
//   build/tests/cleave-bench-activations [N]
#include "runtime/cpu/VectorMath.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

using namespace cleave::runtime::cpu;

int main(int argc, char **argv) {
  const int64_t n = argc > 1 ? std::max(1L, std::atol(argv[1])) : 4096;
  const size_t count = static_cast<size_t>(n);
  std::vector<float> x(count), dy(count), out(count);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    x[size_t(i)] = normal(gen);
    dy[size_t(i)] = normal(gen);
  }
  const float *px = x.data(), *pdy = dy.data();
  float *po = out.data();
  struct Case {
    const char *name;
    std::function<void()> run;
  };
  const Case cases[] = {
      {"gelu (erf)", [&] { geluArray(px, n, false, po); }},
      {"gelu (erf) gradient", [&] { geluGradArray(pdy, px, n, false, po); }},
      {"gelu (tanh)", [&] { geluArray(px, n, true, po); }},
      {"gelu (tanh) gradient", [&] { geluGradArray(pdy, px, n, true, po); }},
      {"sigmoid", [&] { sigmoidArray(px, n, po); }},
      {"silu", [&] { siluArray(px, n, po); }},
      {"silu gradient", [&] { siluGradArray(pdy, px, n, po); }},
      {"tanh", [&] { tanhArray(px, n, po); }},
  };
  // About 3e7 elements a measurement, whatever n.
  const int64_t reps = std::max<int64_t>(1, 30000000 / n);
  std::printf("%-22s %8s   (n = %lld, fastest of 7 x %lld passes)\n", "f32",
              "ns/elem", static_cast<long long>(n),
              static_cast<long long>(reps));
  for (const Case &c : cases) {
    double best = 1e30;
    for (int round = 0; round < 7; ++round) {
      auto start = std::chrono::steady_clock::now();
      for (int64_t r = 0; r < reps; ++r)
        c.run();
      double s = std::chrono::duration<double>(
                     std::chrono::steady_clock::now() - start)
                     .count();
      best = std::min(best, s);
    }
    std::printf("%-22s %8.3f\n", c.name, best * 1e9 / double(reps * n));
  }
  return out[0] == 12345.0f; // keeps the work
}
