#!/usr/bin/env bash
# Faults under mpirun (docs/distributed.md "Faults"), 2 CPU ranks on 600 images:
#  - a rank SIGKILLed mid-run: the job ends within a bound, last.h5 is sound, and
#    `engine resume` to the end gives the straight run's last.h5 bit for bit;
#  - a rank SIGSTOPped with dist.timeout_s=6: the watchdog ends every rank no sooner
#    than the timeout and within timeout + roll call + 3 s (below), its line names the
#    rank and the timeout; resume bit-exact;
#  - a rank that fails (data.dir=/nonexistent on rank 1 only): the job ends at once,
#    one line naming rank 1 and data.dir; a save that fails on rank 0 (a file size
#    limit): exit 3 on every rank, or with on_error=continue a warning naming rank 0;
#  - a config differing on rank 1 (optimizer.lr), data differing on rank 1 (a copy of
#    the data set with one byte changed) and rank 1 resuming where rank 0 starts fresh
#    are refused, exit 2, naming what and the rank.
# The faults land mid-run on any machine, fast or loaded: the ranks are
# tests/tools/engine_paused.cpp (the engine, held at epoch 2's third step until the test
# has struck). ENGINE_TEST_BATCH_SIZE (default 72: 9 steps an epoch) makes the steps
# smaller and more numerous: a deliberately slow run.
# CTest label `mpi`.   mpi_faults.sh ENGINE MPIRUN CONFIG DATA_DIR TMP ENGINE_PAUSED
set -euo pipefail
engine="$1" mpirun="$2" config="$3" data="$4" tmp="$5" paused="$6"
source "$(dirname "$0")/job_control.sh"
[[ -d "$data" ]] || { echo "no data set at $data: skipped"; exit 77; }
command -v pgrep >/dev/null || { echo "no pgrep: skipped"; exit 77; }
rm -rf "$tmp" && mkdir -p "$tmp"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
epochs=4
batch=${ENGINE_TEST_BATCH_SIZE:-72}
hold_step=$(( (600 + batch - 1) / batch + 3 ))  # epoch 2, step 3
sets=(--set "data.dir=$data" --set data.train_limit=600 --set data.val_split=200 --set data.test_limit=200
      --set data.batch_size=$batch --set train.epochs=$epochs --set checkpoint.verify=false --set logging.tensorboard=false)
mpi=("$mpirun" --oversubscribe --bind-to none)
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { echo "${EPOCHREALTIME/,/.}"; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
within() { awk -v s="$1" -v bound="$2" 'BEGIN { exit !(s <= bound) }'; }

"$engine" train "$config" --device cpu --run-dir "$tmp/plain" "${sets[@]}" >"$tmp/plain.log" 2>&1 \
  || { cat "$tmp/plain.log"; fail "the run without mpirun failed"; }

# The pid of rank RANK among mpirun MPIRUN_PID's children (their environment says).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    # grep -z reads the NUL-separated file itself: a pipe from tr would die of SIGPIPE when
    # grep -q stops early, which pipefail turns into "no match" (an environment over one
    # pipe write made this test fail at random).
    if grep -qxz "OMPI_COMM_WORLD_RANK=$2" "/proc/$p/environ" 2>/dev/null; then echo "$p"; return; fi
  done
  fail "no process of rank $2 under mpirun $1"
}

# NAME SIGNAL BOUND_S [SETS...]: 2 ranks in the background, held after epoch 2's step 3;
# SIGNAL to rank 1, then rank 0 let go on; the job must end within BOUND_S seconds, not
# with status 0.
fault_run() {
  local name="$1" sig="$2" bound="$3"
  shift 3
  "${mpi[@]}" -np 2 "$paused" --at-step "$hold_step" --release-file "$tmp/$name.go" -- train "$config" --device cpu \
    --run-dir "$tmp/$name" "${sets[@]}" "$@" >"$tmp/$name.log" 2>&1 &
  local job=$!
  wait_for_paused_ranks "$name" 2 "$hold_step" "$tmp/$name.log" "$job"
  local victim t0 rc=0
  victim=$(rank_pid "$job" 1)
  t0=$(now)
  kill "-$sig" "$victim"
  touch "$tmp/$name.go"  # rank 0 goes on, towards the collective rank 1 will not join
  while kill -0 "$job" 2>/dev/null && within "$(seconds_since "$t0")" "$bound"; do sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then
    kill -9 "$job" "$victim" 2>/dev/null || true
    fail "$name: the job still runs $bound s after SIG$sig to rank 1"
  fi
  wait "$job" || rc=$?
  local took
  took=$(seconds_since "$t0")
  # mpirun's last SIGKILL may take a moment to land (a zombie counts as gone).
  for i in $(seq 50); do
    [[ "$(ps -o stat= -p "$victim" 2>/dev/null)" =~ ^[^Z] ]] || break
    sleep 0.1
  done
  [[ "$(ps -o stat= -p "$victim" 2>/dev/null)" =~ ^[^Z] ]] && { kill -9 "$victim"; fail "$name: rank 1 (pid $victim) outlived the job by 5 s"; }
  [[ $rc != 0 ]] || { cat "$tmp/$name.log"; fail "$name: exit status 0 after SIG$sig to rank 1"; }
  echo "$name: SIG$sig to rank 1 after step $hold_step: every rank ended ${took} s later (bound $bound s), mpirun exit $rc"
  last_took=$took
}

# NAME: last.h5 of the faulted run is sound, and resuming it under 2 ranks ends with the
# straight run's last.h5, bit for bit.
resume_matches() {
  local name="$1"
  "$engine" verify "$tmp/$name/last.h5" >/dev/null || fail "$name: last.h5 is not sound"
  "${mpi[@]}" -np 2 "$engine" resume "$tmp/$name/last.h5" --device cpu >"$tmp/$name.resume.log" 2>&1 \
    || { cat "$tmp/$name.resume.log"; fail "$name: resume failed"; }
  "$engine" diff "$tmp/plain/last.h5" "$tmp/$name/last.h5" >"$tmp/$name.diff" 2>&1 \
    || { cat "$tmp/$name.diff"; fail "$name: the resumed last.h5 differs from the straight run's"; }
  echo "$name: last.h5 sound; $(grep -m1 '^resuming' "$tmp/$name.resume.log"); resumed to the end: identical to the straight run"
}

# A SIGKILLed rank: mpirun sees it die and ends the others.
fault_run killed KILL 30
resume_matches killed

# A stopped rank: nothing dies, so only the watchdog ends the job. Rank 0, let go on,
# enters its next collective within a step (milliseconds here) and waits dist.timeout_s
# for it; then the roll call listens min(2 s, timeout) for the other ranks, which the
# stopped one never answers; then rank 0 prints its line and MPI_Abort ends the job. So
# the job ends between timeout and timeout + 2 s + slack after the SIGSTOP, where the slack
# (3 s) covers that step, mpirun's teardown of a stopped process and this loop's 0.1 s
# polling on a loaded machine. A timeout of 6 s leaves a doubled deadline (12 + 2 s) or
# a doubled roll call well outside the bound of 11 s, and a halved one below 6 s.
timeout_s=6 roll_call_s=2 slack_s=3
fault_run stopped STOP $((timeout_s + roll_call_s + slack_s)) --set dist.timeout_s=$timeout_s
within "$timeout_s" "$last_took" \
  || { cat "$tmp/stopped.log"; fail "stopped: the job ended $last_took s after the SIGSTOP, before dist.timeout_s ($timeout_s s)"; }
grep -aq 'rank 1 did not answer' "$tmp/stopped.log" && grep -aq "within $timeout_s s (dist.timeout_s)" "$tmp/stopped.log" \
  || { cat "$tmp/stopped.log"; fail "stopped: no watchdog line naming rank 1 and the $timeout_s s"; }
echo "stopped: $(grep -am1 'watchdog' "$tmp/stopped.log")"
resume_matches stopped

# MPMD: rank 0 as given, rank 1 with EXTRA... (and its run directory $rank1_dir when set);
# must end with STATUS within 20 s and say PATTERN.
mpmd_refused() {
  local name="$1" status="$2" pattern="$3" rc=0 t0
  shift 3
  t0=$(now)
  timeout 60 "${mpi[@]}" -np 1 "$engine" train "$config" --device cpu --run-dir "$tmp/$name" "${sets[@]}" \
    : -np 1 "$engine" train "$config" --device cpu --run-dir "${rank1_dir:-$tmp/$name}" "${sets[@]}" "$@" \
    >"$tmp/$name.log" 2>&1 || rc=$?
  local took
  took=$(seconds_since "$t0")
  [[ $rc == "$status" ]] || { cat "$tmp/$name.log"; fail "$name: exit status $rc, expected $status"; }
  within "$took" 20 || fail "$name: took $took s"
  grep -aq -- "$pattern" "$tmp/$name.log" || { cat "$tmp/$name.log"; fail "$name: no line saying '$pattern'"; }
  [[ ! -e "$tmp/$name/last.h5" ]] || fail "$name: a checkpoint was written"
  echo "$name: exit $rc in $took s: $(grep -am1 -- "$pattern" "$tmp/$name.log")"
}

mpmd_refused failing 1 "engine: rank 1: data directory '/nonexistent' not found (key data.dir)" --set data.dir=/nonexistent
# Rank 1 would resume (its run directory holds last.h5), rank 0 start fresh.
rank1_dir="$tmp/killed" mpmd_refused checkpoint 2 "the checkpoint rank 1 would resume from differs from rank 0's"
mpmd_refused config 2 "on rank 1: optimizer.lr = 0.02 (rank 0: " --set optimizer.lr=0.02

# A failed save on rank 0 (a file size limit below the checkpoint's size; TCP, as Open
# MPI's shared-memory segment files are larger than that too): on_error=stop ends every
# rank with the single-process status 3; on_error=continue warns, naming rank 0.
limited=(bash -c 'ulimit -f 2000; exec "$0" "$@"' "$engine")
for policy in stop continue; do
  rc=0
  timeout 120 "${mpi[@]}" --mca btl tcp,self -np 1 "${limited[@]}" train "$config" --device cpu --run-dir "$tmp/save_$policy" \
    "${sets[@]}" --set train.epochs=1 --set checkpoint.on_error=$policy \
    : -np 1 "$engine" train "$config" --device cpu --run-dir "$tmp/save_$policy" "${sets[@]}" --set train.epochs=1 \
    --set checkpoint.on_error=$policy >"$tmp/save_$policy.log" 2>&1 || rc=$?
  want=3 line="engine: rank 0: .*File too large; training stopped"
  [[ $policy == continue ]] && want=0 line="engine: rank 0: warning: .*File too large; training goes on"
  [[ $rc == "$want" ]] || { cat "$tmp/save_$policy.log"; fail "failed save ($policy): exit $rc, expected $want"; }
  grep -aq -- "$line" "$tmp/save_$policy.log" || { cat "$tmp/save_$policy.log"; fail "failed save ($policy): no line '$line'"; }
  echo "failed save ($policy): exit $rc: $(grep -am1 -o -- "$line" "$tmp/save_$policy.log" | cut -c1-120)..."
done

# The data set with one pixel of training image 3 changed (IDX: a 16-byte header).
mkdir "$tmp/data"
for f in "$data"/*; do ln -s "$f" "$tmp/data/"; done
rm -f "$tmp/data/train-images-idx3-ubyte" "$tmp/data/train-images-idx3-ubyte.gz"
if [[ -e "$data/train-images-idx3-ubyte.gz" ]]; then gzip -dc "$data/train-images-idx3-ubyte.gz" >"$tmp/data/train-images-idx3-ubyte"
else cp "$data/train-images-idx3-ubyte" "$tmp/data/"; fi
at=$((16 + 3 * 784 + 400))
byte=$(od -An -tu1 -j "$at" -N1 "$tmp/data/train-images-idx3-ubyte")
printf "\\x$(printf %02x $(((byte + 1) % 256)))" | dd of="$tmp/data/train-images-idx3-ubyte" bs=1 seek="$at" conv=notrunc status=none
mpmd_refused data 2 "the data of rank 1 differs from rank 0's" --set "data.dir=$tmp/data"
rm -rf "$tmp/data"
echo "all faults handled"
