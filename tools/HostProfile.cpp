#include "tools/HostProfile.h"

#include "runtime/FusedAttentionCall.h"
#include "runtime/Kernel.h"
#include "runtime/Stages.h"
#include "runtime/cpu/Blas.h"
#include "runtime/comm/Comm.h"

#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string_view>
#include <thread>
#include <unistd.h>
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

// The ops whose integer operands are indices or labels (any zero is one).
bool indexesWithIntegers(ir::OpKind kind) {
  switch (kind) {
  case ir::OpKind::Gather:
  case ir::OpKind::GatherGrad:
  case ir::OpKind::GatherElements:
  case ir::OpKind::GatherElementsGrad:
  case ir::OpKind::ScatterND:
  case ir::OpKind::ScatterNDGradData:
  case ir::OpKind::ScatterNDGradUpdates:
  case ir::OpKind::ScatterElements:
  case ir::OpKind::ScatterElementsGradData:
  case ir::OpKind::ScatterElementsGradUpdates:
  case ir::OpKind::SoftmaxCrossEntropyLoss:
  case ir::OpKind::SoftmaxCrossEntropyLossGrad:
    return true;
  default:
    return false;
  }
}

// One message from a stage's thread to another's that has waited for it a
// while, in the runtime's in-process comm: the median over 100 messages,
// each sent after the sender computed (spun) for 300 us while the receiver
// slept in its receive, of the time from the send to the receive's return
// (`latency`) and of the send call itself (`sendSeconds`: the copy and the
// receiver's wake-up, which the sending stage pays). A short wait is
// cheaper than that (a virtual machine's idle core polls a while before
// it halts: a 50 us gap measured 2 us on a 2-core AMD EPYC, 300 us and
// more 15 to 22 us, and 4 to 7 us to send); a pipeline's stages wait for
// whole actions. The corpus's tiny GPT-2 on 2 stages measured 16 to 18 us
// a waited receive (cleave-run --profile).
struct HandOff {
  double latency = 0, sendSeconds = 0;
};

HandOff measureHandOff() {
  auto comms = runtime::createInProcessComms(2, /*timeoutSeconds=*/10);
  constexpr int kRounds = 100;
  constexpr double kBusySeconds = 300e-6;
  std::vector<double> latencies, sends;
  latencies.reserve(kRounds);
  sends.reserve(kRounds);
  std::atomic<bool> failed{false};
  auto nanos = [] {
    return int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                       Clock::now().time_since_epoch())
                       .count());
  };
  std::thread echo([&] {
    for (int i = 0; i < kRounds && !failed; ++i) {
      int64_t stamp = 0;
      if (llvm::Error e = comms[1]->recv(0, 1, i, &stamp, sizeof stamp)) {
        llvm::consumeError(std::move(e));
        return;
      }
      latencies.push_back(double(nanos() - stamp) * 1e-9);
      if (llvm::Error e = comms[1]->send(0, 2, i, &stamp, sizeof stamp)) {
        llvm::consumeError(std::move(e));
        return;
      }
    }
  });
  for (int i = 0; i < kRounds; ++i) {
    auto busy = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - busy).count() <
           kBusySeconds) {
    }
    int64_t stamp = nanos();
    llvm::Error e = comms[0]->send(1, 1, i, &stamp, sizeof stamp);
    sends.push_back(double(nanos() - stamp) * 1e-9);
    if (!e)
      e = comms[0]->recv(1, 2, i, &stamp, sizeof stamp);
    if (e) {
      llvm::consumeError(std::move(e));
      failed = true;
      comms[0]->abort("host profile: the hand-off measurement failed");
      break;
    }
  }
  echo.join();
  HandOff out;
  if (failed || latencies.empty() || sends.empty())
    return out;
  auto median = [](std::vector<double> &v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  out.latency = median(latencies);
  out.sendSeconds = median(sends);
  return out;
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

// What makes an op's time: its kind, attributes and operand and result
// types (not its values, for the ops the timer runs).
std::string opKey(const ir::Op &op) {
  std::string key(op.name());
  for (const auto &[name, attr] : op.attrs()) {
    key += ' ' + name + '=';
    switch (attr.kind()) {
    case ir::AttrKind::Int: key += std::to_string(attr.getInt()); break;
    case ir::AttrKind::Float: key += std::to_string(attr.getFloat()); break;
    case ir::AttrKind::String: key += attr.getString(); break;
    case ir::AttrKind::Ints:
      for (int64_t v : attr.getInts())
        key += std::to_string(v) + ',';
      break;
    case ir::AttrKind::Floats:
      for (float v : attr.getFloats())
        key += std::to_string(v) + ',';
      break;
    default: key += '?'; break; // a tensor or strings: not timed (below)
    }
  }
  for (const ir::Value *v : op.operands())
    key += " (" + v->type().str() + ')';
  key += " ->";
  for (const ir::Value *v : op.results())
    key += ' ' + v->type().str();
  return key;
}

// Times ops on this machine with the runtime's own kernels, once per
// distinct key (kind, attributes, types): operands of the op's types filled
// with values in [-1, 1), one run to set up, then the median of 3 runs
// (from cold caches where time() says so: evictCaches; else each right
// after its operands and results were read into the caches, as the ops
// that made them leave them in a step), each scaled by the slowdown of a
// reference product run just before it. Not after an untimed run of the
// op itself: in a step other kernels ran in between, and a run of its own
// left its code, branch history and the pool's workers ready for it (the
// corpus's tiny GPT-2 and LLaMA, one stage: predicted 1.46 and 1.49x under
// that way, 1.20 and 1.33 with the operands read; the benchmark-size
// corpus models the same within noise). An op over a
// quarter second by the formulas, or any after 20 s of timing in one
// compile, is left to the formulas; so is one with operands that are not floats or not of static
// shapes (an index or a shape operand: its values matter), or with tensor
// or string-list attributes. The cost model asks only for the ops whose
// time does not depend on their values (passes/Cost.cpp).
class OpTimer {
public:
  OpTimer(int threads, double peakFlops)
      : threads_(threads), peakFlops_(peakFlops) {}

  // What the timing did since the last call, for the user: a note, or ""
  // when nothing was timed.
  std::string takeNote() {
    std::string note;
    if (timed_ > 0)
      note = llvm::formatv("note: --device-profile host: timed {0} distinct "
                           "op(s) with this machine's kernels in {1:F2} s",
                           timed_, spent_)
                 .str();
    if (untimed_ > 0)
      note += llvm::formatv("{0}{1} by the formulas (over {2} s each, or past "
                            "the {3} s budget)",
                            note.empty() ? "note: --device-profile host: "
                                         : "; ",
                            untimed_, kLongestSeconds, kBudgetSeconds)
                  .str();
    timed_ = untimed_ = 0;
    return note;
  }

  std::optional<double> time(const ir::Op &op, double stepBytes) {
    bool cold = passes::opWork(op).bytes > double(levelTwoBytes()) ||
                (op.phase() != ir::Phase::Fwd &&
                 stepBytes > double(lastLevelBytes()));
    std::string key = opKey(op) + (cold ? " cold" : " warm");
    auto it = times_.find(key);
    if (it != times_.end())
      return it->second;
    std::optional<double> t = measure(op, cold);
    times_.emplace(key, t);
    return t;
  }

private:
  std::optional<double> measure(const ir::Op &op, bool cold) {
    if (spent_ > kBudgetSeconds ||
        passes::opWork(op).flops / peakFlops_ > kLongestSeconds) {
      ++untimed_;
      return std::nullopt;
    }
    // Integer operands only where they are indices or labels, which zeros
    // keep in range (elsewhere an integer is a size, a shape or a count,
    // and zero would not be the op's); booleans anywhere.
    for (const ir::Value *v : op.operands())
      if (v->type().numElements() < 0 ||
          (ir::isInteger(v->type().dtype) && !indexesWithIntegers(op.kind())))
        return std::nullopt;
    for (const ir::Value *v : op.results())
      if (v->type().numElements() < 0)
        return std::nullopt;
    for (const auto &[name, attr] : op.attrs())
      if (attr.kind() == ir::AttrKind::Tensor ||
          attr.kind() == ir::AttrKind::Strings)
        return std::nullopt;
    auto start = Clock::now();
    // parallelGemm and the kernels split over the pool of the newest
    // backend: made here, so that it has the stage's threads.
    auto backend = runtime::createCpuBackend(threads_);
    if (!backend->supports(op.kind(), op.operand(0)->type().dtype))
      return std::nullopt;
    std::vector<std::unique_ptr<void, std::function<void(void *)>>> buffers;
    auto buffer = [&](const ir::TensorType &t) {
      size_t bytes = std::max<size_t>(size_t(t.byteSize()), 64);
      void *p = backend->allocate(bytes);
      buffers.emplace_back(p, [&backend](void *q) { backend->release(q); });
      return p;
    };
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    llvm::SmallVector<runtime::TensorRef, 4> ins, outs;
    for (const ir::Value *v : op.operands()) {
      const ir::TensorType &t = v->type();
      void *p = buffer(t);
      if (t.dtype == ir::DType::F32 || t.dtype == ir::DType::F64) {
        for (int64_t i = 0; i < t.numElements(); ++i) {
          float f = uniform(rng);
          if (t.dtype == ir::DType::F32)
            static_cast<float *>(p)[i] = f;
          else
            static_cast<double *>(p)[i] = f;
        }
      } else if (t.dtype == ir::DType::Bool) {
        // A square mask as the causal triangle (a boolean attention mask
        // usually is one, and the attention skips the tiles it hides: all
        // false would time nothing), anything else all true.
        auto *b = static_cast<uint8_t *>(p);
        int64_t n = t.shape.size() >= 2 ? t.shape.back() : 0;
        bool square = n > 0 && t.shape[t.shape.size() - 2] == n;
        for (int64_t i = 0; i < t.numElements(); ++i)
          b[i] = !square || i % n <= (i / n) % n;
      } else if (ir::isInteger(t.dtype)) {
        // Indices and labels: 0 is in range of every table and class.
        std::memset(p, 0, size_t(t.byteSize()));
      } else { // 16-bit floats: 0x3400, finite as either (f16 1/4)
        std::vector<uint16_t> small(size_t(t.numElements()), 0x3400);
        std::memcpy(p, small.data(), small.size() * 2);
      }
      ins.push_back({t.dtype, t.shape, p});
    }
    for (const ir::Value *v : op.results())
      outs.push_back({v->type().dtype, v->type().shape, buffer(v->type())});
    runtime::KernelCall call{op.kind(), op.attrs(), ins, outs, 0};
    if (referenceBest_ == 0) { // on this backend's threads, warm
      referenceBest_ = reference();
      for (int r = 1; r < kReferenceRuns; ++r)
        referenceBest_ = std::min(referenceBest_, reference());
    }
    // Each run is scaled by how much slower than its best the reference
    // product ran right before it (never made faster than measured): a
    // shared machine's slow spell, which lasts far longer than an op,
    // slows both alike. The corpus BERT's step, six compiles each way
    // interleaved: predicted 141 to 176 ms without, 118 to 158 with, for a
    // measured 118 to 124.
    auto touch = [&](llvm::ArrayRef<runtime::TensorRef> refs) {
      for (const runtime::TensorRef &t : refs) {
        int64_t n = 1;
        for (int64_t d : t.shape)
          n *= d;
        size_t bytes = size_t(n) * ir::dtypeSize(t.dtype);
        auto *p = static_cast<volatile const char *>(t.data);
        for (size_t i = 0; i < bytes; i += 64)
          (void)p[i];
      }
    };
    auto once = [&](bool cold) -> std::optional<double> {
      double now = reference(); // the first wakes the pool's workers
      now = std::min(now, reference());
      referenceBest_ = std::min(referenceBest_, now); // the best so far
      double slowdown = std::max(1.0, now / referenceBest_);
      if (cold) {
        evictCaches();
      } else {
        touch(ins);
        touch(outs);
      }
      auto t0 = Clock::now();
      if (llvm::Error e = backend->run(call)) {
        llvm::consumeError(std::move(e));
        return std::nullopt;
      }
      return std::chrono::duration<double>(Clock::now() - t0).count() /
             slowdown;
    };
    std::vector<double> runs;
    if (once(false)) // sets up the library's kernels for these shapes
      for (int r = 0; r < kRuns; ++r)
        if (std::optional<double> t = once(cold))
          runs.push_back(*t);
    spent_ += std::chrono::duration<double>(Clock::now() - start).count();
    ++timed_;
    if (runs.empty())
      return std::nullopt;
    std::sort(runs.begin(), runs.end());
    return runs[runs.size() / 2];
  }

  // Where an op finds its operands in a training step: an op whose
  // operands and results outgrow a core's L2 streams them from memory; a
  // B, W or update op reads values made long before (the stash, the
  // parameters), gone from the caches unless the whole step fits in the
  // last level (L3). Those are timed from cold caches (each run after
  // other bytes replaced the caches' contents), the rest warm (their
  // operands just made). Measured on ResNet-18 (CIFAR size, 2 threads,
  // Intel Xeon with 2 MiB of L2 a core and a shared L3; measured step 59
  // to 63 ms): every op warm 42 ms, every op cold 58 ms; the corpus's tiny
  // GPT-2 (ops of kilobytes, step 1.5 ms) every op cold 2.8 ms. On an AMD
  // EPYC with 1 MiB of L2 that GPT-2's 1.2 MB step was past L2, and its
  // B and W ops, timed cold, came out 3 to 7 times their measured time.
  static size_t levelTwoBytes() {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? size_t(l2) : size_t(2) << 20;
  }
  // The largest cache a core reads through, as the kernel's cache
  // topology lists it for CPU 0 (/sys/devices/system/cpu/cpu0/cache); L2
  // where that cannot be read. (sysconf's L3 is not it: in a virtual
  // machine on a 2-core AMD EPYC it said 384 MiB, the host's sum, where
  // the topology says 32 MiB.)
  static size_t lastLevelBytes() {
    static const size_t bytes = [] {
      size_t best = 0;
      int bestLevel = 0;
      for (int i = 0; i < 8; ++i) {
        std::string dir =
            "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
        std::ifstream levelFile(dir + "/level"), sizeFile(dir + "/size");
        int level = 0;
        std::string size;
        if (!(levelFile >> level) || !(sizeFile >> size) || size.empty())
          continue;
        char unit = size.back();
        size_t n = size_t(std::strtoull(size.c_str(), nullptr, 10));
        n *= unit == 'K' ? size_t(1) << 10 : unit == 'M' ? size_t(1) << 20 : 1;
        if (level > bestLevel || (level == bestLevel && n > best)) {
          bestLevel = level;
          best = n;
        }
      }
      return std::max(best, levelTwoBytes());
    }();
    return bytes;
  }
  void evictCaches() {
    evict_.resize(kEvictBytes);
    for (size_t i = 0; i < evict_.size(); i += 64)
      evict_[i] = char(evict_[i] + 1);
  }

  // The reference: a 256^3 f32 product (about 0.1 ms on 2 threads here)
  // on the pool of the backend alive on this thread.
  double reference() {
    constexpr int64_t n = 256;
    if (refA_.empty()) {
      refA_.assign(n * n, 0.5f);
      refC_.assign(n * n, 0.0f);
    }
    auto t0 = Clock::now();
    runtime::cpu::parallelGemm<float>(false, false, n, n, n, 1.0f,
                                      refA_.data(), n, refA_.data(), n, 0.0f,
                                      refC_.data(), n);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  static constexpr int kReferenceRuns = 9;
  double referenceBest_ = 0;
  std::vector<float> refA_, refC_;
  static constexpr double kBudgetSeconds = 20, kLongestSeconds = 0.25;
  static constexpr int kRuns = 3;
  static constexpr size_t kEvictBytes = size_t(64) << 20;
  std::vector<char> evict_;
  int threads_;
  double peakFlops_;
  std::map<std::string, std::optional<double>> times_;
  double spent_ = 0;
  int timed_ = 0, untimed_ = 0;
};

std::shared_ptr<OpTimer> &hostTimer() {
  static std::shared_ptr<OpTimer> timer;
  return timer;
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
  HandOff handOff = measureHandOff();
  if (handOff.latency > 0) {
    p.linkLatency = handOff.latency;
    p.sendOverhead = handOff.sendSeconds;
  }
  if (const char *env = std::getenv("CLEAVE_HOST_OP_TIMES");
      env && std::string_view(env) == "0")
    return p;
  p.timeOp = hostOpTimer(threads, p.peakFlops);
  return p;
}

std::function<std::optional<double>(const ir::Op &, double)>
hostOpTimer(int threads, double peakFlops) {
  auto timer = std::make_shared<OpTimer>(threads, peakFlops);
  hostTimer() = timer;
  return [timer](const ir::Op &op, double stepBytes) {
    return timer->time(op, stepBytes);
  };
}

void noteHostOpTimes() {
  if (hostTimer())
    if (std::string note = hostTimer()->takeNote(); !note.empty())
      llvm::errs() << note << "\n";
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
          "memory %.3g bytes/s, a message between stages %.3g us (%.3g us "
          "to send it)\n",
          threads, p.peakFlops, p.attentionFlops, p.memBandwidth,
          p.linkLatency * 1e6, p.sendOverhead * 1e6);
    }
    return llvm::Error::success();
  }
  return passes::lookupDeviceProfile(name).takeError();
}

} // namespace cleave::tools
