#!/usr/bin/env python3
"""Pins the engine's own transcendentals (kernels/det_math.h) to exact bits.

Writes tests/data/det_golden.inc: for each input, the bits det::exp, det::log, det::cos
and det::pow_int give today (read from the engine's det_dump tool) and their error
against the exact value, computed with mpmath at 400 bits. test_det_math checks every
entry bit for bit on each CPU path. A change of these bits is a change of the engine's
definition, visible in checkpoints: regenerate only on purpose, and say so in the commit.

    tools/det_golden.py build/tests/det_dump [tests/data/det_golden.inc]

Needs mpmath (Debian: python3-mpmath).
"""
import datetime
import math
import struct
import subprocess
import sys

import mpmath

mpmath.mp.prec = 400


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def double(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]


class XorShift:  # the inputs' own fixed stream: the table is the same on every run
    def __init__(self, seed):
        self.x = seed

    def uniform(self, lo, hi):
        x = self.x
        x ^= (x << 13) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 7
        x ^= (x << 17) & 0xFFFFFFFFFFFFFFFF
        self.x = x
        return lo + (hi - lo) * ((x >> 11) / 9007199254740992.0)


INF, NAN = float("inf"), float("nan")
DBL_MIN, DENORM_MIN, DBL_MAX = 2.2250738585072014e-308, 5e-324, 1.7976931348623157e308
rng = XorShift(20261205)

inputs = []  # (function, x, n)
for x in [0.0, -0.0, INF, -INF, NAN, 1.0, -1.0, 0.5, -0.5, math.log(2), -math.log(2) / 2, math.log(2) / 2,
          1e-300, -1e-300, DENORM_MIN, 2.0**-30, -(2.0**-30), 10.0, -10.0, 50.0, -50.0, 100.0, -100.0,
          700.0, 709.0, 709.78, 709.782712893384, 709.7827128933841, 710.0, -700.0, -708.39, -708.4,
          -710.0, -720.0, -740.0, -744.4, -745.0, -745.1332191019412, -745.1332191019413, -746.0]:
    inputs.append(("exp", x, 0))
inputs += [("exp", rng.uniform(-50.0, 0.0), 0) for _ in range(48)]  # the cross-entropy's range
inputs += [("exp", rng.uniform(-700.0, 700.0), 0) for _ in range(16)]
for x in [1.0, 0.0, -0.0, -1.0, INF, -INF, NAN, 0.5, 2.0, 10.0, 0.1, math.e, 1.0 + 2.0**-52, 1.0 - 2.0**-53,
          0.7071067811865476, 0.7071067811865475, 1.4142135623730951, DBL_MIN, DENORM_MIN, 1e-310, DBL_MAX,
          1e300, 1e-300]:
    inputs.append(("log", x, 0))
inputs += [("log", rng.uniform(1.0, 100.0), 0) for _ in range(32)]
inputs += [("log", math.ldexp(rng.uniform(0.5, 1.0), int(rng.uniform(-1000, 1000))), 0) for _ in range(16)]
for x in [0.0, -0.0, math.pi, math.pi / 2, -math.pi / 2, math.pi / 4, 1.0, -1.0, 0.5, 3.0, INF, -INF, NAN,
          1e6, -1e6, 1000.0]:
    inputs.append(("cos", x, 0))
inputs += [("cos", math.pi * e / 15, 0) for e in range(16)]  # the cosine schedule's 15 epochs
inputs += [("cos", rng.uniform(0.0, math.pi), 0) for _ in range(32)]
for beta in [0.9, 0.999]:
    for t in [1, 2, 3, 10, 100, 1000, 12345, 1000000]:
        inputs.append(("pow_int", beta, t))
inputs += [("pow_int", 0.5, 0), ("pow_int", 2.0, 10), ("pow_int", 0.99, 5000)]


# Hashed streams (tests/det_golden.h): a million inputs each, pinned by one hash of the
# outputs, so that a change moving one result in a million shows (a last-digit change of
# det::exp's 1/6 moves about 0.2 % of its results; the table above alone may miss it).
# (function, draw, lo, hi, n_max, count, seed, what)
streams = [
    ("exp", "uniform", -50.0, 0.0, 1, 1000000, 1, "the cross-entropy's range"),
    ("exp", "uniform", -745.2, 709.8, 1, 1000000, 2, "the whole domain"),
    ("log", "binades", -1073.0, 1024.0, 1, 1000000, 3, "every binade, subnormals included"),
    ("log", "uniform", 1.0, 100.0, 1, 1000000, 4, "the cross-entropy's sums"),
    ("cos", "uniform", 0.0, math.pi, 1, 1000000, 5, "the cosine schedule's range"),
    ("cos", "uniform", -1e4, 1e4, 1, 1000000, 6, "beyond it"),
    ("pow_int", "uniform", 0.9, 1.0, 100000, 200000, 7, "Adam's beta^t"),
]


def exact(fn, x, n):
    v = mpmath.mpf(x)
    if fn == "exp":
        return mpmath.exp(v)
    if fn == "log":
        return mpmath.log(v)
    if fn == "cos":
        return mpmath.cos(v)
    return v**n


def error_ulps(got, fn, x, n):
    """|got - exact| in units in the last place of the exact value; None where the
    result is special (NaN, infinite or zero) and exact in that sense."""
    if math.isnan(x) or math.isinf(x) or (fn == "log" and x <= 0):
        return None
    v = exact(fn, x, n)
    rounded = float(v)  # correct rounding to double
    if math.isinf(rounded) or v == 0:
        return 0.0 if got == rounded else float("inf")
    e = int(mpmath.floor(mpmath.log(abs(v), 2)))
    ulp = mpmath.mpf(2) ** max(e - 52, -1074)
    return float(abs(mpmath.mpf(got) - v) / ulp)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    dump, out = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "tests/data/det_golden.inc"
    request = "".join(f"{fn} 0x{bits(x):016x} {n}\n" for fn, x, n in inputs)
    request += "".join(f"stream {fn} {draw} {lo!r} {hi!r} {n_max} {count} {seed}\n"
                       for fn, draw, lo, hi, n_max, count, seed, _ in streams)
    answer = subprocess.run([dump], input=request, capture_output=True, text=True, check=True).stdout.split("\n")
    rows, worst = [], {}
    stream_rows = []
    for (fn, draw, lo, hi, n_max, count, seed, what), line in zip(streams, answer[len(inputs):]):
        word, h = line.split()
        assert word == "stream", line
        stream_rows.append(f"    {{DetFn::{'PowInt' if fn == 'pow_int' else fn.capitalize()}, DetDraw::{draw.capitalize()}, "
                           f"{lo!r}, {hi!r}, {n_max}, {count}, {seed}ull, {h}ull}},  // {fn}: {what}")
    for (fn, x, n), line in zip(inputs, answer):
        name, xin, nn, yout = line.split()
        assert name == fn and int(xin, 16) == bits(x) and int(nn) == n, line
        y = double(int(yout, 16))
        err = error_ulps(y, fn, x, n)
        if err is not None:
            worst[fn] = max(worst.get(fn, 0.0), err)
        rows.append(f"    {{DetFn::{fn.capitalize() if fn != 'pow_int' else 'PowInt'}, 0x{bits(x):016x}ull, {n}, "
                    f"0x{int(yout, 16):016x}ull, {'-1' if err is None else f'{err:.3f}'}}},  // {fn}({x!r}"
                    f"{', ' + str(n) if fn == 'pow_int' else ''}) = {y!r}")
    today = datetime.date.today().isoformat()
    summary = ", ".join(f"{fn} {worst[fn]:.3f}" for fn in ["exp", "log", "cos", "pow_int"])
    with open(out, "w") as f:
        f.write(f"// Generated by tools/det_golden.py on {today} with mpmath {mpmath.__version__} at "
                f"{mpmath.mp.prec} bits. Do not edit.\n")
        f.write("// The bits of kernels/det_math.h's functions on these inputs are the engine's definition:\n")
        f.write("// tests/test_det_math.cpp checks each on every CPU path. Columns: function, input bits,\n")
        f.write("// n (pow_int), output bits, error in ulps of the exact value (-1: a special value, exact).\n")
        f.write(f"// Largest error in this table, ulps: {summary}.\n")
        f.write("const DetGoldenEntry kDetGolden[] = {\n" + "\n".join(rows) + "\n};\n\n")
        f.write("// Hashed streams (tests/det_golden.h): function, draw, lo, hi, n_max, count, seed, hash.\n")
        f.write("const DetGoldenStream kDetGoldenStreams[] = {\n" + "\n".join(stream_rows) + "\n};\n")
    print(f"det_golden: {len(rows)} entries and {len(stream_rows)} streams written to {out}; "
          f"largest error (ulps): {summary}")


if __name__ == "__main__":
    main()
