# The ONNX library cleave builds against, pinned in this one place.
#
# Debian 12's libonnx-dev is ONNX 1.12: opsets up to 17 and IR version 8,
# which refuses every export of PyTorch's default (dynamo) exporter (opset
# 20, IR version 10). cleave therefore builds the pinned ONNX from its PyPI
# source distribution, against Debian's protobuf, once, into a cache that
# every script and build tree reuses (about 75 s on 2 cores). ONNX's CMake
# wants cmake >= 3.26; Debian 12 has 3.25, so the build runs with the
# pinned cmake wheel from PyPI, unpacked into the same cache.
#
# Sourced by scripts/common.sh; cleave_ensure_onnx prints the install prefix
# (CMake finds it through CMAKE_PREFIX_PATH).

CLEAVE_ONNX_VERSION=1.23.2
CLEAVE_ONNX_SHA256=008cb0467b2bbee41448acc7da8b6f4e704624cb0d327a2d5adafc7ce19bc5b8
CLEAVE_ONNX_URL=https://files.pythonhosted.org/packages/3f/62/bc2dfadb63ecf04cb2d65a6b17751863039d36c65de51d6a3128ab35f1e7/onnx-$CLEAVE_ONNX_VERSION.tar.gz
CLEAVE_CMAKE_WHEEL_VERSION=3.31.6
CLEAVE_CMAKE_WHEEL_SHA256=1c8b05df0602365da91ee6a3336fe57525b137706c4ab5675498f662ae1dbcec
CLEAVE_CMAKE_WHEEL_URL=https://files.pythonhosted.org/packages/59/e8/096984b89133681533650b9078c5ed1c5c9b534e869b5487f22d4de1935c/cmake-$CLEAVE_CMAKE_WHEEL_VERSION-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl

# Where built dependencies live; override with CLEAVE_DEPS_DIR.
CLEAVE_DEPS_DIR=${CLEAVE_DEPS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cleave}
CLEAVE_ONNX_PREFIX=$CLEAVE_DEPS_DIR/onnx-$CLEAVE_ONNX_VERSION

# A cmake >= 3.26 on stdout: the system one if new enough, else the pinned
# PyPI wheel unpacked (not installed) into the cache.
cleave_new_cmake() {
  local have
  have=$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')
  if [ -n "$have" ] && printf '3.26\n%s\n' "$have" | sort -V -C; then
    command -v cmake
    return 0
  fi
  local dir=$CLEAVE_DEPS_DIR/cmake-$CLEAVE_CMAKE_WHEEL_VERSION
  if [ ! -x "$dir/cmake/data/bin/cmake" ]; then
    echo "cleave: fetching cmake $CLEAVE_CMAKE_WHEEL_VERSION (PyPI wheel) to build ONNX" >&2
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    local wheel=$dir.tmp/cmake.whl
    curl -fsSL --retry 3 -o "$wheel" "$CLEAVE_CMAKE_WHEEL_URL" >&2 &&
      echo "$CLEAVE_CMAKE_WHEEL_SHA256  $wheel" | sha256sum -c --quiet - >&2 ||
      { echo "cleave: error: cannot fetch the pinned cmake wheel" >&2; return 1; }
    (cd "$dir.tmp" && python3 -m zipfile -e cmake.whl . && rm cmake.whl) >&2 || return 1
    chmod +x "$dir.tmp"/cmake/data/bin/*
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
  fi
  echo "$dir/cmake/data/bin/cmake"
}

# Builds and installs the pinned ONNX into $CLEAVE_ONNX_PREFIX unless it is
# there already; prints the prefix.
cleave_ensure_onnx() {
  local prefix=$CLEAVE_ONNX_PREFIX
  local stamp="$prefix/.cleave-stamp"
  local want="$CLEAVE_ONNX_VERSION $CLEAVE_ONNX_SHA256"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$prefix"
    return 0
  fi
  echo "cleave: building ONNX $CLEAVE_ONNX_VERSION into $prefix (once; about 2 minutes)" >&2
  local cmake_bin
  cmake_bin=$(cleave_new_cmake) || { echo "cleave: error: no cmake >= 3.26 for ONNX" >&2; return 1; }
  local work=$CLEAVE_DEPS_DIR/onnx-build-$CLEAVE_ONNX_VERSION
  rm -rf "$work" && mkdir -p "$work"
  local tarball=$work/onnx-$CLEAVE_ONNX_VERSION.tar.gz
  curl -fsSL --retry 3 -o "$tarball" "$CLEAVE_ONNX_URL" >&2 ||
    { echo "cleave: error: cannot download $CLEAVE_ONNX_URL" >&2; return 1; }
  echo "$CLEAVE_ONNX_SHA256  $tarball" | sha256sum -c --quiet - >&2 ||
    { echo "cleave: error: $tarball does not have the pinned sha256" >&2; return 1; }
  tar -xzf "$tarball" -C "$work"
  # Static, position-independent, against Debian's shared protobuf; the
  # traditional-ML ops on (ONNX_ML), as in Debian's and PyPI's builds.
  "$cmake_bin" -S "$work/onnx-$CLEAVE_ONNX_VERSION" -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_SHARED_LIBS=OFF \
    -DONNX_USE_PROTOBUF_SHARED_LIBS=ON -DONNX_ML=1 -DONNX_BUILD_TESTS=OFF \
    -DONNX_BUILD_PYTHON=OFF -DONNX_GEN_PB_TYPE_STUBS=OFF -DONNX_WERROR=OFF \
    >"$work/configure.log" 2>&1 ||
    { tail -30 "$work/configure.log" >&2; echo "cleave: error: configuring ONNX failed ($work/configure.log)" >&2; return 1; }
  rm -rf "$prefix"
  "$cmake_bin" --build "$work/build" --target install >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log" >&2; echo "cleave: error: building ONNX failed ($work/build.log)" >&2; return 1; }
  echo "$want" >"$stamp"
  rm -rf "$work"
  echo "$prefix"
}
