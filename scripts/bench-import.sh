#!/usr/bin/env bash
# Import-speed benchmark: exports the 12-layer GPT (hidden 768, ~86M
# parameters) with Debian's PyTorch (once, cached in $CLEAVE_BENCH_DIR), then
# times `cleavec --emit=ir` (read + check + shape inference + import + verify
# + print) several times and checks that the printed IR round-trips through
# cleave-opt. Needs: python3-torch python3-onnx (Debian), a built tree.
set -euo pipefail
source "$(dirname "$0")/common.sh"

dir=${CLEAVE_BENCH_DIR:-/tmp/cleave-bench}
runs=${RUNS:-5}
model="$dir/gpt-12l-768.onnx"
cleavec="$CLEAVE_ROOT/build/tools/cleavec"
opt="$CLEAVE_ROOT/build/tools/cleave-opt"
mkdir -p "$dir"

if [ ! -f "$model" ]; then
  cleave_install_packages python3-torch python3-onnx
  echo "exporting the 12-layer GPT to $model (about 30 s)"
  /usr/bin/python3 "$CLEAVE_ROOT/examples/gpt/export.py" -o "$model" \
    --layers 12 --heads 12 --embd 768 --block-size 1024
fi
ls -l "$model"

times=()
for i in $(seq "$runs"); do
  start=$(date +%s.%N)
  "$cleavec" "$model" --microbatch-size 8 --emit=ir -o "$dir/gpt.cir"
  end=$(date +%s.%N)
  times+=("$(echo "$end - $start" | bc)")
done
printf '%s\n' "${times[@]}" | sort -n | awk '
  { t[NR] = $1 }
  END { printf "cleavec --emit=ir on the 12-layer GPT: min %.3f s, median %.3f s, max %.3f s over %d runs\n",
        t[1], t[int((NR + 1) / 2)], t[NR], NR }'
"$cleavec" "$model" --microbatch-size 8 | sed -n '1,10p'
"$opt" "$dir/gpt.cir" -o "$dir/gpt.round.cir"
cmp "$dir/gpt.cir" "$dir/gpt.round.cir" && echo "IR text round-trips ($(wc -c < "$dir/gpt.cir") bytes)"
