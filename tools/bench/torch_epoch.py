#!/usr/bin/python3
"""One PyTorch (eager, CPU) training epoch of the Fashion-MNIST CNN, for comparison with
the engine (tools/bench/cpu_epoch.sh runs both).

Same model as models/fashion_cnn.h, batch 128, AdamW(lr 1e-3, wd 0.01), dropout 0.25,
model.train(), a fresh shuffle of the training split (the first 55000 of the 60000
training images) every epoch. The images are decoded and normalised into one float32
tensor before the clock starts; only the training loop is timed (no validation, no
checkpoint). Prints one JSON line: {"epoch_seconds": ..., "images": ..., ...}.

Needs Debian's /usr/bin/python3 (python3-torch); the pyenv python3 has no torch.
"""
import argparse
import json
import os
import resource
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.exit(f"torch_epoch.py: {e}; run it with /usr/bin/python3 (Debian's python3-torch)")


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# The one PyTorch definition of the model and the one IDX reader (tools/torch_interop.py).
from torch_interop import make_model, read_idx_images, read_idx_labels  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="train on the first N images only")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--val-split", type=int, default=5000)
    ap.add_argument("--mean", type=float, default=0.2860)
    ap.add_argument("--std", type=float, default=0.3530)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(a.seed)

    try:
        images = read_idx_images(a.data_dir, "train-images-idx3-ubyte")
        labels = read_idx_labels(a.data_dir, "train-labels-idx1-ubyte")
    except (OSError, ValueError) as e:
        sys.exit(f"torch_epoch.py: {e} (install the Fashion-MNIST files or pass --data-dir)")
    n_train = images.shape[0] - a.val_split
    if a.limit is not None:
        if a.limit <= 0:
            sys.exit("torch_epoch.py: --limit must be positive")
        n_train = min(n_train, a.limit)
    # One float32 allocation, normalised in place (no full-size temporaries), so the
    # peak RSS is the model's and the preloaded data's, not the decoder's.
    x = torch.from_numpy(images[:n_train].astype(np.float32)).reshape(n_train, 1, 28, 28)
    x.div_(255.0).sub_(a.mean).div_(a.std)
    y = torch.from_numpy(labels[:n_train].astype(np.int64))
    del images, labels

    model = make_model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    loss_sum = torch.zeros((), dtype=torch.float64)

    t0 = time.perf_counter()
    perm = torch.randperm(n_train)
    for start in range(0, n_train, a.batch_size):
        idx = perm[start:start + a.batch_size]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        loss_sum += loss.detach() * idx.numel()
    seconds = time.perf_counter() - t0

    print(json.dumps({
        "epoch_seconds": seconds,
        "images": n_train,
        "steps": (n_train + a.batch_size - 1) // a.batch_size,
        "train_loss": float(loss_sum) / n_train,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "self_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }))


if __name__ == "__main__":
    main()
