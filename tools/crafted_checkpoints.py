#!/usr/bin/env python3
"""Crafted-checkpoint campaign (issue 9, docs/fuzzing.md).

Writes N checkpoints whose HDF5 metadata bytes are mutated and whose user-block header
is then resealed exactly as docs/checkpoint-format.md 1.1 describes (so every file is
CRC-valid), runs `engine verify FILE` and `engine inspect FILE` on each with a time limit,
and counts:
  crashes   the engine died of a signal (SIGSEGV, SIGABRT, ...)
  hangs     it ran past --timeout seconds (killed)
  slow      it finished, but after more than --slow seconds (listed, not a failure)
  bad msgs  it refused the file, but its error was not exactly one line starting with the path
  accepted  it exited 0 (the mutation left a valid file, or hit bytes nobody reads)
and the peak memory of any single run. `inspect` runs on a file only after `verify`
accepted it (it reads everything and computes norms; on a refused file it repeats the
same checks), unless --all-commands. --jobs runs files in parallel. Exit status 0 only when there are no crashes, hangs
or bad messages. Files that fail are kept (--keep-dir) so they can be replayed.

  tools/crafted_checkpoints.py --engine build/engine -n 10000
  tools/crafted_checkpoints.py --engine build/engine -n 300 --seed 7 --keep-dir out/crafted
"""
import argparse
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_BLOCK = 512
MAGIC = b"ENGINE-CHECKPOINT\n"


def header_fields(data):
    text = data[:USER_BLOCK].split(b"\0", 1)[0].decode("ascii")
    fields = {}
    for line in text.splitlines()[1:]:
        key, _, value = line.partition(" ")
        fields[key] = value
    return fields


def reseal(payload, metadata_bytes, format_version=2):
    """The version-2 header for `payload`, section 1.1 of the format."""
    text = (
        "ENGINE-CHECKPOINT\nformat_version %d\nuserblock_bytes 512\npayload_bytes %d\n"
        "metadata_bytes %d\nmetadata_crc32 %08x\npayload_crc32 %08x\n"
        % (format_version, len(payload), metadata_bytes,
           zlib.crc32(payload[:metadata_bytes]) & 0xFFFFFFFF, zlib.crc32(payload) & 0xFFFFFFFF)
    ).encode()
    text += b"header_crc32 %08x\n" % (zlib.crc32(text) & 0xFFFFFFFF)
    return text + b"\0" * (USER_BLOCK - len(text)) + payload


INTERESTING = [b"\xff" * 8, b"\x00" * 8, b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80",
               b"\x01", b"\x00", b"\xff", b"\x7f", b"\x80", b"\xfe\xff\xff\xff\xff\xff\xff\xff",
               (1 << 28).to_bytes(8, "little"), (1 << 31).to_bytes(8, "little")]


def mutate(payload, metadata_bytes, rng):
    """1..8 mutations inside the metadata region: bit flips, random bytes, boundary values
    (addresses, lengths, counts), or a copied run of metadata bytes."""
    b = bytearray(payload)
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        at = rng.randrange(metadata_bytes)
        if kind < 0.35:
            b[at] ^= 1 << rng.randrange(8)
        elif kind < 0.6:
            b[at] = rng.randrange(256)
        elif kind < 0.9:
            v = rng.choice(INTERESTING)
            end = min(at + len(v), metadata_bytes)
            b[at:end] = v[: end - at]
        else:
            n = rng.randint(2, 32)
            src = rng.randrange(max(1, metadata_bytes - n))
            end = min(at + n, metadata_bytes)
            b[at:end] = b[src:src + (end - at)]
    return bytes(b)


def run(cmd, timeout):
    """(status, stderr, seconds): status is an int exit code, 'signal N' or 'timeout'."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return "timeout", b"", time.time() - t0
    if p.returncode < 0:
        return "signal %d (%s)" % (-p.returncode, signal.Signals(-p.returncode).name), err, time.time() - t0
    return p.returncode, err, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default=os.path.join(ROOT, "build", "engine"))
    ap.add_argument("-n", type=int, default=300, help="number of crafted files")
    ap.add_argument("--base", action="append",
                    help="checkpoint(s) to mutate (default: the v2 fixture and the fuzz seed)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per command")
    ap.add_argument("--commands", default="verify,inspect")
    ap.add_argument("--keep-dir", help="copy every file that crashed, hung or gave a bad message here")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--all-commands", action="store_true",
                    help="run every command on every file, not only after the previous one accepted it")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--slow", type=float, default=10.0,
                    help="report runs that finished but took longer than this many seconds")
    a = ap.parse_args()
    bases = a.base or [os.path.join(ROOT, "tests/data/checkpoint_v2_cpu_mid_epoch.h5"),
                       os.path.join(ROOT, "tests/fuzz/corpus/checkpoint/tiny.h5")]
    commands = a.commands.split(",")
    loaded = []
    for path in bases:
        data = open(path, "rb").read()
        f = header_fields(data)
        payload = data[USER_BLOCK:]
        meta = int(f.get("metadata_bytes", len(payload)))
        assert data == reseal(payload, meta, int(f["format_version"])) or f["format_version"] == "1", \
            "%s: this script's reseal does not reproduce the header" % path
        loaded.append((payload, meta))
    if a.keep_dir:
        os.makedirs(a.keep_dir, exist_ok=True)
    counts = {"files": 0, "runs": 0, "crashes": 0, "hangs": 0, "bad_messages": 0, "accepted": 0,
              "refused": 0, "slow": 0}
    slowest = [0.0]
    failures = {}
    peak_kb, peak_file = 0, None
    start = time.time()
    lock = threading.Lock()
    done = [0]

    def one(i, tmp):
        nonlocal peak_kb, peak_file
        payload, meta = loaded[i % len(loaded)]
        with lock:  # one random stream, so a seed gives the same files whatever --jobs is
            data = reseal(mutate(payload, meta, random.Random(a.seed * 1000003 + i)), meta)
        path = os.path.join(tmp, "crafted_%05d.h5" % i)
        with open(path, "wb") as out:
            out.write(data)
        for cmd in commands:
            status, err, seconds = run([a.engine, cmd, path], a.timeout)
            problem = None
            with lock:
                counts["runs"] += 1
                if seconds > a.slow and status != "timeout":
                    counts["slow"] += 1
                    slowest[0] = max(slowest[0], seconds)
                    if not a.quiet:
                        print("%s %s: slow, %.1fs, exit %s: %s" % (cmd, os.path.basename(path), seconds, status,
                                                              err.decode("utf-8", "replace").strip()[:200]), flush=True)
                maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                if maxrss > peak_kb:
                    peak_kb, peak_file = maxrss, "%s %s" % (cmd, os.path.basename(path))
                if status == "timeout":
                    counts["hangs"] += 1
                    problem = "hang (> %gs)" % a.timeout
                elif isinstance(status, str):
                    counts["crashes"] += 1
                    problem = status
                elif status == 0:
                    counts["accepted"] += 1
                else:
                    counts["refused"] += 1
                    text = err.decode("utf-8", "replace")
                    lines = text.rstrip("\n").split("\n")
                    if len(lines) != 1 or not text.endswith("\n") or path not in lines[0]:
                        counts["bad_messages"] += 1
                        problem = "bad message: %r" % text[:300]
                if problem:
                    kind = problem.split(":")[0]
                    failures[kind] = failures.get(kind, 0) + 1
                    kept = ""
                    if a.keep_dir:
                        kept = os.path.join(a.keep_dir, os.path.basename(path))
                        shutil.copyfile(path, kept)
                    if not a.quiet:
                        print("%s %s: %s %s" % (cmd, os.path.basename(path), problem,
                                                ("(kept: %s)" % kept) if kept else ""), flush=True)
            if status != 0 and not a.all_commands:
                break
        os.unlink(path)
        with lock:
            counts["files"] += 1
            done[0] += 1
            if not a.quiet and done[0] % 500 == 0:
                print("... %d files, %d crashes, %d hangs, %.0fs" % (done[0], counts["crashes"],
                                                                    counts["hangs"], time.time() - start),
                      flush=True)

    with tempfile.TemporaryDirectory(prefix="crafted-") as tmp:
        with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            for f in [pool.submit(one, i, tmp) for i in range(a.n)]:
                f.result()
    print("crafted checkpoints: %(files)d files, %(runs)d runs: %(crashes)d crashes, %(hangs)d hangs, "
          "%(bad_messages)d bad messages, %(refused)d refused, %(accepted)d accepted" % counts)
    if failures:
        print("by kind: " + ", ".join("%s: %d" % kv for kv in sorted(failures.items())))
    if counts["slow"]:
        print("slow runs (finished, over %gs): %d, the slowest %.1fs" % (a.slow, counts["slow"], slowest[0]))
    print("peak memory of one run: %.0f MB (%s); %.0fs" % (peak_kb / 1024, peak_file, time.time() - start))
    return 0 if counts["crashes"] == counts["hangs"] == counts["bad_messages"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
