#!/usr/bin/env bash
# Checkpoint save/load: the engine's save_checkpoint/load_checkpoint against
# torch.save(+fsync)/torch.load on the same training state, in one run, same directory.
#
#   tools/bench/checkpoint_io.sh [--reps N] [--dir DIR] [--bench PATH] [--python PATH] [--keep]
#
# Engine: build/checkpoint_bench (cmake --build build -j2 --target checkpoint_bench; needs
# the Fashion-MNIST files). PyTorch: tools/bench/torch_checkpoint.py. Both write into DIR
# (default: a new directory under ${TMPDIR:-/tmp}), so fsync hits the same file system.
# Ratios are engine/torch of the medians (and of the minima).
set -euo pipefail

die() { echo "checkpoint_io.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
reps=20
dir=""
bench="$root/build/checkpoint_bench"
py=/usr/bin/python3
keep=0

while [[ $# -gt 0 ]]; do
  case "$1" in
    --reps) [[ $# -ge 2 ]] || die "--reps needs a value"; reps="$2"; shift 2 ;;
    --dir) [[ $# -ge 2 ]] || die "--dir needs a value"; dir="$2"; shift 2 ;;
    --bench) [[ $# -ge 2 ]] || die "--bench needs a value"; bench="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a value"; py="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive integer, got '$reps'"
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
echo "directory $dir ($fs_type), $reps repetitions each, load average before: $load_before"

# Run from the repository root so checkpoint_bench finds configs/mnist.json.
engine_json="$(cd "$root" && "$bench" --reps "$reps" --dir "$dir/engine" --json | grep '^{' | tail -n 1)" \
  || die "checkpoint_bench failed"
[[ -n "$engine_json" ]] || die "checkpoint_bench printed no result"
torch_json="$("$py" "$here/torch_checkpoint.py" --reps "$reps" --dir "$dir/torch" --json | grep '^{' | tail -n 1)" \
  || die "torch_checkpoint.py failed"
[[ -n "$torch_json" ]] || die "torch_checkpoint.py printed no result"
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$engine_json" "$torch_json" "$load_before" "$load_after" <<'EOF'
import json, sys
e, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
before, after = sys.argv[3], sys.argv[4]
def row(name, s):
    return f"{name:28}: median {s['median']:8.2f} ms   min {s['min']:8.2f} ms   mean {s['mean']:8.2f} ms"
print(row("engine save_checkpoint", e["save_ms"]))
print(row("torch.save + fsync", t["save_ms"]))
print(row("torch atomic save (info)", t["atomic_save_ms"]))
print(row("engine load_checkpoint", e["load_ms"]))
print(row("torch.load", t["load_ms"]))
print(f"file size: engine {e['file_bytes']} bytes ({e['file_bytes'] / 2**20:.2f} MiB), "
      f"torch {t['file_bytes']} bytes ({t['file_bytes'] / 2**20:.2f} MiB), "
      f"ratio {e['file_bytes'] / t['file_bytes']:.3f}; tensor data engine "
      f"{e['tensor_bytes'] / 2**20:.2f} MiB, torch {t['tensor_bytes'] / 2**20:.2f} MiB")
for what, target in (("save", 1.0), ("load", 1.0)):
    rm = e[f"{what}_ms"]["median"] / t[f"{what}_ms"]["median"]
    rn = e[f"{what}_ms"]["min"] / t[f"{what}_ms"]["min"]
    print(f"{what} ratio engine/torch: {rm:.2f} (medians), {rn:.2f} (minima)   "
          f"(target <= {target:g}: {'met' if rm <= target else 'NOT met'})")
print(f"repetitions {e['reps']}; load average before: {before}; after: {after}")
EOF
