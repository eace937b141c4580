// How much of the machine's cores a run had to itself, read from the
// kernel: the time a thread spent ready to run but waiting for a core (its
// run-queue delay, /proc/thread-self/schedstat), and the CPU time the whole
// machine spent busy (/proc/stat) against this process's own. cleave-run
// reports both, so that a step slower than planned because other processes
// held the cores says so instead of looking like a wrong cost model
// (docs/design/runtime.md, "Sharing the cores").
#pragma once

#include <optional>

namespace cleave::support {

// Seconds the calling thread has waited, runnable, for a core since it
// started; nullopt where the kernel does not keep the figure.
std::optional<double> threadCoreWaitSeconds();

// The machine's busy CPU seconds (every core's user, nice, system, irq,
// softirq and steal time, summed), this process's CPU seconds, and the
// steady clock, read together.
struct CpuUse {
  double machineBusy = 0; // from /proc/stat: 1/100 s resolution
  double ownCpu = 0;      // this process, all threads
  double wall = 0;
};
std::optional<CpuUse> cpuUseNow();

// The cores other processes kept busy, on average, between two readings:
// (machine busy - own) / wall, at least 0; nullopt when less than 0.2 s
// passed (/proc/stat counts in hundredths of a second).
std::optional<double> otherCoresBusy(const CpuUse &from, const CpuUse &to);

// The cores the kernel runs this process on (its affinity mask), at least 1.
int usableCores();

} // namespace cleave::support
