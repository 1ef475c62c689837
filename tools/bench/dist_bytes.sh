#!/usr/bin/env bash
# The bytes each rank sends per training step, counted by Open MPI's pml monitoring
# (every point-to-point message, those inside collectives included), for one or two
# engine binaries side by side:
#
#   tools/bench/dist_bytes.sh [--ranks "2 3 4 6 8"] [--engine PATH] [--base PATH] [--mpirun PATH]
#
# For each W: `mpirun -np W --mca pml_monitoring_enable 2 --mca pml_monitoring_enable_output 3
# --mca pml_monitoring_filename F engine train configs/mnist.json --device cpu` on 10 and
# on 20 training steps of the shipped global batch (data.train_limit = 10 or 20 batches,
# one epoch, the same 128-image validation and test), and the difference of the two runs
# over 10: the per-step bytes with the start, the evaluations and the saves cancelled out.
# Prints, per binary and W, the busiest rank's bytes per step and its ratio to the
# gradient (421,834 floats = 1,687,336 B; a ring allreduce sends 2(W-1)/W of it).
# --base PATH: an older engine binary measured in the same run (the allgather design).
set -euo pipefail

die() { echo "dist_bytes.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
engine="$root/build/engine"
base=""
mpirun="$(command -v mpirun || true)"
ranks="2 3 4 6 8"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --engine) engine="$2"; shift 2 ;;
    --base) base="$2"; shift 2 ;;
    --mpirun) mpirun="$2"; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
[[ -x "$engine" ]] || die "no engine binary at $engine"
[[ -z "$base" || -x "$base" ]] || die "no engine binary at $base"
[[ -n "$mpirun" ]] || die "no mpirun (install openmpi-bin)"
data=/usr/share/datasets/fashion-mnist
[[ -d "$data" ]] || die "no data set at $data (install dataset-fashion-mnist)"
config="$root/configs/mnist.json"
batch="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["data"]["batch_size"])' "$config")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# sent BINARY W STEPS: each rank's bytes sent in the whole run, one per line.
sent() {
  local bin="$1" w="$2" steps="$3" dir="$tmp/w$2s$3"
  rm -rf "$dir" && mkdir -p "$dir"
  "$mpirun" --oversubscribe --bind-to none -np "$w" --mca pml_monitoring_enable 2 \
    --mca pml_monitoring_enable_output 3 --mca pml_monitoring_filename "$dir/prof" \
    "$bin" train "$config" --device cpu --run-dir "$dir/run" --set "data.dir=$data" \
    --set "data.train_limit=$((steps * batch))" --set "data.val_split=128" --set data.test_limit=128 \
    --set train.epochs=1 --set checkpoint.verify=false --set logging.tensorboard=false \
    >"$dir/log" 2>&1 || { cat "$dir/log" >&2; die "$bin on $w ranks failed"; }
  for ((r = 0; r < w; r++)); do
    # "I <from> <to> <bytes> bytes <n> msgs sent": what this rank sent to each peer.
    awk -F'\t' '$1 == "I" { split($4, b, " "); s += b[1] } END { print s + 0 }' "$dir/prof.$r.prof"
  done
}

grad=1687336
printf '%-8s %3s %22s %10s %22s\n' binary W "busiest rank B/step" "x gradient" "ring allreduce B/step"
for w in $ranks; do
  for which in engine base; do
    bin="$engine"
    [[ "$which" == base ]] && { [[ -n "$base" ]] || continue; bin="$base"; }
    mapfile -t a < <(sent "$bin" "$w" 10)
    mapfile -t b < <(sent "$bin" "$w" 20)
    most=0
    for ((r = 0; r < w; r++)); do
      d=$(( (b[r] - a[r]) / 10 ))
      (( d > most )) && most=$d
    done
    python3 -c 'import sys; m, g, w = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]); print(f"{sys.argv[4]:<8} {w:>3} {m:>22,} {m / g:>10.2f} {2 * (w - 1) / w * g:>22,.0f}")' \
      "$most" "$grad" "$w" "$which"
  done
done
echo "engine: $engine${base:+; base: $base}; global batch $batch; $(nproc --all) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
