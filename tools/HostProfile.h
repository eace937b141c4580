// `--device-profile host`: the analytic cost model's figures measured on
// the machine cleavec runs on, when asked for, instead of the fixed `cpu`
// profile (measured once on this machine kind, under load).
#pragma once

#include "passes/Cost.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <functional>
#include <optional>
#include <string>

namespace cleave::tools {

// The runtime's own f32 GEMM (parallelGemm over the CPU backend's pool of
// `threads`) on 1024^3 and a STREAM-like triad over 64 MiB arrays split
// over as many threads, best of 5 runs each (about a second): peakFlops
// (and peakFlops16: the CPU widens bf16), memBandwidth and the link (stages
// on one host pass tensors by memcpy); overhead and latency are the `cpu`
// profile's estimates. And timeOp: each distinct op the cost model asks
// about, run with the runtime's own kernel on `threads` on operands of its
// types, once per compile (HostProfile.cpp says which ops and the bounds);
// CLEAVE_HOST_OP_TIMES=0 leaves every op to the formulas.
passes::DeviceProfile measureHostProfile(int threads);

// The timer measureHostProfile puts in DeviceProfile::timeOp, alone (the
// runtime's kernels on `threads`; `peakFlops` bounds which ops it times:
// none the formulas put over a quarter second).
std::function<std::optional<double>(const ir::Op &, double)>
hostOpTimer(int threads, double peakFlops);

// After planning with "host": a note on stderr of how many distinct ops
// were timed and how long it took (nothing when none were).
void noteHostOpTimes();

// Makes `name` known to lookupDeviceProfile: for "host", measures this
// machine with the threads one of `stagesOnHost` stages gets by default
// (cleave-run's split: cores / stages, at least 1; the stages of a plan
// share the host unless run under MPI across machines) and registers the
// result, saying the figures on stderr; other names are looked up. An
// unknown name is the lookup's error.
llvm::Error prepareDeviceProfile(llvm::StringRef name, int stagesOnHost);

// The profile when --device-profile is not given: $CLEAVE_DEVICE_PROFILE
// if set (the test suites set `cpu`, for figures that do not depend on the
// machine), else "host".
std::string defaultDeviceProfile();

// prepareDeviceProfile for --device-profile's value, or the default when it
// is not given (an unknown name from the environment says so).
llvm::Expected<std::string>
chooseDeviceProfile(const std::optional<std::string> &flag, int stagesOnHost);

} // namespace cleave::tools
