# Driver of attention-opset23.test: $1 tests/models/opset23, $2 a scratch
# folder, $3 and $4 the cleavec and cleave-run binaries.
set -e
models=$1
out=$2
cleavec=$3
cleave_run=$4
for m in rope-causal-gqa float-mask-3d bool-mask-causal; do
  for p in 1 2; do
    schedule=zb-h1
    [ "$p" = 1 ] && schedule=1f1b
    "$cleavec" "$models/$m/model.onnx" --stages $p --microbatches 4 \
      --schedule $schedule --lr 0.1 --momentum 0.9 -o "$out/$m-$p.cplan" >/dev/null
    "$cleave_run" "$out/$m-$p.cplan" --data "$models/$m/steps/data" --steps 3 \
      --quiet --trust-dir "$models" --save "$out/$m-$p.onnx"
  done
  cmp "$out/$m-1.onnx" "$out/$m-2.onnx"
  echo "$m: 1 and 2 stages identical"
done
