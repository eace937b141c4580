#include "support/CpuShare.h"

#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sched.h>
#include <string>
#include <thread>
#include <unistd.h>

namespace cleave::support {

namespace {

// This thread's /proc/thread-self/schedstat, opened on its first reading
// and closed when the thread ends: a read of the open file costs about
// 0.6 us, an open, read and close about 5 (measured on the 2-core EPYC),
// and a profiled step reads it several times an action.
struct SchedStatFile {
  int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  ~SchedStatFile() {
    if (fd >= 0)
      close(fd);
  }
};

} // namespace

std::optional<double> threadCoreWaitSeconds() {
  thread_local SchedStatFile file;
  if (file.fd < 0)
    return std::nullopt;
  // Three numbers: ns on a core, ns waiting on a run queue, time slices.
  char buf[96];
  ssize_t n = pread(file.fd, buf, sizeof buf - 1, 0);
  if (n <= 0)
    return std::nullopt;
  buf[n] = '\0';
  char *end = nullptr;
  std::strtoull(buf, &end, 10);
  if (end == buf)
    return std::nullopt;
  char *after = nullptr;
  unsigned long long waiting = std::strtoull(end, &after, 10);
  if (after == end)
    return std::nullopt;
  return double(waiting) * 1e-9;
}

std::optional<CpuUse> cpuUseNow() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  // user nice system idle iowait irq softirq steal (guest time is already
  // inside user and nice).
  unsigned long long v[8] = {};
  if (!(in >> cpu) || cpu != "cpu")
    return std::nullopt;
  for (unsigned long long &x : v)
    if (!(in >> x))
      return std::nullopt;
  long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0)
    return std::nullopt;
  timespec own{};
  if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &own) != 0)
    return std::nullopt;
  CpuUse u;
  u.machineBusy = double(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / double(hz);
  u.ownCpu = double(own.tv_sec) + double(own.tv_nsec) * 1e-9;
  u.wall = std::chrono::duration<double>(
               std::chrono::steady_clock::now().time_since_epoch())
               .count();
  return u;
}

std::optional<double> otherCoresBusy(const CpuUse &from, const CpuUse &to) {
  double wall = to.wall - from.wall;
  if (wall < 0.2)
    return std::nullopt;
  double others = (to.machineBusy - from.machineBusy) - (to.ownCpu - from.ownCpu);
  return others > 0 ? others / wall : 0.0;
}

int usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    if (int n = CPU_COUNT(&set); n > 0)
      return n;
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? int(n) : 1;
}

} // namespace cleave::support
