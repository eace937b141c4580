#include "runtime/cpu/ThreadPool.h"

#include <climits>

namespace cleave::runtime::cpu {

ThreadPool::ThreadPool(int threads) {
  try {
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this] { workerLoop(); });
  } catch (...) {
    // The system ran out of threads (std::system_error): end the ones that
    // started, or their joinable handles would terminate the process.
    stopWorkers();
    throw;
  }
}

ThreadPool::~ThreadPool() { stopWorkers(); }

void ThreadPool::stopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

void ThreadPool::drain(uint32_t gen, int64_t count,
                       const std::function<void(int64_t)> &task) {
  for (;;) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    do {
      if (uint32_t(t >> 32) != gen || int64_t(t & 0xffffffffu) >= count)
        return;
    } while (!ticket_.compare_exchange_weak(t, t + 1,
                                            std::memory_order_acq_rel));
    task(int64_t(t & 0xffffffffu));
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == count) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_all();
    }
  }
}

void ThreadPool::workerLoop() {
  uint32_t seen = 0;
  for (;;) {
    // Kernels come back to back: watch for the next generation for a short
    // while (about 50 us) before sleeping, so a worker does not pay a
    // futex wake-up (tens of microseconds, longer than many kernels) on
    // every call. The generation is the high half of ticket_.
    for (int spin = 0; spin < kWorkerSpins; ++spin) {
      if (uint32_t(ticket_.load(std::memory_order_acquire) >> 32) != seen ||
          stopping_.load(std::memory_order_relaxed))
        break;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    const std::function<void(int64_t)> *task;
    int64_t count;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_)
        return;
      seen = generation_;
      task = task_;
      count = count_;
    }
    if (task)
      drain(seen, count, *task);
  }
}

void ThreadPool::run(int64_t n, const std::function<void(int64_t)> &task) {
  bool expected = false;
  if (n <= 1 || n > INT32_MAX || workers_.empty() ||
      !busy_.compare_exchange_strong(expected, true)) {
    for (int64_t i = 0; i < n; ++i)
      task(i);
    return;
  }
  uint32_t gen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    count_ = n;
    finished_.store(0);
    gen = ++generation_;
    ticket_.store(uint64_t(gen) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  drain(gen, n, task);
  // Spin briefly (the other share is usually nearly done), then sleep.
  for (int spin = 0; spin < 4000; ++spin)
    if (finished_.load(std::memory_order_acquire) == n)
      break;
  if (finished_.load(std::memory_order_acquire) != n) {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return finished_.load() == n; });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = nullptr;
    count_ = 0;
  }
  busy_.store(false);
}

} // namespace cleave::runtime::cpu
