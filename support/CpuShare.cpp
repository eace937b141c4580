#include "support/CpuShare.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <cstdlib>
#include <fcntl.h>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>
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

// The second of a schedstat file's three numbers (ns on a core, ns
// waiting on a run queue, time slices), from the `n` bytes read into buf.
std::optional<unsigned long long> schedstatWait(char *buf, ssize_t n) {
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
  return waiting;
}

} // namespace

std::optional<double> threadCoreWaitSeconds() {
  thread_local SchedStatFile file;
  if (file.fd < 0)
    return std::nullopt;
  char buf[96];
  std::optional<unsigned long long> waiting =
      schedstatWait(buf, pread(file.fd, buf, sizeof buf - 1, 0));
  if (!waiting)
    return std::nullopt;
  return double(*waiting) * 1e-9;
}

std::optional<CpuUse> cpuUseNow(bool otherWaits) {
  CpuUse u;
  // First: the scan takes a while, the rest is read together.
  if (otherWaits)
    u.otherWaits = otherThreadsWaits();
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

namespace {

bool allDigits(const char *name) {
  if (!*name)
    return false;
  for (const char *c = name; *c; ++c)
    if (*c < '0' || *c > '9')
      return false;
  return true;
}

// A schedstat file's wait, by path; nullopt where the thread ended.
std::optional<unsigned long long> schedstatWait(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return std::nullopt;
  char buf[96];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  return schedstatWait(buf, n);
}

} // namespace

std::optional<ThreadWaits> otherThreadsWaits() {
  DIR *proc = opendir("/proc");
  if (!proc)
    return std::nullopt;
  const long self = long(getpid());
  ThreadWaits waits;
  while (dirent *p = readdir(proc)) {
    if (!allDigits(p->d_name) || std::strtol(p->d_name, nullptr, 10) == self)
      continue;
    char dirPath[300];
    std::snprintf(dirPath, sizeof dirPath, "/proc/%s/task", p->d_name);
    DIR *tasks = opendir(dirPath);
    if (!tasks)
      continue; // the process ended
    while (dirent *t = readdir(tasks)) {
      if (!allDigits(t->d_name))
        continue;
      char path[600];
      std::snprintf(path, sizeof path, "%s/%s/schedstat", dirPath, t->d_name);
      if (std::optional<unsigned long long> w = schedstatWait(path))
        waits.emplace_back(std::strtol(t->d_name, nullptr, 10), *w);
    }
    closedir(tasks);
  }
  closedir(proc);
  if (waits.empty())
    return std::nullopt;
  std::sort(waits.begin(), waits.end());
  return waits;
}

std::optional<double> otherCoresWanted(const CpuUse &from, const CpuUse &to) {
  std::optional<double> busy = otherCoresBusy(from, to);
  if (!busy || !from.otherWaits || !to.otherWaits)
    return std::nullopt;
  // Each thread's wait since the first reading: both lists are sorted by
  // thread id; one missing from the first started in between.
  const ThreadWaits &before = *from.otherWaits;
  double waited = 0;
  auto it = before.begin();
  for (const auto &[tid, ns] : *to.otherWaits) {
    while (it != before.end() && it->first < tid)
      ++it;
    unsigned long long since =
        it != before.end() && it->first == tid ? it->second : 0;
    if (ns > since)
      waited += double(ns - since) * 1e-9;
  }
  return *busy + waited / (to.wall - from.wall);
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
