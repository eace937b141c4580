#!/usr/bin/env bash
# Every GPU check of the CUDA backend in one run, for a machine with a GPU
# (docs/design/cuda.md). Two steps:
#
#   tools/gpu-check.sh bundle [BUILD]   here, where cleave is built: puts
#       stripped cleave-run and unit tests, the shared libraries they need
#       that a bare CUDA machine lacks (protobuf, ONNX, OpenBLAS, Open MPI,
#       ...) and the test plans into BUILD/gpu-bundle.tar.xz, small enough
#       to carry to the GPU machine.
#   tools/gpu-check.sh run [BUILD]      on the GPU machine, with that file
#       carried: unpacks it, runs the checks, writes $OUT/summary.txt (or
#       BUILD/gpu-check/summary.txt) and the logs beside it, and prints the
#       summary.
#
# BUILD defaults to build/. CUDA's own libraries (cudart, cuBLAS) are taken
# from the machine: the CUDA toolkit, or the pip packages of its PyTorch.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-}"
build="${2:-$root/build}"
bundle="$build/gpu-bundle.tar.xz"

case "$mode" in
bundle)
  set -e
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' EXIT
  mkdir -p "$dir/gpu/bin" "$dir/gpu/libs" "$dir/gpu/plans"
  for bin in "$build/tools/cleave-run" "$build/tests/cleave-unit-tests"; do
    strip -o "$dir/gpu/bin/$(basename "$bin")" "$bin"
    ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | \
        ld-linux* | libgcc_s.so* | libcuda.so* | libcudart.so* | \
        libcublas*.so* | libcudnn*.so* | libnccl.so*) ;;
      *) cp -L "$lib" "$dir/gpu/libs/" ;;
      esac
    done
  done
  # OpenBLAS is loaded at run time (runtime/cpu/Blas.cpp), so ldd misses it.
  cp -L "$(ldconfig -p | awk '/libopenblas\.so\.0 / {print $NF; exit}')" \
    "$dir/gpu/libs/"
  # Plans of the committed training models (2 stages, both on the one GPU
  # there), f32 and bf16, their datasets, and the loss comparer.
  for m in mlp gpt mlp_mse; do
    for p in f32 bf16; do
      "$build/tools/cleavec" "$root/tests/models/training/$m/model.onnx" \
        --stages 2 --microbatches 4 --schedule zb-h1 --lr 0.1 --precision $p \
        -o "$dir/gpu/plans/$m-$p.cplan" >/dev/null
    done
    mkdir -p "$dir/gpu/data/$m"
    cp -r "$root/tests/models/training/$m/steps/data" "$dir/gpu/data/$m/"
  done
  cp "$root/tests/lit/cleave-run/Inputs/compare_losses.py" "$dir/gpu/"
  # W batching on the GPU: the example GPT, small microbatches, all W
  # actions adjacent (gpipe-2bp).
  "$build/tools/cleavec" "$root/examples/gpt/gpt-tiny.onnx" \
    --microbatch-size 2 --stages 2 --microbatches 8 --schedule gpipe-2bp \
    -o "$dir/gpu/plans-batch-w.cplan" >/dev/null
  # Activation offload on the GPU: the example GPT kept and offloaded
  # (pinned host frames, the copy stream), the model beside the plans for
  # --save.
  mkdir -p "$dir/gpu/offload"
  cp "$root/examples/gpt/gpt-tiny.onnx" "$dir/gpu/offload/"
  for o in none all; do
    "$build/tools/cleavec" "$dir/gpu/offload/gpt-tiny.onnx"       --microbatch-size 4 --layer-depth 2 --stages 2 --microbatches 4       --schedule zb-h1 --offload $o -o "$dir/gpu/offload/$o.cplan" >/dev/null
  done
  # The bar's benchmark: GPT-2-small, bf16, batch 8 x 1024, against PyTorch
  # (tests/bench/gpt2_small_gpu.py; its tiled weights compress to ~1 MB).
  mkdir -p "$dir/gpu/gpt2/examples/gpt" "$dir/gpu/gpt2/tests/bench"
  cp "$root/examples/gpt/model.py" "$dir/gpu/gpt2/examples/gpt/"
  cp "$root/tests/bench/gpt2_small_gpu.py" "$dir/gpu/gpt2/tests/bench/"
  /usr/bin/python3 "$root/tests/bench/gpt2_small_gpu.py" prepare \
    --out "$dir/onnx" --batch 8
  cp -r "$dir/onnx/data" "$dir/gpu/gpt2/"
  "$build/tools/cleavec" "$dir/onnx/gpt2.onnx" --microbatch-size 8 \
    --microbatches 1 --precision bf16 --lr 1e-4 --device-profile h200 \
    -o "$dir/gpu/gpt2/gpt2-bf16.cplan" >/dev/null
  rm -rf "$dir/onnx" 
  XZ_OPT="-3 -T0" tar -cJf "$bundle" -C "$dir" gpu
  echo "wrote $bundle ($(du -h "$bundle" | cut -f1))"
  ;;
run)
  out="${OUT:-$build/gpu-check}"
  mkdir -p "$out"
  work="$(mktemp -d)"
  tar -xJf "$bundle" -C "$work" || { echo "no $bundle: run 'bundle' first" >&2; exit 1; }
  g="$work/gpu"
  summary="$out/summary.txt"
  libpath="$g/libs"
  for d in /usr/local/cuda/lib64 /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && libpath="$libpath:$d"
  done
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    echo "gpu-check $(date -u '+%Y-%m-%d %H:%M UTC')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
      2>&1 || echo "nvidia-smi: not available"
    echo
    echo "== CUDA unit tests: every op case on the GPU against the CPU backend,"
    echo "   and 3 training steps of each model on 2 stages sharing the GPU"
    "$g/bin/cleave-unit-tests" \
      --gtest_filter='Cuda*:*CudaDeviceTrains*:*CudaKernelsTrain*:Nccl*' \
      >"$out/unit.log" 2>&1
    echo "exit $?"
    grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^\[cuda\]' "$out/unit.log"
    echo
    echo "== cleave-run --device cuda against --device cpu, 20 steps (losses)"
    for plan in "$g"/plans/*.cplan; do
      name="$(basename "$plan" .cplan)"
      data="$g/data/${name%-*}/data"
      "$g/bin/cleave-run" "$plan" --steps 20 --data "$data" >"$out/$name-cpu.log" 2>&1
      "$g/bin/cleave-run" "$plan" --steps 20 --data "$data" --device cuda \
        >"$out/$name-cuda.log" 2>&1
      rc=$?
      tol=1e-4
      [ "${name##*-}" = bf16 ] && tol=2e-2
      printf '%-14s exit %s; ' "$name" "$rc"
      python3 "$g/compare_losses.py" "$out/$name-cpu.log" "$out/$name-cuda.log" $tol 2>&1
      grep -E '^done|error' "$out/$name-cuda.log" | head -n 2
    done
    echo
    echo "== W batching: gpt-tiny gpipe-2bp, M 8 of 2 samples, 2 stages on the"
    echo "   GPU; median step ms of steps 2-30, plain then --batch-w, 3 rounds"
    for round in 1 2 3; do
      for flag in "" --batch-w; do
        "$g/bin/cleave-run" "$g/plans-batch-w.cplan" --device cuda --steps 30 \
          $flag >"$out/batch-w.log" 2>&1 || { tail -n 2 "$out/batch-w.log"; break; }
        grep -E '^step ' "$out/batch-w.log" | tail -n 29 |
          sed -E 's/.* ([0-9.]+) ms .*/\1/' | sort -g | sed -n '15p' |
          tr '\n' ' '
      done
      echo
    done
    echo
    echo "== activation offload: gpt-tiny zb-h1, 2 stages on the GPU, kept and"
    echo "   offloaded (--offload all): same bits, measured peak = planned"
    for o in none all; do
      "$g/bin/cleave-run" "$g/offload/$o.cplan" --device cuda --steps 5 \
        --save "$out/offload-$o.onnx" >"$out/offload-$o.log" 2>&1
      echo "--offload $o: exit $?"
      grep -E '^[0-9]+ .* / |error' "$out/offload-$o.log"
    done
    cmp "$out/offload-none.onnx" "$out/offload-all.onnx" &&
      echo "offload: same bits as keeping"
    echo
    echo "== NCCL between stages on different GPUs (--comm nccl against keyed;"
    echo "   needs two GPUs: NCCL takes one rank per device)"
    gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
    if [ "$gpus" -ge 2 ]; then
      for c in keyed nccl; do
        "$g/bin/cleave-run" "$g/offload/none.cplan" --device cuda --steps 5 \
          --comm $c --save "$out/comm-$c.onnx" >"$out/comm-$c.log" 2>&1
        echo "--comm $c: exit $?"
        grep -E '^done|error' "$out/comm-$c.log" | head -n 2
      done
      cmp "$out/comm-keyed.onnx" "$out/comm-nccl.onnx" &&
        echo "nccl: same bits as keyed"
    else
      echo "skipped: $gpus GPU(s) visible"
    fi
    echo
    echo "== GPT-2-small training step, bf16, batch 8 x 1024 (the bar)"
    "$g/bin/cleave-run" "$g/gpt2/gpt2-bf16.cplan" --device cuda --steps 13 \
      --data "$g/gpt2/data" >"$out/gpt2-cleave.log" 2>&1
    echo "cleave exit $?: median step ms of steps 4-13:"
    grep -E '^step ' "$out/gpt2-cleave.log" | tail -n 10 |
      sed -E 's/.* ([0-9.]+) ms .*/\1/' | sort -g | sed -n '5,6p' | tr '\n' ' '
    echo
    grep -E '^step +(1|13)/|error' "$out/gpt2-cleave.log"
    (cd "$g/gpt2" && python3 tests/bench/gpt2_small_gpu.py torch \
      --data data --steps 10) >"$out/gpt2-torch.log" 2>&1
    echo "torch exit $?:"
    cat "$out/gpt2-torch.log"
  } >"$summary" 2>&1
  rm -rf "$work"
  cat "$summary"
  ;;
*)
  echo "usage: tools/gpu-check.sh bundle|run [BUILD]" >&2
  exit 2
  ;;
esac
