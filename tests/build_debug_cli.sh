#!/usr/bin/env bash
# The CTest fixture cpu_paths_debug_build: a Debug (-O0), CPU-only build of the CLI in DIR,
# for test_cpu_paths' comparison with the Release build. Only the CLI is built (-j2);
# later runs reuse DIR.
#   build_debug_cli.sh SOURCE_DIR DIR
set -euo pipefail
src="$1" dir="$2"
cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DENGINE_CUDA=OFF -DENGINE_MPI=OFF -DBUILD_TESTING=OFF \
  -DENGINE_INSTALL=OFF >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j2 --target engine_cli >"$dir.log" 2>&1 || { tail -50 "$dir.log"; exit 1; }
grep -q '^CMAKE_BUILD_TYPE:STRING=Debug$' "$dir/CMakeCache.txt" || { echo "$dir is not a Debug build"; exit 1; }
echo "Debug CLI: $dir/engine"
