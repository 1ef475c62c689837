#!/usr/bin/env bash
# Prepares, on a machine WITHOUT a GPU, what tools/gpu-check.sh needs on a lent GPU
# machine that cannot build the engine (it has CMake, ninja, CUDA, PyTorch, ncu and
# compute-sanitizer, but no HDF5, doctest or nlohmann-json): exactly the
# binaries gpu-check runs, the shared libraries they need beyond the CUDA toolkit, and
# the Fashion-MNIST files. Output: gpu-pack/ (git-ignored), carried with the tree:
#     device run --carry gpu-pack 'tools/gpu-check.sh'
# What travels is everything tracked + untracked-not-ignored + the pack, 64 MiB at most
# for the device tool; this script measures that real total and refuses (exit 1, pack
# removed) above GPU_PACK_LIMIT_MIB (60: 4 MiB below the device tool's 64). docs/gpu-check.md.
#
#   tools/gpu-pack.sh            build (or update) build-gpu/, pack, measure
# Env: ENGINE_DATA_DIR (the IDX files), GPU_PACK_BUILD (build dir, default build-gpu),
#      GPU_PACK_JOBS (default nproc), GPU_PACK_LIMIT_MIB (60).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACK="$ROOT/gpu-pack"
BUILD=${GPU_PACK_BUILD:-$ROOT/build-gpu}
DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}
JOBS=${GPU_PACK_JOBS:-$(nproc)}
LIMIT_MIB=${GPU_PACK_LIMIT_MIB:-60}
t0=$SECONDS

# ---- What gpu-check.sh runs (keep in step with it) ----------------------------------
GPU_TESTS=()
for src in "$ROOT"/tests/gpu/test_*.cpp; do GPU_TESTS+=("gpu_$(basename "$src" .cpp)"); done
# test_ops: the backend-comparison harness (tests/ops/), op-tests and sanitize run it on cuda.
GPU_TESTS+=(test_ops)
TARGETS=(engine_cli kernel_bench engine_kill_after "${GPU_TESTS[@]}")

# ---- Build: sm_90 (H100/H200) code and PTX; -lineinfo so compute-sanitizer and ncu
# name source lines. Release host code, not stripped (symbols for host backtraces).
# No MPI: the GPU machine has no Open MPI (one GPU: gpu-check's nccl stage runs a 1-rank
# NCCL communicator, which needs none), and libmpi with its dependencies would cost the
# transfer a few MiB for nothing it runs. NCCL is not packed either: the engine opens
# libnccl.so.2 with dlopen, there from PyTorch's wheel (gpu-check puts it on the path).
# ONNX export off as well: gpu-check runs no export, and libonnx with libprotobuf would
# add about 7 MB to the pack. HDF5 static (ENGINE_HDF5_STATIC): Debian's shared libhdf5
# needs curl, OpenSSL, GnuTLS, Kerberos and LDAP for its S3 driver, 6.7 MiB of the pack's
# libraries; the archive brings only what the engine calls.
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_MPI=OFF -DENGINE_ONNX=OFF -DENGINE_HDF5_STATIC=ON \
  -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" -DCMAKE_CUDA_FLAGS="-lineinfo" >/dev/null
compgen -G "$BUILD/CMakeFiles/*/CMakeCUDACompiler.cmake" >/dev/null ||
  { echo "gpu-pack: $BUILD has no CUDA backend (nvcc not found?)" >&2; exit 1; }
nice cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}"
echo "gpu-pack: build done after $((SECONDS - t0)) s"

rm -rf "$PACK"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/tests" "$stage/libs" "$stage/data" "$PACK"
cp "$BUILD/engine" "$BUILD/kernel_bench" "$stage/build/"
cp "$BUILD/tests/engine_kill_after" "$stage/build/tests/"  # the tests' stand-in for a power cut
for t in "${GPU_TESTS[@]}"; do cp "$BUILD/tests/$t" "$stage/build/tests/"; done

# ---- Shared libraries: what ldd lists, except the C runtime and what the GPU machine's
# CUDA installation and PyTorch provide (cuBLAS, cuDNN, cuRAND, the driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libcudnn|libcurand|libnvrtc|libcudart)'
# No BLAS: the CPU GEMM is the engine's own, so the CPU figures measured there are the
# CPU backend's own too.
{ for b in "$stage"/build/engine "$stage"/build/kernel_bench "$stage"/build/tests/*; do ldd "$b"; done; } |
  awk '/=> \// {print $1, $3}' | sort -u >"$stage/ldd.txt"
while read -r name path; do
  [[ "$name" =~ $skip ]] && continue
  cp -L "$path" "$stage/libs/$name"
done <"$stage/ldd.txt"

# Reproducible xz archives (sorted names, zero times and owners, one thread).
pack_dir() {  # pack_dir DIR ARCHIVE
  (cd "$1" && find . -type f | LC_ALL=C sort) >"$stage/list"
  tar -C "$1" --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - -T "$stage/list" |
    xz -9 -T1 >"$2"
}
pack_dir "$stage/libs" "$PACK/libs.tar.xz"
pack_dir "$stage/build" "$PACK/build.tar.xz"

# ---- The dataset: the four IDX files, decompressed (xz does better on the raw bytes
# than on gzip's output), in one xz archive.
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  if [ -f "$DATA/$f.gz" ]; then gzip -dc "$DATA/$f.gz" >"$stage/data/$f"
  elif [ -f "$DATA/$f" ]; then cp "$DATA/$f" "$stage/data/$f"
  else echo "gpu-pack: $DATA/$f(.gz) missing (ENGINE_DATA_DIR)" >&2; exit 1; fi
done
pack_dir "$stage/data" "$PACK/data.tar.xz"

# ---- Manifest: what is in the pack, for gpu-check's summary.
{
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "cuda_architectures 90-real;90-virtual, -lineinfo, Release, not stripped"
  echo "blas none (the engine's own GEMM)"
  echo "binaries $(cd "$stage/build" && find . -type f | LC_ALL=C sort | tr '\n' ' ')"
  echo "libraries $(cd "$stage/libs" && find . -type f -printf '%f ' | tr -s ' ')"
  (cd "$PACK" && sha256sum ./*.tar.xz)
} >"$PACK/MANIFEST.txt"

# ---- The real total: what the device tool will copy.
bytes_of_list() {  # sums the sizes of the NUL-separated paths on stdin (relative to ROOT)
  (cd "$ROOT" && xargs -0 -r stat -c %s -- 2>/dev/null) | awk '{s += $1} END {print s + 0}'
}
tracked=$(git -C "$ROOT" ls-files -z | (cd "$ROOT" && while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done) | bytes_of_list)
untracked=$(git -C "$ROOT" ls-files -z --others --exclude-standard | bytes_of_list)
pack=$(find "$PACK" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
total=$((tracked + untracked + pack))
mib() { awk -v b="$1" 'BEGIN {printf "%.2f MiB", b / 1048576}'; }
{
  echo "transfer tracked $(mib "$tracked"), untracked-not-ignored $(mib "$untracked"), gpu-pack $(mib "$pack"): total $(mib "$total") (limit ${LIMIT_MIB} MiB, device tool 64 MiB)"
  for f in "$PACK"/*.tar.xz; do echo "  $(basename "$f") $(mib "$(stat -c %s "$f")")"; done
} | tee -a "$PACK/MANIFEST.txt"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "gpu-pack: REFUSED: $(mib "$total") to transfer is over ${LIMIT_MIB} MiB; pack removed" >&2
  echo "  largest tracked files:" >&2
  git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 -r stat -c '%s %n' 2>/dev/null) | sort -rn | head -5 | sed 's/^/    /' >&2
  rm -rf "$PACK"
  exit 1
fi
echo "gpu-pack: ready after $((SECONDS - t0)) s: carry gpu-pack and run tools/gpu-check.sh on the GPU machine"
