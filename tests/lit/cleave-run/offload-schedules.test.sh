# Driver of offload-schedules.test: $1 the model, $2 a scratch folder, $3
# and $4 the cleavec and cleave-run binaries, $5 the folder to trust.
set -e
model=$1
out=$2
cleavec=$3
cleave_run=$4
trust=$5
for s in 1f1b zb-h1 interleaved-1f1b zb-v v-min; do
  for r in none all; do
    "$cleavec" "$model" --microbatch-size 4 --layer-depth 2 --stages 2 \
      --microbatches 4 --schedule $s --offload $r \
      -o "$out/$s-$r.cplan" > /dev/null
    "$cleave_run" "$out/$s-$r.cplan" --trust-dir "$trust" --steps 2 \
      --device cuda-emulated --save "$out/$s-$r.onnx" > "$out/$s-$r.run"
    # Every rank's measured peak is its planned one (the first X / Y).
    awk '/^[0-9]+ / && match($0, /[0-9]+ \/ [0-9]+/) { split(substr($0, RSTART, RLENGTH), a, " / "); if (a[1] != a[2]) { print "'$s' '$r': measured " a[1] " planned " a[2]; exit 1 } }' "$out/$s-$r.run"
  done
  cmp "$out/$s-none.onnx" "$out/$s-all.onnx"
  # The offloading run says what waited in host memory; keeping, nothing.
  grep -q '^offloaded activations in host memory, at most: stage 0 [0-9]* B, stage 1 [0-9]* B' "$out/$s-all.run"
  ! grep -q 'offloaded activations' "$out/$s-none.run"
  # Each rank's peak is below the keep-everything plan's.
  awk '/^[0-9]+ / && match($0, /[0-9]+ \/ [0-9]+/) { split(substr($0, RSTART, RLENGTH), a, " / "); print $1, a[1] }' "$out/$s-none.run" > "$out/$s-none.peaks"
  awk '/^[0-9]+ / && match($0, /[0-9]+ \/ [0-9]+/) { split(substr($0, RSTART, RLENGTH), a, " / "); print $1, a[1] }' "$out/$s-all.run" > "$out/$s-all.peaks"
  paste "$out/$s-none.peaks" "$out/$s-all.peaks" | awk '{ if ($4 >= $2) { print "'$s': rank " $1 " offloading holds " $4 ", keeping " $2; exit 1 } }'
  echo "$s: same bits, measured peak = planned, below keeping"
done
