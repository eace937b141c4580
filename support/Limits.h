// The largest sizes cleave accepts for what a user asks of a run: kernel
// threads, workers (pipeline stages x data-parallel replicas), microbatches
// per step and training steps. Asked for by flags (cleavec, cleave-run, ...)
// or read from a plan's header, such counts size thread pools, per-worker
// state and per-microbatch tables, so an absurd one would exhaust threads or
// memory long after the point where it could have been refused. The
// standard bounds fit a machine and a modest cluster; --allow-large raises
// them to the large bounds, which only keep the counts addressable. A plan's
// header is checked against the large bounds (a plan made with
// --allow-large still loads).
#pragma once

#include <cstdint>

namespace cleave::support {

struct SizeLimits {
  int64_t threads;      // kernel threads per stage
  int64_t workers;      // stages x data-parallel replicas
  int64_t microbatches; // per step and replica
  int64_t steps;        // training steps of one run
};

// threads: 4 x this machine's hardware threads (1024 when unknown);
// workers 4096; microbatches 2^20; steps 2^40.
SizeLimits standardLimits();
// threads 2^16, workers 2^20, microbatches 2^24, steps 2^62.
SizeLimits largeLimits();

inline SizeLimits limitsFor(bool allowLarge) {
  return allowLarge ? largeLimits() : standardLimits();
}

} // namespace cleave::support
