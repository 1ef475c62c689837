#!/usr/bin/env python3
"""ONNX consumer test (CTest: py_test_export_onnxruntime; docs/export.md): onnxruntime
runs `engine export --format onnx` of a short run's best.h5 on the 10,000 test images.
Its accuracy equals `engine eval`'s, its argmax agrees on >= 99.9 % of the images, and
every logit is within the tolerance of docs/export.md of the engine's. The export's own
probes pass through onnxruntime (tools/check_export.py) and the probe tolerances the
engine recorded equal the ones computed here. Exit 77 (skipped) only where onnxruntime,
torch or the dataset is missing (tools/setup-debian.sh installs onnxruntime from PyPI).
"""
import os
import sys

import export_consumer as ec

try:
    import numpy as np
    import onnxruntime as ort
    import torch  # noqa: F401 (the tolerance's magnitudes)
except ImportError as e:
    ec.skip("%s (tools/setup-debian.sh installs onnxruntime with pip)" % e)
if not os.path.isdir(ec.DATA_DIR):
    ec.skip("dataset directory %s is missing" % ec.DATA_DIR)


def main():
    import torch_interop as ti
    torch.set_num_threads(2)
    tmp = ec.workdir("export_onnxruntime")
    ckpt = ec.short_run(tmp)
    onnx = os.path.join(tmp, "best.onnx")
    ec.export(ckpt, "onnx", onnx)
    sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    meta = sess.get_modelmeta().custom_metadata_map
    x, labels = ec.test_set(meta)
    name = sess.get_inputs()[0].name
    logits = np.concatenate([sess.run(None, {name: x[i:i + 1000]})[0] for i in range(0, len(x), 1000)])
    engine_logits, engine_accuracy = ec.engine_eval(ckpt, tmp)
    state, _ = ti.load_model_state(ckpt)
    status = ec.check("onnxruntime %s" % ort.__version__, logits, engine_logits, engine_accuracy, labels,
                      ec.tolerance(state, x))
    # The recorded probe tolerances are the ones this derivation gives (independently coded).
    probe_x, _, probe_tol = ec.probes(meta)
    mine = ec.tolerance(state, probe_x)
    # (float32 magnitudes here, double in the engine: within MAGNITUDE_MARGIN.)
    if not np.allclose(mine, probe_tol, rtol=2e-3, atol=0):
        print("FAILED: recorded probe tolerances differ from this derivation by up to %.3g relative"
              % float(np.abs(mine / probe_tol - 1).max()))
        status = 1
    return status or ec.check_probes(onnx)


if __name__ == "__main__":
    sys.exit(main())
