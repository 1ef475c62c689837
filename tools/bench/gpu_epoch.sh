#!/usr/bin/env bash
# GPU benchmark, in one run on one GPU: the engine's train-only epoch (default config,
# fp32), PyTorch eager and PyTorch torch.compile with the dataset preloaded on the GPU.
# usage: gpu_epoch.sh [OUT_FILE]   (env: ENGINE_BIN, ENGINE_DATA_DIR, BENCH_EPOCHS)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ENGINE_BIN=${ENGINE_BIN:-$ROOT/build/engine}
DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
EPOCHS=${BENCH_EPOCHS:-3}
OUTFILE=${1:-/dev/stdout}
RUN=$(mktemp -d)
"$ENGINE_BIN" train "$ROOT/configs/mnist.json" --device cuda --run-dir "$RUN" --fresh \
  --set data.dir="$DATA" --set train.epochs="$EPOCHS" --set checkpoint.verify=false >/dev/null
# Train-only seconds of the fastest epoch after the first (the first includes cuDNN setup).
engine_s=$(python3 -c "
import json,sys
e=[json.loads(l)['epoch_seconds'] for l in open('$RUN/metrics.jsonl') if 'epoch_seconds' in l]
print(min(e[1:]) if len(e)>1 else e[0])")
# PyTorch runs with its own libraries, not the engine's (LD_LIBRARY_PATH may point at an
# older libstdc++ carried for the engine).
eager=$(env -u LD_LIBRARY_PATH python3 "$ROOT/tools/bench/torch_gpu_epoch.py" --epochs "$EPOCHS" --data-dir "$DATA")
compiled=$(env -u LD_LIBRARY_PATH python3 "$ROOT/tools/bench/torch_gpu_epoch.py" --epochs "$EPOCHS" --data-dir "$DATA" --compile)
eager_s=$(echo "$eager" | awk '/^torch_eager_epoch_seconds/ {print $2}')
compiled_s=$(echo "$compiled" | awk '/^torch_compiled_epoch_seconds/ {print $2}')
{
  echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo "engine_epoch_seconds $engine_s"
  echo "$eager"
  echo "$compiled"
  python3 -c "print('ratio engine/eager %.3f  engine/compiled %.3f' % ($engine_s/$eager_s, $engine_s/$compiled_s))"
} >"$OUTFILE"
rm -rf "$RUN"
