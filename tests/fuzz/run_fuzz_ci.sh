#!/usr/bin/env bash
# The CTest test `fuzz` (label fuzz): builds the fuzz build (clang, libFuzzer, ASan+UBSan,
# CPU only) in BUILD_DIR, replays the regression corpus (tests/fuzz/regressions.tar.xz, unpacked
# by tools/fuzz.sh into BUILD_DIR/regressions) and the seed corpora of every
# harness (every input must pass), runs every harness for SECONDS, and runs a crafted-file
# campaign of CRAFTED files against ENGINE. Fails on any crash, hang, out-of-memory or
# malformed rejection; prints the executions per harness. Exits 77 (skipped) when clang
# with libFuzzer is not installed (Debian: clang libclang-rt-14-dev).
#   run_fuzz_ci.sh BUILD_DIR SECONDS CRAFTED ENGINE
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$1" SECONDS_EACH="$2" CRAFTED="$3" ENGINE="$4"

probe="$(mktemp -d)"
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! command -v clang++ >/dev/null || ! clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" 2>/dev/null; then
  echo "skipped: clang++ with libFuzzer (Debian: clang libclang-rt-14-dev) is not installed"
  exit 77
fi

export FUZZ_BUILD_DIR="$BUILD" FUZZ_ARTIFACT_DIR="$BUILD/findings"
mkdir -p "$BUILD"
status=0
start=$SECONDS
echo "== build ($BUILD)"
"$ROOT/tools/fuzz.sh" --replay checkpoint checkpoint_header config idx safetensors >"$BUILD/replay.txt" 2>&1
replay_rc=$?
echo "build and replay: $((SECONDS - start))s"
cat "$BUILD/replay.txt"
[ $replay_rc -eq 0 ] || { echo "FAILED: the regression corpus does not replay cleanly"; status=1; }

for t in checkpoint checkpoint_header config idx safetensors; do
  echo "== fuzz $t"
  "$ROOT/tools/fuzz.sh" "$t" "$SECONDS_EACH" || status=1
done

if [ "$CRAFTED" -gt 0 ]; then
  echo "== crafted checkpoints"
  python3 "$ROOT/tools/crafted_checkpoints.py" --engine "$ENGINE" -n "$CRAFTED" --timeout 20 \
    --keep-dir "$BUILD/findings/crafted" || status=1
fi
echo "fuzz CI: $((SECONDS - start))s in all, $([ $status -eq 0 ] && echo passed || echo FAILED)"
[ $status -eq 0 ] || echo "findings (to keep one: copy it to tests/fuzz/regressions/TARGET/, then tools/fuzz.sh --pack-regressions): $BUILD/findings"
exit $status
