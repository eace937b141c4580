# Driver of thread-bits.test and thread-bits-transformers.test: $1 the
# corpus folder, $2 a scratch folder, $3 and $4 the cleavec and cleave-run
# binaries, then the models (default: the CNNs).
set -e
corpus=$1
out=$2
cleavec=$3
cleave_run=$4
shift 4
models=${*:-resnet18-legacy resnet18-dynamo mobilenet_v2-legacy mobilenet_v2-dynamo}
for m in $models; do
  "$cleavec" "$corpus/$m/model.onnx" --microbatches 4 --lr 0.1 --momentum 0.9 \
    -o "$out/$m-1.cplan" >/dev/null
  for p in 2 4; do
    "$cleavec" "$corpus/$m/model.onnx" --stages $p --microbatches 4 --schedule zb-h1 \
      --lr 0.1 --momentum 0.9 -o "$out/$m-$p.cplan" >/dev/null
  done
  for t in 1 2 4; do
    "$cleave_run" "$out/$m-1.cplan" --data "$corpus/$m/steps/data" --steps 3 \
      --threads $t --quiet --trust-dir "$corpus" --save "$out/$m-t$t.onnx"
  done
  for p in 2 4; do
    "$cleave_run" "$out/$m-$p.cplan" --data "$corpus/$m/steps/data" --steps 3 \
      --threads 1 --quiet --trust-dir "$corpus" --save "$out/$m-s$p.onnx"
  done
  for v in t2 t4 s2 s4; do
    cmp "$out/$m-t1.onnx" "$out/$m-$v.onnx"
  done
  echo "$m: threads 1, 2, 4 and 2, 4 stages identical"
  rm -f "$out/$m"-*.cplan "$out/$m"-*.onnx
done
echo "all done"
