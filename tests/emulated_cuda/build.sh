#!/usr/bin/env bash
# The CTest fixture emulated_cuda_build: a CPU-only Release build of the CLI in DIR whose
# CUDA runtime and ops are tests/emulated_cuda/emulated_cuda.cpp (an emulated device on
# host memory, chosen by the test-only ENGINE_CUDA_EMULATION_SOURCE), for the test
# emulated_cuda_step. Only the CLI and tests/emulated_cuda/inference_during_capture.cpp
# are built (-j2); later runs reuse DIR.
#   build.sh SOURCE_DIR DIR
set -euo pipefail
src="$1" dir="$2"
cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=OFF -DENGINE_ONNX=OFF -DENGINE_MPI=OFF \
  -DBUILD_TESTING=OFF -DENGINE_INSTALL=OFF \
  -DENGINE_CUDA_EMULATION_SOURCE="$src/tests/emulated_cuda/emulated_cuda.cpp" \
  >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; exit 1; }
cmake --build "$dir" -j2 --target engine_cli emulated_inference_during_capture >"$dir.log" 2>&1 || { tail -50 "$dir.log"; exit 1; }
"$dir/engine" version | grep -q "emulated" || { echo "$dir/engine is not the emulated-CUDA build"; "$dir/engine" version; exit 1; }
echo "emulated-CUDA CLI: $dir/engine"
