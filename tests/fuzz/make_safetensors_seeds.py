#!/usr/bin/env python3
"""Writes the seed corpus of the safetensors harness (tests/fuzz/corpus/safetensors/):
a plain file of two tensors with metadata, and a complete engine export of a tiny `mlp`
(input 1x2x2, 2 classes, 1 probe) that `engine verify-export` accepts, so the fuzzer
starts inside the export check too. The probe tolerance is docs/export.md's bound,
computed here as engine/train/export_error_bounds.cpp does. Run: make_safetensors_seeds.py [DIR]"""
import base64, json, os, struct, sys
import numpy as np

U = 2.0 ** -24
gamma = lambda n: n * U / (1 - n * U)


def encode(tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata} if metadata else {}, [], 0
    for name, a in sorted(tensors.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0])):
        header[name] = {"dtype": {"<f4": "F32", "<i8": "I64"}[a.dtype.str], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode()


def main(out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "plain"), "wb") as f:
        f.write(encode({"a.weight": np.arange(6, dtype="<f4").reshape(2, 3),
                        "a.num_batches_tracked": np.array(7, dtype="<i8")}, {"k": "v"}))
    rng = np.random.default_rng(0)
    w1, b1 = rng.uniform(-.5, .5, (128, 4)).astype("<f4"), rng.uniform(-.5, .5, 128).astype("<f4")
    w2, b2 = rng.uniform(-.1, .1, (2, 128)).astype("<f4"), rng.uniform(-.1, .1, 2).astype("<f4")
    x = rng.uniform(-1, 2, (1, 1, 2, 2)).astype("<f4")
    h = np.maximum(x.reshape(1, 4) @ w1.T + b1, 0).astype("<f4")
    logits = (h @ w2.T + b2).astype("<f4")
    xd, w1d, b1d, w2d, b2d = (a.astype(np.float64) for a in (x.reshape(1, 4), w1, b1, w2, b2))
    a1 = xd @ w1d.T + b1d
    e1 = gamma(5) * (np.abs(xd) @ np.abs(w1d).T + np.abs(b1d))
    a1 = np.maximum(a1, 0)
    e2 = e1 @ np.abs(w2d).T + gamma(129) * ((np.abs(a1) + e1) @ np.abs(w2d).T + np.abs(b2d))
    tol = np.nextafter((2 * e2).astype("<f4"), np.float32(np.inf))
    meta = {"format": "engine-export", "format_version": "1", "model": "mlp", "input_shape": "[1,2,2]",
            "classes": "2", "probe_count": "1", "probe_inputs": b64(x), "probe_logits": b64(logits),
            "probe_tolerance": b64(tol)}
    with open(os.path.join(out, "mlp_export"), "wb") as f:
        f.write(encode({"fc1.weight": w1, "fc1.bias": b1, "fc2.weight": w2, "fc2.bias": b2}, meta))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                               "corpus", "safetensors"))
