# Driver of recompute-bits.test: $1 the corpus folder, $2 a scratch folder,
# $3 and $4 the cleavec and cleave-run binaries, then the models.
set -e
corpus=$1
out=$2
cleavec=$3
cleave_run=$4
shift 4
for m in "$@"; do
  for r in none selective full; do
    "$cleavec" "$corpus/$m/model.onnx" --stages 2 --microbatches 4 \
      --schedule zb-h1 --recompute $r --lr 0.1 --momentum 0.9 \
      -o "$out/$m-$r.cplan" >"$out/$m-$r.txt"
    "$cleave_run" "$out/$m-$r.cplan" --data "$corpus/$m/steps/data" --steps 3 \
      --trust-dir "$corpus" --save "$out/$m-$r.onnx" >"$out/$m-$r.run"
    # The measured peak of every rank is the planned one.
    awk '/^[0-9]+ / && match($0, /[0-9]+ \/ [0-9]+/) { split(substr($0, RSTART, RLENGTH), a, " / "); if (a[1] != a[2]) { print "'$m' '$r': measured " a[1] " planned " a[2]; exit 1 } }' "$out/$m-$r.run"
  done
  cmp "$out/$m-none.onnx" "$out/$m-selective.onnx"
  cmp "$out/$m-none.onnx" "$out/$m-full.onnx"
  echo "$m: recompute none, selective and full identical"
  rm -f "$out/$m"-*.cplan
done
echo "all done"
