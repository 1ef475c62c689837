#!/usr/bin/env python3
"""PyTorch reference for the GPU benchmark: one training epoch of the Fashion-MNIST CNN
with the dataset preloaded on the GPU (uint8, gathered and normalised per batch, as the
engine does), AdamW, batch 128, eager or torch.compile. Prints seconds per epoch (the
last of --epochs timed epochs; the first compiled epoch includes compilation and is
reported separately).

usage: torch_gpu_epoch.py [--compile] [--epochs 3] [--data-dir DIR] [--limit N]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

# The one PyTorch definition of the model and the one IDX reader (tools/torch_interop.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_interop import make_model, read_idx_images, read_idx_labels  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data-dir", default=os.environ.get("ENGINE_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--limit", type=int, default=55000)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    images = torch.from_numpy(read_idx_images(a.data_dir, "train-images-idx3-ubyte")[: a.limit].copy()).to(dev)
    labels = torch.from_numpy(read_idx_labels(a.data_dir, "train-labels-idx1-ubyte")[: a.limit].astype(np.int64)).to(dev)
    model = make_model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step_model = torch.compile(model) if a.compile else model
    loss_fn = nn.CrossEntropyLoss()
    n, batch = images.shape[0], 128
    times = []
    for epoch in range(a.epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n, device=dev)
        model.train()
        for start in range(0, n, batch):
            idx = perm[start:start + batch]
            x = ((images[idx].float() / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
            loss = loss_fn(step_model(x), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    mode = "compiled" if a.compile else "eager"
    print(f"torch_{mode}_first_epoch_seconds {times[0]:.4f}")
    print(f"torch_{mode}_epoch_seconds {min(times[1:]) if len(times) > 1 else times[0]:.4f}")


if __name__ == "__main__":
    main()
