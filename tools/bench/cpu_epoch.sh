#!/usr/bin/env bash
# One CPU training epoch of the Fashion-MNIST CNN: the engine against PyTorch eager,
# on this machine, with the same thread count, in one run.
#
#   tools/bench/cpu_epoch.sh [--threads T] [--limit N] [--repeat R] [--engine PATH]
#                            [--python PATH] [--keep]
#
# (a) engine: `engine train configs/mnist.json --device cpu --run-dir TMP
#     --set train.epochs=1 --set checkpoint.verify=false --fresh`; the time is the
#     train-only `epoch_seconds` of TMP/metrics.jsonl (validation, checkpoints and the
#     test evaluation are outside it), peak RSS is the whole process's.
# (b) PyTorch: tools/bench/torch_epoch.py, data preloaded as float tensors, only the
#     training loop timed; peak RSS is the whole process's (interpreter + torch included).
# Peak RSS comes from /usr/bin/time -v, or getrusage(RUSAGE_CHILDREN) when that is missing.
# With --repeat R the two alternate R times; the ratio uses each side's fastest run.
set -euo pipefail

die() { echo "cpu_epoch.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
threads=2
limit=""
repeat=1
engine="$root/build/engine"
py=/usr/bin/python3
keep=0
config="$root/configs/mnist.json"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) [[ $# -ge 2 ]] || die "--threads needs a value"; threads="$2"; shift 2 ;;
    --limit) [[ $# -ge 2 ]] || die "--limit needs a value"; limit="$2"; shift 2 ;;
    --repeat) [[ $# -ge 2 ]] || die "--repeat needs a value"; repeat="$2"; shift 2 ;;
    --engine) [[ $# -ge 2 ]] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a value"; py="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done

[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer, got '$threads'"
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer, got '$repeat'"
[[ -z "$limit" || "$limit" =~ ^[1-9][0-9]*$ ]] || die "--limit must be a positive integer, got '$limit'"
[[ -x "$engine" ]] || die "no engine binary at $engine (build it: cmake --build build -j2 --target engine_cli, or pass --engine)"
[[ -x "$py" ]] || die "no Python at $py (needs Debian's python3 with python3-torch; pass --python)"
"$py" -c 'import torch, numpy' 2>/dev/null || die "$py cannot import torch and numpy (the pyenv python3 has no torch; use /usr/bin/python3)"
[[ -f "$config" ]] || die "missing $config"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/cpu_epoch.XXXXXX")"
cleanup() { if [[ $keep == 1 ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT

export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"

# measure LOG RSSFILE CMD... : runs CMD with stdout+stderr to LOG, writes the peak RSS
# in KiB to RSSFILE; on failure shows the log's tail and stops.
measure() {
  local log="$1" rssfile="$2"; shift 2
  local rc=0
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -v -o "$log.time" "$@" >"$log" 2>&1 || rc=$?
    if [[ $rc -ne 0 ]]; then
      tail -n 20 "$log" >&2; die "'$*' failed (exit $rc); full log in $log (use --keep)"
    fi
    awk -F': ' '/Maximum resident set size/ {print $2}' "$log.time" >"$rssfile"
  else
    "$py" - "$log" "$rssfile" "$@" <<'EOF' || rc=$?
import resource, subprocess, sys
log, rssfile, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(log, "wb") as f:
    rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
open(rssfile, "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) + "\n")
sys.exit(rc)
EOF
    if [[ $rc -ne 0 ]]; then
      tail -n 20 "$log" >&2; die "'$*' failed (exit $rc); full log in $log (use --keep)"
    fi
  fi
  [[ -s "$rssfile" ]] || die "could not read the peak RSS of '$*'"
}

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "cpu_epoch: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "threads $threads, images ${limit:-55000 (full split)}, repeat $repeat, load average before: $load_before"

engine_sets=(--set train.epochs=1 --set checkpoint.verify=false)
torch_args=(--threads "$threads")
if [[ -n "$limit" ]]; then
  engine_sets+=(--set "data.train_limit=$limit")
  torch_args+=(--limit "$limit")
fi

results="$tmp/results.tsv"
: >"$results"
for ((r = 1; r <= repeat; r++)); do
  run="$tmp/engine_run$r"
  measure "$tmp/engine$r.log" "$tmp/engine$r.rss" \
    "$engine" train "$config" --device cpu --run-dir "$run" "${engine_sets[@]}" --fresh
  [[ -s "$run/metrics.jsonl" ]] || die "engine wrote no $run/metrics.jsonl (log: $tmp/engine$r.log)"
  secs="$("$py" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["epoch_seconds"])' "$run/metrics.jsonl")" \
    || die "cannot read epoch_seconds from $run/metrics.jsonl"
  printf 'engine\t%s\t%s\n' "$secs" "$(cat "$tmp/engine$r.rss")" >>"$results"
  printf '  run %d engine : %8.2f s  peak RSS %7.1f MiB  (load %s)\n' "$r" "$secs" \
    "$(awk '{print $1/1024}' "$tmp/engine$r.rss")" "$(cut -d' ' -f1 /proc/loadavg)"

  measure "$tmp/torch$r.log" "$tmp/torch$r.rss" "$py" "$here/torch_epoch.py" "${torch_args[@]}"
  json="$(grep '^{' "$tmp/torch$r.log" | tail -n 1)"
  [[ -n "$json" ]] || die "torch_epoch.py printed no result (log: $tmp/torch$r.log)"
  secs="$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["epoch_seconds"])' "$json")"
  printf 'torch\t%s\t%s\n' "$secs" "$(cat "$tmp/torch$r.rss")" >>"$results"
  printf '  run %d pytorch: %8.2f s  peak RSS %7.1f MiB  (load %s)\n' "$r" "$secs" \
    "$(awk '{print $1/1024}' "$tmp/torch$r.rss")" "$(cut -d' ' -f1 /proc/loadavg)"
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$results" "$threads" "$load_before" "$load_after" "$("$py" -c 'import torch; print(torch.__version__)')" <<'EOF'
import sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
threads, before, after, tv = sys.argv[2:6]
t = {k: min(float(s) for n, s, _ in rows if n == k) for k in ("engine", "torch")}
m = {k: max(int(r) for n, _, r in rows if n == k) for k in ("engine", "torch")}
print(f"engine  epoch (train only): {t['engine']:8.2f} s   peak RSS {m['engine'] / 1024:7.1f} MiB")
print(f"pytorch epoch (train only): {t['torch']:8.2f} s   peak RSS {m['torch'] / 1024:7.1f} MiB   (torch {tv})")
print(f"time ratio engine/pytorch : {t['engine'] / t['torch']:.3f}   (target <= 0.6: "
      f"{'met' if t['engine'] / t['torch'] <= 0.6 else 'NOT met'})")
print(f"peak RSS ratio engine/pytorch: {m['engine'] / m['torch']:.3f}   (target <= 0.3: "
      f"{'met' if m['engine'] / m['torch'] <= 0.3 else 'NOT met'})")
print(f"threads {threads}; load average before: {before}; after: {after}")
EOF
