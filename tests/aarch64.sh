#!/usr/bin/env bash
# aarch64 gives the same bits as x86-64 (docs/architecture.md, "Determinism"): the engine's
# CLI cross-compiled for arm64 (cmake/toolchain-aarch64-linux-gnu.cmake, Debian's
# crossbuild-essential-arm64 and the arm64 HDF5 that tools/fetch-arm64-libs.sh downloads)
# trains the same short run under qemu-aarch64, and `engine diff` must call its last.h5
# identical to this machine's, with the same test metrics:
#   straight   2 epochs on arm64 against 2 epochs here;
#   resumed    epoch 1 here, epoch 2 on arm64 (a job requeued onto an aarch64 node)
#              against the same 2 epochs here.
# Under qemu-user the parser's seccomp filter cannot be installed (prctl gives EINVAL):
# `engine --version` and `engine verify` must say so, and ENGINE_PARSER_SECCOMP=require
# must refuse to parse (docs/security.md).
# Only the CLI is built (-j2), CPU-only, into WORK/build, which later runs reuse. CTest
# label `cpu_models`; skipped (77), saying why, off x86-64, without the cross compiler,
# qemu-aarch64, the arm64 packages or the data set.
#   aarch64.sh ENGINE CONFIG DATA_DIR SOURCE_DIR WORK
set -euo pipefail
engine="$1" config="$2" data="$3" src="$4" work="$5"
debs="${ENGINE_ARM64_DEBS:-$src/.deps/arm64-debs}"
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ "$(uname -m)" == x86_64 ]] || skip "not an x86-64 machine (this test compares arm64 with x86-64)"
command -v aarch64-linux-gnu-g++ >/dev/null || skip "no aarch64-linux-gnu-g++ (Debian's crossbuild-essential-arm64)"
qemu="$(command -v qemu-aarch64 || true)"
[[ -n "$qemu" ]] || skip "no qemu-aarch64 (Debian's qemu-user)"
[[ -f "$debs/packages.txt" ]] || skip "no arm64 packages in $debs (tools/fetch-arm64-libs.sh downloads them)"
[[ -d "$data" ]] || skip "no data set at $data"
seconds() { echo "$(( $(date +%s) - $1 )) s"; }

# The arm64 libraries: every package of the list unpacked into one folder; absolute
# symbolic links (libz.so -> /lib/aarch64-linux-gnu/...) pointed into it.
t0=$(date +%s)
sysroot="$work/sysroot"
rm -rf "$sysroot" && mkdir -p "$sysroot"
while read -r deb; do
  [[ -f "$debs/$deb" ]] || skip "$debs/$deb is missing (rerun tools/fetch-arm64-libs.sh)"
  dpkg-deb -x "$debs/$deb" "$sysroot"
done <"$debs/packages.txt"
while IFS= read -r -d '' link; do
  target="$(readlink "$link")"
  [[ "$target" == /* ]] && ln -sfn "$sysroot$target" "$link"
done < <(find "$sysroot" -type l -print0)

build="$work/build"
# Configured every time (a later run's options reach a kept build directory too).
cmake -S "$src" -B "$build" --toolchain "$src/cmake/toolchain-aarch64-linux-gnu.cmake" \
  -DENGINE_AARCH64_SYSROOT="$sysroot" -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=OFF -DENGINE_MPI=OFF -DENGINE_ONNX=OFF \
  -DBUILD_TESTING=OFF -DENGINE_INSTALL=OFF >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "configuring the arm64 build failed"; }
cmake --build "$build" -j2 --target engine_cli >"$work/build.log" 2>&1 \
  || { tail -50 "$work/build.log"; fail "building the arm64 engine failed"; }
arm_engine="$build/engine"
file -b "$arm_engine" | grep -q 'ARM aarch64' || fail "$arm_engine is not an arm64 program: $(file -b "$arm_engine")"
echo "arm64 engine built in $(seconds "$t0")"

libs="$sysroot/usr/lib/aarch64-linux-gnu:$sysroot/lib/aarch64-linux-gnu"
arm() { "$qemu" -L /usr/aarch64-linux-gnu -E "LD_LIBRARY_PATH=$libs" "$arm_engine" "$@"; }

export OMP_NUM_THREADS=1
tmp="$work/runs"
rm -rf "$tmp" && mkdir -p "$tmp"
sets=(--set "data.dir=$data" --set data.train_limit=96 --set data.batch_size=12 --set data.val_split=16
      --set data.test_limit=64 --set train.epochs=2 --set checkpoint.verify=false --set logging.tensorboard=false)

version="$(arm --version)" || fail "engine --version failed on arm64"
echo "$version" | sed 's/^/arm64: /'
grep -q '^cpu kernels: portable' <<<"$version" || fail "arm64: expected 'cpu kernels: portable ...'"

# This machine: 2 epochs straight, and 1 epoch for the arm64 side to resume.
t0=$(date +%s)
"$engine" train "$config" --device cpu --run-dir "$tmp/x86_2" "${sets[@]}" >"$tmp/x86_2.log" 2>&1 \
  || { cat "$tmp/x86_2.log"; fail "the 2-epoch run on this machine failed"; }
"$engine" train "$config" --device cpu --run-dir "$tmp/resumed" "${sets[@]}" --stop-after-epochs 1 \
  >"$tmp/x86_1.log" 2>&1 || { cat "$tmp/x86_1.log"; fail "the 1-epoch run on this machine failed"; }
grep '^test:' "$tmp/x86_2.log"

# arm64 under qemu, side by side: the straight run, and epoch 2 of this machine's run.
arm train "$config" --device cpu --run-dir "$tmp/arm_2" "${sets[@]}" >"$tmp/arm_2.log" 2>&1 &
straight=$!
arm resume "$tmp/resumed/last.h5" --device cpu --run-dir "$tmp/resumed" >"$tmp/arm_resumed.log" 2>&1 &
resumed=$!
status=0
wait $straight || { cat "$tmp/arm_2.log"; echo "FAIL: the 2-epoch run on arm64 failed" >&2; status=1; }
wait $resumed || { cat "$tmp/arm_resumed.log"; echo "FAIL: resuming on arm64 failed" >&2; status=1; }
[[ $status == 0 ]] || exit 1
echo "runs: $(seconds "$t0")"
grep -q 'resuming from epoch 1' "$tmp/arm_resumed.log" || { cat "$tmp/arm_resumed.log"; fail "the arm64 resume did not start from epoch 1"; }

identical() {  # NAME RUN_DIR LOG
  "$engine" diff "$tmp/x86_2/last.h5" "$2/last.h5" >"$tmp/$1.diff" 2>&1 || { cat "$tmp/$1.diff"; fail "$1: last.h5 differs from this machine's"; }
  grep -q '^verdict: identical' "$tmp/$1.diff" || { cat "$tmp/$1.diff"; fail "$1: no identical verdict"; }
  diff <(grep '^test:' "$tmp/x86_2.log") <(grep '^test:' "$3") || fail "$1: test metrics differ"
  echo "$1: last.h5 $(grep '^verdict' "$tmp/$1.diff"), test metrics identical to this machine's"
}
identical "arm64 straight" "$tmp/arm_2" "$tmp/arm_2.log"
identical "x86-64 epoch 1 + arm64 epoch 2" "$tmp/resumed" "$tmp/arm_resumed.log"

# The parser without its seccomp filter says so, and can be told to refuse.
grep -q '^checkpoint parser: no seccomp filter' <<<"$version" \
  || fail "arm64 under qemu: engine --version does not say the parser runs without its seccomp filter"
out="$(arm verify "$tmp/x86_2/last.h5" 2>&1)" || { echo "$out"; fail "engine verify failed under qemu"; }
echo "$out" | sed 's/^/arm64 verify: /'
grep -q "without the parser's seccomp filter" <<<"$out" || fail "engine verify does not say the parser ran without its seccomp filter"
if out="$(ENGINE_PARSER_SECCOMP=require arm verify "$tmp/x86_2/last.h5" 2>&1)"; then
  echo "$out"; fail "ENGINE_PARSER_SECCOMP=require: engine verify parsed without the filter"
fi
echo "arm64 verify with ENGINE_PARSER_SECCOMP=require: $out"
[[ "$(wc -l <<<"$out")" == 1 ]] || fail "ENGINE_PARSER_SECCOMP=require: expected one line, got: $out"
grep -q 'ENGINE_PARSER_SECCOMP=require' <<<"$out" || fail "the refusal does not name ENGINE_PARSER_SECCOMP"
rm -rf "$tmp"
