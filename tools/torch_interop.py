#!/usr/bin/env python3
"""PyTorch interoperability for engine checkpoints (docs/checkpoint-format.md).

Subcommands
-----------
compare CKPT.h5
    Loads `/model` of an engine checkpoint into the PyTorch module equivalent to
    fashion_cnn (strict: every state key present, shapes and dtypes equal, nothing
    extra), runs it in eval mode on the Fashion-MNIST test images, runs
    `engine eval CKPT --device cpu --dump-logits FILE`, and compares the logits.
    Prints the max |diff| and both accuracies; exit 0 when max |diff| <= --tol.

export-torch OUT.h5
    Trains the PyTorch model briefly and writes a checkpoint the engine accepts
    (`engine verify`, `engine eval`, `engine resume` all work on it).

    How the file is built: the engine first writes a *template* checkpoint by
    training with the same config, seed, epoch count and train_limit (so the step
    counters, scheduler state and group layout are exactly what a real run has),
    with a tiny validation/test split and early stopping off to keep it fast.  The
    template is copied and, with h5py, overwritten in place:

      from PyTorch
        /model/*                          all parameters and running statistics
        /model@bnN.num_batches_tracked    int64 attributes
        /optimizer/exp_avg/<p>, /optimizer/exp_avg_sq/<p>, /optimizer/step@<p>
        /trainer/epoch_sample_loss        per-sample losses of the last epoch
        /trainer@best_metric, @best_epoch, @epochs_without_improvement
                                          recomputed from the PyTorch validation
                                          metrics with the config's early-stopping rule
        /metrics/train_loss, val_loss, val_acc, epoch_seconds
      from the template (checked against what PyTorch did)
        /trainer@epoch, @global_step (must equal the PyTorch step count), @step_in_epoch,
        @epoch_shuffle_offset, @monitor; /scheduler (its per-epoch lr is the lr PyTorch
        used); /optimizer hyperparameters and lr; /scaler; /rng (the engine's stream
        counters, so a resumed run continues as an engine run would);
        /metrics/epoch, lr, loss_scale; /engine_version, /format, /format_version
      patched
        /created_utc    time of the export
        /config         the template's resolved config with data.val_split,
                        data.test_limit and train.early_stopping.patience put back to the
                        values of --config (or the documented defaults), and
                        checkpoint.dir set to the directory of OUT.h5
    Finally the user-block header is rewritten per section 1.1 of the spec (counting
    all of the payload as metadata, which is always right: h5py may have moved
    metadata) and the file is renamed over OUT.h5.

Run with /usr/bin/python3 (needs torch, h5py, numpy).
"""

import argparse
import datetime
import gzip
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

try:
    import numpy as np
except ImportError:  # reported by main(); `--help` still works
    np = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
DEFAULT_CONFIG = os.path.join(REPO, "configs", "mnist.json")

# Engine defaults for the config keys the template run overrides (docs/config.md).
CONFIG_DEFAULTS = {
    ("data", "val_split"): 5000,
    ("data", "test_limit"): None,
    ("train", "early_stopping", "patience"): 5,
}

USERBLOCK = 512
MAGIC = b"ENGINE-CHECKPOINT\n"
SUPPORTED_FORMAT_VERSION = 4


# ---------------------------------------------------------------------------------------
# Lazy imports: torch and h5py are heavy and `--help` should not need them.

def _torch():
    import torch
    torch.set_num_threads(int(os.environ.get("TORCH_INTEROP_THREADS", "2")))
    return torch


def _h5py():
    import h5py
    return h5py


def default_engine():
    env = os.environ.get("ENGINE_BIN")
    if env:
        return env
    return os.path.join(REPO, "build", "engine")


# ---------------------------------------------------------------------------------------
# The model.

def make_model(dropout=0.25):
    """The PyTorch module equivalent to include/engine/nn/models/fashion_cnn.h (same state_dict keys); the
    benchmarks in tools/bench/ use it too. Leaves torch's thread count alone."""
    import torch
    nn = torch.nn

    class FashionCnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(32)
            self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
            self.bn2 = nn.BatchNorm2d(64)
            self.fc1 = nn.Linear(3136, 128)
            self.fc2 = nn.Linear(128, 10)
            self.pool = nn.MaxPool2d(2)
            self.relu = nn.ReLU()
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            x = self.pool(self.relu(self.bn1(self.conv1(x))))
            x = self.pool(self.relu(self.bn2(self.conv2(x))))
            x = torch.flatten(x, 1)
            x = self.dropout(self.relu(self.fc1(x)))
            return self.fc2(x)

    return FashionCnn()


# ---------------------------------------------------------------------------------------
# Data (IDX files, plain or gzipped).

def _open_idx(data_dir, name):
    for candidate in (name + ".gz", name):
        path = os.path.join(data_dir, candidate)
        if os.path.exists(path):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(path, "rb") as fh:
                return path, fh.read()
    raise FileNotFoundError("%s: neither %s nor %s.gz exists" % (data_dir, name, name))


def read_idx_images(data_dir, name):
    path, raw = _open_idx(data_dir, name)
    magic, count, rows, cols = struct.unpack(">IIII", raw[:16])
    if magic != 0x803:
        raise ValueError("%s: bad IDX image magic %#x" % (path, magic))
    data = np.frombuffer(raw, dtype=np.uint8, count=count * rows * cols, offset=16)
    return data.reshape(count, rows, cols)


def read_idx_labels(data_dir, name):
    path, raw = _open_idx(data_dir, name)
    magic, count = struct.unpack(">II", raw[:8])
    if magic != 0x801:
        raise ValueError("%s: bad IDX label magic %#x" % (path, magic))
    return np.frombuffer(raw, dtype=np.uint8, count=count, offset=8).copy()


def normalize(images_u8, mean, std):
    """As the engine's gather_batch: (byte * (1/255) - mean) * (1/std), in float32."""
    x = images_u8.astype(np.float32) * np.float32(1.0 / 255.0)
    x = (x - np.float32(mean)) * np.float32(1.0 / np.float32(std))
    return x.reshape(-1, 1, 28, 28)


def predict(model, x, batch=500):
    torch = _torch()
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out.append(model(torch.from_numpy(np.ascontiguousarray(x[i:i + batch]))).numpy())
    return np.concatenate(out) if out else np.zeros((0, 10), np.float32)


def loss_and_accuracy(logits, labels):
    """Mean cross-entropy (float64) and accuracy as a fraction, like the engine."""
    if len(labels) == 0:
        return float("nan"), float("nan")
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = float(-logp[np.arange(len(labels)), labels].mean())
    acc = float((logits.argmax(axis=1) == labels).mean())
    return loss, acc


# ---------------------------------------------------------------------------------------
# The integrity header (docs/checkpoint-format.md, section 1.1).

def check_header(path):
    """Integrity check as in section 1.1; returns the header fields."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:len(MAGIC)] != MAGIC:
        raise ValueError("%s: not an engine checkpoint (bad magic)" % path)
    if len(data) < USERBLOCK:
        raise ValueError("%s: truncated (shorter than the header)" % path)
    text = data[:USERBLOCK].split(b"\0", 1)[0]
    if data[len(text):USERBLOCK].strip(b"\0"):
        raise ValueError("%s: corrupt header padding" % path)
    if not text.endswith(b"\n"):
        raise ValueError("%s: header text is not terminated" % path)
    lines = text.decode("ascii").splitlines(keepends=True)
    key, value = lines[-1].split()
    if key != "header_crc32" or int(value, 16) != zlib.crc32("".join(lines[:-1]).encode()):
        raise ValueError("%s: header checksum mismatch" % path)
    fields = dict(line.split(" ", 1) for line in (l.rstrip("\n") for l in lines[1:-1]))
    if int(fields["format_version"]) > SUPPORTED_FORMAT_VERSION:
        raise ValueError("%s: format_version %s is newer than supported" % (path, fields["format_version"]))
    if int(fields["userblock_bytes"]) != USERBLOCK:
        raise ValueError("%s: userblock_bytes must be %d" % (path, USERBLOCK))
    payload = data[USERBLOCK:]
    if len(payload) != int(fields["payload_bytes"]):
        raise ValueError("%s: %d payload bytes, the header records %s"
                         % (path, len(payload), fields["payload_bytes"]))
    if zlib.crc32(payload) != int(fields["payload_crc32"], 16):
        raise ValueError("%s: payload checksum mismatch" % path)
    if int(fields["format_version"]) >= 2:
        metadata = int(fields["metadata_bytes"])
        if metadata > len(payload) or zlib.crc32(payload[:metadata]) != int(fields["metadata_crc32"], 16):
            raise ValueError("%s: metadata checksum mismatch" % path)
    return fields


def make_header(payload, format_version):
    """The 512-byte user block for a payload, as the engine's seal() writes it, with all
    of the payload counted as metadata (version 2's metadata_bytes)."""
    text = MAGIC.decode("ascii")
    text += "format_version %d\n" % format_version
    text += "userblock_bytes %d\n" % USERBLOCK
    text += "payload_bytes %d\n" % len(payload)
    if format_version >= 2:
        text += "metadata_bytes %d\n" % len(payload)
        text += "metadata_crc32 %08x\n" % zlib.crc32(payload)
    text += "payload_crc32 %08x\n" % zlib.crc32(payload)
    text += "header_crc32 %08x\n" % zlib.crc32(text.encode("ascii"))
    block = text.encode("ascii")
    if len(block) >= USERBLOCK:
        raise ValueError("header text does not fit the user block")
    return block + b"\0" * (USERBLOCK - len(block))


def reseal(path, format_version):
    """Recomputes the header of a checkpoint whose HDF5 payload was modified in place."""
    with open(path, "r+b") as fh:
        data = fh.read()
        if data[:len(MAGIC)] != MAGIC or len(data) < USERBLOCK:
            raise ValueError("%s: no engine header to reseal" % path)
        if data[USERBLOCK:USERBLOCK + 8] != b"\x89HDF\r\n\x1a\n":
            raise ValueError("%s: the HDF5 superblock is not at offset %d" % (path, USERBLOCK))
        fh.seek(0)
        fh.write(make_header(data[USERBLOCK:], format_version))
        fh.flush()
        os.fsync(fh.fileno())


# ---------------------------------------------------------------------------------------
# Reading /model into PyTorch.

def load_model_state(path):
    """(state_dict for torch, resolved config dict) from an engine checkpoint."""
    torch = _torch()
    h5py = _h5py()
    state = {}
    with h5py.File(path, "r") as f:
        config = json.loads(f.attrs["config"])
        g = f["model"]
        for name, obj in g.items():
            if not isinstance(obj, h5py.Dataset):
                raise ValueError("%s: /model/%s is a group; fashion_cnn has no nested keys" % (path, name))
            if obj.dtype != np.float32:
                raise ValueError("%s: /model/%s has dtype %s, expected float32" % (path, name, obj.dtype))
            state[name] = torch.from_numpy(np.array(obj[()], dtype=np.float32))
        for name, value in g.attrs.items():
            if not isinstance(value, (np.integer, int)):
                raise ValueError("%s: /model attribute %s is %r, expected an int64 scalar"
                                 % (path, name, type(value)))
            state[name] = torch.tensor(int(value), dtype=torch.int64)
    return state, config


def load_strict(model, state, path):
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = ["%s %s vs %s" % (k, tuple(state[k].shape), tuple(expected[k].shape))
             for k in sorted(set(state) & set(expected)) if tuple(state[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or wrong:
        raise ValueError("%s: /model does not match fashion_cnn: missing %s, unexpected %s, shape %s"
                         % (path, missing, unexpected, wrong))
    model.load_state_dict(state, strict=True)


# ---------------------------------------------------------------------------------------
# compare

def run(cmd, what):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        sys.stderr.write("$ %s\n%s" % (" ".join(cmd), proc.stdout))
        raise RuntimeError("%s failed with exit code %d" % (what, proc.returncode))
    return proc.stdout


def cmd_compare(args):
    _torch()  # sets the thread count
    check_header(args.ckpt)
    state, config = load_model_state(args.ckpt)
    model = make_model(config["model"]["dropout"])
    load_strict(model, state, args.ckpt)
    model.eval()

    images = read_idx_images(args.data_dir, "t10k-images-idx3-ubyte")
    labels = read_idx_labels(args.data_dir, "t10k-labels-idx1-ubyte")
    n = len(labels) if args.limit is None else min(args.limit, len(labels))
    images, labels = images[:n], labels[:n].astype(np.int64)
    mean, std = config["data"]["mean"], config["data"]["std"]
    torch_logits = predict(model, normalize(images, mean, std))

    with tempfile.TemporaryDirectory(prefix="torch_interop.") as tmp:
        dump = os.path.join(tmp, "logits.f32")
        cmd = [args.engine, "eval", args.ckpt, "--device", "cpu", "--data-dir", args.data_dir,
               "--dump-logits", dump, "--limit", str(n)]
        out = run(cmd, "engine eval")
        engine_logits = np.fromfile(dump, dtype="<f4")
    if engine_logits.size != n * 10:
        print("engine wrote %d floats, expected %d x 10" % (engine_logits.size, n))
        return 1
    engine_logits = engine_logits.reshape(n, 10)

    diff = np.abs(engine_logits.astype(np.float64) - torch_logits.astype(np.float64))
    max_diff = float(diff.max()) if n else 0.0
    t_loss, t_acc = loss_and_accuracy(torch_logits, labels)
    e_loss, e_acc = loss_and_accuracy(engine_logits, labels)
    agree = int((engine_logits.argmax(1) == torch_logits.argmax(1)).sum())
    engine_line = next((l.strip() for l in out.splitlines() if l.startswith("test:")), "")
    print("checkpoint      %s" % args.ckpt)
    print("test images     %d (%s)" % (n, args.data_dir))
    print("engine          %s" % engine_line)
    print("pytorch         loss %.4f  accuracy %.2f%%" % (t_loss, 100 * t_acc))
    print("engine logits   loss %.4f  accuracy %.2f%%" % (e_loss, 100 * e_acc))
    print("argmax agree    %d / %d" % (agree, n))
    print("max |diff|      %.3g (tolerance %.3g)" % (max_diff, args.tol))
    ok = max_diff <= args.tol
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------
# export-torch

def _get(d, keys, default):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return default
        d = d[k]
    return d


def _set(d, keys, value):
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value


def _modify(attrs, name, value):
    if name not in attrs:
        raise KeyError("template lacks attribute %s" % name)
    attrs.modify(name, value)


def _write_dataset(group, name, value):
    ds = group[name]
    value = np.asarray(value)
    if tuple(ds.shape) != tuple(value.shape):
        raise ValueError("%s: template shape %s, new %s" % (ds.name, ds.shape, value.shape))
    ds[...] = value.astype(ds.dtype)


def make_template(args, tmp, seed, val_small, test_small):
    run_dir = os.path.join(tmp, "template")
    cmd = [args.engine, "train", args.config, "--device", "cpu", "--run-dir", run_dir, "--fresh",
           "--set", "train.epochs=%d" % args.epochs,
           "--set", "data.train_limit=%d" % args.train_limit,
           "--set", "data.val_split=%d" % val_small,
           "--set", "data.test_limit=%d" % test_small,
           "--set", "train.early_stopping.patience=0",
           "--set", "seed=%d" % seed]
    if args.data_dir:
        cmd += ["--set", "data.dir=%s" % args.data_dir]
    print("template: %s" % " ".join(cmd))
    run(cmd, "engine train (template)")
    return os.path.join(run_dir, "last.h5")


def cmd_export(args):
    torch = _torch()
    h5py = _h5py()
    F = torch.nn.functional
    with open(args.config) as fh:
        user_config = json.load(fh)
    seed = args.seed if args.seed is not None else int(_get(user_config, ["seed"], 0))
    out_path = os.path.abspath(args.out)
    out_dir = os.path.dirname(out_path)
    os.makedirs(out_dir, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix=".torch_interop.", dir=out_dir) as tmp:
        template = make_template(args, tmp, seed, val_small=128, test_small=128)
        check_header(template)
        with h5py.File(template, "r") as f:
            config = json.loads(f.attrs["config"])
            sched = dict(f["scheduler"].attrs)
            template_lr = np.array(f["metrics/lr"][()])
            template_epoch = int(f["trainer"].attrs["epoch"])
            template_steps = int(f["trainer"].attrs["global_step"])
            monitor = f["trainer"].attrs["monitor"]
            format_version = int(f.attrs["format_version"])
        if format_version != SUPPORTED_FORMAT_VERSION:
            raise RuntimeError("template has format_version %d; this tool writes version %d"
                               % (format_version, SUPPORTED_FORMAT_VERSION))
        if template_epoch != args.epochs:
            raise RuntimeError("template stopped at epoch %d, expected %d" % (template_epoch, args.epochs))

        # The config stored in the result: the user's values for the keys the template
        # run overrode for speed, the output's directory as the run directory.
        for keys, default in CONFIG_DEFAULTS.items():
            _set(config, list(keys), _get(user_config, list(keys), default))
        config["checkpoint"]["dir"] = out_dir
        data = config["data"]
        if data["val_split"] >= 60000:
            raise RuntimeError("data.val_split must be smaller than the 60000 training images")

        # ---- data
        images = read_idx_images(data["dir"], "train-images-idx3-ubyte")
        labels = read_idx_labels(data["dir"], "train-labels-idx1-ubyte").astype(np.int64)
        train_total = len(labels) - data["val_split"]
        n = min(args.train_limit, train_total)
        x_train = torch.from_numpy(normalize(images[:n], data["mean"], data["std"]))
        y_train = torch.from_numpy(labels[:n])
        x_val = normalize(images[train_total:], data["mean"], data["std"])
        y_val = labels[train_total:]

        # ---- model and optimizer, hyperparameters from the resolved config
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = make_model(config["model"]["dropout"])
        opt_cfg = config["optimizer"]
        opt_cls = torch.optim.AdamW if opt_cfg["name"] == "adamw" else torch.optim.Adam
        optimizer = opt_cls(model.parameters(), lr=opt_cfg["lr"], betas=tuple(opt_cfg["betas"]),
                            eps=opt_cfg["eps"], weight_decay=opt_cfg["weight_decay"])
        batch = data["batch_size"]

        def schedule_lr(epoch):  # engine LrScheduler::lr() with last_epoch = epoch
            if sched["name"] == "constant":
                return float(sched["base_lr"])
            return float(sched["eta_min"] + (sched["base_lr"] - sched["eta_min"]) *
                         (1.0 + math.cos(math.pi * epoch / sched["t_max"])) / 2.0)

        es = config["train"]["early_stopping"]
        lower = monitor == "val_loss"
        best = math.inf if lower else -math.inf
        best_epoch, without = 0, 0
        history = {"train_loss": [], "val_loss": [], "val_acc": [], "epoch_seconds": []}
        steps = 0
        sample_loss = np.zeros(n, np.float32)
        for epoch in range(args.epochs):
            lr = schedule_lr(epoch)
            if abs(lr - template_lr[epoch]) > 1e-12 * max(1.0, abs(lr)):
                raise RuntimeError("lr of epoch %d: %g here, %g in the template" % (epoch + 1, lr, template_lr[epoch]))
            for group in optimizer.param_groups:
                group["lr"] = lr
            model.train()
            t0 = time.monotonic()
            perm = torch.randperm(n, generator=gen)
            for start in range(0, n, batch):
                idx = perm[start:start + batch]
                logits = model(x_train[idx])
                losses = F.cross_entropy(logits, y_train[idx], reduction="none")
                optimizer.zero_grad(set_to_none=True)
                losses.mean().backward()
                optimizer.step()
                sample_loss[start:start + len(idx)] = losses.detach().numpy()
                steps += 1
            seconds = time.monotonic() - t0
            val_loss, val_acc = loss_and_accuracy(predict(model, x_val), y_val)
            train_loss = float(sample_loss.astype(np.float64).sum() / n)
            for k, v in (("train_loss", train_loss), ("val_loss", val_loss),
                         ("val_acc", val_acc), ("epoch_seconds", seconds)):
                history[k].append(v)
            value = val_loss if monitor == "val_loss" else val_acc
            improved = value < best - es["min_delta"] if lower else value > best + es["min_delta"]
            if improved:
                best, best_epoch, without = value, epoch + 1, 0
            else:
                without += 1
            print("pytorch epoch %d/%d  train_loss %.4f  val_loss %.4f  val_acc %.2f%%  lr %g  %.1fs"
                  % (epoch + 1, args.epochs, train_loss, val_loss, 100 * val_acc, lr, seconds))
        if steps != template_steps:
            raise RuntimeError("PyTorch took %d steps, the template %d" % (steps, template_steps))

        # ---- write into a copy of the template, then reseal and rename over OUT
        work = os.path.join(out_dir, ".%s.tmp.%d" % (os.path.basename(out_path), os.getpid()))
        shutil.copyfile(template, work)
        try:
            with h5py.File(work, "r+") as f:
                if f.userblock_size != USERBLOCK:
                    raise RuntimeError("template user block is %d bytes" % f.userblock_size)
                sd = model.state_dict()
                g = f["model"]
                stored = set(g.keys()) | set(g.attrs.keys())
                if stored != set(sd):
                    raise RuntimeError("template /model keys %s differ from PyTorch's %s"
                                       % (sorted(stored ^ set(sd)), ""))
                for name, t in sd.items():
                    if name.endswith("num_batches_tracked"):
                        _modify(g.attrs, name, np.int64(int(t)))
                    else:
                        _write_dataset(g, name, t.detach().numpy())
                o = f["optimizer"]
                names = dict(model.named_parameters())
                if set(o["exp_avg"].keys()) != set(names) or set(o["step"].attrs.keys()) != set(names):
                    raise RuntimeError("template /optimizer parameters differ from PyTorch's")
                for name, p in names.items():
                    st = optimizer.state[p]
                    _write_dataset(o["exp_avg"], name, st["exp_avg"].numpy())
                    _write_dataset(o["exp_avg_sq"], name, st["exp_avg_sq"].numpy())
                    _modify(o["step"].attrs, name, np.int64(int(st["step"])))
                t = f["trainer"]
                _write_dataset(t, "epoch_sample_loss", sample_loss)
                _modify(t.attrs, "best_metric", np.float64(best))
                _modify(t.attrs, "best_epoch", np.int64(best_epoch))
                _modify(t.attrs, "epochs_without_improvement", np.int64(without))
                m = f["metrics"]
                for k, v in history.items():
                    _write_dataset(m, k, np.array(v, dtype=np.float64))
                created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                _modify(f.attrs, "created_utc", created)
                _modify(f.attrs, "config", json.dumps(config, sort_keys=True, separators=(",", ":")))
                _modify(f.attrs, "saved_on", "cpu")
                # The digest of this state (docs/checkpoint-format.md, section 6), which
                # `engine verify` recomputes from the tensors written above.
                _modify(t.attrs, "step_digest", "%016x" % step_digest_of(f))
            reseal(work, format_version)
            check_header(work)
            os.replace(work, out_path)
        finally:
            if os.path.exists(work):
                os.unlink(work)
    print("wrote %s (epoch %d, %d steps, seed %d, %d training images; last val_acc %.2f%%)"
          % (out_path, args.epochs, steps, seed, n, 100 * history["val_acc"][-1]))
    return 0


def step_digest_of(f):
    """The step digest of an open checkpoint, as tools/check_step_digest.py computes it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import check_step_digest
    return check_step_digest.compute(f)[1]


# ---------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compare", help="compare engine and PyTorch logits of a checkpoint")
    p.add_argument("ckpt", metavar="CKPT.h5")
    p.add_argument("--engine", default=default_engine(), help="engine binary (default $ENGINE_BIN or build/engine)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="Fashion-MNIST IDX directory (default %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N test images")
    p.add_argument("--tol", type=float, default=1e-4, help="max |logit diff| allowed (default %(default)g)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("export-torch", help="train with PyTorch and write an engine checkpoint")
    p.add_argument("out", metavar="OUT.h5")
    p.add_argument("--epochs", type=int, default=1, help="epochs to train (default %(default)s)")
    p.add_argument("--train-limit", type=int, default=1024, help="train on the first N images (default %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: the config's)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="engine config JSON (default configs/mnist.json)")
    p.add_argument("--data-dir", default=None, help="dataset directory (default: the config's data.dir)")
    p.add_argument("--engine", default=default_engine(), help="engine binary (default $ENGINE_BIN or build/engine)")
    p.set_defaults(func=cmd_export)

    args = parser.parse_args(argv)
    if getattr(args, "limit", None) is not None and args.limit < 1:
        parser.error("--limit must be >= 1")
    if args.command == "export-torch" and (args.epochs < 1 or args.train_limit < 1):
        parser.error("--epochs and --train-limit must be >= 1")
    if np is None:
        print("torch_interop: needs numpy, torch and h5py (run it with /usr/bin/python3)", file=sys.stderr)
        return 1
    try:
        return args.func(args)
    except (RuntimeError, ValueError, OSError, KeyError) as e:
        print("torch_interop: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
