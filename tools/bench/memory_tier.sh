#!/usr/bin/env bash
# What the memory tier costs (docs/recovery.md, "The memory tier"), two ways on this
# machine:
#   1. per step: build/memory_tier_bench (a training step, then the write of its state
#      into the slot file, each timed; medians and (step + write) / step);
#   2. whole epochs: `engine train configs/mnist.json --device cpu --set train.epochs=1
#      --set checkpoint.verify=false` with checkpoint.memory_tier=/dev/shm and =null,
#      alternating, R pairs; the train-only epoch_seconds of metrics.jsonl, the ratio
#      on/off per pair and its median.
#
#   tools/bench/memory_tier.sh [--repeat R] [--limit N] [--steps S] [--dir DIR] [--build DIR] [--keep]
#
# The target: at most 1.01.
set -euo pipefail

die() { echo "memory_tier.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
repeat=3
limit=""
steps=200
shm=/dev/shm
build="$root/build"
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeat) [[ $# -ge 2 ]] || die "--repeat needs a value"; repeat="$2"; shift 2 ;;
    --limit) [[ $# -ge 2 ]] || die "--limit needs a value"; limit="$2"; shift 2 ;;
    --steps) [[ $# -ge 2 ]] || die "--steps needs a value"; steps="$2"; shift 2 ;;
    --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; shm="$2"; shift 2 ;;
    --build) [[ $# -ge 2 ]] || die "--build needs a value"; build="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$build/engine" && -x "$build/memory_tier_bench" ]] ||
  die "no engine or memory_tier_bench in $build (ninja -C $build engine memory_tier_bench)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/memory_tier.XXXXXX")"
[[ $keep == 1 ]] || trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

(cd "$root" && "$build/memory_tier_bench" --steps "$steps" --dir "$shm")

epoch() {  # on|off -> the epoch's seconds
  local tier=$([[ $1 == on ]] && echo "$shm" || echo null)
  local sets=(--set train.epochs=1 --set checkpoint.verify=false --set logging.tensorboard=false
              --set "checkpoint.memory_tier=$tier")
  [[ -n "$limit" ]] && sets+=(--set "data.train_limit=$limit")
  "$build/engine" train "$root/configs/mnist.json" --device cpu --run-dir "$tmp/$1" "${sets[@]}" --fresh \
    >"$tmp/$1.log" 2>&1 || { cat "$tmp/$1.log" >&2; die "the run with the memory tier $1 failed"; }
  /usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["epoch_seconds"])' \
    "$tmp/$1/metrics.jsonl"
}
ratios=()
for ((i = 1; i <= repeat; ++i)); do
  on=$(epoch on)
  off=$(epoch off)
  r=$(/usr/bin/python3 -c "print(f'{$on / $off:.4f}')")
  ratios+=("$r")
  printf 'pair %d: on %.3f s, off %.3f s, on/off %s\n' "$i" "$on" "$off" "$r"
done
/usr/bin/python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[1:]]; print(f'epoch on/off: median {statistics.median(v):.4f} (range {min(v):.4f} .. {max(v):.4f}), {len(v)} pairs')" "${ratios[@]}"
