# Driver of pipeline-bits.test: $1 the corpus folder, $2 a scratch folder,
# $3 and $4 the cleavec and cleave-run binaries.
set -e
corpus=$1
out=$2
cleavec=$3
cleave_run=$4
for m in gpt2-legacy gpt2-dynamo llama-legacy llama-dynamo bert-legacy \
         bert-dynamo resnet18-legacy resnet18-dynamo mobilenet_v2-legacy \
         mobilenet_v2-dynamo vit-legacy vit-dynamo unet-legacy unet-dynamo rnn-legacy rnn-dynamo; do
  for p in 1 2 4; do
    schedule=zb-h1
    [ "$p" = 1 ] && schedule=1f1b
    "$cleavec" "$corpus/$m/model.onnx" --stages $p --microbatches 4 \
      --schedule $schedule --lr 0.1 --momentum 0.9 -o "$out/$m-$p.cplan" >/dev/null
    "$cleave_run" "$out/$m-$p.cplan" --data "$corpus/$m/steps/data" --steps 3 \
      --quiet --trust-dir "$corpus" --save "$out/$m-$p.onnx"
  done
  cmp "$out/$m-1.onnx" "$out/$m-2.onnx"
  cmp "$out/$m-1.onnx" "$out/$m-4.onnx"
  echo "$m: 1, 2 and 4 stages identical"
  rm -f "$out/$m"-*.cplan
done
echo "all done"
