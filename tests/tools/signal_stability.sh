#!/usr/bin/env bash
# The signal and kill tests, ROUNDS times in a row, each under test_reaper with its
# CTest time limit, counting what passed (docs/testing.md "Signals and kills"):
#   tests/tools/signal_stability.sh BUILD_DIR ROUNDS [LOG_DIR]
# The doctest cases that race a signal or a kill against training (test_preemption,
# test_resume, test_cli, test_run_lock) and the mpirun scripts (mpi_stops,
# mpi_faults; skipped without Open MPI). Exit 0 only when every run passed.
set -u
build=$(cd "${1:?usage: signal_stability.sh BUILD_DIR ROUNDS [LOG_DIR]}" && pwd)
rounds="${2:?usage: signal_stability.sh BUILD_DIR ROUNDS [LOG_DIR]}"
logs="${3:-$build/tests/tmp/signal_stability}"
mkdir -p "$logs"
src=$(cd "$(dirname "$0")/../.." && pwd)
reaper="$build/tests/test_reaper"
export ENGINE_BIN="$build/engine" ENGINE_KILL_AFTER_BIN="$build/tests/engine_kill_after"
export ENGINE_PAUSED_BIN="$build/tests/engine_paused" ENGINE_SOURCE_DIR="$src"
export ENGINE_TEST_TMP="$build/tests/tmp" OMP_NUM_THREADS=2
mkdir -p "$ENGINE_TEST_TMP"

# name | command
cases=(
  "test_preemption|$build/tests/test_preemption"
  "test_resume signals|$build/tests/test_resume -tc=SIGKILL*,SIGTERM*,after a mid-epoch resume*"
  "test_cli signals|$build/tests/test_cli -tc=one writer per run directory*,output to a file*"
  "test_run_lock|$build/tests/test_run_lock"
)
if [[ -x "$build/tests/mpi/agree_cost" ]] && command -v mpirun >/dev/null; then
  mpi_args="$build/engine $(command -v mpirun) $src/configs/mnist.json /usr/share/datasets/fashion-mnist"
  cases+=("mpi_stops|bash $src/tests/mpi/mpi_stops.sh $mpi_args $build/tests/mpi/tmp/mpi_stops $ENGINE_PAUSED_BIN")
  cases+=("mpi_faults|bash $src/tests/mpi/mpi_faults.sh $mpi_args $build/tests/mpi/tmp/mpi_faults $ENGINE_PAUSED_BIN")
fi

passed=0 failed=0
start=$SECONDS
for round in $(seq "$rounds"); do
  for c in "${cases[@]}"; do
    name="${c%%|*}" cmd="${c#*|}"
    log="$logs/round${round}_${name// /_}.log"
    t0=$SECONDS
    # The doctest filter holds spaces: split the command only at the first ' -tc='.
    if [[ "$cmd" == *" -tc="* ]]; then
      "$reaper" 900 "${cmd%% -tc=*}" "-tc=${cmd#* -tc=}" >"$log" 2>&1
    else
      # shellcheck disable=SC2086
      "$reaper" 600 $cmd >"$log" 2>&1
    fi
    rc=$?
    if [[ $rc == 0 ]]; then
      passed=$((passed + 1)); echo "round $round: $name passed ($((SECONDS - t0)) s)"
    else
      failed=$((failed + 1)); echo "round $round: $name FAILED, exit $rc ($((SECONDS - t0)) s): $log"
    fi
  done
done
echo "signal_stability: $passed passed, $failed failed, ${#cases[@]} cases x $rounds rounds in $((SECONDS - start)) s"
[[ $failed == 0 ]]
