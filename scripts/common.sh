# Shared by the scripts in this folder: install the Debian packages cleave
# needs (only those missing, so a prepared machine skips apt entirely) and
# configure + build a tree. Sourced, not run.

CLEAVE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$CLEAVE_ROOT/scripts/onnx.sh"

# Packages the build needs (Open MPI: cleave-run under mpirun, one stage
# per process; the build works without it. libdnnl2: oneDNN's sgemm and
# convolution primitives, loaded at run time, the GEMM library and the
# 2-D convs' on AVX-512 CPUs; OpenBLAS and cleave's own convs without it.
# libdnnl-dev: oneDNN's C types, which the convolution calls are built
# against; without the header those calls are left out). ONNX itself is not Debian's
# (scripts/onnx.sh builds the pinned version); curl, python3 (to unpack
# cmake's wheel) and protobuf are what that build needs.
CLEAVE_BUILD_PACKAGES="g++ cmake ninja-build llvm-14-dev libgtest-dev
  libprotobuf-dev protobuf-compiler libopenblas-dev libdnnl2 libdnnl-dev
  libopenmpi-dev openmpi-bin curl ca-certificates python3"
# Packages scripts/fuzz.sh needs on top: clang and its libFuzzer + sanitizer
# runtimes (libclang_rt.fuzzer-x86_64.a is in libclang-rt-14-dev, which
# clang-14 only recommends).
CLEAVE_FUZZ_PACKAGES="clang-14 libclang-rt-14-dev"
# Packages the tests need on top: lit and FileCheck, the ONNX backend test
# data, a Python for lit, oneDNN (the CLEAVE_GEMM=onednn test and the
# benchmarks against it) and the fuzzing toolchain (scripts/test.sh ends
# with scripts/fuzz.sh); xz and strip for tools/gpu-check.sh's dry run.
CLEAVE_TEST_PACKAGES="llvm-14-tools libonnx-testdata python3 python3-venv libdnnl-dev libtsan2 xz-utils binutils $CLEAVE_FUZZ_PACKAGES"

# A Python with onnxruntime for the tests that reload trained models in it
# (tests/lit/corpus/onnxruntime-reload.test): a venv in the dependency cache
# from these pinned PyPI wheels. Prints the interpreter's path.
CLEAVE_ORT_PINS="onnxruntime==1.32.0 numpy==2.4.6"
cleave_ensure_ort_python() {
  local venv=$CLEAVE_DEPS_DIR/ort-venv
  local stamp="$venv/.cleave-stamp"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$CLEAVE_ORT_PINS" ]; then
    echo "$venv/bin/python"
    return 0
  fi
  echo "cleave: making $venv ($CLEAVE_ORT_PINS from PyPI)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv" >&2 &&
    "$venv/bin/python" -m pip install -q --disable-pip-version-check $CLEAVE_ORT_PINS >&2 ||
    { echo "cleave: error: cannot install $CLEAVE_ORT_PINS into $venv" >&2; return 1; }
  echo "$CLEAVE_ORT_PINS" >"$stamp"
  echo "$venv/bin/python"
}

cleave_install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "cleave: installing Debian packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "cleave: error: packages missing (${missing[*]}) and not root; run as root or install them" >&2
      return 1
    }
    sudo=sudo
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# cleave_configure DIR [cmake args...]: configures a build tree against the
# pinned ONNX (built first if the cache lacks it).
cleave_configure() {
  local dir=$1
  shift
  local onnx_prefix
  onnx_prefix=$(cleave_ensure_onnx) || return 1
  cmake -S "$CLEAVE_ROOT" -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$onnx_prefix" "$@" >/dev/null
}

# cleave_build DIR [cmake args...]
cleave_build() {
  local dir=$1
  shift
  cleave_configure "$dir" "$@" || return 1
  ninja -C "$dir"
}
