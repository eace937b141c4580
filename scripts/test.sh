#!/usr/bin/env bash
# The whole test suite: set up (Debian packages for build and tests), build,
# run ctest (unit, lit, libonnx-testdata sweep), then run the sweep and the
# unit tests again in an AddressSanitizer + UBSan build, the runtime's unit
# tests and the model-zoo CI subset in a ThreadSanitizer build, and last
# fuzz the three readers of untrusted input (scripts/fuzz.sh;
# docs/reliability.md). CLEAVE_FUZZ_SECONDS sets the fuzzers' time, the
# three side by side (default 15 here, a smoke run that keeps CI inside its
# 35 minutes; scripts/fuzz.sh alone defaults to 60; 0 skips).
set -euo pipefail
source "$(dirname "$0")/common.sh"

jobs=$(nproc)
cleave_install_packages $CLEAVE_BUILD_PACKAGES $CLEAVE_TEST_PACKAGES

# onnxruntime for the reload tests (REQUIRES: onnxruntime in lit).
CLEAVE_ORT_PYTHON=$(cleave_ensure_ort_python)
export CLEAVE_ORT_PYTHON
# The fixed cpu device profile for every compile here: the same plans on
# every machine, and no host measurement per cleavec call (slow under the
# sanitizers). The lit test partition/host-profile.test measures it.
export CLEAVE_DEVICE_PROFILE=cpu

# Every build here is a unity build (CMAKE_UNITY_BUILD: a library's
# sources compiled eight to a file, each header parsed once per eight; the
# unit tests stay file by file) with line tables only (-g1: a stack still
# names files and lines; full debug info was a third of the compile time).
# Measured on a clean clone, 2 cores: the release build 512 s -> 406 s with
# unity alone, 265 s with -g1 too; the whole of this script 2076 -> 1372 s
# (docs/benchmarks.md, 2026-12-07 06:49). A developer's build/ can go back
# with -DCMAKE_UNITY_BUILD=OFF.
unity=-DCMAKE_UNITY_BUILD=ON

SECONDS=0
# Each stage's header names the seconds spent before it, so a CI log shows
# where its time went.
stage() { echo "== $1 ($SECONDS s so far)"; }
stage "build (RelWithDebInfo)"
cleave_build "$CLEAVE_ROOT/build" $unity "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
stage ctest
(cd "$CLEAVE_ROOT/build" && ctest --output-on-failure -j "$jobs")

stage "the GPU check script, dry run (cuda-emulated, tiny sizes)"
# tools/gpu-check.sh is what a lent GPU runs once: here every part of it
# runs on the emulated CUDA backend, so it is known to work before then.
if ! bash "$CLEAVE_ROOT/tools/gpu-check.sh" dry-run "$CLEAVE_ROOT/build" \
    > "$CLEAVE_ROOT/build/gpu-check-dry.log" 2>&1; then
  cat "$CLEAVE_ROOT/build/gpu-check-dry.log"
  exit 1
fi
tail -n 2 "$CLEAVE_ROOT/build/gpu-check-dry.log"

stage "sanitizer build (ASan + UBSan): sweep and unit tests"
cleave_configure "$CLEAVE_ROOT/build-asan" -DCLEAVE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-g1 $unity
ninja -C "$CLEAVE_ROOT/build-asan" onnx-testdata-sweep cleave-unit-tests
stage "ASan + UBSan: run"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# sanitizer_ctest DIR REGEX [PREFIX...]: ctest -R REGEX in the build DIR
# (under PREFIX, a command such as setarch), its log kept in DIR; the last
# lines on success, the whole log on failure.
# LeakSanitizer's own tracer has crashed at exit on this machine kind once
# in a run whose every test had passed ("Tracer caught signal 11 ...
# LeakSanitizer has encountered a fatal error"; the same binary passed
# leak-checked right after): a crash of the tool, not a finding. Only that
# is run again, once; a failed test or a reported leak fails at once.
sanitizer_ctest() {
  local dir=$1 regex=$2
  shift 2
  local log="$dir/ctest-$regex.log"
  if (cd "$dir" && "$@" ctest --output-on-failure -j "$jobs" -R "$regex") > "$log" 2>&1; then
    tail -n 3 "$log"
    return 0
  fi
  if grep -q "LeakSanitizer has encountered a fatal error" "$log" &&
      ! grep -q "^\[  FAILED  \]\|ERROR: LeakSanitizer: detected" "$log"; then
    echo "LeakSanitizer's tracer crashed (no test failed, no leak reported): running '$regex' again"
    (cd "$dir" && "$@" ctest --output-on-failure -j "$jobs" -R "$regex")
    return
  fi
  cat "$log"
  return 1
}
sanitizer_ctest "$CLEAVE_ROOT/build-asan" unit
sanitizer_ctest "$CLEAVE_ROOT/build-asan" onnx-testdata-sweep

stage "ThreadSanitizer build: unit tests and the model-zoo CI subset"
# The CPU runtime's own threads (thread pool, pipeline stages) are what it
# checks (its build leaves out the tests that start none); OpenBLAS's
# threads are not instrumented, so it runs on one. ASLR is off for it
# (setarch -R): GCC 12's TSan maps its shadow at fixed addresses that a
# kernel randomizing more address bits can collide with.
cleave_configure "$CLEAVE_ROOT/build-tsan" -DCLEAVE_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" $unity
ninja -C "$CLEAVE_ROOT/build-tsan" cleave-unit-tests cleavec cleave-run cleave-opt
stage "TSan: run"
(
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  export OPENBLAS_NUM_THREADS=1
  # Two shards of the suite side by side, one a core (as under ASan); the
  # no-ASLR personality passes from setarch through ctest to both.
  sanitizer_ctest "$CLEAVE_ROOT/build-tsan" unit-shard setarch "$(uname -m)" -R
  setarch "$(uname -m)" -R "$CLEAVE_ORT_PYTHON" "$CLEAVE_ROOT/tests/models/sweep/check_ci.py" \
    --tools "$CLEAVE_ROOT/build-tsan/tools" --timeout 900
)

fuzz_seconds=${CLEAVE_FUZZ_SECONDS:-15}
if [ "$fuzz_seconds" != 0 ]; then
  stage "fuzzing: $fuzz_seconds s per target"
  bash "$CLEAVE_ROOT/scripts/fuzz.sh" "$fuzz_seconds"
fi
echo "== all tests passed ($SECONDS s)"
