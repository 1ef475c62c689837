#!/usr/bin/env bash
# GPU benchmark, in one run on one GPU: the engine's train-only epoch (default config;
# fp32, fp16, bf16, then fp32 and bf16 with cuda.graphs) against every PyTorch peer of tools/bench/torch_gpu_epoch.py (eager,
# eager + fused AdamW, torch.compile(mode="reduce-overhead"), the whole step in one CUDA
# graph; fp32 and bf16 + channels_last), the dataset preloaded on the GPU everywhere.
# usage: gpu_epoch.sh [OUT_FILE]
# env: ENGINE_BIN, ENGINE_DATA_DIR, BENCH_EPOCHS (3), BENCH_BUDGET (seconds for the
#      PyTorch peers; peers not started within it are reported SKIP), BENCH_TORCH_MODES,
#      BENCH_TORCH_DTYPES
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ENGINE_BIN=${ENGINE_BIN:-$ROOT/build/engine}
DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
EPOCHS=${BENCH_EPOCHS:-3}
BUDGET=${BENCH_BUDGET:-0}
OUTFILE=${1:-/dev/stdout}
status=0
RUN=$(mktemp -d)
trap 'rm -rf "$RUN"' EXIT

# Train-only seconds of the fastest epoch after the first (the first includes cuDNN setup).
engine_epoch() {  # engine_epoch NAME [--set ...]
  local name=$1; shift
  if ! "$ENGINE_BIN" train "$ROOT/configs/mnist.json" --device cuda --run-dir "$RUN/$name" --fresh \
      --set data.dir="$DATA" --set train.epochs="$EPOCHS" --set checkpoint.verify=false "$@" >"$RUN/$name.log" 2>&1; then
    echo "${name} FAIL (engine train: $(tail -1 "$RUN/$name.log"))"; status=1; return
  fi
  python3 - "$RUN/$name/metrics.jsonl" "$name" <<'PY'
import json, sys
e = [json.loads(l)["epoch_seconds"] for l in open(sys.argv[1]) if "epoch_seconds" in l]
print(f"{sys.argv[2]}_epoch_seconds {min(e[1:]) if len(e) > 1 else e[0]:.4f} first_epoch_seconds {e[0]:.4f}")
PY
}

{
  echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo "engine: $("$ENGINE_BIN" --version 2>/dev/null | head -1)"
  engine_epoch engine_fp32
  engine_epoch engine_fp16 --set precision.mode=fp16
  engine_epoch engine_bf16 --set precision.mode=bf16
  # Each step replayed as one CUDA graph (cuda.graphs, off by default until it has run).
  engine_epoch engine_fp32_graphs --set cuda.graphs=true
  engine_epoch engine_bf16_graphs --set precision.mode=bf16 --set cuda.graphs=true
  # PyTorch runs with its own libraries, not the engine's (LD_LIBRARY_PATH may point at
  # an older libstdc++ carried for the engine).
  env -u LD_LIBRARY_PATH python3 "$ROOT/tools/bench/torch_gpu_epoch.py" --epochs "$EPOCHS" --data-dir "$DATA" \
    --budget "$BUDGET" ${BENCH_TORCH_MODES:+--modes "$BENCH_TORCH_MODES"} \
    ${BENCH_TORCH_DTYPES:+--dtypes "$BENCH_TORCH_DTYPES"} 2>"$RUN/torch.err" || { status=1; tail -3 "$RUN/torch.err"; }
} | tee "$RUN/results.txt" >"$OUTFILE"
# Ratios of every peer to the engine's fp32 epoch (> 1: the engine is faster).
python3 - "$RUN/results.txt" <<'PY' >>"$OUTFILE"
import sys
t = {}
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) >= 2 and p[0].endswith("_epoch_seconds"):
        t[p[0][: -len("_epoch_seconds")]] = float(p[1])
base = t.get("engine_fp32")
if base:
    print("peer/engine_fp32: " + "  ".join(f"{k} {v / base:.2f}" for k, v in t.items() if k != "engine_fp32"))
PY
grep -q " FAIL" "$RUN/results.txt" && status=1
exit $status
