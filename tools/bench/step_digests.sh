#!/usr/bin/env bash
# What the step digests cost (docs/replay.md): one CPU training epoch of the default
# config with train.step_digests on and off, alternating in one run, on this machine.
#
#   tools/bench/step_digests.sh [--repeat R] [--limit N] [--threads T] [--engine PATH] [--keep]
#
# Each run: `engine train configs/mnist.json --device cpu --run-dir TMP --set
# train.epochs=1 --set checkpoint.verify=false --set train.step_digests=on|off --fresh`;
# the time is the train-only `epoch_seconds` of TMP/metrics.jsonl (validation, the
# checkpoint and the test evaluation are outside it). The ratio on/off is taken pair by
# pair; the median of the pairs is the figure (the target: at most 1.01).
set -euo pipefail

die() { echo "step_digests.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
repeat=5
limit=""
threads=2
engine="$root/build/engine"
keep=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeat) [[ $# -ge 2 ]] || die "--repeat needs a value"; repeat="$2"; shift 2 ;;
    --limit) [[ $# -ge 2 ]] || die "--limit needs a value"; limit="$2"; shift 2 ;;
    --threads) [[ $# -ge 2 ]] || die "--threads needs a value"; threads="$2"; shift 2 ;;
    --engine) [[ $# -ge 2 ]] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$engine" ]] || die "no engine at $engine (build it, or give --engine)"
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat takes a positive integer"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/step_digests.XXXXXX")"
[[ $keep == 1 ]] || trap 'rm -rf "$tmp"' EXIT

epoch() {  # on|off -> the epoch's seconds
  local digests=$([[ $1 == on ]] && echo true || echo false)
  local sets=(--set train.epochs=1 --set checkpoint.verify=false --set logging.tensorboard=false
              --set "train.step_digests=$digests")
  [[ -n "$limit" ]] && sets+=(--set "data.train_limit=$limit")
  OMP_NUM_THREADS="$threads" "$engine" train "$root/configs/mnist.json" --device cpu --run-dir "$tmp/$1" \
    "${sets[@]}" --fresh >"$tmp/$1.log" 2>&1 || { cat "$tmp/$1.log" >&2; die "the run with digests $1 failed"; }
  /usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["epoch_seconds"])' \
    "$tmp/$1/metrics.jsonl"
}

echo "one epoch ($( [[ -n $limit ]] && echo "$limit" || echo 55000) images), $threads threads, digests on then off, $repeat pairs"
ratios=()
for ((i = 1; i <= repeat; ++i)); do
  on=$(epoch on)
  off=$(epoch off)
  r=$(/usr/bin/python3 -c "print(f'{$on / $off:.4f}')")
  ratios+=("$r")
  printf 'pair %d: on %.3f s, off %.3f s, on/off %s\n' "$i" "$on" "$off" "$r"
done
/usr/bin/python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print(f"ratio on/off: median {statistics.median(r):.4f} (range {r[0]:.4f} .. {r[-1]:.4f}, {len(r)} pairs)")
PY
