#!/usr/bin/env bash
# Import-time benchmark on GPT-2 124M as PyTorch 2's default (dynamo)
# exporter writes it: transformers GPT2LMHeadModel(GPT2Config()) (12
# layers, n_embd 768, vocab 50257, n_positions 1024), random init, dropout
# 0, loss = next-token cross-entropy of input_ids int64 [1, 128], exported
# by tests/bench/export_gpt2_124m.py with
#   torch.onnx.export(WithLoss(model), (ids,), path, dynamo=True,
#                     optimize=False, external_data=True)
# so the ~500 MB of weights lie in MODEL.onnx.data next to the model.
#
#   bash tests/bench/import_gpt2_dynamo.sh
#
# Times, RUNS times each (default 3), median wall time and peak RSS:
#   cleavec MODEL --inference --emit=summary   (import only)
#   cleavec MODEL                              (import + training graph:
#                                               autodiff, B/W split, SGD)
# The export is made once into $CLEAVE_BENCH_DIR (default
# /tmp/cleave-bench-gpt2, outside the repository; never commit it) and
# reused while it is there. Exporting needs the PyTorch 2 venv
# ${CLEAVE_TORCH_VENV:-~/.cache/cleave/torch2-venv}, which
# tests/models/corpus/make-venv.sh creates (torch 2.15, transformers 5.24,
# onnx 1.23.2; CPU is enough, about 15 s). Needs a built tree
# (ninja -C build) and GNU time (/usr/bin/time, Debian package `time`,
# installed with apt-get when missing).
set -euo pipefail
source "$(dirname "$0")/../../scripts/common.sh"

venv=${CLEAVE_TORCH_VENV:-$HOME/.cache/cleave/torch2-venv}
dir=${CLEAVE_BENCH_DIR:-/tmp/cleave-bench-gpt2}
runs=${RUNS:-3}
model="$dir/gpt2-124m.onnx"
cleavec="$CLEAVE_ROOT/build/tools/cleavec"

[ -x "$cleavec" ] || { echo "error: $cleavec missing; build first (ninja -C build)" >&2; exit 1; }
[ -x /usr/bin/time ] || cleave_install_packages time
mkdir -p "$dir"

if [ -f "$model" ] && [ -f "$model.data" ]; then
  echo "reusing the export in $dir (delete it to export again)"
else
  [ -x "$venv/bin/python" ] || {
    echo "error: no PyTorch 2 venv at $venv; create it with" \
         "bash tests/models/corpus/make-venv.sh (or set CLEAVE_TORCH_VENV)" >&2
    exit 1
  }
  # Export into a fresh folder under the final file names (the .onnx names
  # its data file), then move both, so a failed export is never reused.
  rm -rf "$dir/export" "$model" "$model.data"
  mkdir "$dir/export"
  "$venv/bin/python" "$CLEAVE_ROOT/tests/bench/export_gpt2_124m.py" "$dir/export/${model##*/}"
  mv "$dir/export/${model##*/}.data" "$model.data"
  mv "$dir/export/${model##*/}" "$model"
  rmdir "$dir/export"
fi

onnx_bytes=$(stat -c %s "$model")
data_bytes=$(stat -c %s "$model.data")
echo "model: $model"
printf 'model size: %d B graph (.onnx) + %d B weights (.onnx.data) = %.1f MiB\n' \
  "$onnx_bytes" "$data_bytes" "$(echo "($onnx_bytes + $data_bytes) / 1048576" | bc -l)"

# bench LABEL ARGS...: runs cleavec RUNS times; prints the median wall time
# and the largest peak RSS; on failure prints cleavec's error line and exits.
bench() {
  local label=$1; shift
  local times=() rss=0 r start end
  for i in $(seq "$runs"); do
    start=$(date +%s.%N)
    if ! /usr/bin/time -v -o "$dir/time.txt" "$cleavec" "$model" "$@" \
         > "$dir/out.txt" 2> "$dir/err.txt"; then
      echo "$label: cleavec $* failed:" >&2
      grep -m1 . "$dir/err.txt" >&2 || true
      exit 1
    fi
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
    r=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$dir/time.txt")
    [ "$r" -gt "$rss" ] && rss=$r
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v label="$label" -v rss="$rss" '
    { t[NR] = $1 }
    END { printf "%s: median %.3f s (min %.3f, max %.3f, %d runs), peak RSS %.1f MiB\n",
          label, t[int((NR + 1) / 2)], t[1], t[NR], NR, rss / 1024 }'
}

bench "import (cleavec --inference --emit=summary)" --inference --emit=summary
params=$(sed -n 's/^parameters: \([0-9,]*\) elements.*/\1/p' "$dir/out.txt")
echo "parameters: $params ($(grep -m1 '^ops:' "$dir/out.txt") in the forward graph)"
bench "training graph (cleavec, default flags)"
grep -m1 '^ops:' "$dir/out.txt" | sed 's/^/training graph /'
grep -m1 '^training step:' "$dir/out.txt"
