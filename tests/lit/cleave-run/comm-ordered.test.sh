# Driver of comm-ordered.test: $1 the model, $2 a scratch folder, $3 and $4
# the cleavec and cleave-run binaries, $5 the folder to trust.
set -e
model=$1
out=$2
cleavec=$3
cleave_run=$4
trust=$5
both() { # name, plan, cleave-run flags...
  name=$1
  plan=$2
  shift 2
  for c in keyed ordered; do
    "$cleave_run" "$plan" --trust-dir "$trust" --steps 2 --comm $c "$@" \
      --save "$out/$name-$c.onnx" > /dev/null
  done
  cmp "$out/$name-keyed.onnx" "$out/$name-ordered.onnx"
  echo "$name: same bits"
}
for p in 2 4; do
  for s in 1f1b 1f1b-2bp zb-h1 zb-h2 gpipe-2bp interleaved-1f1b zb-v v-half \
           v-min dualpipe-v; do
    if [ $p = 4 ]; then
      case $s in zb-v|v-min|dualpipe-v) ;; *) continue ;; esac
    fi
    "$cleavec" "$model" --microbatch-size 2 --layer-depth 2 --stages $p \
      --microbatches 8 --schedule $s -o "$out/$s-$p.cplan" > /dev/null
    both "$s $p" "$out/$s-$p.cplan"
  done
done
both "zb-h1 clip" "$out/zb-h1-2.cplan" --clip-grad-norm 0.5
both "zb-h1 overlap" "$out/zb-h1-2.cplan" --overlap-steps
"$cleavec" "$model" --microbatch-size 2 --layer-depth 2 --stages 2 \
  --data-parallel 2 --microbatches 4 --schedule zb-h1 -o "$out/dp.cplan" > /dev/null
both "zb-h1 data-parallel" "$out/dp.cplan"
