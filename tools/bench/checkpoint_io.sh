#!/usr/bin/env bash
# Checkpoint save/load: the engine's save_checkpoint/load_checkpoint against
# torch.save(+fsync)/torch.load on the same training state, in one run, same directory.
#
#   tools/bench/checkpoint_io.sh [--rounds R] [--reps N] [--dir DIR] [--bench PATH] [--python PATH] [--keep]
#
# Engine: build/checkpoint_bench (cmake --build build -j2 --target checkpoint_bench; needs
# the Fashion-MNIST files). PyTorch: tools/bench/torch_checkpoint.py. Both write into DIR
# (default: a new directory under ${TMPDIR:-/tmp}), so fsync hits the same file system.
# The two alternate for R rounds (default 7) of N repetitions each (default 15), the
# order swapped every round, because on a shared machine the speed of the disk and of
# memory drifts over seconds: a ratio is only meaningful between runs taken side by side.
# Reported: per tool, the median over rounds of the per-round medians (and the smallest
# minimum); per operation, the median of the per-round ratios engine/torch and their range.
set -euo pipefail

die() { echo "checkpoint_io.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
reps=15
rounds=7
dir=""
bench="$root/build/checkpoint_bench"
py=/usr/bin/python3
keep=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) [[ $# -ge 2 ]] || die "--reps needs a value"; reps="$2"; shift 2 ;;
    --rounds) [[ $# -ge 2 ]] || die "--rounds needs a value"; rounds="$2"; shift 2 ;;
    --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; dir="$2"; shift 2 ;;
    --bench) [[ $# -ge 2 ]] || die "--bench needs a value"; bench="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a value"; py="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive integer, got '$reps'"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
[[ -x "$bench" ]] || die "no checkpoint_bench at $bench (build it: cmake --build build -j2 --target checkpoint_bench, or pass --bench)"
[[ -x "$py" ]] || die "no Python at $py (needs Debian's python3 with python3-torch; pass --python)"
"$py" -c 'import torch' 2>/dev/null || die "$py cannot import torch (the pyenv python3 has no torch; use /usr/bin/python3)"

if [[ -z "$dir" ]]; then
  dir="$(mktemp -d "${TMPDIR:-/tmp}/checkpoint_io.XXXXXX")"
  made=1
else
  mkdir -p "$dir" || die "cannot create $dir"
  made=0
fi
cleanup() { if [[ $made == 1 && $keep == 0 ]]; then rm -rf "$dir"; else echo "files kept in $dir"; fi; }
trap cleanup EXIT

fs_type="$(stat -f -c %T "$dir" 2>/dev/null || echo unknown)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "checkpoint_io: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "directory $dir ($fs_type), $rounds rounds of $reps repetitions each, load average before: $load_before"

run_engine() {
  # From the repository root, so checkpoint_bench finds configs/mnist.json.
  local out
  out="$(cd "$root" && "$bench" --reps "$reps" --dir "$dir/engine" --json | grep '^{' | tail -n 1)" \
    || die "checkpoint_bench failed"
  [[ -n "$out" ]] || die "checkpoint_bench printed no result"
  echo "$out"
}
run_torch() {
  local out
  out="$("$py" "$here/torch_checkpoint.py" --reps "$reps" --dir "$dir/torch" --json | grep '^{' | tail -n 1)" \
    || die "torch_checkpoint.py failed"
  [[ -n "$out" ]] || die "torch_checkpoint.py printed no result"
  echo "$out"
}
results="$dir/rounds.jsonl"
: > "$results"
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then
    e="$(run_engine)"; t="$(run_torch)"
  else
    t="$(run_torch)"; e="$(run_engine)"
  fi
  echo "{\"engine\": $e, \"torch\": $t}" >> "$results"
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$results" "$load_before" "$load_after" <<'EOF'
import json, statistics, sys
rounds = [json.loads(line) for line in open(sys.argv[1])]
before, after = sys.argv[2], sys.argv[3]
def row(name, tool, key):
    meds = [r[tool][key]["median"] for r in rounds]
    mn = min(r[tool][key]["min"] for r in rounds)
    return (f"{name:28}: median {statistics.median(meds):8.2f} ms   min {mn:8.2f} ms   "
            f"(round medians {min(meds):.2f}..{max(meds):.2f})")
print(row("engine save_checkpoint", "engine", "save_ms"))
print(row("torch.save + fsync", "torch", "save_ms"))
print(row("torch atomic save (info)", "torch", "atomic_save_ms"))
print(row("engine load_checkpoint", "engine", "load_ms"))
print(row("torch.load", "torch", "load_ms"))
e, t = rounds[0]["engine"], rounds[0]["torch"]
print(f"file size: engine {e['file_bytes']} bytes ({e['file_bytes'] / 2**20:.2f} MiB), "
      f"torch {t['file_bytes']} bytes ({t['file_bytes'] / 2**20:.2f} MiB), "
      f"ratio {e['file_bytes'] / t['file_bytes']:.3f}; tensor data engine "
      f"{e['tensor_bytes'] / 2**20:.2f} MiB, torch {t['tensor_bytes'] / 2**20:.2f} MiB")
for what, target in (("save", 1.0), ("load", 1.0)):
    ratios = [r["engine"][f"{what}_ms"]["median"] / r["torch"][f"{what}_ms"]["median"] for r in rounds]
    rm = statistics.median(ratios)
    print(f"{what} ratio engine/torch: {rm:.2f} (median of {len(ratios)} side-by-side rounds; "
          f"rounds {min(ratios):.2f}..{max(ratios):.2f}, {sum(x <= target for x in ratios)} of "
          f"{len(ratios)} <= {target:g})   (target <= {target:g}: {'met' if rm <= target else 'NOT met'})")
print(f"{len(rounds)} rounds x {e['reps']} repetitions; load average before: {before}; after: {after}")
EOF
