#include "runtime/cpu/ThreadPool.h"

namespace cleave::runtime::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i)
    workers_.emplace_back([this] { workerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

// Takes task indices until none are left.
void ThreadPool::drain() {
  for (;;) {
    int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= count_)
      return;
    (*task_)(i);
    if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
      std::lock_guard<std::mutex> lock(mu_);
      done_.notify_all();
    }
  }
}

void ThreadPool::workerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_)
        return;
      seen = generation_;
    }
    drain();
  }
}

void ThreadPool::run(int64_t n, const std::function<void(int64_t)> &task) {
  bool expected = false;
  if (n <= 1 || workers_.empty() ||
      !busy_.compare_exchange_strong(expected, true)) {
    for (int64_t i = 0; i < n; ++i)
      task(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &task;
    count_ = n;
    next_.store(0);
    finished_.store(0);
    ++generation_;
  }
  wake_.notify_all();
  drain();
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
