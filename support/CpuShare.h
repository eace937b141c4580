// How much of the machine's cores a run had to itself, read from the
// kernel: the time a thread spent ready to run but waiting for a core (its
// run-queue delay, /proc/thread-self/schedstat), and the CPU time the whole
// machine spent busy (/proc/stat) against this process's own. cleave-run
// reports both, so that a step slower than planned because other processes
// held the cores says so instead of looking like a wrong cost model
// (docs/design/runtime.md, "Sharing the cores").
#pragma once

#include <optional>
#include <utility>
#include <vector>

namespace cleave::support {

// Seconds the calling thread has waited, runnable, for a core since it
// started; nullopt where the kernel does not keep the figure.
std::optional<double> threadCoreWaitSeconds();

// Threads' waits for a core: (thread id, nanoseconds), by thread id.
using ThreadWaits = std::vector<std::pair<long, unsigned long long>>;

// The machine's busy CPU seconds (every core's user, nice, system, irq,
// softirq and steal time, summed), this process's CPU seconds, and the
// steady clock, read together.
struct CpuUse {
  double machineBusy = 0; // from /proc/stat: 1/100 s resolution
  double ownCpu = 0;      // this process, all threads
  double wall = 0;
  // Other processes' threads' waits for a core (otherThreadsWaits), where
  // asked for.
  std::optional<ThreadWaits> otherWaits;
};
// With `otherWaits`, also reads otherThreadsWaits (a scan of /proc).
std::optional<CpuUse> cpuUseNow(bool otherWaits = false);

// The cores other processes kept busy, on average, between two readings:
// (machine busy - own) / wall, at least 0; nullopt when less than 0.2 s
// passed (/proc/stat counts in hundredths of a second).
std::optional<double> otherCoresBusy(const CpuUse &from, const CpuUse &to);

// Every thread of other processes that this process can see and the
// nanoseconds it has waited, runnable, for a core since it started
// (/proc/PID/task/TID/schedstat): about 0.5 ms for a hundred
// threads. nullopt where no other process shows (another PID namespace, a
// hidden /proc) or the kernel keeps no run-queue delay.
std::optional<ThreadWaits> otherThreadsWaits();

// The cores other processes wanted, on average, between two readings: the
// cores they kept busy (otherCoresBusy) plus their threads' waits for a
// core (a thread that started in between counts from 0; one that ended is
// not seen), per second: their threads running or ready to run, on
// average. A CPU-bound neighbour wants 1 whether or not the ranks left it
// its core (beside gpt-tiny's overlapping steps one busy loop got 0.93 of
// a core and waited 0.06); time-integrated, so ranks waking and sleeping
// thousands of times a second do not upset it, as they did instantaneous
// counts of runnable threads. nullopt where either reading lacks
// otherWaits or otherCoresBusy has no figure.
std::optional<double> otherCoresWanted(const CpuUse &from, const CpuUse &to);

// The cores the kernel runs this process on (its affinity mask), at least 1.
int usableCores();

} // namespace cleave::support
