# Driver of torch-reload.test: $1 the corpus, $2 a scratch folder, $3 and
# $4 cleavec and cleave-run, $5 a Python with PyTorch, $6 torch_reload.py,
# $7 the examples folder.
set -e
corpus=$1 out=$2 cleavec=$3 cleave_run=$4 python=$5 script=$6 examples=$7
models="gpt2-dynamo gpt2-legacy llama-dynamo bert-legacy resnet18-legacy vit-dynamo"
for m in $models; do
  "$cleavec" "$corpus/$m/model.onnx" --stages 2 --microbatches 4 \
    --schedule zb-h1 --lr 0.1 --momentum 0.9 -o "$out/$m.cplan" >/dev/null
  "$cleave_run" "$out/$m.cplan" --data "$corpus/$m/steps/data" --steps 3 \
    --quiet --save "$out/$m.onnx" --trust-dir "$corpus/$m" >/dev/null
done
"$python" "$script" "$corpus" "$examples" "$out" $models
