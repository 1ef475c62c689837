#!/usr/bin/env bash
# What `engine audit --jobs N` takes against the run it proves (docs/replay.md): the
# default config on a subset, trained once, then audited, one after the other.
#
#   tools/bench/audit.sh [--limit N] [--epochs E] [--jobs J] [--engine PATH] [--keep]
#
# The run: `engine train configs/mnist.json --device cpu --run-dir TMP --set
# data.train_limit=N --set data.val_split=1000 --set data.test_limit=1000 --set
# train.epochs=E --fresh` (milestones every 5 epochs, as the default config has them);
# then `engine audit TMP --jobs J`. Both are timed from outside, whole processes. The
# target: the audit with --jobs 2 takes no longer than the run (ratio at most 1.00).
set -euo pipefail

die() { echo "audit.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
limit=5000
epochs=15
jobs=2
engine="$root/build/engine"
keep=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --limit) [[ $# -ge 2 ]] || die "--limit needs a value"; limit="$2"; shift 2 ;;
    --epochs) [[ $# -ge 2 ]] || die "--epochs needs a value"; epochs="$2"; shift 2 ;;
    --jobs) [[ $# -ge 2 ]] || die "--jobs needs a value"; jobs="$2"; shift 2 ;;
    --engine) [[ $# -ge 2 ]] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$engine" ]] || die "no engine at $engine (build it, or give --engine)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/audit_bench.XXXXXX")"
[[ $keep == 1 ]] || trap 'rm -rf "$tmp"' EXIT

now() { date +%s.%N; }
t0=$(now)
"$engine" train "$root/configs/mnist.json" --device cpu --run-dir "$tmp/run" --set "data.train_limit=$limit" \
  --set data.val_split=1000 --set data.test_limit=1000 --set "train.epochs=$epochs" --set logging.tensorboard=false \
  --fresh >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log" >&2; die "the run failed"; }
t1=$(now)
status=0
"$engine" audit "$tmp/run" --jobs "$jobs" >"$tmp/audit.log" 2>&1 || status=$?
t2=$(now)
cat "$tmp/audit.log"
[[ $status == 0 ]] || die "the audit did not reproduce every checkpoint (exit $status)"
/usr/bin/python3 - "$t0" "$t1" "$t2" "$jobs" <<'PY'
import sys
t0, t1, t2, jobs = map(float, sys.argv[1:5])
run, audit = t1 - t0, t2 - t1
print(f"run {run:.1f} s, audit --jobs {int(jobs)} {audit:.1f} s: audit/run {audit / run:.3f}")
PY
