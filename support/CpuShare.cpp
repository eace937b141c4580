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

namespace {

// The kernel's count of runnable threads: /proc/loadavg's fourth field,
// "runnable/all".
std::optional<long> runnableNow() {
  std::ifstream load("/proc/loadavg");
  double avg[3];
  std::string entities;
  if (!(load >> avg[0] >> avg[1] >> avg[2] >> entities))
    return std::nullopt;
  char *end = nullptr;
  long runnable = std::strtol(entities.c_str(), &end, 10);
  if (end == entities.c_str() || *end != '/')
    return std::nullopt;
  return runnable;
}

// This process's threads in state R.
std::optional<long> ownRunnable() {
  DIR *dir = opendir("/proc/self/task");
  if (!dir)
    return std::nullopt;
  long own = 0;
  while (dirent *e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9')
      continue;
    char path[300], buf[512];
    std::snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue; // the thread ended
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
      continue;
    buf[n] = '\0';
    // "tid (name) S ...": the state follows the last ')'.
    const char *paren = std::strrchr(buf, ')');
    if (paren && paren[1] == ' ' && paren[2] == 'R')
      ++own;
  }
  closedir(dir);
  return own;
}

} // namespace

std::optional<int> otherRunnableThreads() {
  // The kernel's count before and after the scan of this process's
  // threads: where it moved (a thread woke or went to sleep meanwhile, as
  // the ranks' threads do all the time while steps overlap) the reading is
  // tried again, at most three times. The reading thread is in both
  // counts.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::optional<long> before = runnableNow();
    std::optional<long> own = ownRunnable();
    std::optional<long> after = runnableNow();
    if (!before || !own || !after)
      return std::nullopt;
    if (*before == *after)
      return int(std::max(0L, *before - *own));
  }
  return std::nullopt;
}

void SustainedRunnable::add(int reading) {
  windowLeast_ = inWindow_ == 0 ? reading : std::min(windowLeast_, reading);
  if (++inWindow_ < kWindow)
    return;
  least_.push_back(windowLeast_);
  inWindow_ = 0;
}

std::optional<double> SustainedRunnable::median() const {
  if (least_.size() < 2)
    return std::nullopt;
  std::vector<int> v = least_;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? double(v[n / 2]) : (v[n / 2 - 1] + v[n / 2]) / 2.0;
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
