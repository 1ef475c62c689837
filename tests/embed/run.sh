#!/usr/bin/env bash
# The engine as a package, checked from the outside (CTest test `embed`):
#   1. installs the just-built engine into a temporary prefix and checks the tree (public
#      headers only, each compiling on its own; no path of this machine's build in the
#      CMake package), moves the prefix elsewhere (the package is relocatable), builds
#      tests/embed against it with find_package(engine CONFIG REQUIRED) and runs it;
#      pkg-config: a program compiled and linked with `pkg-config --cflags --libs engine`;
#   2. builds tests/embed with the engine's sources pulled in by FetchContent and the
#      CUDA backend off, runs it, installs that CPU-only engine into a second prefix and
#      repeats step 1 against it. With a CUDA build in step 1, the package is thus
#      proven with the CUDA backend on and off.
# Against each installed package, embed_ranks (tests/embed/ranks.cpp: engine::RunSession)
# trains alone and then, where mpirun exists and the build has MPI, under `mpirun -np 2`:
# the two ranks' last.h5 must be the one process's, bit for bit (`engine diff`); a rank
# that fails alone must end the job, and ranks that differ must be refused by every rank.
# usage: run.sh BUILD_DIR ON|OFF   (the build to install; whether it has the CUDA backend)
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: run.sh BUILD_DIR ON|OFF}" && pwd)
with_cuda=${2:?usage: run.sh BUILD_DIR ON|OFF}
cmake=${CMAKE_COMMAND:-cmake}
cxx=${CXX:-c++}
jobs=${EMBED_JOBS:-2}
data_args=()
if [ -n "${ENGINE_DATA_DIR:-}" ]; then data_args=(--data "$ENGINE_DATA_DIR"); fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/engine-embed.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { echo; echo "== $*"; }
fail() { echo "embed: FAIL: $*" >&2; exit 1; }
# Runs a command quietly; shows its output only when it fails.
quiet() {
  local log=$tmp/last.log
  if ! "$@" >"$log" 2>&1; then cat "$log" >&2; fail "$*"; fi
}

version=$(sed -n 's/^project(engine VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
[ -n "$version" ] || fail "cannot read the project version from $src/CMakeLists.txt"

# The installed tree: exactly the public headers, the library, the CLI, the CMake
# package and engine.pc, with no path of the source or build tree in them.
check_tree() {  # PREFIX CUDA(ON|OFF)
  local p=$1 cuda=$2 f
  for f in lib/libengine.a bin/engine lib/cmake/engine/engineConfig.cmake \
           lib/cmake/engine/engineConfigVersion.cmake lib/cmake/engine/engineTargets.cmake \
           lib/pkgconfig/engine.pc; do
    [ -f "$p/$f" ] || fail "$p/$f was not installed"
  done
  if [ "$cuda" = ON ]; then
    [ -f "$p/lib/cmake/engine/FindCUDNN.cmake" ] || fail "FindCUDNN.cmake missing from a CUDA build's package"
  fi
  diff <(cd "$src/include" && find engine -type f | sort) \
       <(cd "$p/include" && find . -type f | sed 's|^\./||' | sort) \
    || fail "$p/include holds other files than include/engine/ (above: < missing, > extra)"
  if grep -rlF -e "$src" -e "$build" "$p/lib/cmake" "$p/lib/pkgconfig"; then
    fail "the installed package names a path of the build machine's tree (files above)"
  fi
  # engine.pc names no absolute path at all (no -L/usr/local/cuda/..., no /usr/lib/libfoo.so):
  # the prefix comes from ${pcfiledir}, dependencies by .pc module or library name.
  if grep -v '^#' "$p/lib/pkgconfig/engine.pc" | grep -nE '(^|[[:space:]=])(-[LI])?/'; then
    fail "the installed engine.pc holds an absolute path of the build machine (lines above)"
  fi
  "$p/bin/engine" --help >/dev/null || fail "$p/bin/engine --help"
  # Each installed header compiles alone against the installed tree only: none may
  # include a private header (kernels/, io/, core/tensor_ops.h).
  local h n=0
  while IFS= read -r h; do
    echo "#include <$h>" | "$cxx" -std=c++17 -fsyntax-only -Wall -Wextra -I"$p/include" -x c++ - \
      || fail "installed header <$h> does not compile on its own"
    n=$((n + 1))
  done < <(cd "$p/include" && find engine -name '*.h' | sort)
  echo "installed tree ok: $n public headers, each self-contained"
}

# tests/embed built against an installed package, then run.
consumer() {  # PREFIX NAME CUDA(ON|OFF)
  local p=$1 name=$2 cuda=$3
  quiet "$cmake" -S "$src/tests/embed" -B "$tmp/$name" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$p"
  grep -q "engine $version from $p/lib/cmake/engine (CUDA backend: $cuda)" "$tmp/last.log" \
    || { cat "$tmp/last.log"; fail "find_package(engine) did not find $p with CUDA $cuda"; }
  quiet "$cmake" --build "$tmp/$name" -j"$jobs"
  run_embed "$tmp/$name/embed" "$tmp/run-$name" "$cuda"
  run_ranks "$tmp/$name/embed_ranks" "$p/bin/engine" "$tmp/ranks-$name"
}

# engine::RunSession: one process, then two ranks under mpirun (bit for bit), a rank that
# fails alone, ranks that differ.
run_ranks() {  # EXE ENGINE DIR
  local exe=$1 engine=$2 dir=$3 rc
  mkdir -p "$dir"
  "$exe" "$dir/one" --device cpu "${data_args[@]}" >"$dir/one.log" 2>&1 \
    || { cat "$dir/one.log"; fail "embed_ranks in one process"; }
  grep -q "embed_ranks: all checks passed on 1 rank(s)" "$dir/one.log" || { cat "$dir/one.log"; fail "embed_ranks in one process"; }
  echo "embed_ranks, one process: $(grep '^test:' "$dir/one.log")"
  local mpirun=${MPIEXEC:-$(command -v mpirun || true)}
  if [ -z "$mpirun" ]; then echo "embed_ranks under mpirun: skipped (no mpirun)"; return; fi
  if ! grep -q "MPI built" "$dir/one.log"; then echo "embed_ranks under mpirun: skipped (the engine was built without MPI)"; return; fi
  local mpi=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
             OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1
             timeout -s KILL 120 "$mpirun" --oversubscribe --bind-to none -np 2)
  "${mpi[@]}" "$exe" "$dir/two" --device cpu "${data_args[@]}" >"$dir/two.log" 2>&1 \
    || { cat "$dir/two.log"; fail "mpirun -np 2 embed_ranks"; }
  grep -q "embed_ranks: 2 rank(s) (mpi)" "$dir/two.log" || { cat "$dir/two.log"; fail "mpirun -np 2 embed_ranks: not 2 ranks over MPI"; }
  grep -q "embed_ranks: all checks passed on 2 rank(s)" "$dir/two.log" || { cat "$dir/two.log"; fail "mpirun -np 2 embed_ranks"; }
  [ "$(grep -c '^test:' "$dir/two.log")" = 1 ] || { cat "$dir/two.log"; fail "mpirun -np 2 embed_ranks: not rank 0 alone printed"; }
  "$engine" diff "$dir/one/last.h5" "$dir/two/last.h5" >"$dir/diff.log" 2>&1 \
    || { cat "$dir/diff.log"; fail "two ranks' last.h5 differs from one process's"; }
  grep -q '^verdict: identical' "$dir/diff.log" || { cat "$dir/diff.log"; fail "engine diff: no identical verdict"; }
  diff <(grep '^test:' "$dir/one.log") <(grep '^test:' "$dir/two.log") || fail "two ranks' test line differs"
  echo "embed_ranks, mpirun -np 2: last.h5 and test line identical to one process ($(grep '^verdict' "$dir/diff.log"))"
  # Rank 1 fails alone (its data.dir is missing) while rank 0 waits in the start
  # agreement: RunSession::abort_job ends both, at once, with rank 1's line.
  rc=0
  "${mpi[@]}" "$exe" "$dir/failing" --device cpu "${data_args[@]}" --fail-on-rank 1 >"$dir/failing.log" 2>&1 || rc=$?
  [ "$rc" = 1 ] || { cat "$dir/failing.log"; fail "a rank failing alone: exit $rc, expected 1 (137: the job hung)"; }
  grep -q "embed_ranks: rank 1: error: data directory '/nonexistent' not found" "$dir/failing.log" \
    || { cat "$dir/failing.log"; fail "a rank failing alone: no line naming rank 1"; }
  echo "embed_ranks, rank 1 failing alone: the job ended, exit 1: $(grep -m1 'rank 1: error' "$dir/failing.log")"
  # Rank 1 with another optimizer.lr: every rank refuses (exit 2), naming the key.
  rc=0
  "${mpi[@]}" "$exe" "$dir/differing" --device cpu "${data_args[@]}" --differ-on-rank 1 >"$dir/differing.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "$dir/differing.log"; fail "ranks that differ: exit $rc, expected 2"; }
  [ "$(grep -c 'optimizer.lr' "$dir/differing.log")" = 2 ] \
    || { cat "$dir/differing.log"; fail "ranks that differ: not both ranks named optimizer.lr"; }
  echo "embed_ranks, rank 1 differing: refused by both ranks, exit 2: $(grep -m1 'optimizer.lr' "$dir/differing.log" | cut -c1-120)"
}

run_embed() {  # EXE RUN_DIR CUDA(ON|OFF)
  local want=built
  [ "$3" = ON ] || want="not built"
  "$1" "$2" --device cpu "${data_args[@]}" | tee "$tmp/embed.log"
  grep -q "CUDA backend $want," "$tmp/embed.log" || fail "$1: expected the CUDA backend $want"
  grep -q "embed: all checks passed" "$tmp/embed.log" || fail "$1"
}

# pkg-config: flags resolve, and a program built with nothing else links and runs.
pc_check() {  # PREFIX CUDA(ON|OFF)
  local p=$1 cuda=$2 flags
  local path="$p/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  [ "$(PKG_CONFIG_PATH=$path pkg-config --modversion engine)" = "$version" ] \
    || fail "pkg-config --modversion engine"
  # A CUDA build's libraries are where this build found them (engine.pc names none).
  local define=()
  if [ "$cuda" = ON ] && [ -f "$build/engine-pc-cuda-ldflags.txt" ]; then
    define=("--define-variable=cuda_ldflags=$(cat "$build/engine-pc-cuda-ldflags.txt")")
  fi
  flags=$(PKG_CONFIG_PATH=$path pkg-config "${define[@]}" --cflags --libs engine) \
    || fail "pkg-config --cflags --libs engine"
  echo "pkg-config --cflags --libs engine: $flags"
  cat > "$tmp/pc.cpp" <<'EOF'
#include <engine/train/config.h>
#include <engine/core/device.h>
#include <engine/core/tensor.h>
#include <cstdio>
int main() {
  const engine::Config cfg;
  const engine::Tensor t = engine::Tensor::from_vector({2}, {1.5f, -2.0f});
  std::printf("cuda_built=%d batch_size=%d sum=%g\n", engine::cuda_built() ? 1 : 0,
              cfg.data.batch_size, t.to_vector()[0] + t.to_vector()[1]);
  return 0;
}
EOF
  # shellcheck disable=SC2086  # the flags are words
  "$cxx" -std=c++17 "$tmp/pc.cpp" -o "$tmp/pc" $flags || fail "compile and link with pkg-config's flags"
  local want=0
  [ "$cuda" = ON ] && want=1
  "$tmp/pc" | tee "$tmp/pc.log"
  grep -q "cuda_built=$want batch_size=128 sum=-0.5" "$tmp/pc.log" || fail "the pkg-config program"
}

step "1. install $build (CUDA backend $with_cuda)"
quiet "$cmake" --install "$build" --prefix "$tmp/prefix"
mv "$tmp/prefix" "$tmp/prefix-moved"  # relocatable: nothing points back at the first place
check_tree "$tmp/prefix-moved" "$with_cuda"
consumer "$tmp/prefix-moved" embed-installed "$with_cuda"
pc_check "$tmp/prefix-moved" "$with_cuda"

step "2. FetchContent of the sources with -DENGINE_CUDA=OFF, then its install"
quiet "$cmake" -S "$src/tests/embed" -B "$tmp/embed-fetched" -DCMAKE_BUILD_TYPE=Release \
  -DENGINE_SOURCE_DIR="$src" -DENGINE_CUDA=OFF
quiet "$cmake" --build "$tmp/embed-fetched" -j"$jobs"
run_embed "$tmp/embed-fetched/embed" "$tmp/run-fetched" OFF
quiet "$cmake" --install "$tmp/embed-fetched/_deps/engine-build" --prefix "$tmp/prefix-cpu"
check_tree "$tmp/prefix-cpu" OFF
consumer "$tmp/prefix-cpu" embed-installed-cpu OFF
pc_check "$tmp/prefix-cpu" OFF

step "3. two builds as the ranks of one job: refused at start, naming both, nothing written"
# The installed build of step 1 as rank 0, step 2's CPU-only one as rank 1. Two CPU-only
# builds of the same compiler and MPI are one build to the start agreement.
mpirun=${MPIEXEC:-$(command -v mpirun || true)}
if [ "$with_cuda" != ON ]; then
  echo "mixed builds: skipped (both builds are CPU-only)"
elif [ -z "$mpirun" ] || ! grep -q '^mpi: Open MPI' <<<"$("$tmp/prefix-cpu/bin/engine" --version)"; then
  echo "mixed builds: skipped (no mpirun, or the engine was built without MPI)"
else
  mixed=$tmp/mixed
  mixed_data=()
  if [ -n "${ENGINE_DATA_DIR:-}" ]; then mixed_data=(--set "data.dir=$ENGINE_DATA_DIR"); fi
  rc=0
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    OMP_NUM_THREADS=1 timeout -s KILL 120 "$mpirun" --oversubscribe --bind-to none \
    -np 1 "$tmp/prefix-moved/bin/engine" train "$src/configs/mnist.json" --device cpu --run-dir "$mixed/run" \
      --set data.train_limit=64 --set data.val_split=16 --set data.test_limit=16 "${mixed_data[@]}" \
    : -np 1 "$tmp/prefix-cpu/bin/engine" train "$src/configs/mnist.json" --device cpu --run-dir "$mixed/run" \
      --set data.train_limit=64 --set data.val_split=16 --set data.test_limit=16 "${mixed_data[@]}" \
    >"$tmp/mixed.log" 2>&1 || rc=$?
  [ "$rc" = 2 ] || { cat "$tmp/mixed.log"; fail "mixed builds: exit $rc, expected 2 (137: the job hung)"; }
  for r in 0 1; do
    grep -q "^engine: rank $r: .*the engine build of rank 1 differs from rank 0's.*rank 0 runs engine $version (CUDA backend on, .*rank 1 runs engine $version (CPU-only, " "$tmp/mixed.log" \
      || { cat "$tmp/mixed.log"; fail "mixed builds: rank $r gave no line naming both builds"; }
  done
  # Nothing but the run directory's lock (taken before the ranks agree).
  left=$(cd "$mixed/run" && find . -mindepth 1 ! -name .lock | sort)
  [ -z "$left" ] || fail "mixed builds: the refused job wrote $left"
  echo "mixed builds: refused by both ranks, exit 2: $(grep -m1 '^engine: rank 0' "$tmp/mixed.log" | cut -c1-400)"
fi

echo
echo "embed: the package works (CUDA backend $with_cuda, then OFF; find_package, FetchContent, pkg-config; mixed builds refused)"
