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
#       BUILD/gpu-check/summary.txt) and the logs beside it as logs.tar.gz,
#       and prints the summary. GPU_CHECK_PARTS (default: every part) picks
#       parts for a rerun: unit plans corpus batchw offload nccl gpt2
#       graphs profile.
#   tools/gpu-check.sh dry-run [BUILD]  here, without a GPU: bundle and run
#       at tiny sizes with --device cuda-emulated (the CUDA backend's
#       arithmetic on the host) in place of cuda, and check that every part
#       of the script ran and passed, so that the script a lent GPU gets has
#       run before (CI runs it). The GPT-2 part needs a Python with PyTorch
#       2.x (CLEAVE_TORCH_PYTHON, else ~/.cache/cleave/torch2-venv, else
#       python3) and is skipped, saying so, without one.
#
# BUILD defaults to build/. CUDA's own libraries (cudart, cuBLAS) are taken
# from the machine: the CUDA toolkit, or the pip packages of its PyTorch.
set -uo pipefail
# Plans in the bundle use the fixed cpu profile (cleavec's default measures
# this host), so that the same command builds the same bundle anywhere.
export CLEAVE_DEVICE_PROFILE="${CLEAVE_DEVICE_PROFILE:-cpu}"
root="$(cd "$(dirname "$0")/.." && pwd)"
mode="${1:-}"
build="${2:-$root/build}"
bundle="$build/gpu-bundle.tar.xz"
# A dry run (GPU_CHECK_DRY=1, set by `dry-run`): tiny sizes, few steps, the
# emulated CUDA backend, PyTorch on the CPU.
dry="${GPU_CHECK_DRY:-0}"
dev=cuda
steps=20
[ "$dry" = 1 ] && { dev=cuda-emulated; steps=3; bundle="$build/gpu-bundle-dry.tar.xz"; }
# The first Python with PyTorch, ONNX and NumPy, or nothing (and success:
# the bundle's `set -e` must not stop where none is installed, as on CI).
torch_python() {
  for py in "${CLEAVE_TORCH_PYTHON:-}" "$HOME/.cache/cleave/torch2-venv/bin/python" python3; do
    [ -n "$py" ] && "$py" -c 'import torch, onnx, numpy' 2>/dev/null && { echo "$py"; return 0; }
  done
  return 0
}

case "$mode" in
bundle)
  set -e
  dir="$(mktemp -d)"
  trap 'rm -rf "$dir"' EXIT
  mkdir -p "$dir/gpu/bin" "$dir/gpu/libs" "$dir/gpu/plans"
  for bin in "$build/tools/cleave-run" "$build/tools/cleavec" \
    "$build/tests/cleave-unit-tests"; do
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
  # The GELU epilogue: a Gemm with a bias and a tanh Gelu (f32: a bf16
  # plan casts between them, which keeps them apart).
  cp "$root/tests/models/gemm_gelu.onnx" "$dir/gpu/offload/"
  "$build/tools/cleavec" "$dir/gpu/offload/gemm_gelu.onnx" \
    --microbatch-size 64 --microbatches 2 -o "$dir/gpu/offload/gemm-gelu-f32.cplan" \
    >/dev/null
  # Data-parallel sums over NCCL (two GPUs): 2 replicas of one stage.
  "$build/tools/cleavec" "$dir/gpu/offload/gpt-tiny.onnx" \
    --microbatch-size 2 --stages 1 --data-parallel 2 --microbatches 4 \
    -o "$dir/gpu/offload/dp2.cplan" >/dev/null
  # The bar's benchmark: GPT-2-small, bf16, batch 8 x 1024, against PyTorch
  # (tests/bench/gpt2_small_gpu.py; its tiled weights compress to ~1 MB).
  py="$(torch_python)"
  if [ -n "$py" ]; then
    mkdir -p "$dir/gpu/gpt2/examples/gpt" "$dir/gpu/gpt2/tests/bench"
    cp "$root/examples/gpt/model.py" "$dir/gpu/gpt2/examples/gpt/"
    cp "$root/tests/bench/gpt2_small_gpu.py" "$dir/gpu/gpt2/tests/bench/"
    batch=8
    tiny=""
    [ "$dry" = 1 ] && { batch=2; tiny=--tiny; }
    "$py" "$root/tests/bench/gpt2_small_gpu.py" prepare \
      --out "$dir/onnx" --batch $batch $tiny >/dev/null
    cp -r "$dir/onnx/data" "$dir/gpu/gpt2/"
    "$build/tools/cleavec" "$dir/onnx/gpt2.onnx" --microbatch-size $batch \
      --microbatches 1 --precision bf16 --lr 1e-4 --device-profile h200 \
      --weights embed -o "$dir/gpu/gpt2/gpt2-bf16.cplan" >/dev/null
    # The model too, for the profile part's compile.
    mv "$dir/onnx/gpt2.onnx" "$dir/onnx/gpt2.onnx.data" "$dir/gpu/gpt2/"
    rm -rf "$dir/onnx"
  else
    echo "no Python with PyTorch 2.x, onnx and numpy: the bundle has no GPT-2 check"
  fi
  if [ "$dry" = 1 ]; then # not carried anywhere: no need to compress well
    XZ_OPT="-0 -T0" tar -cJf "$bundle" -C "$dir" gpu
  else
    XZ_OPT="-3 -T0" tar -cJf "$bundle" -C "$dir" gpu
  fi
  echo "wrote $bundle ($(du -h "$bundle" | cut -f1))"
  ;;
run)
  out="${OUT:-$build/gpu-check}"
  mkdir -p "$out"
  work="$(mktemp -d)"
  tar -xJf "$bundle" -C "$work" || { echo "no $bundle: run 'bundle' first" >&2; exit 1; }
  g="$work/gpu"
  summary="$out/summary.txt"
  # The logs go to one tarball in $OUT at the end (a lent machine returns
  # at most 8 files); each command has a time limit so that one hang costs
  # one part, not the run. GPU_CHECK_PARTS picks parts for a rerun.
  logs="$work/logs"
  mkdir -p "$logs"
  parts="${GPU_CHECK_PARTS:-unit plans corpus batchw offload nccl gpt2 graphs profile}"
  want() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
  T() { timeout -k 5 "$@"; }
  t0=$SECONDS
  took() { echo "($((SECONDS - t0)) s since the start)"; }
  # LOG STEPS: the median step ms of steps 4 to STEPS in a cleave-run log.
  median_step() {
    grep -E '^step ' "$1" | tail -n $(($2 - 3)) |
      sed -E 's/.* ([0-9.]+) ms .*/\1/' | sort -g |
      sed -n "$(( ($2 - 2) / 2 ))p" | tr '\n' ' '
    echo
  }
  libpath="$g/libs"
  for d in /usr/local/cuda/lib64 /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && libpath="$libpath:$d"
  done
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    echo "gpu-check $(date -u '+%Y-%m-%d %H:%M UTC') (parts: $parts)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
      2>&1 || echo "nvidia-smi: not available"
    echo
    if want unit; then
      echo "== CUDA unit tests: every op case on the GPU against the CPU backend,"
      echo "   3 training steps of each model on 2 stages sharing the GPU, the"
      echo "   corpus's gradients against PyTorch's float64 and the bf16 ones"
      echo "   against PyTorch's bf16, on the GPU"
      T 240 "$g/bin/cleave-unit-tests" \
        --gtest_filter='Cuda*:*CudaDeviceTrains*:*CudaKernelsTrain*:Nccl*:*Corpus.CudaGradients*:*TrainingParity.CudaBf16*' \
        >"$logs/unit.log" 2>&1
      echo "exit $?"
      grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^\[cuda\]|cuda +[0-9]+ gradients|^\[parity bf16 cuda\]' "$logs/unit.log"
      grep -E -A4 'Failure$|error:' "$logs/unit.log" | head -n 60
      echo "-- the convolutions, products and the CNN's training again without"
      echo "   cuDNN and cuBLASLt (im2col, and a Gemm's bias as a copy under a GEMM)"
      CLEAVE_CUDNN=0 CLEAVE_CUBLASLT=0 T 120 "$g/bin/cleave-unit-tests" \
        --gtest_filter='CudaBackend.Convolution*:CudaBackend.Products*:*CudaDeviceTrains*cnn:*TrainingParity.CudaBf16*' \
        >"$logs/unit-no-cudnn.log" 2>&1
      echo "exit $?"
      grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|^\[cuda\]|^\[parity bf16 cuda\]' "$logs/unit-no-cudnn.log"
      grep -E -A4 'Failure$|error:' "$logs/unit-no-cudnn.log" | head -n 30
      echo "-- the attention op cases again with four lanes a row"
      echo "   (CLEAVE_CUDA_ATTENTION=lanes: the D 64 cases)"
      CLEAVE_CUDA_ATTENTION=lanes T 120 "$g/bin/cleave-unit-tests" \
        --gtest_filter='CudaBackend.ProductsThroughCublas' \
        >"$logs/unit-lanes.log" 2>&1
      echo "exit $?"
      grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]' "$logs/unit-lanes.log"
      grep -E -A4 'Failure$|error:' "$logs/unit-lanes.log" | head -n 30
      took
      echo
    fi
    if want plans; then
      echo "== cleave-run --device $dev against --device cpu, $steps steps (losses)"
      for plan in "$g"/plans/*.cplan; do
        name="$(basename "$plan" .cplan)"
        data="$g/data/${name%-*}/data"
        T 60 "$g/bin/cleave-run" "$plan" --steps $steps --data "$data" >"$logs/$name-cpu.log" 2>&1
        T 90 "$g/bin/cleave-run" "$plan" --steps $steps --data "$data" --device $dev \
          >"$logs/$name-cuda.log" 2>&1
        rc=$?
        tol=1e-4
        [ "${name##*-}" = bf16 ] && tol=2e-2
        printf '%-14s exit %s; ' "$name" "$rc"
        if cmpout="$(python3 "$g/compare_losses.py" "$logs/$name-cpu.log" \
          "$logs/$name-cuda.log" $tol 2>&1)"; then
          echo "$cmpout (within $tol)"
        else
          echo "$cmpout (OVER $tol)"
        fi
        grep -E '^done|error' "$logs/$name-cuda.log" | head -n 2
      done
      took
      echo
    fi
    if want corpus; then
      echo "== the PyTorch 2 corpus on 1, 2 and 4 stages sharing the GPU against"
      echo "   the CPU (compiled there from tests/models/corpus; losses)"
      models="gpt2-legacy gpt2-dynamo llama-legacy llama-dynamo bert-legacy
        bert-dynamo resnet18-legacy resnet18-dynamo mobilenet_v2-legacy
        mobilenet_v2-dynamo vit-legacy vit-dynamo unet-legacy unet-dynamo rnn-legacy rnn-dynamo"
      stage_counts="1 2 4"
      csteps=5
      if [ "$dry" = 1 ]; then
        models="gpt2-dynamo llama-legacy resnet18-dynamo"
        stage_counts="1 2"
        csteps=2
      fi
      corpus="$root/tests/models/corpus"
      matched=0
      tried=0
      mkdir -p "$work/corpus"
      for m in $models; do
        for p in $stage_counts; do
          name="$m-$p"
          tried=$((tried + 1))
          if ! T 60 "$g/bin/cleavec" "$corpus/$m/model.onnx" --stages $p \
            --microbatches 4 --schedule 1f1b --lr 0.1 --momentum 0.9 \
            -o "$work/corpus/$name.cplan" >"$logs/corpus-$name-cleavec.log" 2>&1; then
            echo "$name: cleavec failed: $(tail -n 1 "$logs/corpus-$name-cleavec.log")"
            continue
          fi
          for d in cpu $dev; do
            T 60 "$g/bin/cleave-run" "$work/corpus/$name.cplan" --device $d \
              --data "$corpus/$m/steps/data" --steps $csteps \
              --trust-dir "$corpus" >"$logs/corpus-$name-$d.log" 2>&1 ||
              echo "$name --device $d: exit $?: $(grep -m1 error "$logs/corpus-$name-$d.log")"
          done
          if cmpout="$(python3 "$g/compare_losses.py" "$logs/corpus-$name-cpu.log" \
            "$logs/corpus-$name-$dev.log" 1e-4 2>&1)"; then
            matched=$((matched + 1))
          else
            echo "$name: $cmpout (OVER 1e-4)"
          fi
        done
      done
      echo "corpus: $matched of $tried plans train on $dev as on the cpu"
      rm -rf "$work/corpus"
      took
      echo
    fi
    if want batchw; then
      echo "== W batching: gpt-tiny gpipe-2bp, M 8 of 2 samples, 2 stages on the"
      echo "   GPU; median step ms of steps 2-30, plain then --batch-w, 3 rounds"
      rounds="1 2 3"
      bsteps=30
      [ "$dry" = 1 ] && { rounds=1; bsteps=3; }
      for round in $rounds; do
        for flag in "" --batch-w; do
          T 90 "$g/bin/cleave-run" "$g/plans-batch-w.cplan" --device $dev --steps $bsteps \
            $flag >"$logs/batch-w.log" 2>&1 || { echo "batch-w $flag: failed"; tail -n 2 "$logs/batch-w.log"; break; }
          grep -E '^step ' "$logs/batch-w.log" | tail -n $((bsteps - 1)) |
            sed -E 's/.* ([0-9.]+) ms .*/\1/' | sort -g |
            sed -n "$(( (bsteps + 1) / 2 ))p" | tr '\n' ' '
        done
        echo
      done
      took
      echo
    fi
    if want offload; then
      echo "== activation offload: gpt-tiny zb-h1, 2 stages on the GPU, kept and"
      echo "   offloaded (--offload all): same bits, measured peak = planned"
      for o in none all; do
        T 90 "$g/bin/cleave-run" "$g/offload/$o.cplan" --device $dev --steps 3 \
          --save "$logs/offload-$o.onnx" >"$logs/offload-$o.log" 2>&1
        echo "--offload $o: exit $?"
        grep -E '^[0-9]+ .* / |error' "$logs/offload-$o.log"
      done
      cmp "$logs/offload-none.onnx" "$logs/offload-all.onnx" &&
        echo "offload: same bits as keeping"
      took
      echo
    fi
    if want nccl; then
      # PLAN NAME COMM DEVICE STEPS: --comm keyed, then COMM; the same bits.
      keyed_and() {
        for c in keyed $3; do
          T 120 "$g/bin/cleave-run" "$1" --device $4 --steps $5 \
            --comm $c --save "$logs/$2-$c.onnx" >"$logs/$2-$c.log" 2>&1
          echo "--comm $c: exit $?"
          grep -E '^done|error' "$logs/$2-$c.log" | head -n 2
        done
        cmp "$logs/$2-keyed.onnx" "$logs/$2-$3.onnx" &&
          echo "$2: $3 gives the same bits as keyed"
      }
      echo "== order-matched channels on one GPU (--comm ordered against keyed:"
      echo "   the messages taken straight from device memory, held ones too)"
      keyed_and "$g/offload/none.cplan" channels ordered $dev 3
      echo "== parcels (the stages' messages device to device) against staging"
      echo "   through host memory (CLEAVE_PARCELS=0): the same bits"
      for v in 1 0; do
        CLEAVE_PARCELS=$v T 90 "$g/bin/cleave-run" "$g/offload/none.cplan" \
          --device $dev --steps 3 --save "$logs/parcels-$v.onnx" \
          >"$logs/parcels-$v.log" 2>&1
        echo "CLEAVE_PARCELS=$v: exit $?"
      done
      cmp "$logs/parcels-1.onnx" "$logs/parcels-0.onnx" &&
        echo "parcels: the same bits as staging through the host"
      echo "== NCCL between stages on different GPUs (--comm nccl against keyed;"
      echo "   needs two GPUs: NCCL takes one rank per device)"
      gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
      if [ "$gpus" -ge 2 ]; then
        keyed_and_nccl() { keyed_and "$1" "$2" nccl cuda 5; }
        keyed_and_nccl "$g/offload/none.cplan" stages
        echo "-- 2 data-parallel replicas of one stage, one a GPU: the sums"
        echo "   over NCCL against the host's"
        keyed_and_nccl "$g/offload/dp2.cplan" replicas
      else
        echo "skipped: $gpus GPU(s) visible"
      fi
      echo
    fi
    if want gpt2; then
      echo "== GPT-2-small training step, bf16, batch 8 x 1024 (the bar)"
      if [ -f "$g/gpt2/gpt2-bf16.cplan" ]; then
        gsteps=13
        torchargs="--steps 10"
        if [ "$dry" = 1 ]; then
          echo "(dry run: 2 layers, d 64, T 64, batch 2; PyTorch on the CPU)"
          gsteps=4
          torchargs="--steps 2 --device cpu --tiny"
        fi
        T 180 "$g/bin/cleave-run" "$g/gpt2/gpt2-bf16.cplan" --device $dev --steps $gsteps \
          --data "$g/gpt2/data" --profile "$logs/gpt2-profile.json" \
          >"$logs/gpt2-cleave.log" 2>&1
        echo "cleave exit $?: median step ms of steps 4-$gsteps:"
        median_step "$logs/gpt2-cleave.log" $gsteps
        grep -E "^step +(1|$gsteps)/|error|the step took" "$logs/gpt2-cleave.log"
        py=python3
        [ "$dry" = 1 ] && py="$(torch_python)"
        (cd "$g/gpt2" && T 180 "${py:-python3}" tests/bench/gpt2_small_gpu.py torch \
          --data data $torchargs) >"$logs/gpt2-torch.log" 2>&1
        echo "torch exit $?:"
        cat "$logs/gpt2-torch.log"
      else
        echo "skipped: the bundle has no GPT-2 plan (no PyTorch where it was made)"
      fi
      took
      echo
    fi
    if want graphs; then
      echo "== CUDA Graphs (--cuda-graphs) against plain launches: the same"
      echo "   bits (gpt-tiny, 2 stages on the GPU), and GPT-2-small's median step"
      for v in plain graphs; do
        flag=""
        [ $v = graphs ] && flag=--cuda-graphs
        T 90 "$g/bin/cleave-run" "$g/offload/none.cplan" --device $dev --steps 5 \
          $flag --save "$logs/graphs-$v.onnx" >"$logs/graphs-$v.log" 2>&1
        echo "$v: exit $?"
        grep -E '^done|^graphs|error' "$logs/graphs-$v.log" | head -n 3
      done
      cmp "$logs/graphs-plain.onnx" "$logs/graphs-graphs.onnx" &&
        echo "graphs: the same bits as plain launches"
      echo "-- the GELU epilogue (cuBLASLt GELU_AUX_BIAS) against the Gemm and"
      echo "   the tanh Gelu kept apart (CLEAVE_GEMM_GELU=0): 5 steps' losses"
      for p in f32; do
        for f in 1 0; do
          CLEAVE_GEMM_GELU=$f T 60 "$g/bin/cleave-run" \
            "$g/offload/gemm-gelu-$p.cplan" --device $dev --steps 5 \
            >"$logs/gemm-gelu-$p-$f.log" 2>&1
          echo "$p CLEAVE_GEMM_GELU=$f: exit $?"
          grep -E '^Gemm \+ Gelu|error' "$logs/gemm-gelu-$p-$f.log" | head -n 2
        done
        python3 "$g/compare_losses.py" "$logs/gemm-gelu-$p-1.log" \
          "$logs/gemm-gelu-$p-0.log" 1e-3
      done
      if [ -f "$g/gpt2/gpt2-bf16.cplan" ]; then
        gsteps=13
        [ "$dry" = 1 ] && gsteps=4
        for v in plain graphs; do
          flag=""
          [ $v = graphs ] && flag=--cuda-graphs
          T 180 "$g/bin/cleave-run" "$g/gpt2/gpt2-bf16.cplan" --device $dev \
            --steps $gsteps --data "$g/gpt2/data" $flag \
            >"$logs/gpt2-$v.log" 2>&1
          echo "GPT-2 $v: exit $?, median step ms of steps 4-$gsteps:"
          median_step "$logs/gpt2-$v.log" $gsteps
          grep -E '^graphs|error' "$logs/gpt2-$v.log" | head -n 2
        done
      fi
      took
      echo
    fi
    if want profile; then
      echo "== the measured profile fed back: GPT-2-small compiled again with"
      echo "   --cost-model profile: (the GPT-2 part's --profile), predicted"
      echo "   against measured"
      if [ -f "$logs/gpt2-profile.json" ] && [ -f "$g/gpt2/gpt2.onnx" ]; then
        pbatch=8
        [ "$dry" = 1 ] && pbatch=2
        T 120 "$g/bin/cleavec" "$g/gpt2/gpt2.onnx" --microbatch-size $pbatch \
          --microbatches 1 --precision bf16 --lr 1e-4 --weights embed \
          --cost-model "profile:$logs/gpt2-profile.json" \
          -o "$work/gpt2-profiled.cplan" >"$logs/gpt2-profiled-cleavec.log" 2>&1
        echo "cleavec exit $?"
        T 120 "$g/bin/cleave-run" "$work/gpt2-profiled.cplan" --device $dev \
          --steps 6 --data "$g/gpt2/data" >"$logs/gpt2-profiled.log" 2>&1
        echo "cleave-run exit $?"
        grep -E -A3 'step ms \(measured / predicted\)' "$logs/gpt2-profiled.log"
        grep -E 'the step took|error' "$logs/gpt2-profiled.log"
        echo "-- where the GPU's time goes: each device step waited for and"
        echo "   timed (CLEAVE_CUDA_STEP_PROFILE=1), 3 steps"
        CLEAVE_CUDA_STEP_PROFILE=1 T 120 "$g/bin/cleave-run" "$work/gpt2-profiled.cplan" \
          --device $dev --steps 3 --data "$g/gpt2/data" >"$logs/gpt2-steps.log" 2>&1
        echo "exit $?"
        grep -E -A62 '^cuda steps of device' "$logs/gpt2-steps.log"
        echo "-- attention with four lanes a row (CLEAVE_CUDA_ATTENTION=lanes)"
        echo "   against the block steps: 3 steps each, the trained models"
        echo "   compared byte for byte, then the lanes' device steps timed"
        for v in blocks lanes; do
          CLEAVE_CUDA_ATTENTION=$v T 120 "$g/bin/cleave-run" \
            "$work/gpt2-profiled.cplan" --device $dev --steps 3 \
            --data "$g/gpt2/data" --save "$work/gpt2-$v.onnx" \
            >"$logs/gpt2-$v.log" 2>&1
          echo "$v: exit $?: $(grep -E '^step +3/' "$logs/gpt2-$v.log")"
        done
        same=1
        for f in "$work"/gpt2-blocks.onnx*; do
          cmp -s "$f" "$work/gpt2-lanes${f#"$work"/gpt2-blocks}" || same=0
        done
        [ "$same" = 1 ] && echo "lanes: same bits as the block steps" ||
          echo "lanes: the trained models DIFFER"
        rm -f "$work"/gpt2-blocks.onnx* "$work"/gpt2-lanes.onnx*
        CLEAVE_CUDA_ATTENTION=lanes CLEAVE_CUDA_STEP_PROFILE=1 T 120 \
          "$g/bin/cleave-run" "$work/gpt2-profiled.cplan" --device $dev \
          --steps 3 --data "$g/gpt2/data" >"$logs/gpt2-lanes-steps.log" 2>&1
        grep -E -A6 '^cuda steps of device' "$logs/gpt2-lanes-steps.log"
        echo "-- the GEMMs' bias without cuBLASLt's epilogue (CLEAVE_CUBLASLT=0:"
        echo "   a copy of the bias under a cuBLAS GEMM), 6 steps"
        CLEAVE_CUBLASLT=0 T 120 "$g/bin/cleave-run" "$work/gpt2-profiled.cplan" \
          --device $dev --steps 6 --data "$g/gpt2/data" >"$logs/gpt2-no-lt.log" 2>&1
        echo "cleave-run exit $?"
        grep -E '^step +6/|^done|error' "$logs/gpt2-no-lt.log"
        echo "-- the same, each device step timed, 3 steps: the 12 slowest"
        CLEAVE_CUBLASLT=0 CLEAVE_CUDA_STEP_PROFILE=1 T 120 "$g/bin/cleave-run" \
          "$work/gpt2-profiled.cplan" --device $dev --steps 3 \
          --data "$g/gpt2/data" >"$logs/gpt2-no-lt-steps.log" 2>&1
        grep -E -A14 '^cuda steps of device' "$logs/gpt2-no-lt-steps.log"
        rm -f "$work/gpt2-profiled.cplan"
        echo "-- attention as exported (--fused-attention=off: the scores"
        echo "   through cuBLAS and row kernels), 6 steps"
        T 120 "$g/bin/cleavec" "$g/gpt2/gpt2.onnx" --microbatch-size $pbatch \
          --microbatches 1 --precision bf16 --lr 1e-4 --weights embed \
          --fused-attention=off -o "$work/gpt2-unfused.cplan" \
          >"$logs/gpt2-unfused-cleavec.log" 2>&1
        echo "cleavec exit $?"
        T 120 "$g/bin/cleave-run" "$work/gpt2-unfused.cplan" --device $dev \
          --steps 6 --data "$g/gpt2/data" >"$logs/gpt2-unfused.log" 2>&1
        echo "cleave-run exit $?"
        grep -E '^step +6/|^done|error' "$logs/gpt2-unfused.log"
        rm -f "$work/gpt2-unfused.cplan"
      else
        echo "skipped: no profile from the GPT-2 part, or no GPT-2 model in the bundle"
      fi
      took
      echo
    fi
  } >"$summary" 2>&1
  tar -czf "$out/logs.tar.gz" -C "$work" logs
  rm -rf "$work"
  cat "$summary"
  ;;
dry-run)
  # The whole script here, then what must have happened.
  out="${OUT:-$build/gpu-check-dry}"
  rm -rf "$out"
  mkdir -p "$out"
  GPU_CHECK_DRY=1 "$0" bundle "$build" || { echo "dry run: the bundle failed" >&2; exit 1; }
  GPU_CHECK_DRY=1 OUT="$out" "$0" run "$build" >/dev/null
  summary="$out/summary.txt"
  cat "$summary"
  bad=0
  need() { # pattern, what
    grep -qE "$1" "$summary" || { echo "dry run: missing: $2" >&2; bad=1; }
  }
  need '^exit 0$' "the unit tests of the CUDA backend passed"
  for plan in mlp-f32 mlp-bf16 gpt-f32 gpt-bf16 mlp_mse-f32 mlp_mse-bf16; do
    need "^$plan +exit 0; .*\(within " "$plan trained on $dev as on the cpu"
  done
  need '^corpus: ([0-9]+) of \1 plans train' "the corpus trained as on the cpu"
  need '^--offload none: exit 0$' "the kept plan ran"
  need '^--offload all: exit 0$' "the offloading plan ran"
  need '^offload: same bits as keeping$' "offload's bits"
  need '^channels: ordered gives the same bits as keyed$' "the channels' bits"
  need '^parcels: the same bits as staging through the host$' "the parcels' bits"
  need '^graphs: the same bits as plain launches$' "the graphs' bits"
  if grep -q 'skipped: the bundle has no GPT-2 plan' "$summary"; then
    echo "dry run: the GPT-2 part was skipped (no PyTorch here)"
  else
    need '^cleave exit 0' "the GPT-2 plan ran"
    need '^torch exit 0' "the PyTorch side ran"
  fi
  rm -f "$build/gpu-bundle-dry.tar.xz"
  [ $bad = 0 ] && echo "dry run: every part ran" || exit 1
  ;;
*)
  echo "usage: tools/gpu-check.sh bundle|run|dry-run [BUILD]" >&2
  exit 2
  ;;
esac
