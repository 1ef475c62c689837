#!/usr/bin/env bash
# Every CPU benchmark, each side by side with its peer, in one command; replaces, in
# place, the "Current figures" table of docs/benchmarks.md (commit, date, machine; between
# its all.sh markers) and the figures the README quotes (between theirs: the checkpoint
# I/O sentence and the epoch sentence), and changes
# nothing else. The table it replaces is not kept: git has it.
#
#   tools/bench/all.sh [--quick] [--no-write] [--build DIR] [--python PATH]
#
# Runs, in this order (each script's own output is kept in the log directory it names):
#   tools/bench/cpu_epoch.sh      one training epoch, engine vs PyTorch eager (--repeat 2)
#   tools/bench/checkpoint_io.sh  save/load of the training state vs torch.save/torch.load
#   tools/bench/async_save.sh     training-thread stall of checkpoint saves, when present
#   tools/bench/dist_epoch.sh     one epoch: engine 2 ranks vs 1 process vs PyTorch DDP
#                                 (--repeat 2; skipped with a note without mpirun)
#   tools/bench/dist_bytes.sh     bytes sent per step by the busiest rank at W = 2, 4, 8
#                                 (Open MPI's pml monitoring; W = 8 only with --quick)
# A script that does not exist is skipped with a note (in the output and the table).
# --quick: small runs to check the pipeline (cpu_epoch --limit 2048 --repeat 1,
#          checkpoint_io --rounds 2 --reps 5, async_save --rounds 1,
#          dist_epoch --limit 2048 --repeat 1); the table says
#          "quick" and its figures are not the ones to quote.
# --no-write: print the table, change no file.
# Builds engine_cli, checkpoint_bench and async_save_bench in DIR (default build/, Release) first. The
# figures are only as good as the machine is quiet: the table records the load average
# before and after, and figures taken while other work runs are not comparable.
set -euo pipefail

die() { echo "all.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$root/build"
py=/usr/bin/python3
quick=0
write=1

while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --no-write) write=0; shift ;;
    --build) [[ $# -ge 2 ]] || die "--build needs a value"; build="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || die "--python needs a value"; py="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$py" ]] || die "no Python at $py (needs Debian's python3 with python3-torch; pass --python)"

cmake --build "$build" -j2 --target engine_cli checkpoint_bench async_save_bench >/dev/null ||
  die "cannot build engine_cli, checkpoint_bench and async_save_bench in $build (configure it first: cmake -S . -B build -DCMAKE_BUILD_TYPE=Release)"

logs="$(mktemp -d "${TMPDIR:-/tmp}/bench_all.XXXXXX")"
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then commit="$commit+changes"; fi
started="$(date -u '+%Y-%m-%d %H:%M')"
machine="$(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2 / 1048576}' /proc/meminfo)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "all.sh: commit $commit, $started UTC, $machine; load average $load_before; logs in $logs"

# bench NAME SCRIPT ARGS...: runs a benchmark script into $logs/NAME.log, or notes its absence.
bench() {
  local name="$1" script="$2"; shift 2
  if [[ ! -x "$script" ]]; then
    echo "all.sh: note: $script does not exist (yet); $name skipped" | tee "$logs/$name.skipped"
    return 0
  fi
  echo "+ ${script#"$root"/} $*"
  if ! "$script" "$@" 2>&1 | tee "$logs/$name.log"; then
    die "$script failed; its output is in $logs/$name.log"
  fi
}

if [[ $quick == 1 ]]; then
  bench cpu_epoch "$here/cpu_epoch.sh" --engine "$build/engine" --python "$py" --limit 2048 --repeat 1
  bench checkpoint_io "$here/checkpoint_io.sh" --bench "$build/checkpoint_bench" --python "$py" --rounds 2 --reps 5
  bench async_save "$here/async_save.sh" --bench "$build/async_save_bench" --rounds 1
else
  bench cpu_epoch "$here/cpu_epoch.sh" --engine "$build/engine" --python "$py" --repeat 2
  bench checkpoint_io "$here/checkpoint_io.sh" --bench "$build/checkpoint_bench" --python "$py"
  bench async_save "$here/async_save.sh" --bench "$build/async_save_bench"
fi
if ! command -v mpirun >/dev/null; then
  echo "all.sh: note: no mpirun on PATH; dist_epoch skipped" | tee "$logs/dist_epoch.skipped"
elif [[ $quick == 1 ]]; then
  bench dist_epoch "$here/dist_epoch.sh" --engine "$build/engine" --python "$py" --limit 2048 --repeat 1
else
  bench dist_epoch "$here/dist_epoch.sh" --engine "$build/engine" --python "$py" --repeat 2
fi
if command -v mpirun >/dev/null; then
  bench dist_bytes "$here/dist_bytes.sh" --engine "$build/engine" --ranks "$([[ $quick == 1 ]] && echo 8 || echo "2 4 8")"
fi
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

"$py" - "$root" "$logs" "$commit" "$started" "$machine" "$load_before" "$load_after" "$quick" "$write" <<'EOF'
import os, re, sys

root, logs, commit, started, machine, before, after, quick, write = sys.argv[1:10]
quick, write = quick == "1", write == "1"

def log(name):
    p = os.path.join(logs, name + ".log")
    return open(p).read() if os.path.exists(p) else None

def find(text, pattern, what):
    m = re.search(pattern, text, re.M)
    if not m:
        sys.exit(f"all.sh: cannot find {what} in the benchmark output (pattern {pattern!r})")
    return m

def verdict(ratio, target):
    return "**yes**" if ratio <= target else "**no**"

rows = []
epoch = log("cpu_epoch")
e = find(epoch, r"^engine  epoch \(train only\):\s+([\d.]+) s\s+peak RSS\s+([\d.]+) MiB", "the engine's epoch")
t = find(epoch, r"^pytorch epoch \(train only\):\s+([\d.]+) s\s+peak RSS\s+([\d.]+) MiB", "PyTorch's epoch")
images = find(epoch, r"^threads \d+, images (\d+)", "the image count").group(1)
repeat = find(epoch, r"repeat (\d+)", "the repeat count").group(1)
time_ratio = float(e.group(1)) / float(t.group(1))
rss_ratio = float(e.group(2)) / float(t.group(2))
src = f"`cpu_epoch.sh`, {images} images, best of {repeat}"
rows.append(("CPU epoch time, engine / PyTorch eager", "≤ 0.35×",
             f"**{time_ratio:.3f}×** ({e.group(1)} s vs {t.group(1)} s; {src})", verdict(time_ratio, 0.35)))
rows.append(("CPU peak memory (RSS), engine / PyTorch", "≤ 0.3×",
             f"**{rss_ratio:.3f}×** ({e.group(2)} MiB vs {t.group(2)} MiB)", verdict(rss_ratio, 0.3)))

io = log("checkpoint_io")
ratios = {}
for what, engine_label, torch_label in (("save", "engine save_checkpoint", r"torch\.save \+ fsync"),
                                        ("load", "engine load_checkpoint", r"torch\.load")):
    em = find(io, rf"^{engine_label}\s*: median\s+([\d.]+) ms", f"the engine's {what}").group(1)
    tm = find(io, rf"^{torch_label}\s*: median\s+([\d.]+) ms", f"PyTorch's {what}").group(1)
    r = find(io, rf"^{what} ratio engine/torch: ([\d.]+) \(median of (\d+) side-by-side rounds; rounds ([\d.]+)\.\.([\d.]+), (\d+) of (\d+) <= 1\)",
             f"the {what} ratio")
    ratios[what] = float(r.group(1))
    peer = "`torch.save` + fsync" if what == "save" else "`torch.load`"
    rows.append((f"checkpoint {what}, engine / {peer}", "≤ 1×",
                 f"**{r.group(1)}×** (median of {r.group(2)} side-by-side rounds, {r.group(3)}–{r.group(4)}, "
                 f"{r.group(5)} of {r.group(6)} ≤ 1; engine {em} ms, PyTorch {tm} ms)", verdict(float(r.group(1)), 1.0)))

dist = log("dist_epoch")
if dist is not None:
    one = find(dist, r"^engine 1 process x 2 threads \(train only\):\s+([\d.]+) s", "the engine's 1-process epoch")
    two = find(dist, r"^engine (\d+) ranks x 1 thread \(train only\)\s*:\s+([\d.]+) s", "the engine's 2-rank epoch")
    ddp = find(dist, r"^pytorch DDP gloo \d+ ranks x 1 thread\s*:\s+([\d.]+) s", "PyTorch DDP's epoch")
    d_images = find(dist, r"^ranks \d+, images (\d+)", "the image count").group(1)
    d_repeat = find(dist, r"repeat (\d+)", "the repeat count").group(1)
    sent = find(dist, r"^bytes per step per rank, engine .*: sends ([\d,]+), receives ([\d,]+)", "the bytes per step")
    w, r_one, r_ddp = two.group(1), float(two.group(2)) / float(one.group(1)), float(two.group(2)) / float(ddp.group(1))
    d_src = f"`dist_epoch.sh`, {d_images} images, best of {d_repeat}"
    rows.append((f"data-parallel CPU epoch, {w} ranks / 1 process ({w} × 1 thread vs 1 × 2 threads)", "≤ 1.05×",
                 f"**{r_one:.3f}×** ({two.group(2)} s vs {one.group(1)} s; {d_src}; "
                 f"{sent.group(1)} B sent per step per rank)", verdict(r_one, 1.05)))
    rows.append((f"data-parallel CPU epoch, engine {w} ranks / PyTorch DDP (gloo, {w} ranks × 1 thread)", "≤ 0.6×",
                 f"**{r_ddp:.3f}×** ({two.group(2)} s vs {ddp.group(1)} s)", verdict(r_ddp, 0.6)))

dist_bytes = log("dist_bytes")
if dist_bytes is not None:
    for w, sent, ratio in re.findall(r"^engine\s+(\d+)\s+([\d,]+)\s+([\d.]+)\s", dist_bytes, re.M):
        if w != "8":
            continue
        rows.append(("data-parallel bytes sent per step, busiest of 8 ranks / the gradient (pml monitoring)", "≤ 2.0×",
                     f"**{ratio}×** ({sent} B; a ring allreduce 1.75×; `dist_bytes.sh`)", verdict(float(ratio), 2.0)))

extra = []
if dist is None and os.path.exists(os.path.join(logs, "dist_epoch.skipped")):
    extra.append("No `mpirun` on this machine: no data-parallel figures (`tools/bench/dist_epoch.sh`).")
stall = log("async_save")
if stall is not None:
    lines = [l for l in stall.splitlines() if re.search(r"stall|ratio|target", l, re.I)]
    extra.append("`async_save.sh` (checkpoint saves off the training thread), its summary:\n\n```\n" +
                 "\n".join(lines[-8:] or stall.splitlines()[-8:]) + "\n```")
elif os.path.exists(os.path.join(logs, "async_save.skipped")):
    extra.append("`tools/bench/async_save.sh` did not exist at this commit: no stall figures.")

mode = "`--quick`: small runs that check the pipeline, not figures to quote" if quick else "full runs"
block = [f"**Measured at commit `{commit}`, {started} UTC, by `tools/bench/all.sh` ({mode}).** "
         f"Machine: {machine}; load average before {before}, after {after}.", "",
         "| benchmark | target | measured | met? |", "|---|---|---|---|"]
block += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
if extra:
    block += [""] + extra
table = "\n".join(block)
print("\n" + table + "\n")

load_word = ("faster than" if ratios["load"] < 1 else "as fast as" if ratios["load"] == 1 else "slower than")
save_word = ("faster than" if ratios["save"] < 1 else "as fast as" if ratios["save"] == 1 else "slower than")
readme_text = (f"Saving the full training state takes {ratios['save']:.2f}× the time of `torch.save` + fsync "
               f"({save_word} PyTorch) and loading it {ratios['load']:.2f}× the time of `torch.load` "
               f"({load_word} PyTorch), medians of side-by-side rounds at commit `{commit}` "
               f"({started} UTC, load average {before.split()[0]}{', quick mode' if quick else ''}; "
               f"[docs/benchmarks.md](docs/benchmarks.md), \"Current figures\").")
if ratios["load"] > 1:
    readme_text += f" **Loading is slower than `torch.load`** ({ratios['load']:.2f}×)."
if ratios["save"] > 1:
    readme_text += f" **Saving is slower than `torch.save`** ({ratios['save']:.2f}×)."
print(readme_text)
epoch_text = (f"On {machine}, {started[:10]}: one epoch of the shipped config trains in {e.group(1)} s with "
              f"the engine's own kernels, {time_ratio:.3f}× PyTorch eager's {t.group(1)} s, measured side by side "
              f"by `tools/bench/all.sh` at `{commit}`{', quick mode' if quick else ''}")
print(epoch_text)
if not write:
    sys.exit(0)

# Every file is checked before any is written, so a missing marker changes nothing.
BEGIN, END = "<!-- all.sh: current figures begin -->", "<!-- all.sh: current figures end -->"
RB, RE = "<!-- all.sh: readme figures begin -->", "<!-- all.sh: readme figures end -->"
EB, EE = "<!-- all.sh: readme epoch begin -->", "<!-- all.sh: readme epoch end -->"
doc_path = os.path.join(root, "docs", "benchmarks.md")
readme_path = os.path.join(root, "README.md")
doc, readme = open(doc_path).read(), open(readme_path).read()
for path, text, (b_mark, e_mark) in ((doc_path, doc, (BEGIN, END)), (readme_path, readme, (RB, RE)),
                                     (readme_path, readme, (EB, EE))):
    if text.count(b_mark) != 1 or text.count(e_mark) != 1 or text.index(b_mark) > text.index(e_mark):
        sys.exit(f"all.sh: {os.path.relpath(path, root)} needs the markers {b_mark} ... {e_mark}, once each, in that order")
b, e = doc.index(BEGIN) + len(BEGIN), doc.index(END)
doc = doc[:b] + "\n" + table + "\n" + doc[e:]
for b_mark, e_mark, text in ((RB, RE, readme_text), (EB, EE, epoch_text)):
    b, e = readme.index(b_mark) + len(b_mark), readme.index(e_mark)
    readme = readme[:b] + text + readme[e:]
open(doc_path, "w").write(doc)
open(readme_path, "w").write(readme)
print(f"all.sh: wrote the current figures into docs/benchmarks.md and README.md")
EOF
