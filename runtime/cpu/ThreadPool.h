// A small fixed pool of worker threads for the CPU kernels' parallelFor.
//
// Why not OpenMP: libgomp's workers spin at barriers, and on a machine that
// is also running other work (a shared CI box, a second rank) that spinning
// made 2-thread kernels an order of magnitude slower than 1 thread. These
// workers spin only briefly (about 50 us after each call, enough to catch
// the next kernel of a step) and then sleep on a condition variable, and
// the calling thread takes a share of the work itself.
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
  // (The constructor throws std::system_error when the system cannot start
  // that many threads; createBackend turns that into an error.)
  int size() const { return int(workers_.size()) + 1; }

  // Runs task(i) for i in [0, n) across the pool and the caller; returns
  // when all are done. Not reentrant: a task must not call run() again (it
  // runs serially in that case).
  void run(int64_t n, const std::function<void(int64_t)> &task);

private:
  void workerLoop();
  void stopWorkers(); // wakes, ends and joins every worker
  // Runs tasks of generation `gen` until none are left. A thread still
  // draining an earlier generation claims nothing of a newer one: tasks are
  // claimed by a compare-and-swap on `ticket_`, which holds the generation
  // (high 32 bits) and the next task index (low 32 bits) together.
  void drain(uint32_t gen, int64_t count,
             const std::function<void(int64_t)> &task);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)> *task_ = nullptr; // guarded by mu_
  int64_t count_ = 0;                                  // guarded by mu_
  uint32_t generation_ = 0;                            // guarded by mu_
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int64_t> finished_{0};
  bool stop_ = false;                 // guarded by mu_
  std::atomic<bool> stopping_{false}; // stop_, for the workers' spin
  std::atomic<bool> busy_{false};
  static constexpr int kWorkerSpins = 1000; // pause instructions, ~50 us
};

} // namespace cleave::runtime::cpu
