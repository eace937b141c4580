// support/CpuShare: the kernel's figures on how much of the cores a run had.
#include "support/CpuShare.h"

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <ctime>
#include <sched.h>
#include <thread>
#include <sys/wait.h>
#include <unistd.h>

namespace unit_cpu_share {

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
  support::CpuUse from{100.0, 10.0, 50.0, std::nullopt};
  // In 2 s the machine was busy 3.5 core-seconds, this process 1.5 of them.
  support::CpuUse to{103.5, 11.5, 52.0, std::nullopt};
  ASSERT_TRUE(support::otherCoresBusy(from, to).has_value());
  EXPECT_DOUBLE_EQ(*support::otherCoresBusy(from, to), 1.0);
  // /proc/stat counts in hundredths of a second: too short a run says
  // nothing, and rounding never makes the others' share negative.
  EXPECT_FALSE(support::otherCoresBusy(from, {100.1, 10.1, 50.1, std::nullopt}).has_value());
  EXPECT_DOUBLE_EQ(*support::otherCoresBusy(from, {100.5, 10.6, 51.0, std::nullopt}), 0.0);
  EXPECT_GE(support::usableCores(), 1);
}

TEST(CpuShare, ReadsTheMachinesCounters) {
  auto a = support::cpuUseNow();
  if (!a)
    GTEST_SKIP() << "no /proc/stat";
  // Until this thread has run 0.25 s on a core (a loaded machine gives it
  // less than its wall time: 0.016 s of 0.25 beside a build), at most 20 s.
  auto cpuNow = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
  };
  const double start = cpuNow();
  auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  volatile uint64_t x = 0;
  while (cpuNow() - start < 0.25 && std::chrono::steady_clock::now() < giveUp)
    x = x + 1;
  auto b = support::cpuUseNow();
  ASSERT_TRUE(b.has_value());
  ASSERT_GE(cpuNow() - start, 0.25) << "the thread got no 0.25 s of CPU in 20 s";
  // The process's CPU and the machine's busy time both grew by about that
  // much (the machine's in hundredths).
  EXPECT_GT(b->ownCpu - a->ownCpu, 0.2);
  EXPECT_GT(b->machineBusy - a->machineBusy, 0.1);
  EXPECT_GE(b->wall - a->wall, 0.25);
}

// What other processes wanted: what they kept busy plus their threads'
// waits for a core, each thread's since the first reading (one that
// started in between from 0; one that ended is not seen).
TEST(CpuShare, OtherCoresWantedAddsTheirWaitsForACore) {
  support::CpuUse from{100.0, 10.0, 50.0, support::ThreadWaits{{5, 1000000000ull}, {6, 4000000000ull}, {7, 2000000000ull}}};
  support::CpuUse to{103.5, 11.5, 52.0, support::ThreadWaits{{5, 1500000000ull}, {7, 2000000000ull}, {9, 500000000ull}}};
  // Busy 1.0 of a core; waited 0.5 + 0 + 0.5 s in 2 s.
  ASSERT_TRUE(support::otherCoresWanted(from, to).has_value());
  EXPECT_DOUBLE_EQ(*support::otherCoresWanted(from, to), 1.5);
  // Without either scan, or too short a time for /proc/stat: no figure.
  support::CpuUse unscanned = to;
  unscanned.otherWaits.reset();
  EXPECT_FALSE(support::otherCoresWanted(from, unscanned).has_value());
  EXPECT_FALSE(support::otherCoresWanted(unscanned, to).has_value());
  support::CpuUse soon{100.1, 10.1, 50.1, support::ThreadWaits{}};
  EXPECT_FALSE(support::otherCoresWanted(from, soon).has_value());
}

// A busy process sharing one core with this process's busy thread gets
// about half of it and waits for it the other half: it wants the whole
// core, and the scan of its threads says so where /proc/stat's busy time
// says half.
TEST(CpuShare, ABusyNeighbourOnOurCoreWantsAllOfIt) {
  if (!support::otherThreadsWaits())
    GTEST_SKIP() << "no other process visible in /proc, or no schedstat";
  cpu_set_t all, one;
  if (sched_getaffinity(0, sizeof all, &all) != 0)
    GTEST_SKIP() << "no affinity mask";
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &all))
    ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    sched_setaffinity(0, sizeof one, &one);
    spin(30); // killed long before
    _exit(0);
  }
  std::atomic<bool> stop{false};
  std::thread own([&] {
    sched_setaffinity(0, sizeof one, &one);
    volatile uint64_t x = 0;
    while (!stop)
      x = x + 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto from = support::cpuUseNow(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  auto to = support::cpuUseNow(true);
  stop = true;
  own.join();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(from && to);
  std::optional<double> got = support::otherCoresBusy(*from, *to);
  std::optional<double> wanted = support::otherCoresWanted(*from, *to);
  ASSERT_TRUE(got && wanted);
  // Fair sharing: got about 0.5 and waited about 0.5 (a loaded machine
  // makes it wait more, and other processes add to both).
  EXPECT_GE(*wanted, 0.85);
  EXPECT_GE(*wanted - *got, 0.25);
}

} // namespace unit_cpu_share
