#!/usr/bin/env bash
# The time from a relaunch to its first trained step (docs/recovery.md, "Relaunch
# time"), against PyTorch's: the engine's own "resumed in" line and its breakdown.
#
#   tools/bench/relaunch.sh [--repeat R] [--threads T] [--engine PATH] [--python PATH] [--keep]
#
# The engine: `engine train configs/mnist.json --device cpu --run-dir TMP --set
# checkpoint.every_n_steps=20` (the default model and data), killed with SIGKILL once
# last.h5 holds a mid-epoch step; then R relaunches of the same command, each killed
# with SIGKILL as soon as it prints "resumed in" (so every relaunch resumes the same
# checkpoint). The peer: tools/bench/torch_relaunch.py --resume, R times: import torch,
# read the same data, build the model and AdamW, torch.load a mid-run state, one step.
# Medians of the R totals, and the ratio engine / PyTorch. The target: the engine at
# most 0.5 s.
set -euo pipefail

die() { echo "relaunch.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
repeat=5
threads=2
engine="$root/build/engine"
py=/usr/bin/python3
keep=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --repeat) [[ $# -ge 2 ]] || die "--repeat needs a value"; repeat="$2"; shift 2 ;;
    --threads) [[ $# -ge 2 ]] || die "--threads needs a value"; threads="$2"; shift 2 ;;
    --engine) [[ $# -ge 2 ]] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a value"; py="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$engine" ]] || die "no engine at $engine (build it, or give --engine)"
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat takes a positive integer"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/relaunch.XXXXXX")"
pid=""
cleanup() {
  [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null
  [[ $keep == 1 ]] || rm -rf "$tmp"
}
trap cleanup EXIT
export OMP_NUM_THREADS="$threads"
train=("$engine" train "$root/configs/mnist.json" --device cpu --run-dir "$tmp/run" --set checkpoint.every_n_steps=20
       --set logging.tensorboard=false)

# Runs "$@" in the background until its output ($tmp/out) holds `pattern`, then SIGKILLs it.
until_then_kill() {
  local pattern="$1"; shift
  : >"$tmp/out"
  "$@" >"$tmp/out" 2>&1 &
  pid=$!
  for ((i = 0; i < 12000; ++i)); do
    grep -q "$pattern" "$tmp/out" && break
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/out" >&2; die "it ended before printing '$pattern'"; }
    sleep 0.01
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=""
  grep -q "$pattern" "$tmp/out" || die "no '$pattern' within 120 s"
}

# The first run, killed once a mid-epoch last.h5 exists (step 20 or later).
"${train[@]}" --fresh >"$tmp/first.log" 2>&1 &
pid=$!
for ((i = 0; i < 12000; ++i)); do
  [[ -f "$tmp/run/last.h5" ]] && break
  sleep 0.01
done
sleep 0.5
kill -KILL "$pid"; wait "$pid" 2>/dev/null || true; pid=""
[[ -f "$tmp/run/last.h5" ]] || die "the first run wrote no last.h5"

"$py" "$here/torch_relaunch.py" --write "$tmp/state.pt"

engine_totals=(); torch_totals=()
for ((r = 1; r <= repeat; ++r)); do
  until_then_kill "resumed in" "${train[@]}"
  line=$(grep -m1 "resumed in" "$tmp/out")
  echo "engine  $line"
  engine_totals+=("$(echo "$line" | sed 's/resumed in \([0-9.]*\) s.*/\1/')")
  line=$("$py" "$here/torch_relaunch.py" --resume "$tmp/state.pt")
  echo "pytorch $line"
  torch_totals+=("$(echo "$line" | sed 's/resumed in \([0-9.]*\) s.*/\1/')")
done
"$py" - "${engine_totals[*]}" "${torch_totals[*]}" <<'PY'
import statistics, sys
e = [float(v) for v in sys.argv[1].split()]
t = [float(v) for v in sys.argv[2].split()]
me, mt = statistics.median(e), statistics.median(t)
print(f"median of {len(e)}: engine {me:.2f} s, pytorch {mt:.2f} s: engine/pytorch {me / mt:.3f}")
PY
