#!/usr/bin/env bash
# Prepares, on a machine WITHOUT a GPU, everything tools/gpu-check.sh needs on a GPU
# machine that has CUDA but no package registry: a CUDA build for sm_90 (H100/H200),
# the shared libraries it needs beyond the CUDA toolkit (HDF5, OpenBLAS, ...; xz
# compressed), and the Fashion-MNIST files. Output: gpu-pack/ (git-ignored, < 60 MiB),
# to carry with the working tree:  device run --carry gpu-pack 'tools/gpu-check.sh'
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PACK="$ROOT/gpu-pack"
BUILD="$ROOT/build-gpu"
DATA=${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
grep -q "ENGINE_WITH_CUDA" "$BUILD/CMakeCache.txt" || true
rm -rf "$PACK"
mkdir -p "$PACK/build/tests" "$PACK/libs" "$PACK/data"
cp "$BUILD/engine" "$BUILD/kernel_bench" "$PACK/build/"
for b in "$BUILD"/checkpoint_bench; do [ -x "$b" ] && cp "$b" "$PACK/build/"; done
find "$BUILD/tests" -maxdepth 1 -type f -perm -u+x -name 'test_*' -exec cp {} "$PACK/build/tests/" \;
find "$BUILD/tests" -maxdepth 1 -type f -perm -u+x -name 'gpu_test_*' -exec cp {} "$PACK/build/tests/" \;
cp "$BUILD/tests/engine_kill_after" "$PACK/build/tests/"  # the tests' stand-in for a power cut
strip --strip-unneeded "$PACK"/build/engine "$PACK"/build/kernel_bench "$PACK"/build/tests/* 2>/dev/null || true

# Shared libraries: everything ldd lists except the C runtime and what the GPU
# machine's CUDA installation provides (cuBLAS, cuDNN, the driver).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libcuda\.so|libcublas|libcublasLt|libcudnn|libnvrtc)'
{ ldd "$PACK/build/engine"; for t in "$PACK"/build/tests/*; do ldd "$t"; done; } |
  awk '/=> \// {print $1, $3}' | sort -u | while read -r name path; do
    if ! [[ "$name" =~ $skip ]]; then cp -L "$path" "$PACK/libs/$name"; fi
  done
tar -C "$PACK/libs" -cJf "$PACK/libs.tar.xz" .
rm -rf "$PACK/libs"
tar -C "$PACK" -cJf "$PACK/build.tar.xz" build
rm -rf "$PACK/build"
cp "$DATA"/*-ubyte* "$PACK/data/"
du -sh "$PACK"
size_kb=$(du -sk "$PACK" | cut -f1)
if [ "$size_kb" -gt $((60 * 1024)) ]; then
  echo "gpu-pack is ${size_kb} KiB: over the 60 MiB budget for the device transfer" >&2
  exit 1
fi
echo "ready: carry gpu-pack and run tools/gpu-check.sh on the GPU machine"
