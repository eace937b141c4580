#include "tools/HostProfile.h"

#include "runtime/Kernel.h"
#include "runtime/cpu/Blas.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace cleave::tools {
namespace {

using Clock = std::chrono::steady_clock;

template <typename F> double bestSeconds(int runs, F &&work) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    auto start = Clock::now();
    work();
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

double gemmFlops() {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n, 0.0f);
  auto product = [&] {
    runtime::cpu::parallelGemm<float>(false, false, n, n, n, 1.0f, a.data(),
                                      n, b.data(), n, 0.0f, c.data(), n);
  };
  product(); // the library's first call sets itself up
  return 2.0 * n * n * n / bestSeconds(5, product);
}

double triadBandwidth(int threads) {
  const size_t n = (64u << 20) / sizeof(float);
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  auto triad = [&] {
    std::vector<std::thread> workers;
    size_t chunk = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        size_t lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
        for (size_t i = lo; i < hi; ++i)
          a[i] = b[i] + 3.0f * c[i];
      });
    for (std::thread &w : workers)
      w.join();
  };
  triad(); // touch the pages once
  return 3.0 * double(n) * sizeof(float) / bestSeconds(5, triad);
}

} // namespace

passes::DeviceProfile measureHostProfile(int threads) {
  passes::DeviceProfile p = llvm::cantFail(passes::lookupDeviceProfile("cpu"));
  p.name = "host";
  {
    // parallelGemm splits over the pool of the backend alive on the thread.
    auto backend = runtime::createCpuBackend(threads);
    p.peakFlops = p.peakFlops16 = gemmFlops();
  }
  p.memBandwidth = p.linkBandwidth = triadBandwidth(threads);
  return p;
}

llvm::Error prepareDeviceProfile(llvm::StringRef name) {
  if (name == "host") {
    static bool measured = false;
    if (!measured) {
      int threads = std::max(1u, std::thread::hardware_concurrency());
      passes::DeviceProfile p = measureHostProfile(threads);
      passes::registerDeviceProfile(p);
      measured = true;
      llvm::errs() << llvm::format(
          "note: --device-profile host: measured here on %d thread(s): f32 "
          "products %.3g FLOP/s, memory %.3g bytes/s\n",
          threads, p.peakFlops, p.memBandwidth);
    }
    return llvm::Error::success();
  }
  return passes::lookupDeviceProfile(name).takeError();
}

} // namespace cleave::tools
