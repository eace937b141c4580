# Driver of onnxruntime-reload.test: $1 the corpus, $2 a scratch folder,
# $3..$5 cleavec, cleave-run and cleave-opt, $6 a Python with onnxruntime,
# $7 ort_loss.py.
set -e
corpus=$1 out=$2 cleavec=$3 cleave_run=$4 cleave_opt=$5 python=$6 script=$7
for m in gpt2-legacy gpt2-dynamo llama-legacy llama-dynamo bert-legacy \
         bert-dynamo resnet18-legacy resnet18-dynamo mobilenet_v2-legacy \
         mobilenet_v2-dynamo vit-legacy vit-dynamo unet-legacy unet-dynamo rnn-legacy rnn-dynamo; do
  "$cleavec" "$corpus/$m/model.onnx" --stages 2 --microbatches 4 \
    --schedule zb-h1 --lr 0.1 --momentum 0.9 -o "$out/$m.cplan" >/dev/null
  "$cleave_run" "$out/$m.cplan" --data "$corpus/$m/steps/data" --steps 3 \
    --quiet --trust-dir "$corpus" --save "$out/$m.onnx" >/dev/null
  # onnxruntime runs a dynamo export's inference-form BatchNorm on its
  # running statistics (eval()); cleave-opt does the same in eval mode,
  # which also checks the running statistics --save wrote.
  mode=auto
  case $m in *-dynamo) mode=eval ;; esac
  "$cleave_opt" "$out/$m.onnx" --module-mode "$mode" --run \
    --inputs "$corpus/$m/inputs" --outputs "$out/$m-out" >/dev/null
  "$python" "$script" "$out/$m.onnx" "$corpus/$m/inputs" \
    "$out/$m-out/loss.npy" "$m"
done
