#!/usr/bin/env bash
# Fuzzes cleave's three readers of untrusted input with libFuzzer + ASan +
# UBSan: the ONNX importer, the IR text parser (+ verifier) and the .cplan
# loader (+ verifyPlan). See docs/reliability.md.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]    (default 60)
#
# Configures build-fuzz with clang-14 (-DCLEAVE_FUZZ=ON), builds the targets,
# then runs the three side by side for SECONDS, each on a scratch copy of
# its seed corpus (tests/fuzz/corpus/<target>; new inputs are never written
# into the repository). Prints the executions per target and fails if any
# target finds a crash, a sanitizer report, a timeout (10 s) or an
# out-of-memory (2 GiB); the reproducer is kept under
# build-fuzz/findings/<target>/.
# CLEAVE_FUZZ_SEED (default 1) seeds the mutations, so a CI run repeats
# the same inputs; set another for a longer exploratory run.
set -euo pipefail
source "$(dirname "$0")/common.sh"

secs=${1:-60}
case $secs in '' | *[!0-9]*) echo "fuzz.sh: error: SECONDS must be a number, not '$secs'" >&2; exit 2 ;; esac
build=${CLEAVE_FUZZ_BUILD:-$CLEAVE_ROOT/build-fuzz}

cleave_install_packages $CLEAVE_BUILD_PACKAGES $CLEAVE_FUZZ_PACKAGES

echo "== fuzz build (clang-14, libFuzzer + ASan + UBSan) in $build"
t0=$(date +%s)
CC=clang-14 CXX=clang++-14 cleave_configure "$build" \
  -DCLEAVE_FUZZ=ON -DCLEAVE_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DCMAKE_UNITY_BUILD=ON
ninja -C "$build" cleave-fuzz
echo "fuzz build: $(($(date +%s) - t0)) s"

export ASAN_OPTIONS=detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
work=$(mktemp -d "${TMPDIR:-/tmp}/cleave-fuzz-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The three targets run side by side (SECONDS of wall time in all, not
# three times it); each writes its own log and exit status.
fuzz_target() {
  local t=$1 rc=0
  mkdir -p "$work/$t" "$build/findings/$t"
  cp "$CLEAVE_ROOT/tests/fuzz/corpus/$t/"* "$work/$t/"
  # TMPDIR: the targets' scratch files (tests/fuzz/FuzzSupport.h) go to
  # $work too, removed at exit whatever way libFuzzer ends.
  (cd "$build/findings/$t" &&
    TMPDIR=$work "$build/tests/fuzz/fuzz_$t" "$work/$t" -max_total_time="$secs" \
      -seed="${CLEAVE_FUZZ_SEED:-1}" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$build/findings/$t/") >"$build/findings/$t/fuzz.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}
targets=(onnx_import ir_parser plan_loader)
echo "== ${targets[*]}: $secs s each, side by side"
for t in "${targets[@]}"; do
  fuzz_target "$t" &
done
wait
failed=()
summary=()
for t in "${targets[@]}"; do
  log=$build/findings/$t/fuzz.log
  rc=$(cat "$work/$t.rc" 2>/dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  summary+=("fuzz_$t: ${execs:-?} executions in $secs s, ${cov:-cov: ?}, rc $rc")
  if [ "$rc" != 0 ] || grep -qE '^==[0-9]+==ERROR|runtime error:' "$log"; then
    failed+=("fuzz_$t")
    echo "fuzz_$t FAILED (exit $rc); log and reproducer in $build/findings/$t/:" >&2
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written' "$log" | head -20 >&2 || true
  fi
done
echo "== fuzz summary"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz.sh: error: ${failed[*]} found a failure" >&2
  exit 1
fi
echo "== fuzzing found nothing"
