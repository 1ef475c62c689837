#!/usr/bin/env bash
# Stops under mpirun (docs/distributed.md "Stops and preemption"): every rank stops at
# the same step, rank 0 saves once there, every rank exits with the same status, and a
# resume -- on another number of ranks, or without mpirun -- ends bit-identical to a
# straight run (`engine diff`). CTest label `mpi`.
# The signals land at a step chosen by the test on any machine, fast or loaded: the
# ranks are tests/tools/engine_paused.cpp (the engine, held after a step until the
# signal has reached them).
#   mpi_stops.sh ENGINE MPIRUN CONFIG DATA_DIR TMP ENGINE_PAUSED [AGREE_COST]
set -u
engine="$1" mpirun="$2" config="$3" data="$4" tmp="$5" paused="$6" agree_cost="${7:-}"
source "$(dirname "$0")/job_control.sh"
[[ -d "$data" ]] || { echo "no data set at $data: skipped"; exit 77; }
rm -rf "$tmp" && mkdir -p "$tmp"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# As mpi_identity.sh: 600 images in batches of 72 (9 steps an epoch), two epochs, no
# mid-epoch saves of their own (checkpoint.every_n_steps off). ENGINE_TEST_BATCH_SIZE
# makes the steps smaller and more numerous: a deliberately slow run.
batch=${ENGINE_TEST_BATCH_SIZE:-72}
sets=(--set "data.dir=$data" --set data.train_limit=600 --set data.val_split=200 --set data.test_limit=200
      --set data.batch_size=$batch --set train.epochs=2 --set checkpoint.verify=false --set logging.tensorboard=false
      --set checkpoint.every_n_steps=null)
# A rank left waiting would hang: every mpirun has a deadline.
mpi=(timeout -k 10 120 "$mpirun" --oversubscribe --bind-to none)
fail() { echo "FAIL: $*" >&2; exit 1; }
show() { tr '\r' '\n' <"$1" | sed 's/\x1b\[K//g' | grep -v '\[#'; }  # the log without progress bars (mpirun gives rank 0 a pty)

t0=$(date +%s.%N)
"$engine" train "$config" --device cpu --run-dir "$tmp/plain" "${sets[@]}" >"$tmp/plain.log" 2>&1 \
  || { show "$tmp/plain.log"; fail "the straight run failed"; }
plain_seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "straight run: $plain_seconds s; $(grep '^test:' "$tmp/plain.log")"

compare() {  # NAME [REF]: $tmp/NAME/last.h5 and the test metrics of $tmp/NAME.resume.log against $tmp/REF's
  local name="$1" ref="${2:-plain}"
  "$engine" diff "$tmp/$ref/last.h5" "$tmp/$name/last.h5" >"$tmp/$name.diff" 2>&1 \
    || { cat "$tmp/$name.diff"; fail "$name: last.h5 differs from the straight run"; }
  grep -q '^verdict: identical' "$tmp/$name.diff" || { cat "$tmp/$name.diff"; fail "$name: no identical verdict"; }
  diff <(grep '^test:' "$tmp/$ref.log") <(show "$tmp/$name.resume.log" | grep '^test:') \
    || fail "$name: test metrics differ"
  echo "$name: last.h5 and test metrics identical to the straight run"
}
expect_rc() {  # WANT GOT NAME LOG
  [[ "$2" == "$1" ]] || { show "$4"; fail "$3: exit status $2, expected $1"; }
}
resume() {  # NAME [mpirun -np N]: resumes $tmp/NAME/last.h5 to the end
  local name="$1"; shift
  "$@" "$engine" resume "$tmp/$name/last.h5" --device cpu >"$tmp/$name.resume.log" 2>&1 \
    || { show "$tmp/$name.resume.log"; fail "$name: the resume failed"; }
}
# The signal cases: one epoch of 1800 images (25 steps of 72), against its own straight
# run.
sig_sets=("${sets[@]}" --set data.train_limit=1800 --set train.epochs=1)
"$engine" train "$config" --device cpu --run-dir "$tmp/plain1800" "${sig_sets[@]}" >"$tmp/plain1800.log" 2>&1 \
  || { show "$tmp/plain1800.log"; fail "the straight run of 1800 images failed"; }

# Starts `engine train` of sig_sets on 2 ranks in the background into $tmp/NAME, each
# rank held after step 5 until a signal reaches it, and returns once both are held.
start_two_ranks() {
  local name="$1"
  "${mpi[@]}" -np 2 "$paused" --at-step 5 -- train "$config" --device cpu --run-dir "$tmp/$name" "${sig_sets[@]}" \
    >"$tmp/$name.log" 2>&1 &
  bg=$!
  wait_for_paused_ranks "$name" 2 5 "$tmp/$name.log" "$bg"
  mpirun_pid=$(pgrep -P "$bg" | head -n1)  # the signals go to mpirun, not to `timeout`
  [[ -n "$mpirun_pid" ]] || { show "$tmp/$name.log"; fail "$name: no mpirun under timeout"; }
}
# "stopped at epoch 1 step 6": the step after the one the ranks were held at.
mid_epoch_stop() {
  local name="$1"
  show "$tmp/$name.log" | grep -qE '^stopped at epoch 1 step 6;' \
    || { show "$tmp/$name.log"; fail "$name: no mid-epoch stop"; }
  [[ "$(show "$tmp/$name.log" | grep -c '^stopped at epoch')" == 1 ]] || fail "$name: more than one stop message"
  echo "$name: $(show "$tmp/$name.log" | grep '^stopped at epoch' | cut -d';' -f1); $(show "$tmp/$name.log" | grep '^stopped after')"
}

# (b) 4 ranks stopped by --stop-after-epochs 1 (exit 0), resumed in one process.
"${mpi[@]}" -np 4 "$engine" train "$config" --device cpu --run-dir "$tmp/b" "${sets[@]}" --stop-after-epochs 1 \
  >"$tmp/b.log" 2>&1
expect_rc 0 $? "b: mpirun -np 4 --stop-after-epochs 1" "$tmp/b.log"
resume b
compare b

# (c) One process stopped after epoch 1, resumed on 2 ranks.
"$engine" train "$config" --device cpu --run-dir "$tmp/c" "${sets[@]}" --stop-after-epochs 1 >"$tmp/c.log" 2>&1 \
  || { show "$tmp/c.log"; fail "c: the first epoch failed"; }
t0=$(date +%s.%N)
resume c "${mpi[@]}" -np 2
epoch_on_two=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')  # start, epoch 2, test
compare c

# (d) SIGTERM to mpirun mid-epoch: Open MPI forwards it to both ranks, which stop at one
# step, rank 0 saving last.h5 first, before mpirun's SIGKILL. Open MPI 4.1's mpirun then
# exits 1 whatever the ranks' status (its own abort), so only "non-zero" is asked of it.
start_two_ranks d
kill -TERM "$mpirun_pid"
wait "$bg"; rc=$?
[[ "$rc" != 0 ]] || { show "$tmp/d.log"; fail "d: mpirun exited 0 after SIGTERM"; }
mid_epoch_stop d
echo "d: mpirun exit status $rc after SIGTERM"
resume d
compare d plain1800

# (d2) SIGTERM to each rank itself (as Slurm's scancel and preemption deliver it), rank
# by rank 0.3 s apart, so the ranks see it at different steps: both stop at the first
# one's step, exit 130, and mpirun returns 130.
start_two_ranks d2
for rank_pid in $(pgrep -P "$mpirun_pid"); do  # timeout -> mpirun -> the ranks
  [[ "$(cat /proc/"$rank_pid"/comm 2>/dev/null)" == engine_paused ]] && { kill -TERM "$rank_pid" 2>/dev/null; sleep 0.3; }
done
wait "$bg"; rc=$?
expect_rc 130 "$rc" "d2: SIGTERM to the ranks" "$tmp/d2.log"
mid_epoch_stop d2
resume d2
compare d2 plain1800

# (e) SIGUSR1 to mpirun mid-epoch (forwarded): one last.h5 at one step, training goes on,
# and the run ends as the straight run.
start_two_ranks e
kill -USR1 "$mpirun_pid"
wait "$bg"; rc=$?
expect_rc 0 "$rc" "e: SIGUSR1" "$tmp/e.log"
show "$tmp/e.log" | grep -qE '^checkpoint requested: last.h5 saved at epoch 1 step 6; training goes on' \
  || { show "$tmp/e.log"; fail "e: no mid-epoch checkpoint message"; }
echo "e: $(show "$tmp/e.log" | grep '^checkpoint requested')"
cp "$tmp/e.log" "$tmp/e.resume.log"  # the run itself went to the end
compare e plain1800

# (f) --time-limit on 2 ranks: rank 0's clock decides for both, exit 75 from mpirun. The
# limit, 1.5 times (c)'s resume on 2 ranks (start, one epoch, test), lets training begin;
# every step made limit/(steps per epoch) s longer (engine_paused --slow-from-step)
# makes the two epochs' steps twice the limit, so the run cannot end in time on any
# machine.
limit=$(awk -v s="$epoch_on_two" 'BEGIN { printf "%.1f", 1.5 * s }')
steps_per_epoch=$(( (600 + batch - 1) / batch ))
step_seconds=$(awk -v s="$limit" -v n="$steps_per_epoch" 'BEGIN { printf "%.3f", s / n }')
"${mpi[@]}" -np 2 "$paused" --slow-from-step 1 --step-seconds "$step_seconds" -- train "$config" --device cpu \
  --run-dir "$tmp/f" "${sets[@]}" --time-limit "${limit}s" >"$tmp/f.log" 2>&1
rc=$?
expect_rc 75 "$rc" "f: mpirun -np 2 --time-limit ${limit}s" "$tmp/f.log"
show "$tmp/f.log" | grep '^time limit' || fail "f: no time-limit message"
resume f
compare f

# What the agreement costs per step (five int64 allgathered), against a step here.
if [[ -n "$agree_cost" ]]; then
  for np in 2 4; do
    "${mpi[@]}" -np "$np" "$agree_cost" 500 || fail "agree_cost on $np ranks"
  done
fi
echo "all stops agreed"
