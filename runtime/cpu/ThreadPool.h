// A small fixed pool of worker threads for the CPU kernels' parallelFor.
//
// Why not OpenMP: libgomp's workers spin at barriers, and on a machine that
// is also running other work (a shared CI box, a second rank) that spinning
// made 2-thread kernels an order of magnitude slower than 1 thread. These
// workers spin only briefly and then sleep on a condition variable, and the
// calling thread takes a share of the work itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cleave::runtime::cpu {

class ThreadPool {
public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  int size() const { return int(workers_.size()) + 1; }

  // Runs task(i) for i in [0, n) across the pool and the caller; returns
  // when all are done. Not reentrant: a task must not call run() again (it
  // runs serially in that case).
  void run(int64_t n, const std::function<void(int64_t)> &task);

private:
  void workerLoop();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)> *task_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0}, finished_{0};
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::atomic<bool> busy_{false};
};

} // namespace cleave::runtime::cpu
