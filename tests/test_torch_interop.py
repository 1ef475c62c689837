#!/usr/bin/env python3
"""PyTorch interop test (run by CTest as py_test_torch_interop).

(a) an engine-trained checkpoint loads strictly into the equivalent PyTorch module and
    gives the same test logits (tools/torch_interop.py compare, max |diff| <= 1e-4);
(b) a PyTorch-trained checkpoint written by `torch_interop.py export-torch` passes
    `engine verify`, `engine eval` (logits equal PyTorch's, accuracy the same) and
    `engine resume` for one more epoch;
(c) with h5py the string attributes read as `str`, the integrity headers check out
    (docs/checkpoint-format.md section 1.1) and `h5dump -H` reads both files.

Environment: ENGINE_BIN, ENGINE_SOURCE_DIR, ENGINE_TEST_TMP (set by tests/CMakeLists.txt).
Exit 77 (skipped) when torch, h5py or numpy is missing or the dataset is absent.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
DATA_DIR = "/usr/share/datasets/fashion-mnist"

try:
    import numpy as np  # noqa: F401
    import h5py
    import torch
except ImportError as e:  # pragma: no cover - depends on the machine
    print("skipped: %s" % e)
    sys.exit(SKIP)

if not os.path.isdir(DATA_DIR):
    print("skipped: dataset directory %s is missing" % DATA_DIR)
    sys.exit(SKIP)

SOURCE = os.environ.get("ENGINE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.environ.get("ENGINE_BIN") or os.path.join(SOURCE, "build", "engine")
TOOL = os.path.join(SOURCE, "tools", "torch_interop.py")
sys.path.insert(0, os.path.join(SOURCE, "tools"))
import torch_interop  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="2", TORCH_INTEROP_THREADS="2", ENGINE_BIN=ENGINE)
START = time.monotonic()


def fail(msg, output=None):
    if output:
        print(output.rstrip())
    print("FAIL: %s" % msg)
    sys.exit(1)


def run(cmd, what, expect_rc=0):
    print("$ %s" % " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    print("  (exit %d, %.1fs)" % (proc.returncode, time.monotonic() - t0))
    if expect_rc is None:
        if proc.returncode == 0:
            fail("%s exited 0, expected a failure" % what, proc.stdout)
    elif proc.returncode != expect_rc:
        fail("%s exited %d, expected %d" % (what, proc.returncode, expect_rc), proc.stdout)
    return proc.stdout


def parse_compare(out):
    diff = re.search(r"^max \|diff\|\s+(\S+)", out, re.M)
    torch_acc = re.search(r"^pytorch\s+loss \S+\s+accuracy ([0-9.]+)%", out, re.M)
    if not diff or not torch_acc:
        fail("cannot parse the compare output", out)
    return float(diff.group(1)), float(torch_acc.group(1))


def check_strings(path):
    """String attributes come back as str from h5py (variable-length UTF-8)."""
    with h5py.File(path, "r") as f:
        wanted = [(f, "format"), (f, "saved_on"), (f, "created_utc"), (f, "engine_version"),
                  (f, "config"), (f["optimizer"], "name"), (f["scheduler"], "name"),
                  (f["rng"], "algorithm"), (f["trainer"], "monitor")]
        wanted += [(ds, "kind") for ds in f["metrics"].values()]
        for obj, name in wanted:
            value = obj.attrs[name]
            if not isinstance(value, str):
                fail("%s: attribute %s of %s reads as %r, expected str" % (path, name, obj.name, type(value)))
        if f.attrs["format"] != "engine-checkpoint":
            fail("%s: /format is %r" % (path, f.attrs["format"]))
        json.loads(f.attrs["config"])
    try:
        torch_interop.check_header(path)
    except ValueError as e:
        fail("integrity header: %s" % e)
    print("  %s: string attributes are str, header and payload CRC-32 ok" % path)


def check_h5dump(path):
    if not os.path.exists("/usr/bin/h5dump"):
        print("  (no /usr/bin/h5dump; structure dump not checked)")
        return
    run(["/usr/bin/h5dump", "-H", path], "h5dump -H")


def main():
    if not os.path.exists(ENGINE):
        fail("engine binary %s does not exist" % ENGINE)
    base = os.environ.get("ENGINE_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="torch_interop.", dir=base)
    py = sys.executable
    try:
        # (a) engine -> PyTorch
        print("== (a) engine checkpoint into PyTorch")
        run_dir = os.path.join(tmp, "engine_run")
        run([ENGINE, "train", os.path.join(SOURCE, "configs", "mnist.json"), "--device", "cpu",
             "--run-dir", run_dir, "--set", "train.epochs=1", "--set", "data.train_limit=1024",
             "--set", "data.val_split=512", "--set", "data.test_limit=1000"], "engine train")
        engine_ckpt = os.path.join(run_dir, "last.h5")
        out = run([py, TOOL, "compare", engine_ckpt, "--engine", ENGINE, "--data-dir", DATA_DIR,
                   "--limit", "1000", "--tol", "1e-4"], "compare (engine checkpoint)")
        print(out.rstrip())
        diff, _ = parse_compare(out)
        if not diff <= 1e-4:
            fail("max |diff| %g > 1e-4" % diff, out)

        # (b) PyTorch -> engine
        print("== (b) PyTorch-trained checkpoint into the engine")
        config = os.path.join(tmp, "small.json")
        with open(config, "w") as fh:  # small splits keep eval and resume fast
            json.dump({"data": {"val_split": 512, "test_limit": 1000}}, fh)
        exported = os.path.join(tmp, "export", "torch.h5")
        out = run([py, TOOL, "export-torch", exported, "--epochs", "1", "--train-limit", "512",
                   "--seed", "3", "--config", config, "--engine", ENGINE, "--data-dir", DATA_DIR],
                  "export-torch")
        print(out.rstrip())
        run([ENGINE, "verify", exported], "engine verify")
        out = run([py, TOOL, "compare", exported, "--engine", ENGINE, "--data-dir", DATA_DIR,
                   "--limit", "1000", "--tol", "1e-4"], "compare (exported checkpoint)")
        print(out.rstrip())
        diff_exported, torch_acc = parse_compare(out)
        if not diff_exported <= 1e-4:
            fail("max |diff| %g > 1e-4 on the exported checkpoint" % diff_exported, out)
        out = run([ENGINE, "eval", exported, "--device", "cpu"], "engine eval")
        m = re.search(r"^test: loss \S+\s+accuracy ([0-9.]+)% \((\d+) images\)", out, re.M)
        if not m or int(m.group(2)) != 1000:
            fail("engine eval did not report 1000 test images (the stored config's test_limit)", out)
        if abs(float(m.group(1)) - torch_acc) > 0.2:
            fail("engine accuracy %s%% vs PyTorch %.2f%%" % (m.group(1), torch_acc), out)
        print("  engine eval accuracy %s%%, PyTorch %.2f%%" % (m.group(1), torch_acc))
        with h5py.File(exported, "r") as f:
            steps = {int(v) for v in f["optimizer/step"].attrs.values()}
            counters = (int(f["trainer"].attrs["global_step"]), int(f["model"].attrs["bn1.num_batches_tracked"]),
                        int(f["model"].attrs["bn2.num_batches_tracked"]))
        if steps != {4} or counters != (4, 4, 4):  # 512 images / batch 128
            fail("exported step counters %s %s, expected 4 everywhere" % (steps, counters))
        resume_dir = os.path.join(tmp, "resumed")
        out = run([ENGINE, "resume", exported, "--device", "cpu", "--run-dir", resume_dir,
                   "--set", "train.epochs=2"], "engine resume")
        print(out.rstrip())
        if "resuming from epoch 1" not in out or "epoch 2/2" not in out:
            fail("resume did not continue from epoch 1 to epoch 2", out)
        with h5py.File(os.path.join(resume_dir, "last.h5"), "r") as f:
            if int(f["trainer"].attrs["epoch"]) != 2 or int(f["trainer"].attrs["global_step"]) != 8:
                fail("resumed checkpoint is not at epoch 2, step 8")

        # The header really guards the payload: a change made with h5py and not resealed
        # is refused; resealed with the tool's reseal(), its tensors no longer give the
        # step digest the file carries, and it is refused for that; with the digest
        # written again too (as export-torch does), it is accepted.
        tampered = os.path.join(tmp, "export", "tampered.h5")
        shutil.copyfile(exported, tampered)
        with h5py.File(tampered, "r+") as f:
            f["model/fc2.bias"][0] += 1.0
        out = run([ENGINE, "verify", tampered], "engine verify (tampered, not resealed)", expect_rc=None)
        if "checksum mismatch" not in out:
            fail("engine verify accepted a payload changed behind the header's back", out)
        torch_interop.reseal(tampered, torch_interop.SUPPORTED_FORMAT_VERSION)
        out = run([ENGINE, "verify", tampered], "engine verify (tampered, resealed)", expect_rc=None)
        if "its tensors give step digest" not in out:
            fail("engine verify accepted tensors that do not give the file's step digest", out)
        with h5py.File(tampered, "r+") as f:
            f["trainer"].attrs.modify("step_digest", "%016x" % torch_interop.step_digest_of(f))
        torch_interop.reseal(tampered, torch_interop.SUPPORTED_FORMAT_VERSION)
        run([ENGINE, "verify", tampered], "engine verify (tampered, resealed with its digest)")

        # (c) h5py and h5dump view of both files
        print("== (c) h5py strings, integrity headers, h5dump")
        for path in (engine_ckpt, exported):
            check_strings(path)
            check_h5dump(path)
        print("PASS (%.1fs): max |diff| engine ckpt %.3g, exported ckpt %.3g"
              % (time.monotonic() - START, diff, diff_exported))
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
