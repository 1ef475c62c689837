#!/usr/bin/env bash
# Slurm, run for real: a one-node Slurm (munged, slurmctld, slurmd) started by this test
# on this machine, on loopback only, with its own slurm.conf, state, spool and logs in a
# directory of its own; batch scripts shaped like the one in docs/distributed.md ("Slurm,
# tested"), 2 ranks of 1 thread started by `srun --mpi=pmix`:
#  1. usr1:    `#SBATCH --signal=USR1@120` in a 3-minute job: Slurm's own timer signals
#              both ranks (held after step 3 until it has), the engine writes last.h5 at
#              step 4 and training goes on to the end, bit-identical to a straight run;
#  2. requeue: `--time-limit 20s` (the first job's steps made 3 s longer, so that it
#              cannot end in time) exits 75, the batch script runs `scontrol requeue`,
#              the requeued job resumes from last.h5 and ends bit-identical;
#  3. cancel:  `scancel` of the job while both ranks are held after step 5: they stop at
#              step 6 with last.h5 saved; `engine resume` ends bit-identical.
# Skipped (77) without root, the Slurm or munge binaries, srun's pmix plugin, or where
# the daemons do not come up within 60 s. Everything it starts (daemons, jobs, their
# slurmstepd) is stopped on every path by an EXIT trap. CTest label `mpi`.
#   slurm_batch.sh ENGINE CONFIG DATA_DIR TMP ENGINE_PAUSED
set -euo pipefail
engine="$1" config="$2" data="$3" tmp="$4" paused="$5"
source "$(dirname "$0")/job_control.sh"
[[ -d "$data" ]] || { echo "no data set at $data: skipped"; exit 77; }
[[ "$(id -u)" == 0 ]] || { echo "not root (slurmd starts the jobs' processes as their user): skipped"; exit 77; }
for tool in munged slurmctld slurmd sbatch srun scontrol scancel sinfo pgrep; do
  command -v "$tool" >/dev/null || { echo "no $tool (apt-get install slurm-wlm munge): skipped"; exit 77; }
done
rm -rf "$tmp" && mkdir -p "$tmp"
# The jobs run in $tmp: every path absolute.
tmp=$(realpath "$tmp") engine=$(realpath "$engine") paused=$(realpath "$paused") config=$(realpath "$config")
# A Slurm of our own only: nothing from a Slurm job this test might itself run in.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)

# Slurm's files in a short directory (unix sockets: 108 bytes a path), removed at the end
# with its logs copied to $tmp/slurm-logs. Every daemon and every job carries the marker
# ENGINE_SLURM_TEST=$tag in its environment, and slurmstepd (which clears its own) runs
# in $sd/log as slurmd does: the EXIT trap finds them all by one or the other.
# A directory left by a run that was killed (SIGKILL: no trap ran) goes once its owner has.
for old in /tmp/engine-slurm.*; do
  [[ -f "$old/owner" ]] && ! kill -0 "$(cat "$old/owner")" 2>/dev/null && rm -rf "$old"
done
sd=$(mktemp -d /tmp/engine-slurm.XXXXXX)
echo $$ >"$sd/owner"
tag="$(basename "$sd")"
daemons=()
ours() {  # the pids of what this test started in Slurm
  local p
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    if [[ "$(readlink "/proc/$p/cwd" 2>/dev/null)/" == "$sd/"* ]] \
       || grep -qxz "ENGINE_SLURM_TEST=$tag" "/proc/$p/environ" 2>/dev/null; then
      echo "$p"
    fi
  done
}
end_everything() {  # on every path: the jobs, the daemons, whatever is left of them
  local rc=$? p i
  set +e
  cd /
  if [[ -n "${SLURM_CONF:-}" ]] && [[ ${#daemons[@]} -gt 0 ]]; then  # the jobs first, given 15 s to end
    timeout 10 scancel --quiet --user=root >/dev/null 2>&1
    for i in $(seq 150); do [[ -z "$(timeout 5 squeue -h 2>/dev/null)" ]] && break; sleep 0.1; done
  fi
  for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for i in $(seq 100); do
    local alive=0
    for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in $(ours); do kill_tree "$p"; done
  end_background_jobs
  for i in $(seq 50); do [[ -z "$(ours)" ]] && break; sleep 0.1; done
  [[ -z "$(ours)" ]] || { echo "left behind:"; ps -o pid,args -p "$(ours | paste -sd,)"; rc=1; }
  mkdir -p "$tmp/slurm-logs" && cp -r "$sd/log/." "$sd/slurm.conf" "$tmp/slurm-logs/" 2>/dev/null
  rm -rf "$sd"
  exit $rc
}
trap end_everything EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }
show() { cat "$tmp/$1.out" 2>/dev/null || echo "(no $tmp/$1.out)"; }  # NAME: the job's output
skip() { echo "$*: skipped"; exit 77; }
now() { echo "${EPOCHREALTIME/,/.}"; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
port_free() { ! command -v ss >/dev/null || [[ -z "$(ss -Htan "sport = :$1")" ]]; }

# Ports on 127.0.0.1: the controller's, the node daemon's, and 100 for srun, chosen after
# this test's pid among free ones so that parallel runs do not clash.
base=""
for i in $(seq 0 40); do
  b=$((20000 + (($$ + i * 997) % 400) * 100))
  port_free "$b" && port_free "$((b + 1))" && { base=$b; break; }
done
[[ -n "$base" ]] || skip "no two free ports found"
mkdir -p "$sd/munge" "$sd/state" "$sd/spool" "$sd/log" "$sd/tmpfs"
chmod 755 "$sd" "$sd/munge"
touch "$sd/plugstack.conf"
cat >"$sd/slurm.conf" <<EOF
# One node, this machine, as 127.0.0.1 (written by tests/mpi/slurm_batch.sh).
ClusterName=enginetest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SrunPortRange=$((base + 2))-$((base + 99))
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (120 s by default).
AuthInfo=socket=$sd/munge/munge.socket,cred_expire=10
StateSaveLocation=$sd/state
SlurmdSpoolDir=$sd/spool
TmpFS=$sd/tmpfs
SlurmctldPidFile=$sd/slurmctld.pid
SlurmdPidFile=$sd/slurmd.pid
SlurmctldLogFile=$sd/log/slurmctld.log
SlurmdLogFile=$sd/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$sd/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# The main scheduling loop every 5 s (60 by default): a requeued job starts soon after cred_expire.
SchedulerParameters=sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=30
SlurmdParameters=config_overrides
NodeName=enginenode NodeAddr=127.0.0.1 NodeHostname=$(hostname -s) CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 State=UNKNOWN
PartitionName=engine Nodes=enginenode Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$sd/slurm.conf"

# The daemons, in the foreground as this script's jobs.
t_start=$(now)
dd if=/dev/urandom of="$sd/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$sd/munge/munge.key"
# Each runs in $sd/log, and so do the slurmstepd that slurmd starts.
cd "$sd/log"
ENGINE_SLURM_TEST=$tag munged -F --force --socket="$sd/munge/munge.socket" --key-file="$sd/munge/munge.key" \
  --pid-file="$sd/munge/munged.pid" --log-file="$sd/log/munged.log" --seed-file="$sd/munge/munged.seed" \
  >"$sd/log/munged.out" 2>&1 &
daemons+=($!)
for i in $(seq 100); do [[ -S "$sd/munge/munge.socket" ]] && break; kill -0 "${daemons[0]}" 2>/dev/null || break; sleep 0.1; done
[[ -S "$sd/munge/munge.socket" ]] || { cat "$sd/log/munged.out" "$sd/log/munged.log" 2>/dev/null; skip "munged did not start"; }
ENGINE_SLURM_TEST=$tag slurmctld -D -f "$SLURM_CONF" >"$sd/log/slurmctld.out" 2>&1 &
daemons+=($!)
ENGINE_SLURM_TEST=$tag slurmd -D -f "$SLURM_CONF" -N enginenode >"$sd/log/slurmd.out" 2>&1 &
daemons+=($!)
cd "$tmp"
up=0
for i in $(seq 600); do
  [[ "$(sinfo -h -N -o %T 2>/dev/null)" == idle ]] && { up=1; break; }
  for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.1
done
if [[ $up != 1 ]]; then
  tail -n 20 "$sd"/log/*
  skip "slurmctld and slurmd did not bring the node up within 60 s"
fi
srun --mpi=list 2>&1 | grep -qw pmix || skip "srun has no pmix plugin (srun --mpi=list)"
echo "slurm $(sinfo -V | cut -d' ' -f2): node up in $(seconds_since "$t_start") s; ports $base-$((base + 99)) on 127.0.0.1"

# The run: 600 images in batches of 72 (9 steps an epoch), two epochs, no mid-epoch
# saves of its own (as mpi_stops.sh).
sets=(--set "data.dir=$data" --set data.train_limit=600 --set data.val_split=200 --set data.test_limit=200
      --set data.batch_size=72 --set train.epochs=2 --set checkpoint.verify=false --set logging.tensorboard=false
      --set checkpoint.every_n_steps=null)
"$engine" train "$config" --device cpu --run-dir "$tmp/plain" "${sets[@]}" >"$tmp/plain.log" 2>&1 \
  || { cat "$tmp/plain.log"; fail "the straight run failed"; }
echo "straight run: $(grep '^test:' "$tmp/plain.log")"

compare() {  # NAME LOG: $tmp/NAME/last.h5 and the test line in LOG against the straight run
  local name="$1" log="$2"
  "$engine" diff "$tmp/plain/last.h5" "$tmp/$name/last.h5" >"$tmp/$name.diff" 2>&1 \
    || { cat "$tmp/$name.diff"; fail "$name: last.h5 differs from the straight run"; }
  grep -q '^verdict: identical' "$tmp/$name.diff" || { cat "$tmp/$name.diff"; fail "$name: no identical verdict"; }
  diff <(grep '^test:' "$tmp/plain.log") <(grep '^test:' "$log") || fail "$name: test metrics differ"
  echo "$name: last.h5 and test metrics identical to the straight run"
}
# NAME [#SBATCH LINES...]: $tmp/NAME.sbatch, the batch script of docs/distributed.md
# with this test's paths; LAUNCH (set by the script itself) runs the ranks.
write_batch() {
  local name="$1" line
  shift
  {
    echo '#!/bin/bash'
    echo "#SBATCH --job-name=engine-$name"
    echo '#SBATCH --ntasks=2'
    echo '#SBATCH --cpus-per-task=1'
    for line in "$@"; do echo "#SBATCH $line"; done
    echo '#SBATCH --open-mode=append'
    echo "#SBATCH --output=$tmp/$name.out"
    echo
    echo 'export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK'
    cat
    echo 'echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): starting"'
    printf 'srun --mpi=pmix --cpu-bind=cores "${launch[@]}" train %q --device cpu \\\n' "$config"
    printf '     --run-dir %q' "$tmp/$name"
    printf ' %q' "${sets[@]}"
    printf ' "${limit[@]}"\n'
    echo 'rc=$?'
    echo 'echo "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}): srun exit $rc"'
    echo '# 75: --time-limit stopped it with last.h5 saved: go on in a new job.'
    echo 'if [[ $rc == 75 ]]; then scontrol requeue "$SLURM_JOB_ID"; fi'
    echo 'exit $rc'
  } >"$tmp/$name.sbatch"
}
submit() {  # NAME: submits $tmp/NAME.sbatch (with the marker), prints the job id
  ENGINE_SLURM_TEST=$tag sbatch --parsable --chdir="$tmp" "$tmp/$1.sbatch" 2>"$tmp/$1.sbatch.err" \
    || { cat "$tmp/$1.sbatch.err"; fail "$1: sbatch failed"; }
}
field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }
# JOB NAME SECONDS STATE...: waits until the job is in one of STATES (and not completing)
wait_state() {
  local job="$1" name="$2" bound="$3" t0 state
  shift 3
  t0=$(now)
  while :; do
    state=$(field "$job" JobState)
    if [[ " $* " == *" $state "* ]] && [[ "$(field "$job" Reason)" != *Completing* ]] \
       && ! squeue -h -j "$job" -t CG 2>/dev/null | grep -q .; then
      echo "$state"; return 0
    fi
    case "$state" in FAILED|TIMEOUT|CANCELLED|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE)
      [[ " $* " == *" $state "* ]] || { show "$name" >&2; scontrol show job "$job" >&2; fail "$name: job $job ended $state"; } ;;
    esac
    awk -v s="$(seconds_since "$t0")" -v b="$bound" 'BEGIN { exit !(s > b) }' \
      && { show "$name" >&2; scontrol show job "$job" >&2; fail "$name: job $job not $* within $bound s (now $state)"; }
    sleep 0.2
  done
}
# NAME JOB COUNT PATTERN SECONDS: waits until PATTERN is COUNT times in $tmp/NAME.out
# Only a job in a final state ends the wait early: the states between (RUNNING, the
# SIGNALING of a --signal being delivered, COMPLETING, REQUEUED, no answer from scontrol
# while slurmctld is busy ...) keep it polling, and the bound ends it. A final state is
# checked against the file once more: the lines may have landed just before the end.
wait_lines() {
  local name="$1" job="$2" count="$3" pattern="$4" bound="$5" t0
  t0=$(now)
  while [[ "$(grep -ac -- "$pattern" "$tmp/$name.out" 2>/dev/null)" -lt "$count" ]]; do
    case "$(field "$job" JobState)" in
      COMPLETED|FAILED|TIMEOUT|CANCELLED|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED|SPECIAL_EXIT)
        [[ "$(grep -ac -- "$pattern" "$tmp/$name.out" 2>/dev/null)" -ge "$count" ]] && return 0
        show "$name"; scontrol show job "$job"; fail "$name: job $job ended before '$pattern' x$count";;
    esac
    awk -v s="$(seconds_since "$t0")" -v b="$bound" 'BEGIN { exit !(s > b) }' \
      && { show "$name"; fail "$name: no '$pattern' x$count within $bound s"; }
    sleep 0.1
  done
}
gone() {  # NAME SECONDS: waits until no process of the run $tmp/NAME is left
  local i
  for i in $(seq $(($2 * 10))); do pgrep -f -- "--run-dir $tmp/$1( |\$)" >/dev/null || return 0; sleep 0.1; done
  pgrep -af -- "--run-dir $tmp/$1( |\$)"; fail "$1: ranks still running $2 s after the job ended"
}

# 1. usr1: --signal=USR1@120 in a 3-minute job. slurmctld looks at the jobs' time limits
# every 30 s and sends the signal at the first look less than 30 s before the time asked
# for: 30 to 60 s after the start. The ranks wait for it after step 3 (and at most 170 s).
t0=$(now)
write_batch usr1 --time=3 --signal=USR1@120 <<EOF
launch=($(printf '%q' "$paused") --at-step 3 --release-after-signals 1 --give-up-seconds 170 --)
limit=()
EOF
job=$(submit usr1)
wait_lines usr1 "$job" 2 'paused after step 3$' 120
start=$(date -d "$(field "$job" StartTime)" +%s)
wait_lines usr1 "$job" 2 'saw signal 1$' 170
echo "usr1: job $job: both ranks got SIGUSR1 from Slurm $(( $(date +%s) - start )) s after the job started"
wait_state "$job" usr1 120 COMPLETED >/dev/null
gone usr1 30
grep -q '^checkpoint requested: last.h5 saved at epoch 1 step 4; training goes on' "$tmp/usr1.out" \
  || { show usr1; fail "usr1: no 'last.h5 saved at epoch 1 step 4; training goes on'"; }
grep -q 'srun exit 0$' "$tmp/usr1.out" || { show usr1; fail "usr1: srun did not exit 0"; }
echo "usr1: $(grep '^checkpoint requested' "$tmp/usr1.out")"
compare usr1 "$tmp/usr1.out"
echo "usr1: $(seconds_since "$t0") s"

# 2. requeue: --time-limit 20s, exit 75, `scontrol requeue`, the requeued job resumes.
# The first job's steps (from step 1) take 3 s longer: 18 steps cannot end within 20 s
# on any machine. The requeued job (SLURM_RESTART_COUNT=1) runs the engine itself.
t0=$(now)
write_batch requeue --time=5 --requeue <<EOF
launch=($(printf '%q' "$engine"))
limit=(--time-limit 20s)
# (the test's part: the first job cannot end within its --time-limit)
[[ \${SLURM_RESTART_COUNT:-0} == 0 ]] && launch=($(printf '%q' "$paused") --slow-from-step 1 --step-seconds 3 --)
EOF
job=$(submit requeue)
wait_lines requeue "$job" 1 '(restart 0): srun exit 75$' 120
echo "requeue: job $job: $(grep '^time limit' "$tmp/requeue.out" | head -1)"
t_requeue=$(now)
wait_lines requeue "$job" 1 '(restart 1): starting$' 300
echo "requeue: job $job requeued, started again $(seconds_since "$t_requeue") s later"
wait_state "$job" requeue 120 COMPLETED >/dev/null
gone requeue 30
[[ "$(field "$job" Restarts)" == 1 ]] || { scontrol show job "$job"; fail "requeue: Restarts is not 1"; }
grep -q '(restart 1): srun exit 0$' "$tmp/requeue.out" || { show requeue; fail "requeue: the requeued srun did not exit 0"; }
grep -q '^resuming from epoch' "$tmp/requeue.out" || { show requeue; fail "requeue: the requeued job did not resume"; }
echo "requeue: $(grep -m1 '^resuming from epoch' "$tmp/requeue.out")"
compare requeue "$tmp/requeue.out"
echo "requeue: $(seconds_since "$t0") s"

# 3. cancel: scancel while both ranks are held after step 5; they stop at step 6 and save.
t0=$(now)
write_batch cancel --time=5 <<EOF
launch=($(printf '%q' "$paused") --at-step 5 --release-after-signals 1 --give-up-seconds 170 --)
limit=()
EOF
job=$(submit cancel)
wait_lines cancel "$job" 2 'paused after step 5$' 120
scancel "$job"
state=$(wait_state "$job" cancel 60 CANCELLED)
gone cancel 40
grep -q '^stopped at epoch 1 step 6;' "$tmp/cancel.out" || { show cancel; fail "cancel: no 'stopped at epoch 1 step 6'"; }
echo "cancel: job $job $state: $(grep '^stopped at epoch' "$tmp/cancel.out" | cut -d';' -f1); $(grep -a 'xit.* code\|srun exit' "$tmp/cancel.out" | head -1)"
"$engine" verify "$tmp/cancel/last.h5" >/dev/null || fail "cancel: last.h5 is not sound"
"$engine" resume "$tmp/cancel/last.h5" --device cpu >"$tmp/cancel.resume.log" 2>&1 \
  || { cat "$tmp/cancel.resume.log"; fail "cancel: resume failed"; }
echo "cancel: $(grep -m1 '^resuming' "$tmp/cancel.resume.log")"
compare cancel "$tmp/cancel.resume.log"
echo "cancel: $(seconds_since "$t0") s"
echo "slurm: USR1 checkpoint, --time-limit requeue and scancel all end bit-identical to the straight run ($(seconds_since "$t_start") s)"
