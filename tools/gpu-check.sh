#!/usr/bin/env bash
# The one-shot GPU check (docs/gpu-check.md): everything one lent GPU run must measure
# shellcheck disable=SC2317  # functions run through bash -c "$(declare -f ...)"
# and sanitize, inside 8 minutes. Uses the binaries carried in gpu-pack/ (tools/gpu-pack.sh:
# the GPU machine cannot build: no OpenBLAS, HDF5, doctest, nlohmann-json), else builds.
#
#   tools/gpu-check.sh              run every stage
#   tools/gpu-check.sh --dry-run    print the plan (stages, budgets, commands); no GPU needed
#   tools/gpu-check.sh --stages op-tests,bench   run only these stages (setup always runs)
# Env: OUT, GPU_CHECK_EPOCHS (3), GPU_CHECK_BUILD (use this build dir instead of the pack)
#
# Stages, each under its own time budget (seconds; `timeout`), each recorded PASS, FAIL,
# SKIP (a tool the machine's runtime refuses, no GPU, no time left) or TIMEOUT; a failed
# stage never stops the others:
#   setup     25  unpack the pack (binaries, libraries, dataset), check the libraries
#   op-tests  40  GPU op tests vs the CPU reference (test_ops: tests/ops/; chunked and fp16 ops too),
#                 CUDA behaviour (gpu_test_cuda_behaviour: runtime, Philox, casts, determinism,
#                 fp16 overflow and model, layers at W = 2), threads
#   train     20  the default config for GPU_CHECK_EPOCHS epochs on cuda; verify
#   graphs    85  cuda.graphs on against off in fp32, fp16 (forced overflows) and bf16, with
#                 saves among the replays; the replays counted (engine train's "cuda graphs:"
#                 line), and their step digests bisected (identical through the last step);
#                 fp16 stopped by SIGUSR1 and SIGTERM among replays and resumed
#   bf16      30  bf16 on the default run: test accuracy >= 92 %; bf16 with cuda.batch_chunks=true
#   nccl      20  a few hundred images plainly and with dist.backend=nccl (a 1-rank NCCL
#                 communicator, libnccl.so.2 from PyTorch's wheel): engine diff, identical
#   ranks     15  CUDA ranks in the Trainer: 2 ranks sharing the GPU (threads, host-staged
#                 exchange) against one process, the MLP and the CNN, bit for bit
#                 (gpu_test_gpu_ranks; CUDA ranks stay opt-in, ENGINE_CUDA_RANKS=1, until it passes)
#   resume    40  GPU training tests (determinism, stop/SIGKILL resume, GPU<->CPU),
#                 a GPU checkpoint evaluated and resumed on the CPU
#   bench     75  engine fp32/fp16 vs every PyTorch peer (tools/bench/gpu_epoch.sh)
#   ncu       25  per-kernel table, ncu --print-summary per-kernel over a few hundred launches
#   sanitize  70  compute-sanitizer: memcheck over every op of the op list (test_ops, cuda
#                 required) and an fp16 training run with graphs; racecheck, initcheck,
#                 synccheck on filtered op tests and a short run (8 runs sharing the budget)
#   ab        25  every switch of tools/bench/gpu_ab_switches.txt, A vs B: time, engine diff
# Total 470 s of budgets, plus the script's own few seconds: under 8 minutes (480 s; a
# stage whose budget no longer fits is SKIPped).
# Output: $OUT/gpu-check-summary.txt (the summary), $OUT/gpu-check.log (everything),
# $OUT/*.txt per stage. OUT defaults to ./gpu-check-out.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
EPOCHS=${GPU_CHECK_EPOCHS:-3}
DRY_RUN=0
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --stages) ONLY=",$2,"; shift ;;
    --stages=*) ONLY=",${1#--stages=},";;
    -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (--dry-run, --stages LIST)" >&2; exit 2 ;;
  esac
  shift
done

# Stage budgets, seconds (keep the header comment in step).
declare -A BUDGET=([setup]=25 [op-tests]=40 [train]=20 [graphs]=85 [bf16]=30 [nccl]=20 [ranks]=15 [resume]=40 [bench]=75 [ncu]=25 [sanitize]=70 [ab]=25)


mkdir -p "$OUT"
SUMMARY="$OUT/gpu-check-summary.txt"
LOG="$OUT/gpu-check.log"
: >"$SUMMARY"
: >"$LOG"
failures=0
START=$SECONDS
say() { echo "$*" | tee -a "$SUMMARY"; }
# The runtime refusing a tool (no profiling permission, unsupported device or driver):
# such a result is SKIP, not FAIL.
# Only looked for in the output of ncu and compute-sanitizer (CAN_REFUSE=1).
REFUSED='ERR_NVGPUCTRPERM|not supported on this|is not supported|Unable to (initialize|find)|permission to access|profiling is not (allowed|permitted)|Device not supported|unsupported device|No supported devices|CUPTI_ERROR|could not be initialized'

# ---- Running -------------------------------------------------------------------------

# run NAME BUDGET COMMAND...: runs the command under `timeout`, output to LOG and to
# $OUT/NAME.txt; prints its status word. In dry-run mode prints the command instead.
run() {
  local name=$1 budget=$2; shift 2
  if [ $DRY_RUN -eq 1 ]; then
    printf '    [%s, <= %s s] %s\n' "$name" "$budget" "$*" | tee -a "$SUMMARY"
    return 0
  fi
  local t0=$SECONDS rc
  echo "=== $name ($budget s): $*" >>"$LOG"
  timeout --kill-after=5 "$budget" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  cat "$OUT/$name.txt" >>"$LOG"
  local took=$((SECONDS - t0)) word
  if [ $rc -eq 0 ]; then word=PASS
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then word=TIMEOUT
  elif [ $rc -eq 77 ]; then word=SKIP
  elif [ "${CAN_REFUSE:-0}" = 1 ] && grep -qE "$REFUSED" "$OUT/$name.txt"; then word=SKIP
  else word=FAIL; fi
  local detail=""
  [ "$word" = SKIP ] && detail=": $(grep -m1 -E "$REFUSED|skipping|skipped" "$OUT/$name.txt" | cut -c1-120)"
  [ "$word" = FAIL ] && detail=": exit $rc, $(grep -m1 -iE 'error|fail' "$OUT/$name.txt" | cut -c1-120)"
  printf '  %-7s %-34s %4d s%s\n' "$word" "$name" "$took" "$detail" | tee -a "$SUMMARY"
  case "$word" in FAIL | TIMEOUT) failures=$((failures + 1)) ;; esac
  [ "$word" = PASS ]
}

# A stage runs when selected and when its budget still fits in what is left of 480 s.
stage_begin() {  # stage_begin NAME: 0 to run it
  local name=$1
  if [ -n "$ONLY" ] && [ "$name" != setup ] && [[ "$ONLY" != *",$name,"* ]]; then return 1; fi
  local left=$((480 - (SECONDS - START)))
  say "== $name (budget ${BUDGET[$name]} s)"
  if [ $DRY_RUN -eq 0 ] && [ "$left" -lt "${BUDGET[$name]}" ]; then
    say "  SKIP    $name: ${left} s left of 480, budget ${BUDGET[$name]} s"
    return 1
  fi
  STAGE_DEADLINE=$((SECONDS + BUDGET[$name]))
}
# Seconds left in the current stage (at least 1), for the budget of its next command.
left() { local l=$((STAGE_DEADLINE - SECONDS)); [ $DRY_RUN -eq 1 ] && l=${BUDGET[$CURRENT]}; echo $((l > 1 ? l : 1)); }

say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)$([ $DRY_RUN -eq 1 ] && echo ' (dry run: nothing is executed)')"
GPU_PRESENT=0
if ! command -v nvidia-smi >/dev/null; then echo "none (nvidia-smi not found)" >"$OUT/gpu-name.txt"
elif nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/gpu-name.txt" 2>&1; then
  GPU_PRESENT=1
fi
sed 's/^/gpu: /' "$OUT/gpu-name.txt" | head -2 | tee -a "$SUMMARY"
[ -f "$ROOT/gpu-pack/MANIFEST.txt" ] && sed 's/^/pack: /' "$ROOT/gpu-pack/MANIFEST.txt" | tee -a "$SUMMARY"

# ---- setup ---------------------------------------------------------------------------
CURRENT=setup
stage_begin setup
PACKDIR=/tmp/engine-pack
unpack() {  # unpack ARCHIVE DIR: tar with xz, else Python's lzma (the GPU machine has python3)
  mkdir -p "$2" && { tar -C "$2" -xJf "$1" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }
}
if [ -n "${GPU_CHECK_BUILD:-}" ]; then
  # An existing build directory (a machine that can build; also for trying this script).
  BUILD=$(cd "$GPU_CHECK_BUILD" && pwd)
  DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
elif [ -d "$ROOT/gpu-pack" ]; then
  BUILD=$PACKDIR/build
  DATA=$PACKDIR/data
  export LD_LIBRARY_PATH="$PACKDIR/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ $DRY_RUN -eq 1 ]; then
    run unpack "$(left)" "unpack gpu-pack/{build,libs,data}.tar.xz into $PACKDIR"
  else
    rm -rf "$PACKDIR"
    run unpack "$(left)" bash -c "$(declare -f unpack); unpack '$ROOT/gpu-pack/build.tar.xz' '$PACKDIR/build' &&
      unpack '$ROOT/gpu-pack/libs.tar.xz' '$PACKDIR/libs' && unpack '$ROOT/gpu-pack/data.tar.xz' '$PACKDIR/data'"
  fi
else
  # No pack: build here (needs the Debian packages of tools/setup-debian.sh).
  BUILD="$ROOT/build-gpu"
  DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
  BUDGET[setup]=600
  run build 600 bash -c "cmake -S '$ROOT' -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-lineinfo && cmake --build '$BUILD'"
fi
# cuDNN (and cuBLAS when the toolkit has none) come from PyTorch's Python environment there,
# and libnccl.so.2 (opened with dlopen for dist.backend=nccl; the pack cannot carry it).
for mod in nvidia.cudnn nvidia.cublas nvidia.cuda_runtime nvidia.nccl; do
  d=$(python3 -c "import $mod as m, os; print(os.path.join(m.__path__[0], 'lib'))" 2>/dev/null || true)
  [ -n "$d" ] && [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64"
export ENGINE_BIN="$BUILD/engine" ENGINE_SOURCE_DIR="$ROOT" ENGINE_TEST_TMP=/tmp/engine-gpu-tests
export ENGINE_KILL_AFTER_BIN="$BUILD/tests/engine_kill_after" ENGINE_DATA_DIR="$DATA" OMP_NUM_THREADS=8
mkdir -p "$ENGINE_TEST_TMP"
if [ $DRY_RUN -eq 0 ]; then
  if [ ! -x "$ENGINE_BIN" ]; then say "  FAIL    no engine binary at $ENGINE_BIN"; failures=$((failures + 1))
  elif ldd "$ENGINE_BIN" | grep -q "not found"; then
    say "  FAIL    libraries missing:"; ldd "$ENGINE_BIN" | grep "not found" | tee -a "$SUMMARY"; failures=$((failures + 1))
  else
    say "  PASS    libraries: $(ldd "$ENGINE_BIN" | grep -cE '=> /') resolved; $("$ENGINE_BIN" --version 2>&1 | head -1)"
  fi
  [ $GPU_PRESENT -eq 0 ] && say "  NOTE    nvidia-smi sees no GPU: GPU stages will SKIP or FAIL"
fi
CFG="$ROOT/configs/mnist.json"
TRAIN=("$ENGINE_BIN" train "$CFG" --device cuda --set data.dir="$DATA")

# ---- op-tests ------------------------------------------------------------------------
CURRENT=op-tests
if stage_begin op-tests; then
  for t in gpu_test_cuda_behaviour gpu_test_cuda_threads; do
    [ $DRY_RUN -eq 1 ] || [ -x "$BUILD/tests/$t" ] || { say "  FAIL    $t: not in the build"; failures=$((failures + 1)); continue; }
    run "$t" "$(left)" "$BUILD/tests/$t"
    # On a GPU machine a skipped GPU test means the engine did not find the GPU.
    if [ $DRY_RUN -eq 0 ] && [ $GPU_PRESENT -eq 1 ] && grep -q "no CUDA GPU: skipping" "$OUT/$t.txt"; then
      say "  FAIL    $t skipped although nvidia-smi sees a GPU"; failures=$((failures + 1))
    fi
  done
  # The backend-comparison harness (tests/ops/): every op's cases on cpu and cuda against
  # ref::; ENGINE_TEST_OPS_REQUIRE_CUDA=1 makes a missing device a failure, not a skip.
  if [ $DRY_RUN -eq 1 ] || [ -x "$BUILD/tests/test_ops" ]; then
    run test_ops "$(left)" env ENGINE_TEST_OPS_REQUIRE_CUDA=1 "$BUILD/tests/test_ops"
  else
    say "  FAIL    test_ops: not in the build"; failures=$((failures + 1))
  fi
fi

# ---- train ---------------------------------------------------------------------------
CURRENT=train
RUN=/tmp/engine-gpu-run
if stage_begin train; then
  rm -rf "$RUN"
  run train "$(left)" "${TRAIN[@]}" --run-dir "$RUN" --set train.epochs="$EPOCHS"
  [ -f "$RUN/metrics.jsonl" ] && sed 's/^/    /' "$RUN/metrics.jsonl" | tee -a "$SUMMARY"
  run verify-last "$(left)" "$ENGINE_BIN" verify "$RUN/last.h5"
fi

# ---- graphs --------------------------------------------------------------------------
# cuda.graphs=true (each step replayed as a CUDA graph) must give the eager run's bits in
# every precision, over 3 epochs (the third all replays) with saves among the replays (every 5 steps, unverified,
# so nothing drops the graphs: the host reads the scaler and step counts the graph moved
# on), fp16 from a scale of 2^40 (its first steps overflow and are skipped during
# replays, and it grows every 3 steps); the engine's own count must show replays. Then a
# run stopped by SIGUSR1 and SIGTERM among replays and resumed with graphs, in fp16.
CURRENT=graphs
if stage_begin graphs; then
  G=(--set data.train_limit=4000 --set data.test_limit=512 --set checkpoint.verify=false
     --set checkpoint.every_n_steps=5 --set cuda.batch_chunks=false --set train.epochs=3)
  FP16_OVERFLOW=(--set precision.mode=fp16 --set precision.loss_scale.init=1099511627776
                 --set precision.loss_scale.growth_interval=3)
  for prec in fp32 fp16 bf16; do
    P=(--set precision.mode=$prec)
    [ $prec = fp16 ] && P=("${FP16_OVERFLOW[@]}")
    rm -rf "/tmp/engine-graphs-$prec-off" "/tmp/engine-graphs-$prec-on"
    run "graphs-$prec-off" "$(left)" "${TRAIN[@]}" --fresh --run-dir "/tmp/engine-graphs-$prec-off" "${G[@]}" "${P[@]}" \
      --set cuda.graphs=false
    run "graphs-$prec-on" "$(left)" "${TRAIN[@]}" --fresh --run-dir "/tmp/engine-graphs-$prec-on" "${G[@]}" "${P[@]}" \
      --set cuda.graphs=true
    if [ $DRY_RUN -eq 0 ]; then
      said=$(grep -m1 '^cuda graphs:' "$OUT/graphs-$prec-on.txt")
      say "    $prec: ${said:-no 'cuda graphs:' line}"
      launched=$(echo "$said" | sed -n 's/.* \([0-9]*\) launched.*/\1/p')
      if [ -z "$launched" ] || [ "$launched" -eq 0 ]; then
        say "  FAIL    graphs-$prec: cuda.graphs=true and nothing replayed"; failures=$((failures + 1))
      fi
    fi
    run "graphs-$prec-diff" "$(left)" "$ENGINE_BIN" diff "/tmp/engine-graphs-$prec-off/last.h5" "/tmp/engine-graphs-$prec-on/last.h5"
    # The step digests the device summed (docs/replay.md), step by step: "identical through step N".
    run "graphs-$prec-bisect" "$(left)" "$ENGINE_BIN" bisect "/tmp/engine-graphs-$prec-off" "/tmp/engine-graphs-$prec-on" \
      --device cuda
  done
  # fp16 stopped among replays (SIGUSR1: a save; SIGTERM: stop, exit 130) and resumed,
  # against its straight run with graphs off: 40 epochs, so that the signals (3 s and 4 s
  # after the start) land while it trains.
  R=/tmp/engine-graphs-fp16-stopped
  LONG=("${G[@]}" "${FP16_OVERFLOW[@]}" --set train.epochs=40)
  rm -rf "$R" /tmp/engine-graphs-fp16-long-off
  run graphs-fp16-long-off "$(left)" "${TRAIN[@]}" --fresh --run-dir /tmp/engine-graphs-fp16-long-off "${LONG[@]}" \
    --set cuda.graphs=false
  stop_among_replays() {
    "$@" & local pid=$!
    sleep 3; kill -USR1 $pid; sleep 1; kill -TERM $pid
    wait $pid; local rc=$?
    echo "exit $rc (130: stopped by SIGTERM; 0: it ended before the signals, use more epochs)"; [ $rc -eq 130 ]
  }
  run graphs-fp16-stop "$(left)" bash -c "$(declare -f stop_among_replays); stop_among_replays $(printf '%q ' \
    "${TRAIN[@]}" --fresh --run-dir "$R" "${LONG[@]}" --set cuda.graphs=true)"
  run graphs-fp16-resume "$(left)" "${TRAIN[@]}" --run-dir "$R" "${LONG[@]}" --set cuda.graphs=true
  run graphs-fp16-resume-diff "$(left)" "$ENGINE_BIN" diff /tmp/engine-graphs-fp16-long-off/last.h5 "$R/last.h5"
fi

# ---- bf16 ----------------------------------------------------------------------------
# bf16 on the default run (15 epochs, the shipped config): test accuracy >= 92 %; and the
# chunked bf16 kernels (cuda.batch_chunks=true) on a short run, verified.
CURRENT=bf16
if stage_begin bf16; then
  rm -rf /tmp/engine-bf16 /tmp/engine-bf16-chunks
  run bf16-default "$(left)" "${TRAIN[@]}" --fresh --run-dir /tmp/engine-bf16 --set precision.mode=bf16
  if [ $DRY_RUN -eq 0 ]; then
    acc=$(python3 -c "import json,sys; t=[json.loads(l) for l in open(sys.argv[1]) if 'test_acc' in l]; print(t[-1]['test_acc'] if t else '')" \
      /tmp/engine-bf16/metrics.jsonl 2>/dev/null)
    say "    bf16 default run: test accuracy ${acc:-none}"
    if [ -z "$acc" ] || ! python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) >= 0.92 else 1)" "$acc"; then
      say "  FAIL    bf16-accuracy: ${acc:-no test accuracy} < 0.92"; failures=$((failures + 1))
    fi
  fi
  run bf16-chunks "$(left)" "${TRAIN[@]}" --fresh --run-dir /tmp/engine-bf16-chunks --set precision.mode=bf16 \
    --set cuda.batch_chunks=true --set train.epochs=2 --set data.train_limit=4096 --set data.test_limit=512
  run bf16-chunks-verify "$(left)" "$ENGINE_BIN" verify /tmp/engine-bf16-chunks/last.h5
fi

# ---- nccl ----------------------------------------------------------------------------
# One process through a 1-rank NCCL communicator must give the plain run's bits (the
# layers compute by chunks either way; NCCL exchanges nothing at W = 1 but is started,
# bootstrapped and torn down). Two GPUs and more: only on a multi-GPU machine.
CURRENT=nccl
if stage_begin nccl; then
  SMALL=(--fresh --set train.epochs=1 --set data.train_limit=512 --set data.test_limit=512 --set checkpoint.verify=false
         --set cuda.batch_chunks=true)  # the chunked kernels (off by default until this passes)
  rm -rf /tmp/engine-nccl-plain /tmp/engine-nccl-nccl
  run nccl-plain "$(left)" "${TRAIN[@]}" --run-dir /tmp/engine-nccl-plain "${SMALL[@]}"
  run nccl-1rank "$(left)" "${TRAIN[@]}" --run-dir /tmp/engine-nccl-nccl "${SMALL[@]}" --set dist.backend=nccl
  run nccl-diff "$(left)" "$ENGINE_BIN" diff /tmp/engine-nccl-plain/last.h5 /tmp/engine-nccl-nccl/last.h5
fi

# ---- ranks ---------------------------------------------------------------------------
# Two CUDA ranks on one GPU (NCCL refuses that, so the host-staged exchange between two
# threads) must end with one process's state: the check before CUDA ranks are on.
CURRENT=ranks
if stage_begin ranks; then
  run gpu_test_gpu_ranks "$(left)" env ENGINE_DATA_DIR="$DATA" "$BUILD/tests/gpu_test_gpu_ranks"
fi

# ---- resume --------------------------------------------------------------------------
CURRENT=resume
if stage_begin resume; then
  run gpu_test_gpu_training "$(left)" "$BUILD/tests/gpu_test_gpu_training"
  if [ $DRY_RUN -eq 1 ] || [ -f "$RUN/last.h5" ]; then
    run eval-on-cpu "$(left)" "$ENGINE_BIN" eval "$RUN/last.h5" --device cpu --limit 2048 --data-dir "$DATA"
    rm -rf /tmp/engine-gpu-run-cpu
    run resume-on-cpu "$(left)" "$ENGINE_BIN" resume "$RUN/last.h5" --device cpu --run-dir /tmp/engine-gpu-run-cpu \
      --set train.epochs=$((EPOCHS + 1)) --set data.train_limit=2048
  else
    say "  SKIP    GPU->CPU eval/resume: the train stage left no last.h5"
  fi
fi

# ---- bench ---------------------------------------------------------------------------
CURRENT=bench
if stage_begin bench; then
  # The engine runs take ~15 s; the rest of the budget goes to the PyTorch peers.
  run bench "$(left)" env BENCH_BUDGET=$(($(left) - 30)) ENGINE_BIN="$ENGINE_BIN" ENGINE_DATA_DIR="$DATA" \
    bash "$ROOT/tools/bench/gpu_epoch.sh"
  [ $DRY_RUN -eq 0 ] && sed 's/^/    /' "$OUT/bench.txt" | tee -a "$SUMMARY"
fi

# ---- ncu -----------------------------------------------------------------------------
CURRENT=ncu
if stage_begin ncu; then
  if [ $DRY_RUN -eq 0 ] && ! command -v ncu >/dev/null; then
    say "  SKIP    ncu: not installed"
  else
    # 300 launches: a few training steps of every kernel (about 40 launches a step) after
    # the first ones; --clock-control none keeps the GPU's own clocks (comparable times).
    # Three metrics, not the default sections: one or two replay passes per kernel, so
    # 300 launches fit the budget; the summary gives each kernel's count, min/avg/max.
    CAN_REFUSE=1 run ncu "$(left)" ncu --clock-control none --print-summary per-kernel --launch-skip 200 --launch-count 300 \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      "${TRAIN[@]}" --run-dir /tmp/engine-gpu-ncu --fresh --set train.epochs=1 --set data.train_limit=4096 \
      --set data.val_split=512 --set data.test_limit=512 --set checkpoint.verify=false
    # The per-kernel table (kernel names, invocations, durations); the whole of it is in ncu.txt.
    [ $DRY_RUN -eq 0 ] && grep -E 'kernel|Kernel|Duration|Invocations' "$OUT/ncu.txt" | head -80 | sed 's/^/    /' >>"$SUMMARY"
  fi
fi

# ---- sanitize ------------------------------------------------------------------------
CURRENT=sanitize
if stage_begin sanitize; then
  if [ $DRY_RUN -eq 0 ] && ! command -v compute-sanitizer >/dev/null; then
    say "  SKIP    compute-sanitizer: not installed"
  else
    # Filtered to stay fast: the op tests of one of each kind of kernel (reductions,
    # elementwise, pooling, dropout, loss, optimiser; racecheck and synccheck matter for
    # the reductions' shared memory), and one short training run (every kernel of a step).
    # (test_ops' case names are "<ops>: <what>"; doctest splits a filter at commas, so
    # each pattern names a case by a comma-free part of it.)
    OPS_FILTER='-tc=batchnorm_forward_train*ragged*,relu_forward*,maxpool2x2_forward*,dropout_forward*,cross_entropy: loss*,reduce_sum*,adam_update*,conv2d_backward: bias gradient*,unscale_check*,adam_prepare_step*,loss_scale_update*,round_to_float*'
    # racecheck and synccheck are slower and matter only where blocks share memory and
    # barriers: the reductions, at shapes that are ragged but small enough.
    SYNC_FILTER='-tc=batchnorm_forward_train*: train (y*,reduce_sum*,conv2d_backward: bias gradient*,cross_entropy: loss*'
    SHORT=("${TRAIN[@]}" --fresh --set train.epochs=1 --set data.train_limit=256 --set data.val_split=128
      --set data.test_limit=128 --set data.batch_size=64 --set checkpoint.verify=false)
    i=0
    # Each of the 8 runs gets an even share of what is left of the stage.
    share() { if [ $DRY_RUN -eq 1 ]; then echo $((BUDGET[sanitize] / 8)); else echo $(($(left) / (8 - i))); fi; }
    for tool in memcheck racecheck initcheck synccheck; do
      filter=$OPS_FILTER
      # (initcheck's --track-unused-memory is off by default; CUDA 13's compute-sanitizer
      # takes it as a switch, and "--track-unused-memory no" ran "no" as the program.)
      case "$tool" in racecheck | synccheck) filter=$SYNC_FILTER ;; esac
      sanitizer=(compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit 20)
      # memcheck through tools/gpu-memcheck.sh: the leak check, less the CUDA context's
      # handles and buffers, which live as long as the process on purpose.
      [ "$tool" = memcheck ] && sanitizer=(bash "$ROOT/tools/gpu-memcheck.sh")
      # memcheck: every op of the op list (no filter), the casts, and a run with graphs.
      if [ "$tool" = memcheck ]; then
        CAN_REFUSE=1 run "sanitize-$tool-ops" "$(share)" env ENGINE_TEST_OPS_REQUIRE_CUDA=1 \
          "${sanitizer[@]}" "$BUILD/tests/test_ops"
      else
        CAN_REFUSE=1 run "sanitize-$tool-ops" "$(share)" env ENGINE_TEST_OPS_REQUIRE_CUDA=1 \
          "${sanitizer[@]}" "$BUILD/tests/test_ops" "$filter"
      fi
      i=$((i + 1))
      CAN_REFUSE=1 run "sanitize-$tool-train" "$(share)" "${sanitizer[@]}" "${SHORT[@]}" \
        --run-dir "/tmp/engine-gpu-sanitize-$tool" $([ "$tool" = memcheck ] && echo "--set precision.mode=fp16 \
        --set cuda.graphs=true --set cuda.batch_chunks=false")
      i=$((i + 1))
      if [ $DRY_RUN -eq 0 ]; then
        for part in ops train; do
          f="$OUT/sanitize-$tool-$part.txt"
          [ -f "$f" ] && say "    $tool $part: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' "$f" || echo 'no summary line')"
        done
      fi
    done
  fi
fi

# ---- ab ------------------------------------------------------------------------------
CURRENT=ab
if stage_begin ab; then
  SWITCHES="$ROOT/tools/bench/gpu_ab_switches.txt"
  # One A/B pair: two short runs (2 epochs of the full training set, so the second
  # epoch's time is a steady-state figure), their epoch times, and `engine diff`.
  ab_pair() {  # ab_pair NAME BITS "A settings" "B settings"
    local name=$1 bits=$2 a=$3 b=$4 side settings sets ta tb
    for side in A B; do
      settings=$a; [ $side = B ] && settings=$b
      sets=()
      for kv in $settings; do [ "$kv" = - ] || sets+=(--set "$kv"); done
      rm -rf "/tmp/engine-ab-$name-$side"
      "${TRAIN[@]}" --run-dir "/tmp/engine-ab-$name-$side" --fresh --set train.epochs=2 \
        --set checkpoint.verify=false "${sets[@]}" >"/tmp/engine-ab-$name-$side.log" 2>&1 ||
        { echo "$name $side: engine train failed: $(tail -1 "/tmp/engine-ab-$name-$side.log")"; return 1; }
    done
    epoch() { python3 -c "import json,sys; e=[json.loads(l)['epoch_seconds'] for l in open(sys.argv[1]) if 'epoch_seconds' in l]; print(f'{e[-1]:.4f}')" "$1/metrics.jsonl"; }
    ta=$(epoch "/tmp/engine-ab-$name-A"); tb=$(epoch "/tmp/engine-ab-$name-B")
    local same=no
    "$ENGINE_BIN" diff "/tmp/engine-ab-$name-A/last.h5" "/tmp/engine-ab-$name-B/last.h5" >"/tmp/engine-ab-$name.diff" 2>&1 && same=yes
    echo "$name: A ${ta} s/epoch, B ${tb} s/epoch (B/A $(python3 -c "print(f'{$tb/$ta:.3f}')")), identical checkpoints: $same (must: $bits)"
    [ "$bits" = equal ] && [ $same = no ] && { echo "$name: FAIL: the bits must be equal"; sed -n 1,5p "/tmp/engine-ab-$name.diff"; return 1; }
    return 0
  }
  if [ $DRY_RUN -eq 1 ] || [ -f "$SWITCHES" ]; then
    trim() { local t=$1; t=${t#"${t%%[![:space:]]*}"}; printf '%s' "${t%"${t##*[![:space:]]}"}"; }
    while IFS= read -r line; do
      [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
      IFS='|' read -r name a b bits <<<"$line"
      name=$(trim "$name"); a=$(trim "$a"); b=$(trim "$b"); bits=$(trim "$bits")
      case "$bits" in equal | differ) ;; *) say "  FAIL    ab: bad line in ${SWITCHES#"$ROOT"/}: $line"; failures=$((failures + 1)); continue ;; esac
      if [ $DRY_RUN -eq 1 ]; then
        run "ab-$name" "$(left)" "A: engine train --set ${a// / --set } | B: --set ${b// / --set } | engine diff, bits $bits"
      else
        run "ab-$name" "$(left)" bash -c "$(declare -p TRAIN ENGINE_BIN); $(declare -f ab_pair); ab_pair '$name' '$bits' '$a' '$b'"
        sed 's/^/    /' "$OUT/ab-$name.txt" | tail -3 | tee -a "$SUMMARY" >/dev/null
      fi
    done <"$SWITCHES"
  fi
fi

say "== done in $((SECONDS - START)) s (budget 480 s); failures: $failures"
exit $((failures > 0))
