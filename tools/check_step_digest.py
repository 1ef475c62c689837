#!/usr/bin/env python3
"""Recomputes a checkpoint's step digest from what the file stores and compares it with
trainer/step_digest (docs/checkpoint-format.md, "Step digests"), with h5py and numpy only:
a reader written from the format document, not from the engine's code.

  check_step_digest.py CKPT.h5 [...]            "<path>: step G digest <hex> ok" per file
  check_step_digest.py --compute CKPT.h5 [...]  only the recomputed digest, one per line

Exit 0 when every file's stored digest matches, 1 on a mismatch (or a file without
trainer/step_digest: format_version 3 and older), 2 on a file that cannot be read."""
import json
import sys

import h5py
import numpy as np

MASK64 = (1 << 64) - 1
DIGEST_INDEX_MULTIPLIER = 0x9E3779B1
DIGEST_OFFSET = 0x6A09E667
FOLD_START = 0x6A09E667F3BCC908


class Unreadable(Exception):
    pass


def digest_words(words, first=0):
    """Sum over i of a*(a|1) mod 2^64, a = w_i ^ (DIGEST_OFFSET + (first+i)*MULTIPLIER mod 2^32)."""
    w = np.asarray(words, dtype="<u4").ravel().astype(np.uint64)
    if w.size == 0:
        return 0
    i = np.arange(first, first + w.size, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    key = (np.uint64(DIGEST_OFFSET) + i * np.uint64(DIGEST_INDEX_MULTIPLIER)) & np.uint64(0xFFFFFFFF)
    a = w ^ key  # below 2^32, so a * (a | 1) is exact in uint64
    return int(np.sum(a * (a | np.uint64(1)), dtype=np.uint64))  # numpy's uint64 sum wraps mod 2^64


def tensor_words(array):
    """A tensor's little-endian 32-bit words: one per float32; other dtypes' bytes padded with zeros."""
    array = np.asarray(array)
    if array.dtype.kind == "f" and array.dtype.itemsize == 4:
        return np.ascontiguousarray(array, dtype="<f4").view("<u4").ravel()
    raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    raw += b"\0" * (-len(raw) % 4)
    return np.frombuffer(raw, dtype="<u4")


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def fold(h, part):
    return mix64(h ^ (part & MASK64))


def group_state(group):
    """(tensors, scalars) of a state group, keys as in section 3.2 (a '/' in a key is a nested group)."""
    tensors, scalars = {}, {}

    def walk(g, prefix):
        for name, value in g.attrs.items():
            scalars[prefix + name] = value
        for name, obj in g.items():
            if isinstance(obj, h5py.Group):
                walk(obj, prefix + name + "/")
            elif obj.attrs.get("kind") == "series":
                scalars[prefix + name] = list(obj[()])
            else:
                tensors[prefix + name] = obj[()]

    walk(group, "")
    return tensors, scalars


def integer(scalars, key, where):
    value = scalars.get(key)
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise Unreadable("%s/%s is missing or not an integer" % (where, key))
    return int(value)


def compute(f):
    """(global_step, combined digest, stored digest text or None) of an open checkpoint."""
    for name in ("trainer", "rng", "model", "optimizer"):
        if name not in f:
            raise Unreadable("no group /" + name)
    tensors_t, trainer = group_state(f["trainer"])
    step = integer(trainer, "global_step", "trainer")
    epoch_in = integer(trainer, "step_in_epoch", "trainer")
    shuffle_offset = integer(trainer, "epoch_shuffle_offset", "trainer")

    h = fold(FOLD_START, step)
    h = fold(h, shuffle_offset)
    _, rng = group_state(f["rng"])
    for name in sorted(rng):  # every integer of /rng but the seed is a stream's counter
        if name != "seed" and isinstance(rng[name], (int, np.integer)):
            h = fold(h, int(rng[name]))

    loss = 0
    if step != 0:
        if "epoch_sample_loss" not in tensors_t:
            raise Unreadable("no trainer/epoch_sample_loss")
        losses = np.asarray(tensors_t["epoch_sample_loss"])
        if losses.dtype != np.float32:
            raise Unreadable("trainer/epoch_sample_loss is not float32")
        try:
            batch = int(json.loads(f.attrs["config"])["data"]["batch_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise Unreadable("no data.batch_size in the config (%s)" % e)
        n = losses.size
        if n == 0 or batch <= 0:
            raise Unreadable("an empty epoch_sample_loss or batch_size %d" % batch)
        steps_per_epoch = -(-n // batch)
        s = epoch_in if epoch_in > 0 else steps_per_epoch  # 0: an epoch-end save, its last step
        if s > steps_per_epoch:
            raise Unreadable("step_in_epoch %d beyond the epoch's %d steps" % (s, steps_per_epoch))
        start = (s - 1) * batch
        loss = digest_words(tensor_words(losses.ravel()[start:start + batch]), start)
    h = fold(h, loss)

    named = []
    for group in ("model", "optimizer"):
        tensors, _ = group_state(f[group])
        named += [(group + "/" + key, value) for key, value in tensors.items()]
    for _, value in sorted(named, key=lambda kv: kv[0].encode("utf-8")):  # the engine's byte order
        h = fold(h, digest_words(tensor_words(value)))

    stored = trainer.get("step_digest")
    if isinstance(stored, bytes):
        stored = stored.decode("utf-8", "replace")
    return step, h, stored


def main(argv):
    only_compute = "--compute" in argv
    paths = [a for a in argv if a != "--compute"]
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    status = 0
    for path in paths:
        try:
            with h5py.File(path, "r") as f:
                step, digest, stored = compute(f)
        except (OSError, Unreadable) as e:
            print("%s: cannot compute its step digest: %s" % (path, " ".join(str(e).split())))
            return 2
        hex_digest = "%016x" % digest
        if only_compute:
            print(hex_digest)
        elif stored is None:
            print("%s: step %d has no trainer/step_digest (format_version 3 or older); the tensors give %s"
                  % (path, step, hex_digest))
            status = max(status, 1)
        elif stored.lower() == hex_digest and len(stored) == 16:
            print("%s: step %d digest %s ok" % (path, step, hex_digest))
        else:
            print("%s: step %d stored %s but the tensors give %s" % (path, step, stored, hex_digest))
            status = max(status, 1)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
