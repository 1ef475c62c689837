#!/usr/bin/env bash
# engine export --format onnx against torch.onnx.export of the same model (docs/benchmarks.md,
# "Export"): a short run's best.h5, exported REPS times each way, median wall time and size.
# The engine's time is the whole command as a user runs it: loading and checking the
# checkpoint, evaluating its test set for the recorded accuracy (10,000 images), the
# probes and their tolerances, the checker, the atomic write. torch's is torch.onnx.export
# alone, of a module already loaded.
#   tools/bench/export.sh [ENGINE] [REPS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
ENGINE="${1:-$ROOT/build/engine}" REPS="${2:-5}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$ENGINE" train "$ROOT/configs/mnist.json" --device cpu --run-dir "$tmp/run" --set train.epochs=1 \
  --set data.train_limit=384 --set data.val_split=128 >/dev/null
"$ENGINE" export "$tmp/run/best.h5" --format safetensors -o "$tmp/w.safetensors" >/dev/null
times=()
for _ in $(seq "$REPS"); do
  start=$(date +%s.%N)
  "$ENGINE" export "$tmp/run/best.h5" --format onnx -o "$tmp/engine.onnx" >/dev/null
  times+=("$(echo "$(date +%s.%N) - $start" | bc -l)")
done
median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
# The part of it that is the test-set evaluation: engine eval of the same checkpoint.
start=$(date +%s.%N)
"$ENGINE" eval "$tmp/run/best.h5" --device cpu >/dev/null
eval_seconds="$(echo "$(date +%s.%N) - $start" | bc -l)"
echo "{\"engine_seconds\": $median, \"engine_eval_seconds\": $eval_seconds, \"engine_bytes\": $(stat -c %s "$tmp/engine.onnx")}"
/usr/bin/python3 "$ROOT/tools/bench/torch_onnx_export.py" "$tmp/w.safetensors" "$tmp/torch.onnx" --reps "$REPS"
