#!/usr/bin/env bash
# Simulated step time and peak memory of every schedule for the bundled
# models, against 1F1B (docs/schedules.md). Uses the analytic cost model with
# the cpu device profile; the figures are predictions, not measurements.
#   scripts/bench-schedules.sh [build-dir]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

run() { # model label depth P M
  local model=$1 label=$2 depth=$3 p=$4 m=$5
  for s in 1f1b gpipe gpipe-2bp 1f1b-2bp zb-h1 zb-h2; do
    "$build/tools/cleavec" "$model" --microbatch-size 4 --layer-depth "$depth" \
      --stages "$p" --microbatches "$m" --schedule "$s" \
      --report "$tmp/$s.json" >/dev/null
  done
  /usr/bin/python3 - "$tmp" "$label" "$p" "$m" <<'PY'
import json, sys
tmp, label, p, m = sys.argv[1:]
base = json.load(open(f"{tmp}/1f1b.json"))["schedule"]
for s in ["1f1b", "gpipe", "gpipe-2bp", "1f1b-2bp", "zb-h1", "zb-h2"]:
    r = json.load(open(f"{tmp}/{s}.json"))["schedule"]
    print(f"| {label} | {p} | {m} | {s} | {r['step_time']*1e3:.2f} ms | "
          f"{base['step_time']/r['step_time']:.2f}x | "
          f"{max(r['peak_bytes'])/2**20:.2f} MiB | "
          f"{max(r['bubble_fraction'])*100:.1f}% |")
PY
}

echo "| model | P | M | schedule | step (simulated) | vs 1f1b | peak bytes (max stage) | max bubble |"
echo "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"
run "$root/examples/gpt/gpt-tiny.onnx" gpt-tiny 2 4 8
run "$root/tests/models/gpt12_small.onnx" gpt-12 1 4 8
run "$root/tests/models/gpt12_small.onnx" gpt-12 1 8 16
