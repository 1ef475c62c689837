"""What the export consumer tests share (tests/test_export_onnxruntime.py,
tests/test_export_torch.py; docs/export.md): a short engine run, `engine eval`'s logits
of its 10,000 test images, those images normalised as the export's metadata says, and
the tolerance of docs/export.md per image and logit, computed the way the engine computes
it for the probes (engine/train/export_error_bounds.cpp), here in PyTorch.

Environment: ENGINE_BIN, ENGINE_SOURCE_DIR, ENGINE_TEST_TMP (set by tests/CMakeLists.txt).
"""

import base64
import json
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
DATA_DIR = "/usr/share/datasets/fashion-mnist"
SOURCE = os.environ.get("ENGINE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.environ.get("ENGINE_BIN") or os.path.join(SOURCE, "build", "engine")
sys.path.insert(0, os.path.join(SOURCE, "tools"))

U = 2.0 ** -24          # float32's unit roundoff
BATCHNORM_ULPS = 8      # engine/train/export_error_bounds.cpp, kBatchNormUlps
MAGNITUDE_MARGIN = 1.001


def skip(reason):
    print("skipped: " + reason)
    sys.exit(SKIP)


def run(args):
    proc = subprocess.run([ENGINE] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError("engine %s: exit %d\n%s" % (" ".join(args), proc.returncode, proc.stdout))
    return proc.stdout


def workdir(name):
    base = os.environ.get("ENGINE_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=name + ".", dir=base)


def short_run(tmp):
    """best.h5 of a short fashion_cnn run: 384 training images, 1 epoch."""
    run_dir = os.path.join(tmp, "run")
    run(["train", os.path.join(SOURCE, "configs", "mnist.json"), "--device", "cpu", "--run-dir", run_dir,
         "--set", "train.epochs=1", "--set", "data.train_limit=384", "--set", "data.val_split=128",
         "--set", "data.dir=" + DATA_DIR])
    return os.path.join(run_dir, "best.h5")


def export(ckpt, fmt, path):
    """`engine export` of ckpt to path in fmt, then the export's self-test (verify-export)."""
    print(run(["export", ckpt, "--format", fmt, "-o", path, "--data-dir", DATA_DIR]).strip())
    print(run(["verify-export", path]).strip())


def check_probes(path):
    """The export's recorded probes through this consumer (tools/check_export.py): its exit status."""
    return subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "check_export.py"), path]).returncode


def engine_eval(ckpt, tmp):
    """(logits [10000, 10], the accuracy `engine eval` prints, in %)."""
    import numpy as np
    dump = os.path.join(tmp, "engine_logits.f32")
    out = run(["eval", ckpt, "--device", "cpu", "--data-dir", DATA_DIR, "--dump-logits", dump])
    accuracy = float(re.search(r"accuracy ([0-9.]+)%", out).group(1))
    return np.fromfile(dump, "<f4").reshape(-1, 10), accuracy


def test_set(meta):
    """The test images as the export's metadata says to normalise them, and the labels."""
    import torch_interop as ti
    images = ti.read_idx_images(DATA_DIR, "t10k-images-idx3-ubyte")
    labels = ti.read_idx_labels(DATA_DIR, "t10k-labels-idx1-ubyte")
    return ti.normalize(images, float(meta["input_mean"]), float(meta["input_std"])), labels


def probes(meta):
    import numpy as np
    n, classes = int(meta["probe_count"]), int(meta["classes"])
    get = lambda key, shape: np.frombuffer(base64.b64decode(meta[key]), "<f4").reshape(shape).copy()
    return (get("probe_inputs", [n] + json.loads(meta["input_shape"])), get("probe_logits", (n, classes)),
            get("probe_tolerance", (n, classes)))


def tolerance(state, x, batch=1000):
    """Per image and logit of fashion_cnn: twice the bound on the error of any float32
    evaluation (docs/export.md, "The tolerance"). The sums of magnitudes run in float32
    for speed (double takes minutes here): a sum of K non-negative terms is then off by
    at most K u relative (2e-4 for fc1), which the factor MAGNITUDE_MARGIN covers."""
    import torch
    import torch.nn.functional as F
    gamma = lambda n: n * U / (1 - n * U)
    s = {k: v.float() for k, v in state.items() if v.is_floating_point()}
    out = []
    with torch.no_grad():
        for i in range(0, len(x), batch):
            a = torch.from_numpy(x[i:i + batch]).float()
            e = torch.zeros_like(a)

            def affine(name, a, e, op):
                w, b = s[name + ".weight"], s[name + ".bias"]
                k = w[0].numel() + 1
                # |W| e + g (|W| (|a| + e) + |b|) = g (|W| (|a| + e (1 + g) / g) + |b|): one pass.
                g = gamma(k)
                return op(a, w, b), g * op(a.abs() + e * ((1 + g) / g), w.abs(), b.abs())

            conv = lambda a, w, b: F.conv2d(a, w, b, padding=1)
            for c, bn in (("conv1", "bn1"), ("conv2", "bn2")):
                a, e = affine(c, a, e, conv)
                g, beta, m, v = (s[bn + p].view(1, -1, 1, 1) for p in (".weight", ".bias", ".running_mean", ".running_var"))
                scale = g / torch.sqrt(v + float(torch.tensor(1e-5, dtype=torch.float32)))
                a, e = ((a - m) * scale + beta,
                        scale.abs() * e + BATCHNORM_ULPS * U * (scale.abs() * (a.abs() + e + m.abs()) + beta.abs()))
                a, e = torch.relu(F.max_pool2d(a, 2)), F.max_pool2d(e, 2)
            a, e = torch.flatten(a, 1), torch.flatten(e, 1)
            a, e = affine("fc1", a, e, F.linear)
            a = torch.relu(a)
            a, e = affine("fc2", a, e, F.linear)
            out.append(2 * MAGNITUDE_MARGIN * e.double().numpy())
    import numpy as np
    return np.concatenate(out)


def check(name, consumer_logits, engine_logits, engine_accuracy, labels, tol):
    """The issue's three checks; prints the figures, returns 0 when all hold."""
    import numpy as np
    accuracy = 100.0 * float((consumer_logits.argmax(1) == labels).mean())
    agree = 100.0 * float((consumer_logits.argmax(1) == engine_logits.argmax(1)).mean())
    diff = np.abs(consumer_logits.astype(np.float64) - engine_logits.astype(np.float64))
    print("%s: accuracy %.2f %% (engine eval %.2f %%), argmax agreement %.3f %% of %d, max |logit diff| %.3g, "
          "tolerance %.3g to %.3g, at most %.4f %% of its tolerance"
          % (name, accuracy, engine_accuracy, agree, len(labels), diff.max(), tol.min(), tol.max(),
             100 * float((diff / tol).max())))
    failures = []
    if round(accuracy, 2) != engine_accuracy:
        failures.append("accuracy %.2f %% differs from engine eval's %.2f %%" % (accuracy, engine_accuracy))
    if agree < 99.9:
        failures.append("argmax agreement %.3f %% < 99.9 %%" % agree)
    if not (diff <= tol).all():
        i = np.unravel_index(np.argmax(diff - tol), diff.shape)
        failures.append("image %d logit %d: |diff| %.3g > tolerance %.3g" % (i[0], i[1], diff[i], tol[i]))
    for f in failures:
        print("FAILED: " + f)
    return 1 if failures else 0
