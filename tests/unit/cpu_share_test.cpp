// support/CpuShare: the kernel's figures on how much of the cores a run had.
#include "support/CpuShare.h"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <sched.h>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

using namespace cleave;

namespace {

// Spins for `seconds` of wall time on the calling thread.
void spin(double seconds) {
  auto end = std::chrono::steady_clock::now() +
             std::chrono::duration<double>(seconds);
  volatile uint64_t x = 0;
  while (std::chrono::steady_clock::now() < end)
    x = x + 1;
}

} // namespace

TEST(CpuShare, ThreadsSharingOneCoreWaitForIt) {
  if (!support::threadCoreWaitSeconds())
    GTEST_SKIP() << "the kernel keeps no run-queue delay (schedstat)";
  // Two threads pinned to one core, both busy for 0.3 s: each is ready
  // while the other runs, so each waits for the core a good part of it.
  cpu_set_t one;
  CPU_ZERO(&one);
  if (sched_getaffinity(0, sizeof one, &one) != 0)
    GTEST_SKIP() << "no affinity mask";
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &one))
    ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  double waited[2] = {0, 0};
  std::atomic<int> ready{0};
  auto work = [&](int i) {
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    ++ready;
    while (ready < 2)
      std::this_thread::yield();
    double before = support::threadCoreWaitSeconds().value_or(0);
    spin(0.3);
    waited[i] = support::threadCoreWaitSeconds().value_or(0) - before;
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  // Fair sharing makes it about 0.15 s each; a loaded machine only more.
  EXPECT_GT(waited[0] + waited[1], 0.1);
  // Alone on its core (or sharing it with whatever else runs), this thread
  // has waited for a core no longer than the wall time since it started.
  double mine = support::threadCoreWaitSeconds().value_or(-1);
  EXPECT_GE(mine, 0);
}

TEST(CpuShare, OtherCoresAreTheMachinesBusyTimeLessOurs) {
  support::CpuUse from{100.0, 10.0, 50.0};
  // In 2 s the machine was busy 3.5 core-seconds, this process 1.5 of them.
  support::CpuUse to{103.5, 11.5, 52.0};
  ASSERT_TRUE(support::otherCoresBusy(from, to).has_value());
  EXPECT_DOUBLE_EQ(*support::otherCoresBusy(from, to), 1.0);
  // /proc/stat counts in hundredths of a second: too short a run says
  // nothing, and rounding never makes the others' share negative.
  EXPECT_FALSE(support::otherCoresBusy(from, {100.1, 10.1, 50.1}).has_value());
  EXPECT_DOUBLE_EQ(*support::otherCoresBusy(from, {100.5, 10.6, 51.0}), 0.0);
  EXPECT_GE(support::usableCores(), 1);
}

TEST(CpuShare, ReadsTheMachinesCounters) {
  auto a = support::cpuUseNow();
  if (!a)
    GTEST_SKIP() << "no /proc/stat";
  spin(0.25);
  auto b = support::cpuUseNow();
  ASSERT_TRUE(b.has_value());
  // This thread ran 0.25 s: the process's CPU and the machine's busy time
  // both grew by about that much (the machine's in hundredths).
  EXPECT_GT(b->ownCpu - a->ownCpu, 0.1);
  EXPECT_GT(b->machineBusy - a->machineBusy, 0.1);
  EXPECT_GE(b->wall - a->wall, 0.25);
}

// A busy process beside this one is a runnable thread of another process
// at every sample, whether or not it holds a core at that instant; this
// process's own busy thread is not counted.
TEST(CpuShare, CountsOtherProcessesRunnableThreads) {
  if (!support::otherRunnableThreads())
    GTEST_SKIP() << "no /proc/loadavg or /proc/self/task";
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    spin(30); // killed long before
    _exit(0);
  }
  std::atomic<bool> stop{false};
  std::thread own([&] {
    volatile uint64_t x = 0;
    while (!stop)
      x = x + 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int samples = 0, total = 0;
  for (int i = 0; i < 40; ++i) {
    // No reading where the kernel's count kept moving (a busy machine).
    if (std::optional<int> n = support::otherRunnableThreads()) {
      EXPECT_GE(*n, 0);
      total += *n;
      ++samples;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop = true;
  own.join();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_GE(samples, 10);
  // The child: 1 at every reading (more where the machine runs other work).
  EXPECT_GE(double(total) / samples, 0.9);
}

// The least reading of each window: a thread that was ready in some
// readings of five (woken now and then) does not count, one ready in all
// does; the median over the windows.
TEST(CpuShare, SustainedRunnableKeepsEachWindowsLeast) {
  support::SustainedRunnable s;
  for (int r : {1, 2, 1, 1, 1})
    s.add(r);
  EXPECT_FALSE(s.median().has_value()); // one window is too few
  for (int r : {0, 1, 2, 1, 3})
    s.add(r);
  ASSERT_TRUE(s.median().has_value());
  EXPECT_DOUBLE_EQ(*s.median(), 0.5);
  for (int r : {2, 2, 2, 2})
    s.add(r);
  EXPECT_DOUBLE_EQ(*s.median(), 0.5); // an unfinished window is not counted
  s.add(3);
  EXPECT_DOUBLE_EQ(*s.median(), 1.0);
}
