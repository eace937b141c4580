#!/usr/bin/env bash
# The main job, as far as cleave goes today: set up (Debian packages, build)
# and compile the bundled example GPT, printing its summary and its IR.
set -euo pipefail
source "$(dirname "$0")/common.sh"

cleave_install_packages $CLEAVE_BUILD_PACKAGES
cleave_build "$CLEAVE_ROOT/build"

model="$CLEAVE_ROOT/examples/gpt/gpt-tiny.onnx"
echo
echo "== cleavec $model --microbatch-size 8 --emit=summary"
"$CLEAVE_ROOT/build/tools/cleavec" "$model" --microbatch-size 8 --emit=summary
echo
echo "== cleavec $model --microbatch-size 8 --emit=ir"
"$CLEAVE_ROOT/build/tools/cleavec" "$model" --microbatch-size 8 --emit=ir
