#!/usr/bin/python3
"""torch.save / torch.load of the same training state the engine checkpoints, for
comparison with checkpoint_bench (tools/bench/checkpoint_io.sh runs both).

The state mirrors an engine checkpoint taken after one AdamW step: the model's
state_dict (Fashion-MNIST CNN, 421,834 parameters, BatchNorm buffers), the AdamW
optimizer's state_dict after one step (exp_avg, exp_avg_sq, step), the
CosineAnnealingLR state_dict, a GradScaler-like dict, the RNG state
(torch.get_rng_state()), the trainer counters with the per-sample loss buffer of the
epoch (float32 [55000], as the engine keeps), the (empty) metrics history and the
resolved config as JSON text.

save = torch.save(state, path) + open the file and os.fsync it;
load = torch.load(path, map_location="cpu"). Each is timed --reps times after one
untimed warm-up; also reported: an atomic save like the engine's (temporary file,
fsync, os.replace, directory fsync). Prints a human summary, or one JSON line (--json).
Needs Debian's /usr/bin/python3 (python3-torch).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.exit(f"torch_checkpoint.py: {e}; run it with /usr/bin/python3 (Debian's python3-torch)")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_interop import make_model  # noqa: E402  (the same model as every other script)


def build_state(train_count=55000, epochs=15, seed=0):
    torch.manual_seed(seed)
    model = make_model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs, eta_min=0.0)
    x = torch.randn(128, 1, 28, 28)
    y = torch.randint(0, 10, (128,))
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    sample_loss = torch.zeros(train_count, dtype=torch.float32)
    sample_loss[:128] = loss.detach()
    config = {"seed": seed, "device": "cpu", "data": {"batch_size": 128, "val_split": 5000},
              "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.01},
              "scheduler": {"name": "cosine", "t_max": None}, "train": {"epochs": epochs}}
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "scaler": {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                   "growth_interval": 2000, "_growth_tracker": 0, "enabled": False},
        "rng": {"torch": torch.get_rng_state()},
        "trainer": {"epoch": 0, "global_step": 1, "step_in_epoch": 1,
                    "epoch_shuffle_offset": 0, "best_metric": float("inf"), "best_epoch": 0,
                    "epochs_without_improvement": 0, "monitor": "val_loss",
                    "epoch_sample_loss": sample_loss},
        "metrics": {k: [] for k in ("epoch", "train_loss", "val_loss", "val_acc", "lr",
                                    "loss_scale", "epoch_seconds")},
        "config_json": json.dumps(config),
    }


def save_fsync(state, path):
    torch.save(state, path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(state, path):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def timed(fn, reps):
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return {"median": statistics.median(out), "min": min(out), "mean": statistics.fmean(out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.reps < 1:
        sys.exit("torch_checkpoint.py: --reps must be positive")
    torch.set_num_threads(a.threads)

    work = a.dir or tempfile.mkdtemp(prefix="torch_checkpoint.")
    os.makedirs(work, exist_ok=True)
    try:
        state = build_state()
        path = os.path.join(work, "bench.pt")
        save = timed(lambda: save_fsync(state, path), a.reps)
        size = os.path.getsize(path)
        load = timed(lambda: torch.load(path, map_location="cpu"), a.reps)
        back = torch.load(path, map_location="cpu")
        if not torch.equal(back["model"]["fc1.weight"], state["model"]["fc1.weight"]):
            sys.exit("torch_checkpoint.py: reloaded state differs")
        atomic = timed(lambda: save_atomic(state, os.path.join(work, "atomic.pt")), a.reps)
        tensor_bytes = 0
        stack = [state]
        while stack:
            o = stack.pop()
            if isinstance(o, torch.Tensor):
                tensor_bytes += o.numel() * o.element_size()
            elif isinstance(o, dict):
                stack.extend(o.values())
            elif isinstance(o, (list, tuple)):
                stack.extend(o)
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    res = {"reps": a.reps, "save_ms": save, "load_ms": load, "atomic_save_ms": atomic,
           "file_bytes": size, "tensor_bytes": tensor_bytes, "torch": torch.__version__}
    if a.json:
        print(json.dumps(res))
        return
    print(f"torch checkpoint: {tensor_bytes / 2**20:.2f} MiB of tensor data (torch {torch.__version__})")
    for name, s in (("torch.save+fsync", save), ("torch.load", load), ("atomic save", atomic)):
        print(f"{name:16}: median {s['median']:8.3f} ms  min {s['min']:8.3f} ms  "
              f"mean {s['mean']:8.3f} ms  ({a.reps} reps)")
    print(f"file size       : {size} bytes ({size / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
