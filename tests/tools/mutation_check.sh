#!/usr/bin/env bash
# Plants known bugs one at a time and checks that a test catches each (docs/testing.md,
# "Mutation check"). Every tests/tools/mutations/*.patch is one bug, a patch against the
# sources, whose header names it and the tests that must catch it:
#   # bug: the dropout counter restarts at each epoch
#   # tests: test_dropout_keying
# For each: the patch is applied to a scratch worktree of HEAD, the build is brought up
# to date (incrementally: one build directory for all), the named CTest tests run, and
# the patch is reverted. A bug that every named test passes is reported as NOT CAUGHT
# and the script exits 1. Not part of CI: it rebuilds for every bug (about 20-30 min
# with the whole list on 2 cores). The scratch worktree and its build stay for the next
# run unless it ends clean (or --keep), so a second run builds only what changed.
#   tests/tools/mutation_check.sh [--keep] [REGEX]   (REGEX: picks patches by name, e.g. '^0[25]-')
set -euo pipefail
keep=no
if [[ "${1:-}" == --keep ]]; then keep=yes; shift; fi
pattern="${1:-}"
src="$(cd "$(dirname "$0")/../.." && pwd)"
scratch="${MUTATION_DIR:-${TMPDIR:-/tmp}/engine-mutants}"
jobs="${MUTATION_JOBS:-2}"

head="$(git -C "$src" rev-parse HEAD)"
if git -C "$scratch" rev-parse --git-dir >/dev/null 2>&1; then
  # The last run's worktree: to HEAD, touching only the files that differ.
  git -C "$scratch" checkout --quiet --force --detach "$head"
else
  rm -rf "$scratch"
  git -C "$src" worktree add --detach "$scratch" "$head" >/dev/null
fi
finished=no
cleanup() {
  if [[ $keep == no && $finished == yes ]]; then git -C "$src" worktree remove --force "$scratch" 2>/dev/null || true; fi
}
trap cleanup EXIT
echo "mutation check of $(git -C "$src" rev-parse --short HEAD) in $scratch"
if [[ -n "$(git -C "$src" status --porcelain --untracked-files=no)" ]]; then
  echo "note: uncommitted changes in $src are not part of the check (it runs HEAD)"
fi

build="$scratch/build"
cmake -S "$scratch" -B "$build" -DCMAKE_BUILD_TYPE=Release >"$scratch/configure.log" 2>&1 \
  || { cat "$scratch/configure.log"; exit 2; }
echo "building the unmutated tree first ..."
cmake --build "$build" -j"$jobs" >"$scratch/build.log" 2>&1 || { tail -40 "$scratch/build.log"; exit 2; }

rows=()
not_caught=0
for patch in "$src"/tests/tools/mutations/*.patch; do
  name="$(basename "$patch" .patch)"
  [[ -z "$pattern" || "$name" =~ $pattern ]] || continue
  bug="$(sed -n 's/^# bug: //p' "$patch")"
  tests="$(sed -n 's/^# tests: //p' "$patch")"
  [[ -n "$bug" && -n "$tests" ]] || { echo "$patch: no '# bug:' or '# tests:' line"; exit 2; }
  git -C "$scratch" apply "$patch" || { echo "$patch no longer applies to HEAD: update it"; exit 2; }
  t0=$(date +%s)
  result=""
  if ! cmake --build "$build" -j"$jobs" >"$scratch/$name.build.log" 2>&1; then
    result="build failed (see $scratch/$name.build.log)"
    not_caught=$((not_caught + 1))
  else
    caught=()
    for t in $tests; do
      if ! ctest --test-dir "$build" -R "^${t}\$" --output-on-failure >"$scratch/$name.$t.log" 2>&1; then
        caught+=("$t")
      elif ! grep -q "tests passed\|tests failed" "$scratch/$name.$t.log" || grep -q "No tests were found" "$scratch/$name.$t.log"; then
        echo "$name: no test named $t"; exit 2
      fi
    done
    if [[ ${#caught[@]} -gt 0 ]]; then
      result="caught by ${caught[*]}"
    else
      result="NOT CAUGHT"
      not_caught=$((not_caught + 1))
    fi
  fi
  git -C "$scratch" apply -R "$patch"
  took=$(( $(date +%s) - t0 ))
  echo "$name: $result (${took} s)"
  rows+=("| $name | $bug | $tests | $result |")
done
# The build back at HEAD, so that --keep leaves a tree that matches its binaries.
cmake --build "$build" -j"$jobs" >"$scratch/build.log" 2>&1 || true

echo
echo "| patch | bug | tests run | result |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
if [[ $not_caught -gt 0 ]]; then
  echo "mutation check: $not_caught bug(s) not caught (the worktree stays: $scratch)"
  exit 1
fi
finished=yes
echo "mutation check: every bug was caught"
