#!/usr/bin/env bash
# Two hosts on one machine: two network namespaces joined by a veth pair, mpirun in the
# first, the remote ranks started in the second by a plm_rsh_agent script (in place of
# ssh), everything over TCP (docs/distributed.md, "A lost host"):
#  - 2 ranks (one a host) and 4 ranks (two a host) write the checkpoint and test line of
#    the run without mpirun, bit for bit;
#  - the second host's link taken down mid-epoch (epoch 2, step 3, held there by
#    tests/tools/engine_paused.cpp): the whole job, mpirun and both hosts' processes,
#    ends within dist.timeout_s + 10 s, and `engine resume` on one process then ends
#    with the straight run's last.h5. With the Open MPI daemons' TCP keepalive set short
#    (the mpirun options docs/distributed.md gives) mpirun names the lost node; with the
#    kernel giving up on unacknowledged data sooner (net.ipv4.tcp_retries2=3, set in the
#    test's own namespaces only) the engine's watchdog names the lost rank.
# Needs root and `ip` (network namespaces); otherwise skipped (77). No traffic leaves the
# two namespaces. CTest label `mpi`.
#   mpi_two_hosts.sh ENGINE MPIRUN CONFIG DATA_DIR TMP ENGINE_PAUSED
set -euo pipefail
engine="$1" mpirun="$2" config="$3" data="$4" tmp="$5" paused="$6"
source "$(dirname "$0")/job_control.sh"
[[ -d "$data" ]] || { echo "no data set at $data: skipped"; exit 77; }
command -v pgrep >/dev/null || { echo "no pgrep: skipped"; exit 77; }
[[ "$(id -u)" == 0 ]] || { echo "not root (network namespaces need it): skipped"; exit 77; }
command -v ip >/dev/null || { echo "no ip (iproute2): skipped"; exit 77; }
rm -rf "$tmp" && mkdir -p "$tmp"

# The two hosts: namespaces and veth ends named after this test's pid, so that parallel
# runs cannot clash; a /24 of their own (nothing else is routed there).
ns_a="engine2h_a_$$" ns_b="engine2h_b_$$" veth_a="e2ha$$" veth_b="e2hb$$"
net="10.213.$(($$ % 250 + 1))" timeout_s=5
host_a="$net.1" host_b="$net.2"
made=()
end_everything() {  # on every path: the jobs, whatever runs in the namespaces, the namespaces
  local ns p
  end_background_jobs
  for ns in "${made[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}
trap end_everything EXIT
for ns in "$ns_a" "$ns_b"; do
  ip netns add "$ns" 2>"$tmp/netns.err" || { cat "$tmp/netns.err"; echo "ip netns add failed: skipped"; exit 77; }
  made+=("$ns")
  ip -n "$ns" link set lo up
done
ip -n "$ns_a" link add "$veth_a" type veth peer name "$veth_b" netns "$ns_b" 2>"$tmp/veth.err" \
  || { cat "$tmp/veth.err"; echo "no veth pair between namespaces: skipped"; exit 77; }
ip -n "$ns_a" addr add "$host_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$host_b/24" dev "$veth_b"
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up
echo "hosts: $host_a (namespace $ns_a, mpirun) and $host_b (namespace $ns_b)"

# mpirun calls the agent as `agent HOST command...` to start its daemon on HOST.
cat >"$tmp/agent" <<EOF
#!/bin/sh
[ "\$1" = "$host_b" ] || { echo "agent: unknown host \$1" >&2; exit 1; }
echo "daemon started on \$1" >>"$tmp/agent.log"
shift
# Host B has a disk of its own at $tmp/disk (host A's is the real one): a bind mount in
# the mount namespace that ip netns exec makes, which no other process sees.
exec ip netns exec $ns_b sh -c "mount --bind $tmp/disk_b $tmp/disk && \$*"
EOF
mkdir -p "$tmp/disk" "$tmp/disk_b"
chmod +x "$tmp/agent"
printf '%s slots=1\n%s slots=1\n' "$host_a" "$host_b" >"$tmp/hosts2"
printf '%s slots=2\n%s slots=2\n' "$host_a" "$host_b" >"$tmp/hosts4"

export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
sets=(--set "data.dir=$data" --set data.train_limit=600 --set data.val_split=200 --set data.test_limit=200
      --set data.batch_size=72 --set train.epochs=2 --set checkpoint.verify=false --set logging.tensorboard=false)
hold_step=12  # 9 steps an epoch: epoch 2, step 3
# What a user sets so that a lost host ends the job (docs/distributed.md): the daemons'
# connections probed after 1 s idle, every 1 s, given up after 3 missed probes.
keepalive=(--mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3)
mpi=(ip netns exec "$ns_a" timeout -s KILL 120 "$mpirun" --oversubscribe --bind-to none -x OMP_NUM_THREADS
     --mca plm_rsh_agent "$tmp/agent" --mca btl tcp,self
     --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24")
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { echo "${EPOCHREALTIME/,/.}"; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
within() { awk -v s="$1" -v bound="$2" 'BEGIN { exit !(s <= bound) }'; }

"$engine" train "$config" --device cpu --run-dir "$tmp/plain" "${sets[@]}" >"$tmp/plain.log" 2>&1 \
  || { cat "$tmp/plain.log"; fail "the run without mpirun failed"; }
grep '^test:' "$tmp/plain.log"

compare() {  # NAME [LOG]: $tmp/NAME/last.h5 and the test line in LOG ($tmp/NAME.log) against the plain run
  local name="$1" log="${2:-$tmp/$1.log}"
  "$engine" diff "$tmp/plain/last.h5" "$tmp/$name/last.h5" >"$tmp/$name.diff" 2>&1 \
    || { cat "$tmp/$name.diff"; fail "$name: last.h5 differs from the run without mpirun"; }
  grep -q '^verdict: identical' "$tmp/$name.diff" || { cat "$tmp/$name.diff"; fail "$name: no identical verdict"; }
  diff <(grep '^test:' "$tmp/plain.log") <(grep '^test:' "$log") || fail "$name: test metrics differ"
  echo "$name: last.h5 and test metrics identical to the run without mpirun"
}

# The ranks of NP across the two hosts: the same bits as one process.
for np in 2 4; do
  rm -f "$tmp/agent.log"
  "${mpi[@]}" "${keepalive[@]}" -np "$np" --hostfile "$tmp/hosts$np" "$engine" train "$config" --device cpu \
    --run-dir "$tmp/hosts_np$np" "${sets[@]}" >"$tmp/hosts_np$np.log" 2>&1 \
    || { cat "$tmp/hosts_np$np.log"; fail "mpirun -np $np across the two hosts failed"; }
  [[ "$(grep -c '^test:' "$tmp/hosts_np$np.log")" == 1 ]] || { cat "$tmp/hosts_np$np.log"; fail "np $np: not exactly one test line"; }
  # mpirun started a daemon on host B through the agent, and the run had NP ranks.
  grep -q "^daemon started on $host_b" "$tmp/agent.log" || fail "np $np: no daemon started on $host_b"
  # Ranks on two hosts: the batch norm exchanges once per statistic and layer.
  grep -q "^data-parallel on $np ranks (mpi, several hosts)" "$tmp/hosts_np$np.log" ||
    { cat "$tmp/hosts_np$np.log"; fail "np $np: no 'data-parallel on $np ranks (mpi, several hosts)'"; }
  compare "hosts_np$np"
done

# NAME NP PATTERN [MPIRUN OPTIONS...]: NP ranks held after $hold_step; host B's link goes
# down, the ranks go on towards a collective host B's ranks cannot join. Within
# dist.timeout_s + 10 s mpirun must have exited (not 0) and nothing may be left in either
# namespace; PATTERN must be in the output (mpirun's, or a rank's). Each rank writes to a
# file of its own: a host's daemon forwarding no output has nothing unacknowledged on its
# connection to mpirun, so its TCP keepalive can tell that mpirun is gone.
link_cut() {
  local name="$1" np="$2" pattern="$3"
  shift 3
  local bound=$((timeout_s + 10)) rc=0 ns i
  ip -n "$ns_b" link set "$veth_b" up
  "${mpi[@]}" "$@" -np "$np" --hostfile "$tmp/hosts$np" \
    sh -c 'exec "$0" "$@" >"'"$tmp/$name"'.rank$OMPI_COMM_WORLD_RANK" 2>&1' \
    "$paused" --at-step "$hold_step" --release-file "$tmp/$name.go" -- train "$config" --device cpu \
    --run-dir "$tmp/$name" "${sets[@]}" --set "dist.timeout_s=$timeout_s" >"$tmp/$name.log" 2>&1 &
  local job=$!
  for i in $(seq 12000); do
    [[ "$(cat "$tmp/$name".rank* 2>/dev/null | grep -ac "paused after step $hold_step\$")" -ge "$np" ]] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  [[ "$(cat "$tmp/$name".rank* 2>/dev/null | grep -ac "paused after step $hold_step\$")" -ge "$np" ]] \
    || { cat "$tmp/$name.log" "$tmp/$name".rank* 2>/dev/null; fail "$name: $np ranks did not reach step $hold_step"; }
  local t0 took gone
  t0=$(now)
  ip -n "$ns_b" link set "$veth_b" down
  touch "$tmp/$name.go"
  while kill -0 "$job" 2>/dev/null && within "$(seconds_since "$t0")" "$bound"; do sleep 0.1; done
  kill -0 "$job" 2>/dev/null && { cat "$tmp/$name.log" "$tmp/$name".rank*; fail "$name: mpirun still runs $bound s after host B's link went down"; }
  wait "$job" || rc=$?
  took=$(seconds_since "$t0")
  while [[ -n "$(ip netns pids "$ns_a")$(ip netns pids "$ns_b")" ]] && within "$(seconds_since "$t0")" "$bound"; do sleep 0.1; done
  for ns in "$ns_a" "$ns_b"; do
    [[ -z "$(ip netns pids "$ns")" ]] || { ps -o pid,stat,args -p "$(ip netns pids "$ns" | paste -sd,)" || true; \
      fail "$name: processes left in $ns $bound s after the link went down"; }
  done
  gone=$(seconds_since "$t0")
  [[ $rc != 0 ]] || { cat "$tmp/$name.log"; fail "$name: mpirun exit status 0 after the link went down"; }
  # (grep on the files: `cat | grep -q` fails under pipefail when grep stops reading early)
  grep -aqh -- "$pattern" "$tmp/$name.log" "$tmp/$name".rank* \
    || { cat "$tmp/$name.log" "$tmp/$name".rank*; fail "$name: no line saying '$pattern'"; }
  echo "$name: host B's link down after step $hold_step: mpirun exit $rc ${took} s later, both hosts empty after ${gone} s (bound $bound s)"
  echo "$name: $(grep -ahm1 -- "$pattern" "$tmp/$name.log" "$tmp/$name".rank* | head -1)"
  # The run resumes on one process to the straight run's bits.
  "$engine" verify "$tmp/$name/last.h5" >/dev/null || fail "$name: last.h5 is not sound"
  "$engine" resume "$tmp/$name/last.h5" --device cpu >"$tmp/$name.resume.log" 2>&1 \
    || { cat "$tmp/$name.resume.log"; fail "$name: resume failed"; }
  echo "$name: $(grep -m1 '^resuming' "$tmp/$name.resume.log")"
  compare "$name" "$tmp/$name.resume.log"
}

# The user's setting: mpirun's daemon keepalive notices the lost host and names it.
link_cut cut2 2 "Remote daemon: .* on node $host_b" "${keepalive[@]}"
link_cut cut4 4 "Remote daemon: .* on node $host_b" "${keepalive[@]}"

# The kernel's setting instead (default keepalive): the watchdog names the lost rank, and
# the kernel, giving up on the abort's unacknowledged messages after ~3 s, lets mpirun end.
retries=()
for ns in "$ns_a" "$ns_b"; do retries+=("$(ip netns exec "$ns" sysctl -n net.ipv4.tcp_retries2)"); done
ip netns exec "$ns_a" sysctl -qw net.ipv4.tcp_retries2=3
ip netns exec "$ns_b" sysctl -qw net.ipv4.tcp_retries2=3
link_cut cut2_watchdog 2 "rank 1 did not answer (stopped, hung or dead)"
ip netns exec "$ns_a" sysctl -qw "net.ipv4.tcp_retries2=${retries[0]}"
ip netns exec "$ns_b" sysctl -qw "net.ipv4.tcp_retries2=${retries[1]}"
# checkpoint.peer_replica: rank 1, on host B, keeps a copy of every save on host B's own
# disk. The job is held in epoch 2 once epoch 1's saves are on both disks, host B's link
# goes down (the job ends), host A's run directory is destroyed, and the job relaunched
# on both hosts resumes from host B's copy, sent to rank 0 over the job's collective, and
# ends with the straight run's bits; rank 0's run directory is repaired from it.
peer_copy() {
  local name=peer run="$tmp/disk/peer" i rc=0
  ip -n "$ns_b" link set "$veth_b" up
  "${mpi[@]}" "${keepalive[@]}" -np 2 --hostfile "$tmp/hosts2" \
    sh -c 'exec "$0" "$@" >"'"$tmp/$name"'.rank$OMPI_COMM_WORLD_RANK" 2>&1' \
    "$paused" --at-step "$hold_step" --release-file "$tmp/$name.go" -- train "$config" --device cpu \
    --run-dir "$run" "${sets[@]}" --set checkpoint.peer_replica=true --set "dist.timeout_s=$timeout_s" \
    >"$tmp/$name.log" 2>&1 &
  local job=$!
  # Both ranks held after step $hold_step, and epoch 1's last.h5 written on both disks
  # (the writer threads go on while training is held).
  for i in $(seq 12000); do
    [[ "$(cat "$tmp/$name".rank* 2>/dev/null | grep -ac "paused after step $hold_step\$")" -ge 2 ]] &&
      "$engine" verify "$run/last.h5" >/dev/null 2>&1 && "$engine" verify "$tmp/disk_b/peer/last.h5" >/dev/null 2>&1 &&
      break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  "$engine" verify "$tmp/disk_b/peer/last.h5" >/dev/null 2>&1 \
    || { cat "$tmp/$name.log" "$tmp/$name".rank* 2>/dev/null; fail "$name: no sound copy on host B's disk"; }
  grep -aq "peer copy: rank 1, on another host" "$tmp/$name.rank0" \
    || { cat "$tmp/$name.rank0"; fail "$name: rank 0 names no peer copy"; }
  ip -n "$ns_b" link set "$veth_b" down
  touch "$tmp/$name.go"
  wait "$job" || rc=$?
  [[ $rc != 0 ]] || fail "$name: mpirun exit status 0 after the link went down"
  for i in $(seq 300); do [[ -z "$(ip netns pids "$ns_a")$(ip netns pids "$ns_b")" ]] && break; sleep 0.1; done
  # Host A's disk is lost; host B's copy is the only one left.
  rm -rf "$run"
  ip -n "$ns_b" link set "$veth_b" up
  "${mpi[@]}" "${keepalive[@]}" -np 2 --hostfile "$tmp/hosts2" "$engine" train "$config" --device cpu \
    --run-dir "$run" "${sets[@]}" --set checkpoint.peer_replica=true >"$tmp/$name.resume.log" 2>&1 \
    || { cat "$tmp/$name.resume.log"; fail "$name: the relaunched job failed"; }
  grep -q "^resuming from epoch 1, step 0 of epoch 2 (rank 1's $run/last.h5)" "$tmp/$name.resume.log" \
    || { cat "$tmp/$name.resume.log"; fail "$name: not resumed from rank 1's copy"; }
  grep -q "^repaired $run/last.h5 (missing) from rank 1's $run/last.h5" "$tmp/$name.resume.log" \
    || { cat "$tmp/$name.resume.log"; fail "$name: rank 0's run directory not repaired"; }
  echo "$name: $(grep -m1 '^resuming' "$tmp/$name.resume.log")"
  compare disk/peer "$tmp/$name.resume.log"
  # Host B's copy (host A reaches host B's disk at its real place) holds the same end.
  "$engine" diff "$tmp/plain/last.h5" "$tmp/disk_b/peer/last.h5" >"$tmp/$name.b.diff" 2>&1 \
    || { cat "$tmp/$name.b.diff"; fail "$name: host B's copy differs from the straight run at the end"; }
}
peer_copy

echo "two hosts: identical at 2 and 4 ranks; a lost host ends the job in time and the run resumes bit-exactly; with host A's disk lost, the run resumes from host B's peer copy bit-exactly"
