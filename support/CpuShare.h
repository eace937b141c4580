// How much of the machine's cores a run had to itself, read from the
// kernel: the time a thread spent ready to run but waiting for a core (its
// run-queue delay, /proc/thread-self/schedstat), and the CPU time the whole
// machine spent busy (/proc/stat) against this process's own. cleave-run
// reports both, so that a step slower than planned because other processes
// held the cores says so instead of looking like a wrong cost model
// (docs/design/runtime.md, "Sharing the cores").
#pragma once

#include <optional>
#include <vector>

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

// Threads of other processes running or ready to run right now: the
// kernel's count of runnable threads (/proc/loadavg's fourth field) less
// this process's threads in state R (/proc/self/task/*/stat), at least 0.
// A CPU-bound neighbour counts 1 whether or not it holds a core at that
// instant: what it wants, where otherCoresBusy says what it got (beside
// ranks that keep its core busy too, a busy loop got 0.67 to 1.0 of a
// core, run to run). About 20 us with a dozen threads; nullopt where the
// files cannot be read or the kernel's count moved during three readings.
std::optional<int> otherRunnableThreads();

// Other processes' threads that stay ready to run, from readings of
// otherRunnableThreads some milliseconds apart: the least of each kWindow
// readings in a row, and the median of those. A CPU-bound neighbour shows
// in every reading; a thread that wants a core now and then does not stay:
// the process reading this one's step lines, woken by each line, waits for
// a core while the ranks and a busy neighbour hold them all. Beside
// gpt-tiny's ranks and one busy loop single readings averaged 1.25 to 1.36
// (1.7 to 1.9 while steps overlapped), the windows' least readings 1.0 to
// 1.25 (one window in eight at 2), their median 1.
class SustainedRunnable {
public:
  static constexpr int kWindow = 5;
  void add(int reading);
  // The median of the windows' least readings; nullopt below 2 windows.
  std::optional<double> median() const;

private:
  int windowLeast_ = 0, inWindow_ = 0;
  std::vector<int> least_; // by window
};

// The cores the kernel runs this process on (its affinity mask), at least 1.
int usableCores();

} // namespace cleave::support
