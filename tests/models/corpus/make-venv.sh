#!/usr/bin/env bash
# Create the Python venv that export_corpus.py runs in: PyTorch 2 and the
# ONNX tool chain at the versions the committed corpus was exported with,
# pinned here (the one place they are listed), from PyPI.
#
#   bash tests/models/corpus/make-venv.sh [VENV]
#   $VENV/bin/python tests/models/corpus/export_corpus.py
#
# VENV defaults to $CLEAVE_TORCH_VENV, else ~/.cache/cleave/torch2-venv.
# Idempotent: an existing venv that already has exactly these versions is
# left alone (prints its path); one with other versions is brought to them.
# Needs python3 >= 3.10 with the venv module (the corpus was made with
# CPython 3.11.7) and network access to PyPI. torch from PyPI is the CUDA
# build (about 3 GB with its nvidia-* wheels); the export runs on the CPU.
set -euo pipefail

PINS=(
  torch==2.15.0
  torchvision==0.29.2
  transformers==5.24.0
  timm==1.0.31
  onnx==1.23.2
  onnxscript==0.7.2
  onnxruntime==1.32.0
  numpy==2.4.6
  # Not imported by export_corpus.py, but the dynamo exporter builds and
  # serializes its graphs with it (an onnxscript dependency, >= 0.5 only).
  onnx-ir==1.1.0
)

VENV=${1:-${CLEAVE_TORCH_VENV:-$HOME/.cache/cleave/torch2-venv}}
PYTHON=${PYTHON:-python3}

# Prints nothing and succeeds when every pin is installed at its version.
check() {
  "$VENV/bin/python" - "${PINS[@]}" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
bad = []
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    # torch / torchvision wheels may carry a local tag (2.15.0+cu132).
    if have is None or have.split("+")[0] != want:
        bad.append("%s (have %s)" % (pin, have))
if bad:
    print("missing or other version: " + ", ".join(bad))
    sys.exit(1)
EOF
}

if [ -x "$VENV/bin/python" ] && check >/dev/null 2>&1; then
  echo "$VENV"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "make-venv: creating $VENV" >&2
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade --quiet pip >&2
echo "make-venv: installing ${PINS[*]}" >&2
"$VENV/bin/python" -m pip install "${PINS[@]}" >&2
check >&2
echo "$VENV"
