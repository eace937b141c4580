// The kernels' thread pool: every task of a run executes exactly once, also
// when runs follow each other so fast that a worker is still leaving the
// previous run (a worker must never claim a task of a newer run with a
// stale view, which once lost or doubled a completion and hung the caller).
#include "runtime/cpu/ThreadPool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace unit_cpu_thread_pool {

using cleave::runtime::cpu::ThreadPool;

TEST(ThreadPool, BackToBackRunsExecuteEachTaskOnce) {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(8);
    for (int round = 0; round < 20000; ++round) {
      int64_t n = 2 + round % 6; // sizes change between runs too
      for (int64_t i = 0; i < n; ++i)
        hits[i].store(0);
      pool.run(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << "round " << round << " task " << i;
    }
  }
}

TEST(ThreadPool, NestedRunsExecuteSerially) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.run(2, [&](int64_t) {
    pool.run(3, [&](int64_t) { inner.fetch_add(1); });
  });
  EXPECT_EQ(inner.load(), 6);
}

} // namespace unit_cpu_thread_pool
