#!/usr/bin/env python3
"""TensorBoard event files of a run, read back with the tensorboard package
(run by CTest as py_test_tensorboard).

Trains 2 of 4 epochs through the CLI, stops, resumes to the end, and reads
RUN_DIR/tensorboard with tensorboard's own EventAccumulator: one event file; the tags
train_loss, val_loss, val_acc, lr, loss_scale, epoch_seconds at steps 1..4, each step
exactly once (the resume neither duplicates nor loses an epoch), with the values of
metrics.jsonl; test_loss and test_acc at the last step. logging.tensorboard=false
writes no event file.

Environment: ENGINE_BIN, ENGINE_SOURCE_DIR, ENGINE_TEST_TMP (set by tests/CMakeLists.txt).
Exit 77 (skipped) only when the tensorboard module or the dataset is missing; CI
installs tensorboard so that this test runs.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
DATA_DIR = os.environ.get("ENGINE_DATA_DIR", "/usr/share/datasets/fashion-mnist")

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:  # pragma: no cover - depends on the machine
    print("skipped: %s (pip install tensorboard)" % e)
    sys.exit(SKIP)

if not os.path.isdir(DATA_DIR):
    print("skipped: dataset directory %s is missing" % DATA_DIR)
    sys.exit(SKIP)

SOURCE = os.environ.get("ENGINE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.environ.get("ENGINE_BIN") or os.path.join(SOURCE, "build", "engine")
EPOCH_TAGS = ["train_loss", "val_loss", "val_acc", "lr", "loss_scale", "epoch_seconds"]
TEST_TAGS = {"test_loss": "test_loss", "test_acc": "test_acc"}


def fail(msg, output=None):
    if output:
        print(output.rstrip())
    print("FAIL: %s" % msg)
    sys.exit(1)


def run(cmd, what):
    print("$ %s" % " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="2"))
    print("  (exit %d, %.1fs)" % (proc.returncode, time.monotonic() - t0))
    if proc.returncode != 0:
        fail("%s exited %d" % (what, proc.returncode), proc.stdout)
    return proc.stdout


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def train_cmd(run_dir, *extra):
    return [ENGINE, "train", os.path.join(SOURCE, "configs", "mnist.json"), "--device", "cpu",
            "--run-dir", run_dir, "--set", "data.dir=%s" % DATA_DIR, "--set", "train.epochs=4",
            "--set", "train.early_stopping.patience=0", "--set", "data.train_limit=256",
            "--set", "data.val_split=128", "--set", "data.test_limit=256",
            "--set", "data.batch_size=64", "--set", "checkpoint.every_n_epochs=null"] + list(extra)


def accumulate(run_dir):
    files = glob.glob(os.path.join(run_dir, "tensorboard", "*"))
    names = [os.path.basename(f) for f in files]
    if len(files) != 1 or not names[0].startswith("events.out.tfevents."):
        fail("expected exactly one event file in %s/tensorboard, found %r" % (run_dir, names))
    ea = EventAccumulator(os.path.join(run_dir, "tensorboard"), size_guidance={"scalars": 0})
    ea.Reload()
    return ea, files[0]


def main():
    if not os.path.exists(ENGINE):
        fail("engine binary %s does not exist" % ENGINE)
    base = os.environ.get("ENGINE_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="tensorboard.", dir=base)
    try:
        run_dir = os.path.join(tmp, "run")
        run(train_cmd(run_dir, "--stop-after-epochs", "2"), "engine train (first 2 epochs)")
        ea, first_file = accumulate(run_dir)
        steps = [e.step for e in ea.Scalars("train_loss")]
        if steps != [1, 2]:
            fail("after 2 epochs the event file holds train_loss steps %r" % steps)
        out = run(train_cmd(run_dir), "engine train (resumed)")
        if "resuming from epoch 2" not in out:
            fail("the second train did not resume from epoch 2", out)

        ea, path = accumulate(run_dir)
        if path != first_file:
            fail("the resumed run wrote %s instead of continuing %s" % (path, first_file))
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            lines = [json.loads(l) for l in fh if l.strip()]
        epochs = [l for l in lines if "epoch" in l]
        test = [l for l in lines if "test_acc" in l]
        if len(epochs) != 4 or len(test) != 1:
            fail("metrics.jsonl has %d epochs and %d test lines" % (len(epochs), len(test)))
        tags = set(ea.Tags()["scalars"])
        if tags != set(EPOCH_TAGS) | set(TEST_TAGS):
            fail("scalar tags %r" % sorted(tags))
        for tag in EPOCH_TAGS:
            events = ea.Scalars(tag)
            if [e.step for e in events] != [1, 2, 3, 4]:
                fail("%s: steps %r, expected each of 1..4 once" % (tag, [e.step for e in events]))
            for e, m in zip(events, epochs):
                if e.value != f32(m[tag]):
                    fail("%s at step %d: %r in the event file, %r in metrics.jsonl" % (tag, e.step, e.value, m[tag]))
            walls = [e.wall_time for e in events]
            if walls != sorted(walls):
                fail("%s: wall times go backwards: %r" % (tag, walls))
        for tag, key in TEST_TAGS.items():
            events = ea.Scalars(tag)
            if [e.step for e in events] != [4] or events[0].value != f32(test[0][key]):
                fail("%s: %r, expected %r at step 4" % (tag, [(e.step, e.value) for e in events], test[0][key]))
        print("  %s: %d tags, steps 1..4 once each, values equal metrics.jsonl" % (os.path.basename(path), len(tags)))

        off = os.path.join(tmp, "off")
        run(train_cmd(off, "--set", "logging.tensorboard=false", "--set", "train.epochs=1"),
            "engine train (logging.tensorboard=false)")
        if os.path.exists(os.path.join(off, "tensorboard")):
            fail("logging.tensorboard=false still wrote %s/tensorboard" % off)
        print("OK")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
