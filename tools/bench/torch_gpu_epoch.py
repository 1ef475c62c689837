#!/usr/bin/env python3
"""PyTorch peers for the GPU benchmark: one training epoch of the Fashion-MNIST CNN with
the dataset preloaded on the GPU (uint8, gathered and normalised per batch, as the engine
does), AdamW (lr 1e-3, weight decay 0.01), batch 128, 55,000 images (the engine's default
training split). Every peer in one process (torch imported and the data loaded once):

  eager      eager model, AdamW (foreach, the default)
  fused      eager model, AdamW(fused=True)
  compile    torch.compile(model, mode="reduce-overhead") (CUDA graphs of the compiled
             forward and backward), AdamW(fused=True)
  graph      the whole step (gather, forward, loss, backward, AdamW(capturable=True,
             fused=True)) captured once per batch shape in torch.cuda.graph and replayed;
             the ragged last batch (55,000 % 128 = 88) has its own graph

each in fp32 and in bf16 (torch.autocast to bfloat16, channels_last). Prints one line
per peer: "torch_<mode>_<dtype>_epoch_seconds S first_epoch_seconds F", S the fastest
timed epoch after the first (the first includes cuDNN autotuning, compilation, capture).

usage: torch_gpu_epoch.py [--modes eager,fused,compile,graph] [--dtypes fp32,bf16]
                          [--epochs 3] [--data-dir DIR] [--limit 55000]
                          [--budget SECONDS]  (peers not started within it are skipped)
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

MEAN, STD, BATCH = 0.2860, 0.3530, 128


def run_peer(mode, dtype, images, labels, epochs):
    dev = images.device
    torch.manual_seed(0)
    model = make_model().to(dev)
    bf16 = dtype == "bf16"
    if bf16:
        model = model.to(memory_format=torch.channels_last)
    fused = mode != "eager"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01,
                            fused=fused, capturable=(mode == "graph"))
    loss_fn = nn.CrossEntropyLoss()
    step_model = torch.compile(model, mode="reduce-overhead") if mode == "compile" else model
    n = images.shape[0]

    def batch_input(idx):
        x = ((images[idx].float() / 255.0 - MEAN) / STD).unsqueeze(1)
        return x.contiguous(memory_format=torch.channels_last) if bf16 else x

    def step(idx):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(step_model(batch_input(idx)), labels[idx])
        opt.zero_grad(set_to_none=(mode != "graph"))
        loss.backward()
        opt.step()
        return loss

    graphs = {}
    if mode == "graph":
        # Warm up on a side stream (as torch.cuda.graphs' documentation requires), then
        # capture one graph per batch size; both share one memory pool.
        sizes = sorted({BATCH, n % BATCH} - {0}, reverse=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for size in sizes:
                for _ in range(3):
                    step(torch.arange(size, device=dev))
        torch.cuda.current_stream().wait_stream(side)
        pool = None
        for size in sizes:
            static_idx = torch.arange(size, device=dev)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                step(static_idx)
            pool = g.pool()
            graphs[size] = (g, static_idx)

    times = []
    model.train()
    for _ in range(epochs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        perm = torch.randperm(n, device=dev)
        for start in range(0, n, BATCH):
            idx = perm[start:start + BATCH]
            if graphs:
                g, static_idx = graphs[idx.shape[0]]
                static_idx.copy_(idx)
                g.replay()
            else:
                step(idx)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="eager,fused,compile,graph")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data-dir", default=os.environ.get("ENGINE_DATA_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--limit", type=int, default=55000)
    ap.add_argument("--budget", type=float, default=0, help="seconds; 0 = no limit")
    a = ap.parse_args()
    start = time.perf_counter()
    dev = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    images = torch.from_numpy(read_idx_images(a.data_dir, "train-images-idx3-ubyte")[: a.limit].copy()).to(dev)
    labels = torch.from_numpy(read_idx_labels(a.data_dir, "train-labels-idx1-ubyte")[: a.limit].astype(np.int64)).to(dev)
    print(f"torch {torch.__version__} cuda {torch.version.cuda} cudnn {torch.backends.cudnn.version()} "
          f"on {torch.cuda.get_device_name(0)}", flush=True)
    status = 0
    # torch.compile's peers last: compiling takes the longest, so a tight budget skips
    # them rather than the others.
    peers = [(m, d) for m in a.modes.split(",") for d in a.dtypes.split(",")]
    peers.sort(key=lambda p: p[0] == "compile")
    for mode, dtype in peers:
        name = f"torch_{mode}_{dtype}"
        if a.budget and time.perf_counter() - start > a.budget:
            print(f"{name} SKIP (over the {a.budget:.0f} s budget)", flush=True)
            continue
        try:
            times = run_peer(mode, dtype, images, labels, a.epochs)
        except Exception as e:  # one peer failing must not hide the others
            print(f"{name} FAIL {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            status = 1
            continue
        best = min(times[1:]) if len(times) > 1 else times[0]
        print(f"{name}_epoch_seconds {best:.4f} first_epoch_seconds {times[0]:.4f}", flush=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
