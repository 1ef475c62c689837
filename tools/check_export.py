#!/usr/bin/env python3
"""Runs the self-test of an `engine export` file outside the engine (docs/export.md): the
probe inputs of its metadata through onnxruntime (.onnx) or PyTorch (.safetensors, loaded
strictly into the reference module of tools/torch_interop.py), each logit against the
recorded one within its recorded tolerance. Exit 0 when all pass.  check_export.py FILE"""
import base64, json, os, sys
import numpy as np

def floats(meta, key, shape):
    return np.frombuffer(base64.b64decode(meta[key]), "<f4").reshape(shape).copy()

def main(path):
    if path.endswith(".onnx"):
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        meta = sess.get_modelmeta().custom_metadata_map
        run = lambda x: sess.run(None, {sess.get_inputs()[0].name: x})[0]
    else:
        import torch, safetensors, safetensors.torch
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_interop import make_model
        with safetensors.safe_open(path, "pt") as f:
            meta = f.metadata()
        model = make_model() if meta["model"] == "fashion_cnn" else make_mlp(json.loads(meta["input_shape"]), int(meta["classes"]))
        model.load_state_dict(safetensors.torch.load_file(path), strict=True)
        run = lambda x: model.eval()(torch.from_numpy(x)).detach().numpy()
    n, classes = int(meta["probe_count"]), int(meta["classes"])
    x = floats(meta, "probe_inputs", [n] + json.loads(meta["input_shape"]))
    want, tol = floats(meta, "probe_logits", (n, classes)), floats(meta, "probe_tolerance", (n, classes))
    diff = np.abs(run(np.ascontiguousarray(x)).astype(np.float64) - want)
    ok = bool((diff <= tol).all())
    print("%s: %s (%d probes, max |diff| %.3g, at most %.1f %% of a tolerance)"
          % (path, "OK" if ok else "FAILED", n, diff.max(), 100 * (diff / tol).max()))
    return 0 if ok else 1

def make_mlp(shape, classes, hidden=128):
    import torch
    class Mlp(torch.nn.Module):  # include/engine/nn/models/mlp.h: flatten, fc1, relu, dropout, fc2
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(int(np.prod(shape)), hidden), torch.nn.Linear(hidden, classes)
        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))
    return Mlp()

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
