#!/usr/bin/python3
"""torch.onnx.export of the reference module (tools/torch_interop.py make_model) with the
weights of an engine safetensors export, opset 13, dynamic batch: the comparison for
`engine export --format onnx` (tools/bench/export.sh). Prints one JSON line: the median
seconds of --reps exports (after one untimed warm-up) and the file's size.
  torch_onnx_export.py WEIGHTS.safetensors OUT.onnx [--reps N]"""
import argparse, json, os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch, safetensors.torch
from torch_interop import make_model

p = argparse.ArgumentParser()
p.add_argument("weights"), p.add_argument("out"), p.add_argument("--reps", type=int, default=5)
a = p.parse_args()
torch.set_num_threads(2)
model = make_model()
model.load_state_dict(safetensors.torch.load_file(a.weights), strict=True)
model.eval()
x = torch.zeros(1, 1, 28, 28)
times = []
for i in range(a.reps + 1):
    t = time.perf_counter()
    torch.onnx.export(model, x, a.out, opset_version=13, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    if i:
        times.append(time.perf_counter() - t)
print(json.dumps({"seconds": statistics.median(times), "bytes": os.path.getsize(a.out), "torch": torch.__version__}))
