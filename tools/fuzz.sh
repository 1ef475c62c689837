#!/usr/bin/env bash
# Fuzzing (docs/fuzzing.md).
#   tools/fuzz.sh TARGET SECONDS [LIBFUZZER_ARGS...]   fuzz one harness for SECONDS
#   tools/fuzz.sh --replay [TARGET...]                 replay the regression corpus
#   tools/fuzz.sh --pack-regressions                   fold new findings into the archive
# TARGET: checkpoint, checkpoint_header, config, idx, safetensors.
# The regression corpus is committed as one archive, tests/fuzz/regressions.tar.xz
# (TARGET/FILE inside; xz shares the bytes of the many near-copies of one checkpoint),
# plus any loose new findings in tests/fuzz/regressions/TARGET/ until --pack-regressions
# moves them into the archive. --replay replays both.
# Builds the fuzz build (clang, libFuzzer, ASan+UBSan, CPU only) in $FUZZ_BUILD_DIR
# (default build-fuzz/) when needed. Fuzzing keeps going past crashes (libFuzzer's fork
# mode), saves every crashing, hanging or memory-hungry input under
# $FUZZ_ARTIFACT_DIR/TARGET/ (default tests/fuzz/regressions/TARGET/, the committed
# regression corpus), and prints the executions run and each new finding with the top of
# its stack. Exit status: 0 = no finding, 1 = findings (or a replayed input fails), 2 = usage.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
ARTIFACTS="${FUZZ_ARTIFACT_DIR:-$ROOT/tests/fuzz/regressions}"
LOOSE="$ROOT/tests/fuzz/regressions"            # new findings, not yet in the archive
ARCHIVE="$ROOT/tests/fuzz/regressions.tar.xz"   # the committed regression corpus
TARGETS=(checkpoint checkpoint_header config idx safetensors)
JOBS="${FUZZ_BUILD_JOBS:-2}"

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

build() {
  [ "${FUZZ_NO_BUILD:-0}" = 1 ] && return 0  # binaries already in $FUZZ_BUILD_DIR/tests/fuzz/
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD" -DENGINE_FUZZ=ON -DENGINE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER="${FUZZ_CC:-clang}" -DCMAKE_CXX_COMPILER="${FUZZ_CXX:-clang++}" >/dev/null || exit 1
  fi
  cmake --build "$BUILD" -j"$JOBS" --target "$@" >"$BUILD/fuzz-build.log" 2>&1 ||
    { tail -40 "$BUILD/fuzz-build.log" >&2; echo "fuzz.sh: build failed (log: $BUILD/fuzz-build.log)" >&2; exit 1; }
}

# Per-target inputs: seed directories and libFuzzer options.
# The checkpoint fixtures of tests/data/ (5 MB, real training checkpoints; three of them
# in tests/data/fixtures.tar.xz, unpacked into $BUILD/fixture-seeds/) are seeds too,
# whole: HDF5 refuses a truncated file before parsing much (the superblock records the
# end of the file), and crafted-file crashes come mostly from the fixture's richer
# structure. The small tests/fuzz/corpus/checkpoint/tiny.h5 keeps the executions fast.
fixture_seeds() {
  local dir="$BUILD/fixture-seeds"
  rm -rf "$dir" && mkdir -p "$dir" || exit 1
  cp "$ROOT"/tests/data/*.h5 "$dir/" || exit 1
  if [ -f "$ROOT/tests/data/fixtures.tar.xz" ]; then
    tar -C "$dir" -xJf "$ROOT/tests/data/fixtures.tar.xz" || { echo "fuzz.sh: cannot unpack tests/data/fixtures.tar.xz" >&2; exit 1; }
  fi
  echo "$dir"
}
seeds_of() {
  case "$1" in
    checkpoint) echo "$ROOT/tests/fuzz/corpus/checkpoint $(fixture_seeds)" ;;
    *) echo "$ROOT/tests/fuzz/corpus/$1" ;;
  esac
}
options_of() {
  case "$1" in
    checkpoint) echo "-max_len=5300000" ;;
    checkpoint_header) echo "-max_len=1024 -dict=$ROOT/tests/fuzz/checkpoint_header.dict" ;;
    config) echo "-max_len=4096 -dict=$ROOT/tests/fuzz/config.dict" ;;
    idx) echo "-max_len=8192" ;;
    safetensors) echo "-max_len=16384 -dict=$ROOT/tests/fuzz/safetensors.dict" ;;
  esac
}
valid_target() { local t; for t in "${TARGETS[@]}"; do [ "$t" = "$1" ] && return 0; done; return 1; }

# The signature of a finding: the kind of report and the first three frames of the
# engine or a library it calls (libFuzzer's and the sanitizers' own frames skipped).
signature() {
  local bin="$1" input="$2" report
  report="$(timeout 300 "$bin" -rss_limit_mb=2048 -timeout=120 "$input" 2>&1)"
  local kind
  kind="$(grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|rejection is not one line|verify accepted|load_config accepted|resolved config changes|inconsistent sizes|label out of range|deadly signal|Timeout|out-of-memory' <<<"$report" |
    sed -E 's/^.*ERROR: //; s/^.*(runtime error: )/\1/; s/0x[0-9a-f]+/X/g; s/[0-9]{3,}/N/g; s/ \(.*$//' | cut -d: -f1-2 | head -c 90)"
  local frames
  frames="$(grep -E '^ +#[0-9]+ 0x' <<<"$report" |
    grep -vE 'libFuzzer|fuzzer::|__sanitizer|__asan|__ubsan|compiler-rt|libc\.so|libstdc\+\+|pthread_kill|abort|raise|__cxa_throw|std::terminate|LLVMFuzzerTestOneInput|__interceptor' |
    sed -E 's/^ +#[0-9]+ 0x[0-9a-f]+ in ([^ (<]+).*/\1/; s/^ +#[0-9]+ 0x[0-9a-f]+ +\(.*\/([^/]+)\+(0x[0-9a-f]+)\).*/\1+\2/' |
    head -3 | paste -sd '<' - | sed 's/</ < /g')"
  echo "${kind:-unknown} @ ${frames:-?}"
}

# True when the input passes on its own, three times out of three.
replays_clean() {
  local i
  for i in 1 2 3; do
    timeout 300 "$1" -rss_limit_mb=2048 -timeout=120 "$2" >/dev/null 2>&1 || return 1
  done
  return 0
}

# The fuzzing log's lines about crashes: each report's first lines (at most 60 in all).
crash_context() {
  grep -n -E -A12 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|deadly signal|rejection is not one line|verify accepted|CRASH|crash-[0-9a-f]{40}' "$1" | head -60
}

# Inputs that are a fixture of tests/data/ with a few bytes changed (most checkpoint
# findings: the fuzzer mutates the 5 MB fixture's metadata) are stored in the archive as
# NAME.patch: a base fixture, the size, the SHA-256 of the input, and "offset byte"
# lines. `patch_corpus make DIR` turns such files into patches, `patch_corpus apply DIR`
# rebuilds them (checking the SHA-256). So the archive holds no copy of the fixture.
patch_corpus() {
  python3 - "$1" "$2" "$ROOT" <<'EOF'
import hashlib, os, sys
mode, top, root = sys.argv[1], sys.argv[2], sys.argv[3]
MAGIC, MAX_CHANGES = "engine-fuzz-patch 1", 4096
bases = sorted(os.path.join("tests/data", f) for f in os.listdir(os.path.join(root, "tests/data")) if f.endswith(".h5"))
base_bytes = {b: open(os.path.join(root, b), "rb").read() for b in bases}
for d, _, files in os.walk(top):
    for f in sorted(files):
        path = os.path.join(d, f)
        if mode == "apply" and f.endswith(".patch"):
            lines = open(path).read().split("\n")
            if lines[0] != MAGIC: sys.exit(f"fuzz.sh: {path}: not a corpus patch")
            base, size, digest = lines[1].split(" ", 1)[1], int(lines[2].split()[1]), lines[3].split()[1]
            data = bytearray(base_bytes[base])
            if len(data) != size: sys.exit(f"fuzz.sh: {path}: {base} is not {size} bytes")
            for line in lines[4:]:
                if line:
                    off, val = map(int, line.split())
                    data[off] = val
            if hashlib.sha256(data).hexdigest() != digest: sys.exit(f"fuzz.sh: {path}: rebuilt input does not match its SHA-256")
            open(path[:-len(".patch")], "wb").write(data)
            os.remove(path)
        elif mode == "make" and not f.endswith(".patch"):
            data = open(path, "rb").read()
            for b in bases:
                ref = base_bytes[b]
                if len(ref) != len(data): continue
                changes = [(i, data[i]) for i in range(len(data)) if data[i] != ref[i]] if data != ref else []
                if len(changes) > MAX_CHANGES: continue
                with open(path + ".patch", "w") as out:
                    out.write(f"{MAGIC}\nbase {b}\nsize {len(data)}\nsha256 {hashlib.sha256(data).hexdigest()}\n")
                    out.writelines(f"{i} {v}\n" for i, v in changes)
                os.remove(path)
                break
EOF
}

# Unpacks the committed archive into $1 (emptied first), patches rebuilt.
unpack_archive() {
  rm -rf "$1" && mkdir -p "$1" || exit 1
  [ -f "$ARCHIVE" ] || return 0
  tar -C "$1" -xJf "$ARCHIVE" || { echo "fuzz.sh: cannot unpack ${ARCHIVE#"$ROOT"/}" >&2; exit 1; }
  patch_corpus apply "$1" || exit 1
}

# Adds the loose findings of tests/fuzz/regressions/TARGET/ to the archive (a file of
# the same name is replaced) and removes them. The archive is reproducible: sorted
# names, zero times and owners, single-threaded xz.
pack_regressions() {
  local work t f added=0
  work="$(mktemp -d)"
  unpack_archive "$work/corpus"
  for t in "${TARGETS[@]}"; do
    for f in "$LOOSE/$t"/*; do
      [ -f "$f" ] || continue
      mkdir -p "$work/corpus/$t" && cp "$f" "$work/corpus/$t/" || exit 1
      added=$((added + 1))
    done
  done
  patch_corpus make "$work/corpus" || exit 1
  (cd "$work/corpus" && find . -type f | LC_ALL=C sort | sed 's|^\./||' >"$work/list") || exit 1
  tar -C "$work/corpus" --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=a+rX,u+w,go-w \
    -cf - -T "$work/list" | xz -9e -T1 >"$ARCHIVE.tmp" && mv "$ARCHIVE.tmp" "$ARCHIVE" || exit 1
  for t in "${TARGETS[@]}"; do
    for f in "$LOOSE/$t"/*; do [ -f "$f" ] && rm -f "$f"; done
    rmdir "$LOOSE/$t" 2>/dev/null
  done
  rmdir "$LOOSE" 2>/dev/null
  echo "${ARCHIVE#"$ROOT"/}: $(wc -l <"$work/list") inputs ($added added), $(wc -c <"$ARCHIVE") bytes"
  rm -rf "$work"
}

replay() {
  local targets=("$@") t f rc failed=0 total=0
  [ ${#targets[@]} -eq 0 ] && targets=("${TARGETS[@]}")
  for t in "${targets[@]}"; do valid_target "$t" || usage; done
  build $(printf 'fuzz_%s ' "${targets[@]}")
  local unpacked="$BUILD/regressions"
  unpack_archive "$unpacked"
  for t in "${targets[@]}"; do
    local bin="$BUILD/tests/fuzz/fuzz_$t" n=0 bad=0
    shopt -s nullglob
    local inputs=("$unpacked/$t"/* "$LOOSE/$t"/* "$ROOT/tests/fuzz/corpus/$t"/*)
    shopt -u nullglob
    for f in "${inputs[@]}"; do
      [ -f "$f" ] || continue
      n=$((n + 1))
      timeout 300 "$bin" -rss_limit_mb=2048 -timeout=120 "$f" >/dev/null 2>&1
      rc=$?
      if [ $rc -ne 0 ]; then
        bad=$((bad + 1))
        echo "FAIL $t ${f#$ROOT/} (exit $rc): $(signature "$bin" "$f")"
      fi
    done
    echo "replay $t: $n inputs, $bad failing"
    total=$((total + n)); failed=$((failed + bad))
  done
  echo "replay: $total inputs, $failed failing"
  [ $failed -eq 0 ]
}

fuzz() {
  local t="$1" seconds="$2"; shift 2
  valid_target "$t" || usage
  [[ "$seconds" =~ ^[0-9]+$ ]] || usage
  build "fuzz_$t"
  local bin="$BUILD/tests/fuzz/fuzz_$t" work="$BUILD/corpus/$t" out="$ARTIFACTS/$t"
  mkdir -p "$work" "$out"
  local before
  before="$(ls "$out")"
  local log="$BUILD/fuzz-$t.log"
  echo "fuzzing $t for ${seconds}s (log: ${log#$ROOT/})"
  # Fork mode with -ignore_*: a finding is saved and fuzzing goes on for the whole time.
  # -rss_limit_mb/-malloc_limit_mb: an input that makes one load take > 2 GB is a finding.
  # shellcheck disable=SC2046
  "$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/" $(options_of "$t") "$@" \
    "$work" $(seeds_of "$t") >"$log" 2>&1
  local rc=$?
  # Fork mode's status lines: "#EXECS: cov: .. ft: .. corp: .. exec/s .. oom/timeout/crash: a/b/c time: Ts ..."
  local last execs
  last="$(grep -E '^#[0-9]+: cov:' "$log" | tail -1)"
  execs="$(sed -E 's/^#([0-9]+):.*/\1/' <<<"$last")"
  local new=() f
  while IFS= read -r f; do
    [ -n "$f" ] && ! grep -qxF "$f" <<<"$before" && new+=("$f")
  done < <(ls "$out")
  echo "$t: ${execs:-?} executions in ${seconds}s; ${last#*: }"
  if [ ${#new[@]} -gt 0 ]; then
    echo "$t: ${#new[@]} new finding(s) saved in ${out#$ROOT/}/:"
    local sigs="" reproduced=0
    for f in "${new[@]}"; do
      # A finding is a failure when its input fails again on its own. One that replays
      # cleanly three times depended on what ran before it in the fuzzing process, or on
      # the machine (memory, load): it is kept and reported with what the fuzzing log
      # says about it, for a person to look into, and does not fail the run.
      if replays_clean "$bin" "$out/$f"; then
        echo "  $f: not reproducible (3 clean replays of the input alone); from the fuzzing log:"
        crash_context "$log" | sed 's/^/    | /'
        continue
      fi
      reproduced=$((reproduced + 1))
      local s; s="$(signature "$bin" "$out/$f")"
      echo "  $f: $s"
      sigs+="$s"$'\n'
    done
    if [ $reproduced -gt 0 ]; then
      echo "$t: $(sort -u <<<"${sigs%$'\n'}" | wc -l) unique signature(s)"
      return 1
    fi
    echo "$t: no reproducible crash, hang or out-of-memory"
    return 0
  fi
  if [ $rc -ne 0 ] || [ -z "$execs" ]; then
    tail -20 "$log"; echo "$t: libFuzzer exited with status $rc"; return 1
  fi
  echo "$t: no crash, hang or out-of-memory"
  return 0
}

[ $# -ge 1 ] || usage
if [ "$1" = "--replay" ]; then shift; replay "$@"; exit $?; fi
if [ "$1" = "--pack-regressions" ]; then [ $# -eq 1 ] || usage; pack_regressions; exit 0; fi
[ $# -ge 2 ] || usage
fuzz "$@"
