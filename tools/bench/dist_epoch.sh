#!/usr/bin/env bash
# One data-parallel CPU training epoch of the Fashion-MNIST CNN, three ways side by side
# in one run, on the same two cores' worth of threads:
#
#   tools/bench/dist_epoch.sh [--limit N] [--repeat R] [--engine PATH] [--python PATH]
#                             [--mpirun PATH] [--keep]
#
# (a) engine, 1 process x 2 threads (OMP_NUM_THREADS=2, no mpirun);
# (b) engine, 2 ranks x 1 thread: `mpirun --oversubscribe --bind-to none -np 2`, the
#     environment of tests/mpi/mpi_identity.sh (OMP_NUM_THREADS=1 per rank);
# (c) PyTorch DDP, gloo, 2 ranks x 1 thread: tools/bench/torch_ddp_epoch.py (spawned
#     processes, the same model and AdamW, the global batch of configs/mnist.json split
#     over the ranks as DistributedSampler would, data preloaded).
# Both engine runs: `engine train configs/mnist.json --device cpu --run-dir TMP
# --set train.epochs=1 --set checkpoint.verify=false --fresh` (and a 256-image test
# evaluation, outside the timing); the time is the train-only `epoch_seconds` of
# TMP/metrics.jsonl, which rank 0 writes (the ranks step together). PyTorch's is the
# training loop only, the maximum over the ranks.
# With --repeat R the three alternate R times; each ratio uses each side's fastest run:
#   2 ranks / 1 process          (target <= 1.05: splitting a batch over ranks costs little)
#   engine 2 ranks / PyTorch DDP (target <= 0.6)
# Also prints the bytes each rank sends and receives per training step, computed from the
# model's layer shapes by the rules in docs/benchmarks.md ("Bytes per step per rank";
# tools/bench/dist_bytes.sh counts them), next to what a ring allreduce of the gradients
# (PyTorch DDP) moves.
# The figures are only as good as the machine is quiet (the load average is printed).
set -euo pipefail

die() { echo "dist_epoch.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
limit=""
repeat=1
engine="$root/build/engine"
py=/usr/bin/python3
mpirun="$(command -v mpirun || true)"
keep=0
config="$root/configs/mnist.json"
ranks=2  # the comparison is 2 ranks x 1 thread against 1 process x 2 threads

while [[ $# -gt 0 ]]; do
  case "$1" in
    --limit) [[ $# -ge 2 ]] || die "--limit needs a value"; limit="$2"; shift 2 ;;
    --repeat) [[ $# -ge 2 ]] || die "--repeat needs a value"; repeat="$2"; shift 2 ;;
    --engine) [[ $# -ge 2 ]] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a value"; py="$2"; shift 2 ;;
    --mpirun) [[ $# -ge 2 ]] || die "--mpirun needs a value"; mpirun="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done

[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat must be a positive integer, got '$repeat'"
[[ -z "$limit" || "$limit" =~ ^[1-9][0-9]*$ ]] || die "--limit must be a positive integer, got '$limit'"
[[ -x "$engine" ]] || die "no engine binary at $engine (build it: cmake --build build -j2 --target engine_cli, or pass --engine)"
[[ -n "$mpirun" && -x "$mpirun" ]] || die "no mpirun (install openmpi-bin, or pass --mpirun)"
[[ -x "$py" ]] || die "no Python at $py (needs Debian's python3 with python3-torch; pass --python)"
"$py" -c 'import torch, numpy, torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null ||
  die "$py cannot import torch with gloo and numpy (the pyenv python3 has no torch; use /usr/bin/python3)"
[[ -f "$config" ]] || die "missing $config"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/dist_epoch.XXXXXX")"
cleanup() { if [[ $keep == 1 ]]; then echo "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT

# Open MPI as root in a container, with Docker's shared memory (tests/mpi/mpi_identity.sh).
mpi_env=(OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
         OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1)

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "dist_epoch: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "ranks $ranks, images ${limit:-55000 (full split)}, repeat $repeat, load average before: $load_before"

engine_sets=(--set train.epochs=1 --set checkpoint.verify=false --set data.test_limit=256)
torch_args=(--world "$ranks" --threads 1)
if [[ -n "$limit" ]]; then
  engine_sets+=(--set "data.train_limit=$limit")
  torch_args+=(--limit "$limit")
fi

# epoch_seconds RUN_DIR LOG: the train-only seconds of the run's first (only) epoch.
epoch_seconds() {
  local run="$1" log="$2"
  [[ -s "$run/metrics.jsonl" ]] || die "the engine wrote no $run/metrics.jsonl (log: $log, use --keep)"
  "$py" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["epoch_seconds"])' "$run/metrics.jsonl" ||
    die "cannot read epoch_seconds from $run/metrics.jsonl"
}
# run_or_die LOG CMD...: runs CMD with stdout+stderr to LOG; on failure shows the log's
# tail and stops.
run_or_die() {
  local log="$1"; shift
  local rc=0
  "$@" >"$log" 2>&1 || rc=$?
  if [[ $rc -ne 0 ]]; then tail -n 20 "$log" >&2; die "'$*' failed (exit $rc); full log in $log (use --keep)"; fi
}

results="$tmp/results.tsv"
: >"$results"
for ((r = 1; r <= repeat; r++)); do
  run="$tmp/one$r"
  run_or_die "$tmp/one$r.log" env OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 \
    "$engine" train "$config" --device cpu --run-dir "$run" "${engine_sets[@]}" --fresh
  secs="$(epoch_seconds "$run" "$tmp/one$r.log")"
  printf 'one\t%s\n' "$secs" >>"$results"
  printf '  run %d engine 1 process x 2 threads: %8.2f s  (load %s)\n' "$r" "$secs" "$(cut -d' ' -f1 /proc/loadavg)"

  run="$tmp/ranks$r"
  run_or_die "$tmp/ranks$r.log" env "${mpi_env[@]}" "$mpirun" --oversubscribe --bind-to none -np "$ranks" \
    "$engine" train "$config" --device cpu --run-dir "$run" "${engine_sets[@]}" --fresh
  grep -q "^data-parallel on $ranks ranks" "$tmp/ranks$r.log" ||
    die "the engine under mpirun did not say 'data-parallel on $ranks ranks' (built without MPI?); log: $tmp/ranks$r.log"
  secs="$(epoch_seconds "$run" "$tmp/ranks$r.log")"
  printf 'ranks\t%s\n' "$secs" >>"$results"
  printf '  run %d engine %d ranks x 1 thread  : %8.2f s  (load %s)\n' "$r" "$ranks" "$secs" "$(cut -d' ' -f1 /proc/loadavg)"

  run_or_die "$tmp/torch$r.log" "$py" "$here/torch_ddp_epoch.py" "${torch_args[@]}"
  json="$(grep '^{' "$tmp/torch$r.log" | tail -n 1)"
  [[ -n "$json" ]] || die "torch_ddp_epoch.py printed no result (log: $tmp/torch$r.log)"
  secs="$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["epoch_seconds"])' "$json")"
  printf 'torch\t%s\n' "$secs" >>"$results"
  printf '  run %d pytorch DDP %d ranks x 1 thread: %8.2f s  (load %s)\n' "$r" "$ranks" "$secs" "$(cut -d' ' -f1 /proc/loadavg)"
done
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$results" "$ranks" "$load_before" "$load_after" "$root" <<'EOF'
import json, sys
results, ranks, before, after, root = sys.argv[1:6]
W = int(ranks)
rows = [l.split("\t") for l in open(results).read().split("\n") if l]
t = {k: min(float(s) for n, s in rows if n == k) for k in ("one", "ranks", "torch")}
print(f"engine 1 process x 2 threads (train only): {t['one']:8.2f} s")
print(f"engine {W} ranks x 1 thread (train only)  : {t['ranks']:8.2f} s")
print(f"pytorch DDP gloo {W} ranks x 1 thread      : {t['torch']:8.2f} s")
r1 = t["ranks"] / t["one"]
r2 = t["ranks"] / t["torch"]
print(f"ratio {W} ranks / 1 process: {r1:.3f}   (target <= 1.05: {'met' if r1 <= 1.05 else 'NOT met'})")
print(f"ratio engine {W} ranks / pytorch DDP: {r2:.3f}   (target <= 0.6: {'met' if r2 <= 0.6 else 'NOT met'})")

# Bytes per training step per rank, from the layer shapes (the model of
# tools/torch_interop.py, = models/fashion_cnn.cpp) and the global batch of the config,
# as Open MPI's pml monitoring counts them (tools/bench/dist_bytes.sh measures them):
# an allgather or an alltoall of a piece of m bytes sends (W-1)*m per rank.
# Per step (engine/core/collective/parameter_shards.cpp, engine/nn/layers.cpp,
# engine/train/trainer_step.cpp):
#   one alltoall of the conv/linear weight (float) and bias (double) block sums, each
#     rank's piece for rank s being s's shard of them, times the most blocks a rank holds;
#   one allgather of the updated parameter shards (P/W floats, the largest shard);
#   BatchNorm2d (synchronised): forward sum(x), sum((x-mean)^2), C doubles each, and
#     backward [sum(dy) | sum(dy*(x-mean))], 2C doubles, in allgathers: the forward's
#     of channel groups (ranks on one host, engine/core/batchnorm_ops.cpp: 512 KiB of x
#     of a rank's even share of the batch; 2 exchanges per group), the backward's of the
#     whole layer (1 exchange); the bytes do not depend on the grouping;
#   the per-sample losses: the largest rank's sample count of floats: 1 allgather;
#   the stop agreement (RunProtocol::agree): 5 int64: 1 allgather.
# PyTorch DDP allreduces the gradients only (per-rank BN); gloo's ring allreduce sends
# and receives 2(W-1)/W of them per rank.
sys.path.insert(0, root + "/tools")
import torch
from torch_interop import make_model
batch = json.load(open(root + "/configs/mnist.json"))["data"]["batch_size"]
F32, F64 = 4, 8
layout, bn, exchanges, grads = [], 0, 2, 0  # layout: (values, bytes per value, exchanged?)
model = make_model()
plane = {}  # BatchNorm2d -> H*W of its input
hooks = [m.register_forward_hook(lambda m, i, o: plane.__setitem__(m, i[0].shape[2] * i[0].shape[3]))
         for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
model.train()(torch.zeros(2, 1, 28, 28))
even = -(-batch // W)  # a rank's even share of the global batch
def groups(channels, hw, tensors):  # kernels/cpu/elementwise_ops.cpp: batchnorm_channel_group
    per_group = min(channels, max(1, (512 * 1024) // (4 * even * hw * tensors)))
    return -(-channels // per_group)
for m in model.modules():
    if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
        layout += [(m.weight.numel(), F32, True), (m.bias.numel(), F64, True)]
    elif isinstance(m, torch.nn.BatchNorm2d):
        layout += [(m.weight.numel(), F32, False), (m.bias.numel(), F32, False)]
        bn += 4 * m.num_features * F64
        exchanges += 2 * groups(m.num_features, plane[m], 1) + 1
    grads += sum(p.numel() for p in m.parameters(recurse=False))
def tree_blocks(b, e):  # kernels/chunk_tree.h
    out, p = 0, b
    while p < e:
        size = 1
        while size * 2 <= 8 and p % (size * 2) == 0 and p + size * 2 <= e: size *= 2
        out, p = out + 1, p + size
    return out
most_blocks = max(tree_blocks(8 * r // W, 8 * (r + 1) // W) for r in range(W))
def shard_bytes(r):  # rank r's shard [P*r/W, P*(r+1)/W) of the exchanged gradients
    lo, hi, at, n = grads * r // W, grads * (r + 1) // W, 0, 0
    for values, size, exchanged in layout:
        if exchanged: n += max(0, min(hi, at + values) - max(lo, at)) * size
        at += values
    return n
alltoall = most_blocks * max(shard_bytes(r) for r in range(W))
params = max(grads * (r + 1) // W - grads * r // W for r in range(W)) * F32
chunk = lambda c: batch * c // 8  # kernels/chunk_tree.h: chunk c = [B*c/8, B*(c+1)/8)
losses = max(chunk(8 * (r + 1) // W) - chunk(8 * r // W) for r in range(W)) * F32
agree = 5 * 8
exchanges += 2
sent = (W - 1) * (alltoall + params + bn + losses + agree)
ring = 2 * (W - 1) / W * grads * F32
print(f"bytes per step per rank, engine ({exchanges} exchanges, global batch {batch}): sends {sent:,}, "
      f"receives {sent:,} (alltoall of the gradients' shards, allgather of the parameters; W = {W})")
print(f"bytes per step per rank, ring allreduce of the {grads:,} gradient floats (PyTorch DDP): "
      f"sends {ring:,.0f}, receives {ring:,.0f}")
print(f"load average before: {before}; after: {after}")
EOF
