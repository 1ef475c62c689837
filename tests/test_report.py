#!/usr/bin/env python3
"""`engine report` rendered in a real headless browser (run by CTest as py_test_report).

Trains a 15-epoch run on a small subset through the CLI, damages one milestone file,
runs `engine report`, then has Debian's chromium load the page (--dump-dom and
--screenshot) and checks what it rendered: four chart SVGs, each with its curve over
all 15 epochs, visible in the screenshot in the curves' own colours; the 10x10
confusion matrix summing to the test count; the config; the checkpoint table with the
damaged file's error. Also: the page fetches nothing, the metrics fall back to last.h5
without metrics.jsonl, and bad run directories are one-line errors.

Environment: ENGINE_BIN, ENGINE_SOURCE_DIR, ENGINE_TEST_TMP (set by tests/CMakeLists.txt).
Exit 77 (skipped) when chromium or the dataset is missing.
"""

import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zlib

SKIP = 77
DATA_DIR = os.environ.get("ENGINE_DATA_DIR", "/usr/share/datasets/fashion-mnist")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SOURCE = os.environ.get("ENGINE_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.environ.get("ENGINE_BIN") or os.path.join(SOURCE, "build", "engine")
EPOCHS = 15
TEST_COUNT = 600
# The curves' colours in apps/report/report.cpp, one per chart.
CHART_COLOURS = {
    "chart-loss": [(31, 119, 180), (255, 127, 14)],   # train_loss, val_loss
    "chart-accuracy": [(44, 160, 44)],                # val_acc
    "chart-lr": [(214, 39, 40)],                      # lr
    "chart-loss-scale": [(140, 86, 75)],              # loss_scale
}

if CHROMIUM is None:
    print("skipped: chromium is not installed (apt-get install chromium; .ci/packages.txt lists it)")
    sys.exit(SKIP)
if not os.path.isdir(DATA_DIR):
    print("skipped: dataset directory %s is missing" % DATA_DIR)
    sys.exit(SKIP)


def fail(msg, output=None):
    if output:
        print(output.rstrip())
    print("FAIL: %s" % msg)
    sys.exit(1)


def run(cmd, what, expect_rc=0, timeout=600):
    print("$ %s" % " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="2"))
    elapsed = time.monotonic() - t0
    print("  (exit %d, %.1fs)" % (proc.returncode, elapsed))
    if expect_rc is None:
        if proc.returncode == 0:
            fail("%s exited 0, expected a failure" % what, proc.stdout)
    elif proc.returncode != expect_rc:
        fail("%s exited %d, expected %d" % (what, proc.returncode, expect_rc), proc.stdout)
    return proc.stdout, elapsed


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.text = [], []

    def iter(self, tag=None):
        for c in self.children:
            if tag is None or c.tag == tag:
                yield c
            yield from c.iter(tag)

    def all_text(self):
        return "".join(self.text) + "".join(c.all_text() for c in self.children)

    def by_id(self, id_):
        return next((n for n in self.iter() if n.attrs.get("id") == id_), None)


class TreeBuilder(html.parser.HTMLParser):
    VOID = {"meta", "br", "img", "input", "link", "hr", "col", "source", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#document", [], None)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text.append(data)


def parse_html(text):
    b = TreeBuilder()
    b.feed(text)
    b.close()
    return b.root


def png_pixels(path):
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("%s is not a PNG" % path)
    at, idat = 8, b""
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
            if depth != 8 or colour not in (2, 6) or interlace:
                fail("unexpected PNG format depth %d colour %d interlace %d" % (depth, colour, interlace))
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        at += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def colour_count(rows, bpp, colour):
    needle = bytes(colour)
    count = 0
    for row in rows:
        for x in range(0, len(row), bpp):
            if row[x:x + 3] == needle:
                count += 1
    return count


def chromium(args, tmp, what):
    profile = tempfile.mkdtemp(prefix="chromium-profile.", dir=tmp)
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--user-data-dir=%s" % profile] + args
    print("$ %s" % " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=180)
    if proc.returncode != 0:
        fail("chromium (%s) exited %d" % (what, proc.returncode), proc.stderr[-3000:])
    return proc.stdout


def check_page(dom, metrics, epochs):
    doc = parse_html(dom)
    svgs = {n.attrs.get("id"): n for n in doc.iter("svg")}
    for chart_id, colours in CHART_COLOURS.items():
        svg = svgs.get(chart_id)
        if svg is None:
            fail("the rendered DOM has no <svg id=%s>" % chart_id)
        paths = [p for p in svg.iter("path") if "series" in p.attrs.get("class", "")]
        if len(paths) < len(colours):
            fail("%s: %d curves, expected %d" % (chart_id, len(paths), len(colours)))
        for p in paths[:len(colours)]:
            points = re.findall(r"[ML]\s*(-?[0-9.]+) (-?[0-9.]+)", p.attrs.get("d", ""))
            if len(points) != epochs:
                fail("%s: curve %s has %d points, expected %d" % (chart_id, p.attrs.get("data-name"), len(points), epochs))
            xs = [float(x) for x, _ in points]
            if xs != sorted(xs) or xs[0] >= xs[-1]:
                fail("%s: x coordinates do not advance with the epochs" % chart_id)
        ticks = [t for t in svg.iter("text") if t.attrs.get("class") in ("xtick", "ytick")]
        labels = [t.all_text() for t in svg.iter("text") if t.attrs.get("class") in ("xlabel", "ylabel")]
        if len(ticks) < 4 or labels[:1] != ["epoch"] or len(labels) != 2:
            fail("%s: axes need ticks and labels, got %d ticks, labels %r" % (chart_id, len(ticks), labels))
    # The values behind the loss curve are the metrics: the lowest train_loss point is
    # the lowest y on screen (highest y coordinate is the smallest value).
    loss_path = next(p for p in svgs["chart-loss"].iter("path") if p.attrs.get("data-name") == "train_loss")
    ys = [float(y) for _, y in re.findall(r"[ML]\s*(-?[0-9.]+) (-?[0-9.]+)", loss_path.attrs["d"])]
    train = [m["train_loss"] for m in metrics]
    if ys.index(max(ys)) != train.index(min(train)) or ys.index(min(ys)) != train.index(max(train)):
        fail("the train_loss curve does not follow metrics.jsonl")
    acc_paths = [p.attrs.get("data-name", "") for p in svgs["chart-accuracy"].iter("path")]
    if not any(name.startswith("test_acc") for name in acc_paths):
        fail("the accuracy chart has no test accuracy line: %r" % acc_paths)

    table = doc.by_id("confusion")
    if table is None:
        fail("no confusion-matrix table")
    # The classes are labelled with the names the dataset gives (Dataset::class_names).
    heads = [th.all_text() for th in table.iter("th")]
    for name in ("0T-shirt/top", "9Ankle boot"):
        if not any(h.replace(" ", "").replace("\n", "") == name.replace(" ", "") for h in heads):
            fail("the confusion matrix has no column labelled %r: %r" % (name, heads))
    rows = [r for r in table.iter("tr") if any(True for _ in r.iter("td"))]
    cells = [[int(td.all_text()) for td in r.iter("td") if "cm" in td.attrs.get("class", "")] for r in rows]
    if len(cells) != 10 or any(len(r) != 10 for r in cells):
        fail("the confusion matrix is %d rows of %r cells, expected 10x10" % (len(cells), [len(r) for r in cells]))
    total = sum(map(sum, cells))
    if total != TEST_COUNT:
        fail("the confusion matrix sums to %d, expected the %d test images" % (total, TEST_COUNT))
    diagonal = sum(cells[i][i] for i in range(10))
    print("  confusion matrix: 10x10, %d images, %d on the diagonal" % (total, diagonal))
    if diagonal <= total // 10:
        fail("the diagonal (%d of %d) is no better than chance" % (diagonal, total))

    config = doc.by_id("config")
    if config is None:
        fail("no config block")
    cfg = json.loads(config.all_text())
    if cfg["train"]["epochs"] != epochs or cfg["data"]["test_limit"] != TEST_COUNT:
        fail("the config block does not hold the run's config: %r" % cfg["train"])

    ck = doc.by_id("checkpoints")
    if ck is None:
        fail("no checkpoint table")
    rows = {}
    for tr in ck.iter("tr"):
        tds = [td.all_text().strip() for td in tr.iter("td")]
        if tds:
            rows[tds[0]] = tds
    return rows


def main():
    if not os.path.exists(ENGINE):
        fail("engine binary %s does not exist" % ENGINE)
    base = os.environ.get("ENGINE_TEST_TMP") or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="report.", dir=base)
    try:
        run_dir = os.path.join(tmp, "run")
        _, train_s = run([ENGINE, "train", os.path.join(SOURCE, "configs", "mnist.json"), "--device", "cpu",
                          "--run-dir", run_dir, "--set", "data.dir=%s" % DATA_DIR,
                          "--set", "train.epochs=%d" % EPOCHS, "--set", "train.early_stopping.patience=0",
                          "--set", "data.train_limit=192", "--set", "data.val_split=128",
                          "--set", "data.test_limit=%d" % TEST_COUNT, "--set", "data.batch_size=64",
                          "--set", "checkpoint.every_n_epochs=5", "--set", "checkpoint.verify=false"],
                         "engine train")
        with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
            lines = [json.loads(l) for l in fh if l.strip()]
        metrics = [l for l in lines if "epoch" in l]
        if [m["epoch"] for m in metrics] != list(range(1, EPOCHS + 1)):
            fail("metrics.jsonl epochs %r" % [m["epoch"] for m in metrics])

        # A damaged milestone shows its error in the checkpoint table.
        damaged = os.path.join(run_dir, "epoch_0010.h5")
        with open(damaged, "r+b") as fh:
            fh.seek(os.path.getsize(damaged) // 2)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0xFF]))

        out, report_s = run([ENGINE, "report", run_dir, "--device", "cpu"], "engine report")
        if report_s > 60:
            fail("engine report took %.1fs (> 60 s)" % report_s)
        page = os.path.join(run_dir, "report.html")
        if page not in out:
            fail("engine report did not name %s" % page, out)
        with open(page, encoding="utf-8") as fh:
            source = fh.read()
        # Self-contained: nothing to fetch (the SVG namespace is a name, not a request).
        external = re.findall(r"""(?:src|href)\s*=|<script|<link|@import|url\(|https?://(?!www\.w3\.org/2000/svg)""", source)
        if external:
            fail("the report refers to outside resources: %r" % external[:5])

        page_url = "file://" + os.path.abspath(page)
        dom = chromium(["--dump-dom", page_url], tmp, "dump-dom")
        rows = check_page(dom, metrics, EPOCHS)
        want = ["last.h5", "best.h5", "epoch_0005.h5", "epoch_0010.h5", "epoch_0015.h5"]
        if sorted(rows) != sorted(want):
            fail("checkpoint table lists %r, expected %r" % (sorted(rows), sorted(want)))
        for name, tds in rows.items():
            integrity = tds[-1]
            if name == "epoch_0010.h5":
                if integrity == "ok" or "epoch_0010.h5" not in integrity:
                    fail("the damaged epoch_0010.h5 shows integrity %r" % integrity)
            elif integrity != "ok":
                fail("%s shows integrity %r" % (name, integrity))
        if rows["last.h5"][1] != str(EPOCHS) or rows["epoch_0005.h5"][1] != "5":
            fail("checkpoint epochs: %r" % rows)
        print("  checkpoint table: %s" % ", ".join("%s=%s" % (k, v[-1][:40]) for k, v in sorted(rows.items())))

        shot = os.path.join(tmp, "report.png")
        chromium(["--window-size=1300,1800", "--hide-scrollbars", "--screenshot=%s" % shot, page_url], tmp, "screenshot")
        w, h, bpp, pixels = png_pixels(shot)
        for chart_id, colours in CHART_COLOURS.items():
            for colour in colours:
                n = colour_count(pixels, bpp, colour)
                print("  screenshot %dx%d: %d pixels of %s's colour %r" % (w, h, n, chart_id, colour))
                if n < 40:
                    fail("the screenshot shows no %s curve in colour %r (%d pixels)" % (chart_id, colour, n))
        if os.environ.get("REPORT_KEEP_SCREENSHOT"):
            shutil.copy(shot, os.environ["REPORT_KEEP_SCREENSHOT"])

        # Without metrics.jsonl the metrics come from last.h5 (no best.h5 here: a note, exit 0).
        bare = os.path.join(tmp, "bare")
        os.makedirs(bare)
        shutil.copy(os.path.join(run_dir, "last.h5"), bare)
        out, _ = run([ENGINE, "report", bare, "-o", os.path.join(tmp, "bare.html")], "report from last.h5")
        if "report of %d epoch(s)" % EPOCHS not in out or "best.h5" not in out:
            fail("the fallback report did not use last.h5's %d epochs or note the missing best.h5" % EPOCHS, out)
        with open(os.path.join(tmp, "bare.html"), encoding="utf-8") as fh:
            bare_doc = parse_html(fh.read())
        curve = next(p for p in bare_doc.by_id("chart-lr").iter("path") if "series" in p.attrs.get("class", ""))
        if curve.attrs.get("data-points") != str(EPOCHS):
            fail("the fallback lr curve has %s points" % curve.attrs.get("data-points"))

        # Bad run directories: one line naming the path, non-zero exit.
        empty = os.path.join(tmp, "empty")
        os.makedirs(empty)
        for target in (os.path.join(tmp, "absent"), empty):
            out, _ = run([ENGINE, "report", target], "report of %s" % target, expect_rc=None)
            if out.count("\n") != 1 or target not in out:
                fail("expected one line naming %s" % target, out)
        print("OK: 15-epoch run trained in %.1fs, report in %.1fs, rendered by %s" % (train_s, report_s, CHROMIUM))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
