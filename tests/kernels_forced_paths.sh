#!/usr/bin/env bash
# test_ops (the backend-comparison harness, tests/ops/) under every CPU path this CPU has (ENGINE_CPU_KERNELS=avx512|avx2|portable):
# the ops that pick their loops by the path (the GEMM, pooling, col2im) are checked
# against ref:: on each path, not only on the one this CPU runs by default. A path the
# CPU lacks is skipped (engine --version refuses it with exit 2).
#   kernels_forced_paths.sh ENGINE TEST_OPS
set -euo pipefail
engine="$1" test_ops="$2"
ran=0
for path in avx512 avx2 portable; do
  if ! ENGINE_CPU_KERNELS="$path" "$engine" --version >/dev/null 2>&1; then
    echo "path $path: not on this CPU, skipped"
    continue
  fi
  echo "== ENGINE_CPU_KERNELS=$path"
  ENGINE_CPU_KERNELS="$path" "$test_ops"
  ran=$((ran + 1))
done
[[ "$ran" -ge 1 ]] || { echo "no CPU path ran" >&2; exit 1; }
