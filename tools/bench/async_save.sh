#!/usr/bin/env bash
# What checkpoint saves cost the training thread, with checkpoint.async on (the default):
# the stall per save (target: <= 1 ms per 5 MB save), and an epoch of 50 steps of the
# Fashion-MNIST CNN that saves, verified, after every step against the same epoch saving
# only at its end (target: <= 1.15x), trained on one thread (OMP_NUM_THREADS=1) so that
# the writer thread has the other core. --sync measures the same with checkpoint.async off.
#
#   tools/bench/async_save.sh [--rounds R] [--steps N] [--sync] [--dir DIR] [--bench PATH] [--data DIR] [--set K=V]...
#
# --set overrides a config key of the measured runs, e.g. --set 'checkpoint.replicas=["/tmp/r"]'
# for the stall with a replica tier (docs/recovery.md); --bench runs another build's bench
# (side by side with this one: alternate the two commands).
#
# Needs build/async_save_bench (cmake --build build -j2 --target async_save_bench) and the
# Fashion-MNIST files (default /usr/share/datasets/fashion-mnist, or $ENGINE_DATA_DIR).
# The two modes alternate for R rounds (default 5), the order swapped every round; the
# ratio is the median of the per-round ratios. On a machine whose cores are busy with
# other work the writer competes with training for CPU, and the ratio says so.
set -euo pipefail

die() { echo "async_save.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bench="$root/build/async_save_bench"
data="${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}"
args=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds|--steps|--dir|--set) [[ $# -ge 2 ]] || die "$1 needs a value"; args+=("$1" "$2"); shift 2 ;;
    --sync) args+=("--sync"); shift ;;
    --bench) [[ $# -ge 2 ]] || die "--bench needs a value"; bench="$2"; shift 2 ;;
    --data) [[ $# -ge 2 ]] || die "--data needs a value"; data="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$bench" ]] || die "$bench not found: cmake --build build -j2 --target async_save_bench"
[[ -e "$data/train-images-idx3-ubyte.gz" || -e "$data/train-images-idx3-ubyte" ]] || die "no Fashion-MNIST files in $data"

echo "async_save.sh at $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
OMP_NUM_THREADS=1 exec "$bench" --data "$data" "${args[@]}"
