#include "tools/HostProfile.h"

#include "runtime/FusedAttentionCall.h"
#include "runtime/Kernel.h"
#include "runtime/Stages.h"
#include "runtime/cpu/Blas.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
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

// The fused attention kernels (forward and backward) on 4 heads of 512
// queries and keys, head size 64, f32, no mask: FLOP/s as the cost model
// counts them (2 products forward, 7 backward, of 2 Tq Tk D each).
double attentionFlops() {
  const int64_t heads = 4, len = 512, dim = 64, n = heads * len * dim;
  std::vector<float> q(n, 0.01f), k(n, 0.02f), v(n, 0.5f), o(n), dout(n, 1.0f),
      dq(n), dk(n), dv(n), lse(heads * len);
  std::vector<double> delta(heads * len);
  auto input = [&](const std::vector<float> &x) {
    runtime::cuda::AttnInput in;
    in.data = x.data();
    in.strides[0] = n, in.strides[1] = len * dim, in.strides[2] = dim,
    in.strides[3] = 1;
    return in;
  };
  auto output = [&](std::vector<float> &x) {
    runtime::cuda::AttnOutput out;
    out.data = x.data();
    out.strides[0] = n, out.strides[1] = len * dim, out.strides[2] = dim,
    out.strides[3] = 1;
    return out;
  };
  runtime::cuda::AttentionOperands a;
  a.batch = 1, a.queryHeads = a.kvHeads = heads, a.queryLen = a.keyLen = len,
  a.headDim = dim, a.scale = runtime::cuda::defaultAttentionScale(dim);
  a.q = input(q), a.k = input(k), a.v = input(v);
  runtime::cuda::AttentionStep fwd;
  fwd.in = a, fwd.out = output(o), fwd.lse = lse.data();
  runtime::cuda::AttentionGradStep bwd;
  bwd.in = a, bwd.out = input(o), bwd.dOut = input(dout);
  bwd.lse = lse.data(), bwd.delta = delta.data();
  bwd.dq = output(dq), bwd.dk = output(dk), bwd.dv = output(dv);
  auto both = [&] {
    runtime::runAttentionForwardOnCpu(fwd);
    runtime::runAttentionBackwardOnCpu(bwd);
  };
  both();
  double product = 2.0 * heads * len * len * dim;
  return 9 * product / bestSeconds(3, both);
}

} // namespace

passes::DeviceProfile measureHostProfile(int threads) {
  passes::DeviceProfile p = llvm::cantFail(passes::lookupDeviceProfile("cpu"));
  p.name = "host";
  {
    // parallelGemm splits over the pool of the backend alive on the thread.
    auto backend = runtime::createCpuBackend(threads);
    p.peakFlops = p.peakFlops16 = gemmFlops();
    p.attentionFlops = attentionFlops();
  }
  p.memBandwidth = p.linkBandwidth = triadBandwidth(threads);
  return p;
}

std::string defaultDeviceProfile() {
  const char *env = std::getenv("CLEAVE_DEVICE_PROFILE");
  return env && *env ? env : "host";
}

llvm::Expected<std::string>
chooseDeviceProfile(const std::optional<std::string> &flag, int stagesOnHost) {
  std::string name = flag ? *flag : defaultDeviceProfile();
  if (llvm::Error e = prepareDeviceProfile(name, stagesOnHost)) {
    if (flag)
      return std::move(e);
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "CLEAVE_DEVICE_PROFILE: " +
                                       llvm::toString(std::move(e)));
  }
  return name;
}

llvm::Error prepareDeviceProfile(llvm::StringRef name, int stagesOnHost) {
  if (name == "host") {
    int threads = int(runtime::threadsPerStage(0, stagesOnHost));
    static int measuredFor = 0;
    if (measuredFor != threads) {
      passes::DeviceProfile p = measureHostProfile(threads);
      passes::registerDeviceProfile(p);
      measuredFor = threads;
      llvm::errs() << llvm::format(
          "note: --device-profile host: measured here on %d thread(s) a "
          "stage: f32 products %.3g FLOP/s, fused attention %.3g FLOP/s, "
          "memory %.3g bytes/s\n",
          threads, p.peakFlops, p.attentionFlops, p.memBandwidth);
    }
    return llvm::Error::success();
  }
  return passes::lookupDeviceProfile(name).takeError();
}

} // namespace cleave::tools
