#!/usr/bin/env python3
"""safetensors consumer test (CTest: py_test_export_torch; docs/export.md): PyTorch loads
`engine export --format safetensors` of a short run's best.h5 with
safetensors.torch.load_file into the reference module of tools/torch_interop.py,
strictly, and runs the 10,000 test images: accuracy equal to `engine eval`'s, argmax
agreement >= 99.9 %, every logit within the tolerance of docs/export.md. The export's
probes pass through PyTorch (tools/check_export.py). Exit 77 (skipped) only where torch,
safetensors or the dataset is missing (tools/setup-debian.sh installs safetensors).
"""
import os
import sys

import export_consumer as ec

try:
    import numpy as np
    import torch
    import safetensors
    import safetensors.torch
except ImportError as e:
    ec.skip("%s (tools/setup-debian.sh installs safetensors with pip)" % e)
if not os.path.isdir(ec.DATA_DIR):
    ec.skip("dataset directory %s is missing" % ec.DATA_DIR)


def main():
    import torch_interop as ti
    torch.set_num_threads(2)
    tmp = ec.workdir("export_torch")
    ckpt = ec.short_run(tmp)
    path = os.path.join(tmp, "best.safetensors")
    ec.export(ckpt, "safetensors", path)
    with safetensors.safe_open(path, "pt") as f:
        meta = f.metadata()
    state = safetensors.torch.load_file(path)
    model = ti.make_model()
    model.load_state_dict(state, strict=True)  # raises on a missing or unexpected key
    x, labels = ec.test_set(meta)
    logits = ti.predict(model, x)
    engine_logits, engine_accuracy = ec.engine_eval(ckpt, tmp)
    status = ec.check("torch %s" % torch.__version__, logits, engine_logits, engine_accuracy, labels,
                      ec.tolerance(state, x))
    return status or ec.check_probes(path)


if __name__ == "__main__":
    sys.exit(main())
