#!/usr/bin/env python3
"""emulated_cuda_step: what a CUDA training step costs, held without a GPU.

Trains configs/mnist.json with --device cuda on the emulated-CUDA CLI (the fixture
emulated_cuda_build: tests/emulated_cuda/emulated_cuda.cpp, an emulated device on host
memory that writes one trace line per op, allocation, copy and synchronisation), once per
variant, and holds for two consecutive mid-epoch steps of each:
  * the ops of a step, in order;
  * the allocations, device-to-host copies and synchronisations of a step;
  * the op arguments (op.arg) that differ between the two steps: each is a value that a
    replayed CUDA graph would freeze, so each must reach the device by another way.
What a CUDA op does inside itself (its scratch, the chunked batch norm's host finish in
kernels/cuda/chunk_ops.cu) is not seen: the emulated op is the CPU's.
The numbers are the baseline as the engine is NOW: the GPU work (issue 40) is to drive
the allocations, device-to-host copies, synchronisations and changed arguments to 0, and
this test is updated as it does (docs/architecture.md, "A training step").

Then: the emulated run's last.h5 evaluates on the CPU, and `engine diff` compares an
emulated cuda.batch_chunks=true run with a CPU run of the same config (printed, not held:
on a GPU the bits differ; on the emulation the ops are the CPU's).

  step_trace.py ENGINE_BIN CONFIG TMP_DIR        exit 0 pass, 1 fail, 77 no data set
"""
import os
import shutil
import subprocess
import sys
import time

engine, config, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
data_dir = os.environ.get("ENGINE_DATA_DIR", "/usr/share/datasets/fashion-mnist")
if not any(os.path.exists(os.path.join(data_dir, f)) for f in ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte")):
    print(f"Fashion-MNIST not found in {data_dir}: skipped")
    sys.exit(77)
if not os.access(engine, os.X_OK):
    print(f"{engine}: no emulated-CUDA CLI (the fixture emulated_cuda_build builds it)")
    sys.exit(1)

# 512 training images in batches of 64: 8 steps; steps 3 and 4 are mid-epoch.
COMMON = ["--set", f"data.dir={data_dir}", "--set", "data.train_limit=512", "--set", "data.val_split=256",
          "--set", "data.test_limit=256", "--set", "data.batch_size=64", "--set", "train.epochs=1"]
FIRST, SECOND = 3, 4  # 1-based steps of the epoch

# ---- The baseline: what a step costs now (to be driven to 0 by the GPU work) ---------------

FWD_WHOLE = ["gather_batch",
             "conv2d_forward", "batchnorm_forward_train", "maxpool2x2_forward", "relu_forward",
             "conv2d_forward", "batchnorm_forward_train", "maxpool2x2_forward", "relu_forward",
             "linear_forward", "relu_forward", "dropout_forward", "linear_forward",
             "cross_entropy"]
BWD_WHOLE = ["linear_backward", "dropout_backward", "relu_backward", "linear_backward",
             "relu_backward", "maxpool2x2_backward", "batchnorm_backward", "conv2d_backward",
             "relu_backward", "maxpool2x2_backward", "batchnorm_backward", "conv2d_backward"]
# Each update adds its tensors' step digests as it writes them; one launch at the step's
# end moves them, with the batch norms' statistics' and the losses', into the ring that
# saves and epoch ends read (train.step_digests: no wait in the step, one launch more).
DIGESTS = ["step_digest_finish"]
ADAM = ["adam_update"] * 12

UNSCALE = ["unscale_check"] * 12
# fp16: the loss scaler stays on the device. After the unscale, one thread counts Adam's
# steps and makes its factors unless the step overflowed (adam_prepare_step), the updates
# skip on the flag, and one thread updates the scale and clears the flag.
SCALED_ADAM = ["adam_prepare_step"] + ADAM + ["loss_scale_update"] + DIGESTS


def rename(ops, chunks, suffix):
    """The ops of a variant: the chunked forms with `chunks` (op_name: a chunked-only op,
    or an op given its batch by chunks), and the conv/linear ops of a precision ("",
    "_f16", "_bf16")."""
    out = []
    for op in ops:
        if op.startswith(("conv2d_", "linear_")):
            out.append(op + ("_chunks" if chunks else "") + suffix)
            # By chunks, one process: the bias gradient's double sum, rounded on the device.
            if chunks and op.endswith("_backward"):
                out.append("round_to_float")
            continue
        if op.startswith("batchnorm_") and chunks:
            op += "_chunks"
        out.append(op)
    return out


# Every variant: no argument of the step's ops changes from step to step. The per-step
# values (the batch's place in the epoch's order, the dropout counter, the loss scale,
# Adam's factors) reach the kernels through one upload a step (engine/core/step_values.h:
# `copy_h2d_async`, from page-locked memory, not waited for), which sits just before the
# step's gather_batch, so at the end of the step before in this trace's cut.
PER_STEP = []
# cuda.batch_chunks=true in one process: each of the 4 conv/linear backward ops sums its
# bias gradient in double into one buffer that only grows, and round_to_float rounds it on
# the device: nothing allocated, nothing read back.
# precision bf16 has no loss scaler: fp32's costs, with the bf16 conv/linear ops.
EXPECTED = {
    "fp32 whole batch": {"ops": rename(FWD_WHOLE + BWD_WHOLE, False, "") + ADAM + DIGESTS,
                         "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "changed": PER_STEP},
    # cuda.graphs=true: steps 1 and 2 run eagerly (the first sizes the buffers), step 3 is
    # captured and launched, later ones replay the graph: one `graph_launch` a step (at the
    # end of the step before, in this trace's cut, as the upload), the same ops inside.
    "fp32 whole batch, graphs": {"ops": rename(FWD_WHOLE + BWD_WHOLE, False, "") + ADAM + DIGESTS,
                                 "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "launches": 1,
                                 "changed": PER_STEP},
    "fp32 batch chunks": {"ops": rename(FWD_WHOLE + BWD_WHOLE, True, "") + ADAM + DIGESTS,
                          "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "changed": PER_STEP},
    "fp16 whole batch": {"ops": rename(FWD_WHOLE + BWD_WHOLE, False, "_f16") + UNSCALE + SCALED_ADAM,
                         "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "changed": PER_STEP},
    "fp16 whole batch, graphs": {"ops": rename(FWD_WHOLE + BWD_WHOLE, False, "_f16") + UNSCALE + SCALED_ADAM,
                                 "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "launches": 1,
                                 "changed": PER_STEP},
    "fp16 batch chunks": {"ops": rename(FWD_WHOLE + BWD_WHOLE, True, "_f16") + UNSCALE + SCALED_ADAM,
                          "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "changed": PER_STEP},
    "bf16 whole batch": {"ops": rename(FWD_WHOLE + BWD_WHOLE, False, "_bf16") + ADAM + DIGESTS,
                         "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "changed": PER_STEP},
    "bf16 batch chunks": {"ops": rename(FWD_WHOLE + BWD_WHOLE, True, "_bf16") + ADAM + DIGESTS,
                          "allocs": 0, "d2h": 0, "syncs": 0, "uploads": 1, "changed": PER_STEP},
}

VARIANTS = [
    ("fp32 whole batch", ["--set", "cuda.batch_chunks=false"]),
    ("fp32 whole batch, graphs", ["--set", "cuda.batch_chunks=false", "--set", "cuda.graphs=true"]),
    ("fp32 batch chunks", ["--set", "cuda.batch_chunks=true"]),
    ("fp16 whole batch", ["--set", "cuda.batch_chunks=false", "--set", "precision.mode=fp16"]),
    ("fp16 whole batch, graphs", ["--set", "cuda.batch_chunks=false", "--set", "precision.mode=fp16",
                                  "--set", "cuda.graphs=true"]),
    ("fp16 batch chunks", ["--set", "cuda.batch_chunks=true", "--set", "precision.mode=fp16"]),
    ("bf16 whole batch", ["--set", "cuda.batch_chunks=false", "--set", "precision.mode=bf16"]),
    ("bf16 batch chunks", ["--set", "cuda.batch_chunks=true", "--set", "precision.mode=bf16"]),
]


def run(args, env=None, check=True):
    t0 = time.time()
    p = subprocess.run([engine] + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        print(f"FAILED ({p.returncode}): engine {' '.join(args)}\n{p.stdout[-4000:]}")
        sys.exit(1)
    return p, time.time() - t0


def op_name(words):
    """An op line's op, with the batch split and the precision it was given, so that each
    variant's expected list names them too: an op given chunks (`split=chunks[...]`) is
    "NAME_chunks", as the chunked-only ops are named; `p=fp16` adds "_f16" ("conv2d_forward_f16"),
    fp32 nothing."""
    suffix = {"p=fp32": "", "p=fp16": "_f16", "p=bf16": "_bf16"}  # not dropout's p=0x1p-2
    name = words[1]
    if any(w.startswith("split=chunks") for w in words[2:]):
        name += "_chunks"
    for w in words[2:]:
        if w in suffix:
            return name + suffix[w]
    return name


def parse(path):
    """The trace as steps: each from an `op gather_batch` up to the next one."""
    steps, cur = [], None
    with open(path) as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            if words[0] == "op" and words[1] == "gather_batch":
                cur = []
                steps.append(cur)
            if cur is not None:
                cur.append(words)
    return steps


def strip_progress(step):
    """The step without fit()'s progress read: a reduce_sum of the epoch's losses so far
    (and its result's copy) after the step's last adam_update, done when 200 ms have
    passed since the last one (engine/train/run_loop.cpp): timing, not the step. Returns
    the step and the number of progress reads taken out."""
    last_adam = max((i for i, w in enumerate(step) if w[:2] == ["op", "adam_update"]), default=-1)
    out, reads, skip_result = [], 0, False
    for i, w in enumerate(step):
        if i > last_adam and w[:2] == ["op", "reduce_sum"]:
            reads += 1
            skip_result = True
            continue
        if skip_result and w[0] == "copy_d2h" and w[-1] == "result":
            skip_result = False
            continue
        out.append(w)
    return out, reads


def summary(step):
    ops = [op_name(w) for w in step if w[0] == "op"]
    count = lambda kind: sum(1 for w in step if w[0] == kind)
    return {"ops": ops, "allocs": count("alloc"), "h2d": count("copy_h2d"), "uploads": count("copy_h2d_async"), "launches": count("graph_launch"),
            "d2h": count("copy_d2h"), "syncs": count("sync"), "memsets": count("memset")}


def changed_args(a, b):
    opa = [w for w in a if w[0] == "op"]
    opb = [w for w in b if w[0] == "op"]
    if [w[1] for w in opa] != [w[1] for w in opb]:
        return None
    # A pointer to memory allocated during the step counts as changed whatever its
    # address (the allocator may or may not hand out the same block again): a graph
    # would freeze it.
    fresh_a = {w[2] for w in a if w[0] == "alloc" and len(w) > 2}
    fresh_b = {w[2] for w in b if w[0] == "alloc" and len(w) > 2}
    out = set()
    for x, y in zip(opa, opb):
        for ax, ay in zip(x[2:], y[2:]):
            va, vb = ax.split("=", 1)[1], ay.split("=", 1)[1]
            if ax != ay or va in fresh_a or vb in fresh_b:
                out.add(x[1] + "." + ax.split("=", 1)[0])
    return sorted(out)


failures = []
rows = []
shutil.rmtree(tmp, ignore_errors=True)
os.makedirs(tmp)
for name, extra in VARIANTS:
    tag = name.replace(" ", "_")
    trace = os.path.join(tmp, tag + ".trace")
    run_dir = os.path.join(tmp, tag)
    env = dict(os.environ, ENGINE_EMULATED_CUDA_TRACE=trace)
    _, secs = run(["train", config, "--device", "cuda", "--run-dir", run_dir] + COMMON + extra, env=env)
    steps = parse(trace)
    if len(steps) < SECOND:
        failures.append(f"{name}: only {len(steps)} steps in the trace")
        continue
    (a, ra), (b, rb) = strip_progress(steps[FIRST - 1]), strip_progress(steps[SECOND - 1])
    sa, sb = summary(a), summary(b)
    ch = changed_args(a, b)
    print(f"== {name} ({secs:.1f} s): step {FIRST}, {len(sa['ops'])} ops:")
    print("   " + " ".join(sa["ops"]))
    print(f"   allocs {sa['allocs']}, h2d {sa['h2d']}, uploads {sa['uploads']}, d2h {sa['d2h']}, syncs {sa['syncs']}, "
          f"memsets {sa['memsets']}")
    print(f"   changed between steps {FIRST} and {SECOND}: {ch}")
    print(f"   (progress reads taken out, timing-dependent: {ra} and {rb})")
    for line in a:
        if line[0] != "op":
            print("     " + " ".join(line))
    rows.append((name, len(sa["ops"]), sa["allocs"], sa["h2d"], sa["uploads"], sa["d2h"], sa["syncs"], sa["memsets"],
                 ", ".join(ch if ch is not None and ch else ["(none)"] if ch is not None else ["(op sequences differ)"])))
    exp = EXPECTED.get(name)
    if exp is None:
        failures.append(f"{name}: no expectation written")
        continue
    for s, label in ((sa, FIRST), (sb, SECOND)):
        for key in ("ops", "allocs", "d2h", "syncs", "uploads", "launches"):
            if s[key] != exp.get(key, 0):
                failures.append(f"{name}: step {label} {key}: {s[key]} != expected {exp[key]}")
    if ch != sorted(exp["changed"]):
        failures.append(f"{name}: changed args {ch} != expected {sorted(exp['changed'])}")
    # The emulated run's checkpoint is an ordinary checkpoint: it evaluates on the CPU.
    p, _ = run(["eval", os.path.join(run_dir, "last.h5"), "--device", "cpu", "--data-dir", data_dir], check=False)
    if p.returncode != 0:
        failures.append(f"{name}: engine eval last.h5 --device cpu failed:\n{p.stdout[-2000:]}")

print("\n| variant | ops | allocs | h2d | uploads | d2h | syncs | memsets | args changed between steps |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(str(x) for x in r) + " |")

# Graphs on and off: the same checkpoint, bit for bit; and the graphs runs were replayed.
for prec in ("fp32", "fp16"):
    on, off = f"{prec}_whole_batch,_graphs", f"{prec}_whole_batch"
    graphs_trace = open(os.path.join(tmp, on + ".trace")).read().split("\n")
    captures = sum(1 for l in graphs_trace if l.startswith("capture_end"))
    launches = sum(1 for l in graphs_trace if l.startswith("graph_launch"))
    print(f"\n{prec}, cuda.graphs=true: {captures} capture(s), {launches} graph launches")
    if captures < 1 or launches < 5:
        failures.append(f"{prec} cuda.graphs=true: {captures} captures and {launches} launches (expected >= 1 and >= 5)")
    p, _ = run(["diff", os.path.join(tmp, on, "last.h5"), os.path.join(tmp, off, "last.h5")], check=False)
    print(f"engine diff (emulated cuda, {prec}, graphs on) vs (graphs off): exit {p.returncode}, "
          f"{'identical' if p.returncode == 0 else 'different'}")
    if p.returncode != 0:
        failures.append(f"{prec}: cuda.graphs=true and false give different checkpoints:\n" + p.stdout[-2000:])

# Graphs across saves, epochs, an overflow and signals, per precision: every variant ends
# with the checkpoint of the same run with graphs off, bit for bit.
#  * Three epochs of 5 steps (the last of 60 samples), checkpoint.every_n_steps=2 with
#    checkpoint.verify=false: saves among replayed steps, each reading the state the
#    device holds (the loss scaler, Adam's step counts with a scaler) between replays;
#    the third epoch is all replays, so its end reads what replays alone moved on.
#  * fp16 starts from a loss scale of 2^26, so its first steps overflow and are skipped
#    while the graph replays, and grows it every 3 steps, so it overflows again later.
#  * The graphs outlive the saves, the evaluations and the epoch's end: one capture per
#    batch size (64 and the last 60) for the whole run, every later step a replay.
#  * A run stopped by SIGUSR1 (a save) and SIGTERM among replays, then resumed with graphs.
def count_lines(path, prefix):
    try:
        with open(path) as f:
            return sum(1 for l in f if l.startswith(prefix))
    except FileNotFoundError:
        return 0


def signal_after_launches(proc, path, count, sig, deadline):
    while count_lines(path, "graph_launch") < count:
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.005)
    proc.send_signal(sig)
    return True


def checkpoint_counts(path):
    """The scaler's scale and conv1.weight's Adam step count, and the global step."""
    import h5py
    with h5py.File(path, "r") as f:
        return (float(f["scaler"].attrs["scale"]), int(f["optimizer/step"].attrs["conv1.weight"]),
                int(f["trainer"].attrs["global_step"]))


import signal
GRAPH_RUN = ["--set", "cuda.batch_chunks=false", "--set", "data.train_limit=316", "--set", "train.epochs=3",
             "--set", "checkpoint.every_n_steps=2", "--set", "checkpoint.verify=false",
             "--set", "data.val_split=64", "--set", "data.test_limit=64"]  # the 16-bit references are slow
GRAPH_STEPS = 5  # 316 / 64, rounded up: 4 of 64 and one of 60
PRECISIONS = {
    "fp32": [],
    "fp16": ["--set", "precision.mode=fp16", "--set", "precision.loss_scale.init=67108864",
             "--set", "precision.loss_scale.growth_interval=3"],
    "bf16": ["--set", "precision.mode=bf16"],
}
for prec, prec_args in PRECISIONS.items():
    args = COMMON + GRAPH_RUN + prec_args
    off_dir, on_dir, stopped_dir = (os.path.join(tmp, f"{prec}_graphs_{k}") for k in ("off", "on", "stopped"))
    run(["train", config, "--device", "cuda", "--run-dir", off_dir] + args + ["--set", "cuda.graphs=false"])
    on_trace = os.path.join(tmp, f"{prec}_graphs_on.trace")
    p, _ = run(["train", config, "--device", "cuda", "--run-dir", on_dir] + args + ["--set", "cuda.graphs=true"],
               env=dict(os.environ, ENGINE_EMULATED_CUDA_TRACE=on_trace))
    captures, launches = count_lines(on_trace, "capture_end"), count_lines(on_trace, "graph_launch")
    # The engine's own count (device_activity, what tools/gpu-check.sh reads on a GPU).
    said = f"cuda graphs: {captures} captured, {launches} launched"
    if said not in p.stdout:
        failures.append(f"{prec}: engine train did not say '{said}':\n" + p.stdout[-1000:])
    p, _ = run(["diff", os.path.join(on_dir, "last.h5"), os.path.join(off_dir, "last.h5")], check=False)
    print(f"\n{prec}, 3 epochs, every_n_steps=2, verify=false: graphs on: {captures} captures, {launches} launches; "
          f"engine diff against graphs off: exit {p.returncode}, {'identical' if p.returncode == 0 else 'different'}")
    if p.returncode != 0:
        failures.append(f"{prec}: graphs on (saves among replays) and off give different checkpoints:\n"
                        + p.stdout[-2000:])
    # Every step's digests, recorded from the device's ring at saves and epoch ends: the
    # same with graphs on and off (bisect reads both records), and each checkpoint's the
    # digest of its own tensors (engine verify).
    p, _ = run(["bisect", on_dir, off_dir], check=False)
    steps = 3 * GRAPH_STEPS
    print(f"{prec}: engine bisect graphs on / off: exit {p.returncode}: {p.stdout.strip().splitlines()[-1]}")
    if p.returncode != 0 or f"identical through step {steps} (from the recorded step digests)" not in p.stdout:
        failures.append(f"{prec}: the step digests of graphs on and off are not identical through step {steps}:\n"
                        + p.stdout[-2000:])
    for d in (on_dir, off_dir):
        p, _ = run(["verify", os.path.join(d, "last.h5")], check=False)
        if p.returncode != 0:
            failures.append(f"{prec}: engine verify {d}/last.h5 failed:\n" + p.stdout[-1000:])
    # The first two steps of each size run eagerly, the next is captured; the last step of
    # epoch 1 (60 samples) is its size's first, epoch 2's last is captured, and every
    # step of epoch 3 is replayed.
    if captures != 2 or launches < 3 * GRAPH_STEPS - 4:
        failures.append(f"{prec}: graphs on: {captures} captures and {launches} launches in 3 epochs of "
                        f"{GRAPH_STEPS} steps "
                        f"(expected 2 captures, the graphs kept across saves, evaluations and epochs)")
    if prec == "fp16":
        scale, adam_steps, global_step = checkpoint_counts(os.path.join(off_dir, "last.h5"))
        print(f"fp16 graphs off: final scale {scale:g}, Adam steps {adam_steps} of {global_step} steps")
        if global_step - adam_steps < 3:
            failures.append(f"fp16: only {global_step - adam_steps} steps skipped for overflow (expected >= 3)")
    trace = os.path.join(tmp, f"{prec}_graphs_stopped.trace")
    proc = subprocess.Popen([engine, "train", config, "--device", "cuda", "--run-dir", stopped_dir] + args
                            + ["--set", "cuda.graphs=true"],
                            env=dict(os.environ, ENGINE_EMULATED_CUDA_TRACE=trace),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    usr1 = signal_after_launches(proc, trace, 2, signal.SIGUSR1, deadline)
    term = usr1 and signal_after_launches(proc, trace, count_lines(trace, "graph_launch") + 2, signal.SIGTERM,
                                          deadline)
    out, _ = proc.communicate(timeout=300)
    at_stop = count_lines(trace, "graph_launch")
    if not term or proc.returncode != 130:
        failures.append(f"{prec} graphs and signals: the run was not stopped mid-way by SIGTERM (exit "
                        f"{proc.returncode}, signals sent: USR1 {usr1}, TERM {term}):\n{out[-1500:]}")
        continue
    run(["train", config, "--device", "cuda", "--run-dir", stopped_dir] + args + ["--set", "cuda.graphs=true"])
    p, _ = run(["diff", os.path.join(off_dir, "last.h5"), os.path.join(stopped_dir, "last.h5")], check=False)
    print(f"{prec}, graphs, SIGUSR1 save and SIGTERM stop after {at_stop} launches, resumed with graphs: "
          f"engine diff against graphs off: exit {p.returncode}, {'identical' if p.returncode == 0 else 'different'}")
    if p.returncode != 0:
        failures.append(f"{prec} graphs: the stopped and resumed run differs from the graphs-off run:\n"
                        + p.stdout[-2000:])

# A Classifier on the GPU called from another thread while the step's graph is captured
# (tests/emulated_cuda/inference_during_capture.cpp): each capture is held open 300 ms.
probe = os.path.join(os.path.dirname(engine), "emulated_inference_during_capture")
p = subprocess.run([probe, config, data_dir, os.path.join(tmp, "fp32_whole_batch", "last.h5")],
                   env=dict(os.environ, ENGINE_EMULATED_CUDA_CAPTURE_HOLD_MS="300"),
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
print("\n" + p.stdout.strip())
if p.returncode != 0:
    failures.append(f"inference during a capture: exit {p.returncode}")

# An emulated cuda.batch_chunks=true run against a CPU run of the same config.
cpu_dir = os.path.join(tmp, "cpu")
run(["train", config, "--device", "cpu", "--run-dir", cpu_dir] + COMMON)
p, _ = run(["diff", os.path.join(tmp, "fp32_batch_chunks", "last.h5"), os.path.join(cpu_dir, "last.h5")], check=False)
verdict = "identical" if p.returncode == 0 else "different"
print(f"\nengine diff (emulated cuda, batch_chunks=true) vs (cpu): exit {p.returncode}, {verdict}")
print("\n".join(p.stdout.strip().splitlines()[-15:]))

if failures:
    print("\nFAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("\nemulated_cuda_step: passed")
