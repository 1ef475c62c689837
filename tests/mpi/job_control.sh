# Sourced by the mpirun tests: whatever a script starts in the background ends with it,
# on every path (a failed check's exit included). mpirun and its ranks are stopped
# before they are killed, so none reacts to the others' deaths meanwhile. (test_reaper,
# which runs every test, kills anything still left once the script has ended.)
kill_tree() {  # PID: the process and everything below it
  local child
  kill -STOP "$1" 2>/dev/null || true
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -KILL "$1" 2>/dev/null || true
}
end_background_jobs() {
  local job
  for job in $(jobs -p); do kill_tree "$job"; done
  wait 2>/dev/null || true
}
trap end_background_jobs EXIT

# NAME COUNT STEP LOG JOB: waits until COUNT ranks of the job say (on stderr, in LOG) that
# tests/tools/engine_paused.cpp holds them after STEP; fails when the job ends first.
wait_for_paused_ranks() {
  local name="$1" count="$2" step="$3" log="$4" job="$5" i
  for i in $(seq 12000); do
    [[ "$(grep -ac "paused after step $step\$" "$log" 2>/dev/null)" -ge "$count" ]] && return 0
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  [[ "$(grep -ac "paused after step $step\$" "$log" 2>/dev/null)" -ge "$count" ]] && return 0
  cat "$log"
  echo "FAIL: $name: $count rank(s) did not reach step $step" >&2
  exit 1
}
