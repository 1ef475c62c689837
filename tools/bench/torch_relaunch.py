#!/usr/bin/python3
"""The PyTorch peer of a relaunch (tools/bench/relaunch.sh): a training script started
again after a crash, up to its first trained step.

  torch_relaunch.py --write STATE.pt    a mid-run training state (model, AdamW, cosine
                                        scheduler, RNG, counters, the epoch's per-sample
                                        losses), saved with torch.save
  torch_relaunch.py --resume STATE.pt   start as a training script does: import torch,
                                        read and normalise the 55 000 training images,
                                        build the model and optimizer, torch.load the
                                        state and load it, train one step; then print
                                        "resumed in T s: ..." with the same breakdown
                                        points as the engine's line, T counted from the
                                        process's exec (its start time in /proc/self/stat)

Needs Debian's /usr/bin/python3 (python3-torch).
"""
import os
import sys
import time


def seconds_since_exec():
    """From the kernel's start time of this process (clock ticks since boot) to now."""
    with open("/proc/self/stat") as f:
        text = f.read()
    fields = text[text.rindex(")") + 2:].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the whole line
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


def main():
    t_main = time.perf_counter()
    exec_to_main = seconds_since_exec()
    if len(sys.argv) != 3 or sys.argv[1] not in ("--write", "--resume"):
        sys.exit("usage: torch_relaunch.py --write|--resume STATE.pt")
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from torch_interop import make_model, read_idx_images, read_idx_labels
    from bench.torch_checkpoint import build_state
    t_import = time.perf_counter()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if sys.argv[1] == "--write":
        torch.save(build_state(), sys.argv[2])
        return
    data_dir = "/usr/share/datasets/fashion-mnist"
    images = read_idx_images(data_dir, "train-images-idx3-ubyte")
    labels = read_idx_labels(data_dir, "train-labels-idx1-ubyte")
    n = images.shape[0] - 5000
    x = torch.from_numpy(images[:n].astype("float32")).reshape(n, 1, 28, 28)
    x.div_(255.0).sub_(0.2860).div_(0.3530)
    y = torch.from_numpy(labels[:n].astype("int64"))
    model = make_model()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=15, eta_min=0.0)
    t_data = time.perf_counter()
    state = torch.load(sys.argv[2], weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    t_load = time.perf_counter()
    perm = torch.randperm(n)
    idx = perm[:128]
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    opt.step()
    t_step = time.perf_counter()
    print(f"resumed in {exec_to_main + t_step - t_main:.2f} s: exec and interpreter {exec_to_main:.2f}, "
          f"import torch {t_import - t_main:.2f}, data and model {t_data - t_import:.2f}, "
          f"torch.load and load_state_dict {t_load - t_data:.2f}, first step {t_step - t_load:.2f}", flush=True)


if __name__ == "__main__":
    main()
