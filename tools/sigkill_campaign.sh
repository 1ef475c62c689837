#!/usr/bin/env bash
# SIGKILLs at random moments against the memory tier (docs/recovery.md, "The memory
# tier"): a run with checkpoint.memory_tier is killed with SIGKILL again and again,
# relaunched each time with the same command, and must
#   - resume at most one step behind the last step it recorded before the kill (the
#     last sound line of step_digests.jsonl, written before that step's slot),
#   - never resume from a damaged slot (the relaunch checks every slot's digest, and the
#     run's own checks would part from the straight run's bits otherwise),
#   - end with a last.h5 bit-identical to a straight run's (engine diff).
#
#   tools/sigkill_campaign.sh [--kills N] [--limit IMAGES] [--epochs E] [--engine PATH] [--keep]
#
# Defaults: 200 kills, 4096 training images, 40 epochs (1280 steps of 128 images), early stopping off, no
# mid-epoch saves (the disk holds only epoch ends: every mid-epoch resume comes from the
# memory tier). Each kill lands 0 to 0.4 s after a launch has recorded its first new step
# (in a step, or during a slot's write), and each such kill is followed by a relaunch
# killed as soon as it says where it resumes (before its first step). Exit 0 when every
# check held.
set -euo pipefail

die() { echo "sigkill_campaign.sh: $*" >&2; exit 1; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
kills=200
limit=4096
epochs=40
engine="$root/build/engine"
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kills) [[ $# -ge 2 ]] || die "--kills needs a value"; kills="$2"; shift 2 ;;
    --limit) [[ $# -ge 2 ]] || die "--limit needs a value"; limit="$2"; shift 2 ;;
    --epochs) [[ $# -ge 2 ]] || die "--epochs needs a value"; epochs="$2"; shift 2 ;;
    --engine) [[ $# -ge 2 ]] || die "--engine needs a value"; engine="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$engine" ]] || die "no engine at $engine (build it, or give --engine)"
[[ "$kills" =~ ^[0-9]+$ ]] || die "--kills takes a count"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sigkill_campaign.XXXXXX")"
pid=""
cleanup() {
  local rc=$?
  [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null
  if [[ $keep == 1 || $rc != 0 && -n ${SIGKILL_CAMPAIGN_KEEP_FAILED:-} ]]; then
    echo "sigkill_campaign.sh: kept $tmp" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
mkdir -p "$tmp/shm"
data=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
if ! ls "$data"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "sigkill_campaign.sh: skipping: no Fashion-MNIST in $data (apt-get install dataset-fashion-mnist)"
  exit 77
fi
common=(train "$root/configs/mnist.json" --device cpu --set "data.dir=$data" --set "data.train_limit=$limit"
        --set data.val_split=512 --set data.test_limit=512 --set "train.epochs=$epochs" --set train.early_stopping.patience=0
        --set checkpoint.every_n_epochs=null --set logging.tensorboard=false --set checkpoint.verify=false)
steps_per_epoch=$(( (limit + 127) / 128 ))

"$engine" "${common[@]}" --run-dir "$tmp/straight" >"$tmp/straight.log" 2>&1 ||
  { cat "$tmp/straight.log" >&2; die "the straight run failed"; }

# The last step step_digests.jsonl records soundly (a torn last line is not counted).
last_recorded() {
  /usr/bin/python3 - "$1/step_digests.jsonl" <<'PY'
import json, sys, zlib
step = 0
try:
    data = open(sys.argv[1], "rb").read()
except FileNotFoundError:
    data = b""
for line in data.split(b"\n")[:-1]:
    crc, _, text = line.partition(b" ")
    if len(crc) != 8 or int(crc, 16) != zlib.crc32(text):
        break
    step = json.loads(text)["step"]
print(step)
PY
}

run=(env OMP_NUM_THREADS=2 "$engine" "${common[@]}" --run-dir "$tmp/run" --set "checkpoint.memory_tier=$tmp/shm")
from_memory=0; from_disk=0; over=0; fresh=0; worst=0; done_early=0
lines_in() { if [[ -f $1 ]]; then wc -l <"$1"; else echo 0; fi; }
for ((k = 1; k <= kills; ++k)); do
  before=$(lines_in "$tmp/run/step_digests.jsonl")
  "${run[@]}" >"$tmp/out" 2>&1 &
  pid=$!
  # Killed in training, whatever the machine's speed: once the run has recorded a step
  # past the steps the log held at its launch, then 0 to 0.4 s on (in a step, or in a
  # slot's write). Kills before the first step are the relaunches' own (below).
  deadline=$((SECONDS + 120))
  while (( SECONDS < deadline )) && kill -0 "$pid" 2>/dev/null &&
        (( $(lines_in "$tmp/run/step_digests.jsonl") <= before )); do
    sleep 0.01
  done
  sleep "$(printf '0.%03d' $((RANDOM % 400)))"
  if ! kill -KILL "$pid" 2>/dev/null; then  # it ended first: the run is complete
    wait "$pid" || { cat "$tmp/out" >&2; die "kill $k: the run failed"; }
    pid=""; done_early=1; break
  fi
  wait "$pid" 2>/dev/null || true
  pid=""
  recorded=$(last_recorded "$tmp/run")
  if [[ $recorded == 0 ]]; then  # killed before its first step was recorded: nothing to resume
    fresh=$((fresh + 1)); continue
  fi
  # The relaunch must say where it resumes ("resuming from ...", printed right after the
  # "training ..." line); it is killed as soon as it has, which is one more kill. A
  # relaunch that finds no sealed slot and no checkpoint (killed in the first slot's
  # write) starts over and prints its first epoch without that line.
  # Emptied here, not by the background job's redirection, which happens after the fork:
  # until then the loop below would read the previous relaunch's "resuming" line.
  : >"$tmp/relaunch"
  "${run[@]}" >>"$tmp/relaunch" 2>&1 &
  pid=$!
  deadline=$((SECONDS + 60))
  while (( SECONDS < deadline )); do
    grep -qE "^(resuming from epoch|epoch [0-9]+/)" "$tmp/relaunch" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  ended=0; kill -0 "$pid" 2>/dev/null || ended=1
  kill -KILL "$pid" 2>/dev/null || true
  status=0; wait "$pid" 2>/dev/null || status=$?
  pid=""
  line=$(grep -m1 "^resuming from epoch" "$tmp/relaunch" || true)
  if [[ -z "$line" ]] && grep -qE "^epoch [0-9]+/" "$tmp/relaunch"; then
    line="resuming from epoch 0, step 0 of epoch 1 (started over)"
  fi
  if [[ -z "$line" ]]; then
    echo "--- the relaunch's output:" >&2; cat "$tmp/relaunch" >&2; echo "--- the killed run's:" >&2; cat "$tmp/out" >&2
    if [[ $ended == 1 ]]; then
      how="exit status $status"; (( status > 128 )) && how="signal $((status - 128))"
      die "kill $k: step $recorded recorded, and the relaunch ended ($how) without saying where it resumes"
    fi
    die "kill $k: step $recorded recorded, and the relaunch did not resume within 60 s"
  fi
  e=$(echo "$line" | sed -n 's/^resuming from epoch \([0-9]*\), step \([0-9]*\) of.*/\1/p')
  s=$(echo "$line" | sed -n 's/^resuming from epoch \([0-9]*\), step \([0-9]*\) of.*/\2/p')
  resumed=$((e * steps_per_epoch + s))
  behind=$((recorded - resumed))
  (( behind > worst )) && worst=$behind
  (( behind <= 1 )) || die "kill $k: step $recorded recorded, the relaunch resumes at step $resumed: $line"
  if [[ $line == *"(started over)" ]]; then over=$((over + 1))
  elif [[ $line == *" slot "* ]]; then from_memory=$((from_memory + 1))
  else from_disk=$((from_disk + 1)); fi
done
# To the end, then against the straight run.
"${run[@]}" >"$tmp/last.log" 2>&1 || { cat "$tmp/last.log" >&2; die "the final relaunch failed"; }
"$engine" diff "$tmp/straight/last.h5" "$tmp/run/last.h5" >"$tmp/diff.log" 2>&1 ||
  { cat "$tmp/diff.log" >&2; die "the final last.h5 differs from the straight run's"; }
left=$(find "$tmp/shm" -name 'engine-*' | wc -l)
[[ $left == 0 ]] || die "the finished run left $left file(s) in the memory tier's directory"
echo "$((from_memory + from_disk + over + fresh)) kills$( [[ $done_early == 1 ]] && echo " (the run ended before the last)"):" \
     "$from_memory resumed from the memory tier, $from_disk from the disk, $over started over (killed in the first slot's write)," \
     "$fresh before any step was recorded;" \
     "at most $worst step(s) behind the last recorded; final last.h5 identical to the straight run's; tier removed"
