#!/usr/bin/python3
"""One PyTorch DistributedDataParallel (gloo, CPU) training epoch of the Fashion-MNIST CNN,
for comparison with the engine under mpirun (tools/bench/dist_epoch.sh runs both).

W processes (torch.multiprocessing spawn; --world, default 2), one intra-op thread each
(--threads), the model of tools/torch_interop.py (= models/fashion_cnn.cpp), AdamW(lr 1e-3,
wd 0.01), dropout 0.25, model.train(). The GLOBAL batch is --batch-size (128, as
data.batch_size of configs/mnist.json): each rank takes batch_size / W samples per step,
its share of a fresh shuffle of the training split (the first 55000 of the 60000 training
images) exactly as torch.utils.data.DistributedSampler(shuffle=True, drop_last=False)
would give it (indices perm[rank::W], the permutation padded to a multiple of W), but
indexed from tensors preloaded before the clock starts (no DataLoader workers).

DDP set up as an expert would for this model on CPU:
- default gradient bucketing (25 MiB buckets: the 1.7 MB of gradients go in one or two
  buckets, their allreduce overlapping the rest of the backward pass);
- gradient_as_bucket_view=True (the gradients live in the buckets: no copy in or out);
- static_graph=True (the same graph every step; lets DDP skip the unused-parameter
  search and fix the bucket order after the first step; --no-static-graph to compare);
- broadcast_buffers=False: BatchNorm stays per rank (torch 1.13's SyncBatchNorm has no
  CPU implementation), and broadcasting rank 0's running statistics every forward would
  only overwrite the other ranks' copies, never rank 0's, so it costs a collective per
  step for nothing (--broadcast-buffers to compare);
- zero_grad(set_to_none=True); no no_sync (every step synchronises).
So PyTorch exchanges only the 421,834 gradient floats per step, by gloo's ring allreduce,
while the engine also exchanges the synchronised-BatchNorm sums and the per-sample losses,
in fixed order (docs/benchmarks.md, "Data-parallel epoch").

Only the training loop is timed, between two barriers; the figure is the maximum over the
ranks. Prints one JSON line: {"epoch_seconds": ..., "images": ..., "world": ..., ...}.
Needs Debian's /usr/bin/python3 (python3-torch with gloo); the pyenv python3 has no torch.
"""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.exit(f"torch_ddp_epoch.py: {e}; run it with /usr/bin/python3 (Debian's python3-torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_interop import make_model, read_idx_images, read_idx_labels  # noqa: E402


def worker(rank, a, n_train, init_file, result_file):
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=a.world)

    # Data preloaded as float tensors (each rank holds the split, as a DataLoader over an
    # in-memory data set would).
    images = read_idx_images(a.data_dir, "train-images-idx3-ubyte")
    labels = read_idx_labels(a.data_dir, "train-labels-idx1-ubyte")
    x = torch.from_numpy(images[:n_train].astype(np.float32)).reshape(n_train, 1, 28, 28)
    x.div_(255.0).sub_(a.mean).div_(a.std)
    y = torch.from_numpy(labels[:n_train].astype(np.int64))
    del images, labels

    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    model = make_model()
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, broadcast_buffers=a.broadcast_buffers, gradient_as_bucket_view=True,
        static_graph=a.static_graph)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    local_batch = a.batch_size // a.world
    loss_sum = torch.zeros((), dtype=torch.float64)

    # DistributedSampler(shuffle=True, seed=a.seed) at epoch 0: the same permutation on
    # every rank, padded to a multiple of W with its own first indices, rank r takes r::W.
    g = torch.Generator()
    g.manual_seed(a.seed)
    dist.barrier()
    t0 = time.perf_counter()
    perm = torch.randperm(n_train, generator=g)
    total = -(-n_train // a.world) * a.world
    if total > n_train:
        perm = torch.cat([perm, perm[:total - n_train]])
    mine = perm[rank:total:a.world]
    steps = 0
    for start in range(0, mine.numel(), local_batch):
        idx = mine[start:start + local_batch]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        loss_sum += loss.detach() * idx.numel()
        steps += 1
    dist.barrier()
    seconds = time.perf_counter() - t0

    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    ls = loss_sum.clone()
    dist.all_reduce(ls, op=dist.ReduceOp.SUM)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss], dtype=torch.int64)
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump({
                "epoch_seconds": float(t),
                "rank0_seconds": seconds,
                "images": n_train,
                "world": a.world,
                "global_batch": a.batch_size,
                "local_batch": local_batch,
                "steps": steps,
                "train_loss": float(ls) / total,
                "threads_per_rank": torch.get_num_threads(),
                "static_graph": a.static_graph,
                "broadcast_buffers": a.broadcast_buffers,
                "backend": dist.get_backend(),
                "torch": torch.__version__,
                "max_rank_maxrss_kib": int(rss),
            }, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="number of ranks (processes)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--limit", type=int, default=None, help="train on the first N images only")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=128, help="the global batch")
    ap.add_argument("--val-split", type=int, default=5000)
    ap.add_argument("--mean", type=float, default=0.2860)
    ap.add_argument("--std", type=float, default=0.3530)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-static-graph", dest="static_graph", action="store_false")
    ap.add_argument("--broadcast-buffers", action="store_true")
    a = ap.parse_args()
    if a.world < 1 or a.threads < 1:
        sys.exit("torch_ddp_epoch.py: --world and --threads must be positive")
    if a.batch_size % a.world:
        sys.exit(f"torch_ddp_epoch.py: the global batch {a.batch_size} does not split over {a.world} ranks")
    if a.limit is not None and a.limit <= 0:
        sys.exit("torch_ddp_epoch.py: --limit must be positive")
    try:  # read once here so that a missing data set is one line, not W tracebacks
        n_total = read_idx_labels(a.data_dir, "train-labels-idx1-ubyte").shape[0]
    except (OSError, ValueError) as e:
        sys.exit(f"torch_ddp_epoch.py: {e} (install the Fashion-MNIST files or pass --data-dir)")
    n_train = n_total - a.val_split
    if a.limit is not None:
        n_train = min(n_train, a.limit)

    # All ranks on this machine: gloo over the loopback device, whatever the host name
    # resolves to (set GLOO_SOCKET_IFNAME to choose another).
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="torch_ddp_epoch.") as tmp:
        init_file, result_file = os.path.join(tmp, "init"), os.path.join(tmp, "result.json")
        mp.spawn(worker, args=(a, n_train, init_file, result_file), nprocs=a.world, join=True)
        print(open(result_file).read())


if __name__ == "__main__":
    main()
