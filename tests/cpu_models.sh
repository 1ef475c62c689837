#!/usr/bin/env bash
# The same run on other CPU models gives the same bits (docs/architecture.md,
# "Determinism"): a short `engine train` on this machine, then the same binary and command
# under QEMU's user-mode emulation of older x86-64 CPUs, and `engine diff` must call every
# last.h5 identical to this machine's, with the same test metrics:
#   Haswell   AVX2 and FMA, no AVX-512: the avx2 path;
#   Nehalem   SSE4.2, no AVX and no FMA: the portable path with a software fma, and
#             glibc's non-FMA variants of every libm routine (which the step must not use).
# This machine runs its own path (avx512 where it has AVX-512). ENGINE_CPU_KERNELS forces a
# path on one CPU (tests/test_cpu_paths.cpp); this test changes the CPU itself, as a run
# resumed on another node does. Emulated floating point is slow (about 1 minute per run
# here), so the run is tiny: 32 training images in batches of 12 (a ragged last batch), a
# validation of 16 and a test of 16.
# The golden table of the engine's transcendentals (test_det_math's "golden table" case)
# runs on each emulated CPU too: its portable code without AVX or FMA on the Nehalem.
# CTest label `cpu_models`; skipped (77) without qemu-x86_64 (Debian's qemu-user), off
# x86-64, or without the data set.
#   cpu_models.sh ENGINE CONFIG DATA_DIR TMP TEST_DET_MATH
set -euo pipefail
engine="$1" config="$2" data="$3" tmp="$4" det_test="$5"
[[ "$(uname -m)" == x86_64 ]] || { echo "not an x86-64 machine: skipped"; exit 77; }
qemu="$(command -v qemu-x86_64 || true)"
[[ -n "$qemu" ]] || { echo "no qemu-x86_64 (Debian's qemu-user): skipped"; exit 77; }
[[ -d "$data" ]] || { echo "no data set at $data: skipped"; exit 77; }
rm -rf "$tmp" && mkdir -p "$tmp"
export OMP_NUM_THREADS=1
sets=(--set "data.dir=$data" --set data.train_limit=32 --set data.batch_size=12 --set data.val_split=16
      --set data.test_limit=16 --set train.epochs=1 --set checkpoint.verify=false --set logging.tensorboard=false)
fail() { echo "FAIL: $*" >&2; exit 1; }

path_of() {  # the `cpu kernels:` line of `engine --version` under the given launcher
  "$@" "$engine" --version 2>/dev/null | grep '^cpu kernels:' || true
}

"$engine" train "$config" --device cpu --run-dir "$tmp/native" "${sets[@]}" >"$tmp/native.log" 2>&1 \
  || { cat "$tmp/native.log"; fail "the run on this machine failed"; }
echo "this machine: $(path_of env)"
grep '^test:' "$tmp/native.log"

# The emulated runs go side by side (one per core); each is checked after both end.
models=(Haswell Nehalem)
declare -A expect=([Haswell]="cpu kernels: avx2" [Nehalem]="cpu kernels: portable")
pids=()
for m in "${models[@]}"; do
  "$qemu" -cpu "$m" "$engine" train "$config" --device cpu --run-dir "$tmp/$m" "${sets[@]}" \
    >"$tmp/$m.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!models[@]}"; do
  wait "${pids[$i]}" || { cat "$tmp/${models[$i]}.log"; echo "FAIL: the run on an emulated ${models[$i]} failed" >&2; status=1; }
done
[[ $status == 0 ]] || exit 1

for m in "${models[@]}"; do
  line="$(path_of "$qemu" -cpu "$m")"
  echo "emulated $m: $line"
  [[ "$line" == "${expect[$m]}"* ]] || fail "emulated $m: expected '${expect[$m]} ...', engine --version says '$line'"
  "$engine" diff "$tmp/native/last.h5" "$tmp/$m/last.h5" >"$tmp/$m.diff" 2>&1 \
    || { cat "$tmp/$m.diff"; fail "emulated $m: last.h5 differs from this machine's"; }
  grep -q '^verdict: identical' "$tmp/$m.diff" || { cat "$tmp/$m.diff"; fail "emulated $m: no identical verdict"; }
  diff <(grep '^test:' "$tmp/native.log") <(grep '^test:' "$tmp/$m.log") || fail "emulated $m: test metrics differ"
  echo "emulated $m: last.h5 and test metrics identical to this machine's"
  "$qemu" -cpu "$m" "$det_test" -tc='golden table*' >"$tmp/$m.det" 2>&1 || { cat "$tmp/$m.det"; fail "emulated $m: det:: differs from its golden table"; }
  grep -q 'test cases: 1 | 1 passed' "$tmp/$m.det" || { cat "$tmp/$m.det"; fail "emulated $m: the golden-table case did not run"; }
  echo "emulated $m: det:: golden table identical"
done
rm -rf "$tmp"
