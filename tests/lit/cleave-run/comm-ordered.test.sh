# Driver of comm-ordered.test: $1 the model, $2 a scratch folder, $3 and $4
# the cleavec and cleave-run binaries, $5 the folder to trust, $6 a GPT
# with a tied embedding and $7 its folder.
set -e
model=$1
out=$2
cleavec=$3
cleave_run=$4
trust=$5
tied=$6
tied_trust=$7
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
# Messages straight from a device backend's memory: on the emulated CUDA
# backend the channels take the slots themselves (the host transport
# stages them, held messages included), as NCCL's do on a GPU.
both "1f1b 2 device" "$out/1f1b-2.cplan" --device cuda-emulated
both "zb-v 4 device" "$out/zb-v-4.cplan" --device cuda-emulated
# CLEAVE_PARCELS=0: staged through host memory, the same bits.
CLEAVE_PARCELS=0 "$cleave_run" "$out/1f1b-2.cplan" --trust-dir "$trust" \
  --steps 2 --device cuda-emulated --save "$out/staged.onnx" > /dev/null
cmp "$out/staged.onnx" "$out/1f1b 2 device-keyed.onnx"
echo "staged device: same bits"
# A tied embedding on two stages: its gradient's message (the step
# program's) rides the channel between them; ZB-V puts both on one rank.
trust=$tied_trust
for p in 2 4; do
  "$cleavec" "$tied" --stages $p --microbatches 2 --schedule zb-h1 \
    -o "$out/tied-$p.cplan" > /dev/null
  both "tied $p" "$out/tied-$p.cplan"
done
both "tied 4 device" "$out/tied-4.cplan" --device cuda-emulated
"$cleavec" "$tied" --stages 2 --chunks 2 --microbatches 4 --schedule zb-v \
  -o "$out/tied-v.cplan" > /dev/null
both "tied zb-v" "$out/tied-v.cplan"
