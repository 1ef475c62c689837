#!/usr/bin/env bash
# The one-shot GPU check. On a machine with an NVIDIA GPU: uses the build carried in
# gpu-pack/ (see tools/gpu-pack.sh) or builds one, then
#   1. runs the gpu-labelled tests (CUDA ops vs the CPU reference, GPU training,
#      determinism, bit-exact resume, GPU<->CPU remap, the fp16 loss scaler),
#   2. trains the default config for a few epochs on the GPU,
#   3. verifies the checkpoints, evaluates one on the CPU, resumes it on the CPU,
#   4. runs the side-by-side benchmark against PyTorch (eager and torch.compile),
# and writes a summary to $OUT/gpu-check-summary.txt (OUT defaults to ./gpu-check-out).
# Budget: well under 8 minutes on an H200.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
EPOCHS=${GPU_CHECK_EPOCHS:-3}
mkdir -p "$OUT"
SUMMARY="$OUT/gpu-check-summary.txt"
LOG="$OUT/gpu-check.log"
: >"$SUMMARY"
: >"$LOG"
failures=0
say() { echo "$*" | tee -a "$SUMMARY"; }
step() {  # step NAME COMMAND...: runs, logs, records PASS/FAIL/SKIP with seconds
  local name=$1; shift
  local t0=$SECONDS rc
  echo "=== $name: $*" >>"$LOG"
  "$@" >>"$LOG" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then say "PASS  $name ($((SECONDS - t0)) s)"
  elif [ $rc -eq 77 ]; then say "SKIP  $name"
  else say "FAIL  $name (exit $rc, $((SECONDS - t0)) s; see gpu-check.log)"; failures=$((failures + 1)); fi
  return $rc
}

say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
GPU_PRESENT=0
if nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >/tmp/gpu-name 2>&1; then
  GPU_PRESENT=1
fi
sed 's/^/gpu: /' /tmp/gpu-name | tee -a "$SUMMARY"

# ---- the build and its libraries --------------------------------------------------
# cuDNN comes from PyTorch's Python environment there (pip package nvidia-cudnn-cu13).
cudnn_dir=$(python3 -c "import nvidia.cudnn as m, os; print(os.path.join(m.__path__[0], 'lib'))" 2>/dev/null || true)
if [ -d "$ROOT/gpu-pack" ]; then
  mkdir -p /tmp/engine-pack /tmp/engine-libs
  tar -C /tmp/engine-pack -xJf "$ROOT/gpu-pack/build.tar.xz"
  tar -C /tmp/engine-libs -xJf "$ROOT/gpu-pack/libs.tar.xz"
  BUILD=/tmp/engine-pack/build
  export LD_LIBRARY_PATH="/tmp/engine-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export ENGINE_DATA_DIR="$ROOT/gpu-pack/data"
else
  BUILD="$ROOT/build-gpu"
  step build bash -c "cmake -S '$ROOT' -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES='90-real;90-virtual' && cmake --build '$BUILD'" || exit 1
fi
[ -n "$cudnn_dir" ] && export LD_LIBRARY_PATH="$cudnn_dir:$LD_LIBRARY_PATH"
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
export ENGINE_BIN="$BUILD/engine" ENGINE_SOURCE_DIR="$ROOT" ENGINE_TEST_TMP=/tmp/engine-gpu-tests
export ENGINE_KILL_AFTER_BIN="$BUILD/tests/engine_kill_after"
DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
mkdir -p "$ENGINE_TEST_TMP"
if ! ldd "$ENGINE_BIN" | grep -q "not found"; then :; else
  say "FAIL  libraries missing:"; ldd "$ENGINE_BIN" | grep "not found" | tee -a "$SUMMARY"; exit 1
fi

# ---- 1. gpu-labelled tests, then the CPU suites (16 cores there) --------------------
for t in "$BUILD"/tests/gpu_test_*; do
  step "$(basename "$t")" "$t"
  # On a GPU machine a skipped GPU test means the engine did not find the GPU.
  if [ $? -eq 77 ] && [ $GPU_PRESENT -eq 1 ]; then say "FAIL  $(basename "$t") skipped although nvidia-smi sees a GPU"; failures=$((failures + 1)); fi
done
for t in test_kernels test_gradcheck test_checkpoint test_optim test_state; do
  [ -x "$BUILD/tests/$t" ] && step "$t (cpu)" "$BUILD/tests/$t"
done

# ---- 2-3. train the default config on the GPU, verify, remap to the CPU --------------
RUN=/tmp/engine-gpu-run
rm -rf "$RUN"
step "train ${EPOCHS} epochs on cuda" "$ENGINE_BIN" train "$ROOT/configs/mnist.json" --device cuda \
  --run-dir "$RUN" --set data.dir="$DATA" --set train.epochs="$EPOCHS"
[ -f "$RUN/metrics.jsonl" ] && sed 's/^/  /' "$RUN/metrics.jsonl" | tee -a "$SUMMARY"
step "verify last.h5" "$ENGINE_BIN" verify "$RUN/last.h5"
step "verify best.h5" "$ENGINE_BIN" verify "$RUN/best.h5"
step "eval GPU checkpoint on cpu" "$ENGINE_BIN" eval "$RUN/last.h5" --device cpu
step "resume GPU checkpoint on cpu (1 more epoch)" "$ENGINE_BIN" resume "$RUN/last.h5" --device cpu \
  --run-dir /tmp/engine-gpu-run-cpu --set train.epochs=$((EPOCHS + 1)) --set data.train_limit=4096
# A small GPU checkpoint to commit as tests/data fixture (GPU->CPU remap test).
FIX=/tmp/engine-gpu-fixture
rm -rf "$FIX"
step "small fixture run on cuda" "$ENGINE_BIN" train "$ROOT/configs/mnist.json" --device cuda --run-dir "$FIX" \
  --set data.dir="$DATA" --set train.epochs=2 --set data.train_limit=1024 --set data.val_split=512 \
  --set data.test_limit=512 --set data.batch_size=64 --set precision.mode=fp16 --stop-after-epochs 1
[ -f "$FIX/last.h5" ] && cp "$FIX/last.h5" "$OUT/gpu_fixture_v1.h5"

# ---- 4. benchmark: engine vs PyTorch eager vs torch.compile on this GPU --------------
if [ -x "$ROOT/tools/bench/gpu_epoch.sh" ]; then
  step "benchmark (tools/bench/gpu_epoch.sh)" env ENGINE_BIN="$ENGINE_BIN" ENGINE_DATA_DIR="$DATA" \
    bash "$ROOT/tools/bench/gpu_epoch.sh" "$OUT/gpu-bench.txt"
  [ -f "$OUT/gpu-bench.txt" ] && sed 's/^/  /' "$OUT/gpu-bench.txt" | tee -a "$SUMMARY"
fi

say "failures: $failures"
exit $((failures > 0))
