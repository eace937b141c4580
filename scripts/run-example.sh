#!/usr/bin/env bash
# The main job: set up (Debian packages, build), compile the bundled example
# GPT to a 2-stage zero-bubble (ZB-H1) plan, train it for 300 steps on a
# text every Debian machine has, and write the plan, the predicted and the
# measured timeline, and the trained model under out/.
set -euo pipefail
source "$(dirname "$0")/common.sh"

cleave_install_packages $CLEAVE_BUILD_PACKAGES
cleave_build "$CLEAVE_ROOT/build"

model="$CLEAVE_ROOT/examples/gpt/gpt-tiny.onnx"
text=/usr/share/common-licenses/GPL-3
out="$CLEAVE_ROOT/out"
mkdir -p "$out"
echo
echo "== cleavec $model (2 stages, zb-h1, 4 microbatches of 8)"
"$CLEAVE_ROOT/build/tools/cleavec" "$model" --microbatch-size 8 --stages 2 \
  --microbatches 4 --schedule zb-h1 --optimizer adamw --lr 0.003 \
  --timeline "$out/step.svg" -o "$out/gpt.cplan"
echo
echo "== cleave-run $out/gpt.cplan --data text:$text --steps 300"
"$CLEAVE_ROOT/build/tools/cleave-run" "$out/gpt.cplan" --data "text:$text" \
  --trust-dir "$(dirname "$model")" \
  --steps 300 --trace "$out/trace.json" --save "$out/gpt-trained.onnx"
echo
echo "wrote $out/gpt.cplan, $out/step.svg (predicted), $out/trace.json (measured), $out/gpt-trained.onnx"
