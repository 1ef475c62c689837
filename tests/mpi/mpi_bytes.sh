#!/usr/bin/env bash
# The bytes a rank sends per training step, as Open MPI's pml monitoring counts them
# (tools/bench/dist_bytes.sh: runs of 10 and 20 steps, the difference over 10), must stay
# within the sharded design's bound (docs/benchmarks.md "Bytes per step per rank"): at
# W = 8 the busiest rank sends at most 2.0 times the gradient (1.77 measured; a ring
# allreduce 1.75), at W = 2 at most 1.05 times (1.00). Byte counts do not depend on the
# machine's speed. CTest label `mpi`; skipped without the data set or the monitoring
# component.
#   mpi_bytes.sh ENGINE MPIRUN SOURCE_DIR
set -euo pipefail
engine="$1" mpirun="$2" src="$3"
[[ -d /usr/share/datasets/fashion-mnist ]] || { echo "no data set: skipped"; exit 77; }
ompi_info 2>/dev/null | grep -q 'MCA pml: monitoring' || { echo "Open MPI has no pml monitoring component: skipped"; exit 77; }
out="$("$src/tools/bench/dist_bytes.sh" --engine "$engine" --mpirun "$mpirun" --ranks "2 8")"
echo "$out"
check() {  # W BOUND
  local ratio
  ratio="$(awk -v w="$1" '$1 == "engine" && $2 == w { print $4 }' <<<"$out")"
  [[ -n "$ratio" ]] || { echo "FAIL: no figure for W = $1"; exit 1; }
  awk -v r="$ratio" -v b="$2" 'BEGIN { exit !(r <= b) }' \
    || { echo "FAIL: W = $1: the busiest rank sends $ratio times the gradient per step, above $2"; exit 1; }
  echo "W = $1: $ratio x the gradient per step (bound $2)"
}
check 2 1.05
check 8 2.0
