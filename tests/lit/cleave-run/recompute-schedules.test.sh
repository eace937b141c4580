# Driver of recompute-schedules.test: $1 the model, $2 a scratch folder, $3
# and $4 the cleavec and cleave-run binaries, $5 the folder to trust.
set -e
model=$1
out=$2
cleavec=$3
cleave_run=$4
trust=$5
for s in 1f1b 1f1b-2bp zb-h1 zb-h2 gpipe-2bp interleaved-1f1b zb-v v-half \
         v-min dualpipe-v; do
  for r in none selective full; do
    "$cleavec" "$model" --microbatch-size 4 --layer-depth 2 --stages 2 \
      --microbatches 4 --schedule $s --recompute $r \
      -o "$out/$s-$r.cplan" > /dev/null
    "$cleave_run" "$out/$s-$r.cplan" --trust-dir "$trust" --steps 2 \
      --save "$out/$s-$r.onnx" > "$out/$s-$r.run"
    # Every rank's measured peak is its planned one (the first X / Y).
    awk '/^[0-9]+ / && match($0, /[0-9]+ \/ [0-9]+/) { split(substr($0, RSTART, RLENGTH), a, " / "); if (a[1] != a[2]) { print "'$s' '$r': measured " a[1] " planned " a[2]; exit 1 } }' "$out/$s-$r.run"
  done
  cmp "$out/$s-none.onnx" "$out/$s-selective.onnx"
  cmp "$out/$s-none.onnx" "$out/$s-full.onnx"
  echo "$s: same bits, measured peak = planned"
done
