#!/usr/bin/env bash
# Nothing lost by a change: two builds of the CLI (the old one, the new one) train the
# standard runs, and each pair must give the same bits at every step (their step
# digests, compared by the new build's `engine bisect`) and the same final checkpoint
# (`engine diff`, wall-clock timings aside).
#
#   tools/same_bits.sh --old ENGINE --new ENGINE [--old-emulated ENGINE --new-emulated ENGINE]
#                      [--mpirun PATH] [--limit N] [--keep]
#
# The runs, each on a small slice of Fashion-MNIST (data.train_limit, 2 epochs):
#   straight        engine train on the CPU
#   resumed         stopped after epoch 1 and resumed (compared with the other build's
#                   straight run: a resume is bit-identical to a run without one)
#   ranks 2, 4      mpirun -np 2 and -np 4 (when Open MPI is present)
#   path P          ENGINE_CPU_KERNELS=P for each CPU path this CPU has
#   emulated        --device cuda on the emulated device (tests/emulated_cuda/build.sh
#                   builds it) in fp32, fp16 and bf16, whole batch with cuda.graphs off
#                   and on, and batch chunks
# Exit status: 0 every pair identical, 1 a pair parted (its bisect says where), 2 a run
# failed.
set -uo pipefail

die() { echo "same_bits.sh: $*" >&2; exit 2; }

old="" new="" old_emu="" new_emu="" mpirun="$(command -v mpirun || true)" limit=1024 keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --old) old="$2"; shift 2 ;;
    --new) new="$2"; shift 2 ;;
    --old-emulated) old_emu="$2"; shift 2 ;;
    --new-emulated) new_emu="$2"; shift 2 ;;
    --mpirun) mpirun="$2"; shift 2 ;;
    --limit) limit="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (try --help)" ;;
  esac
done
[[ -x "$old" && -x "$new" ]] || die "give --old ENGINE and --new ENGINE (executables)"
[[ -z "$old_emu" || -x "$old_emu" ]] && [[ -z "$new_emu" || -x "$new_emu" ]] || die "an emulated engine is not executable"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
config="$here/../configs/mnist.json"
data="${ENGINE_DATA_DIR:-/usr/share/datasets/fashion-mnist}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/same_bits.XXXXXX")"
[[ $keep == 1 ]] && echo "runs kept in $tmp" || trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# mpirun refuses root unless told (CI runs as root).
[[ $(id -u) -eq 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

common=(--set "data.dir=$data" --set "data.train_limit=$limit" --set data.val_split=256
        --set data.test_limit=256 --set data.batch_size=64 --set train.epochs=2
        --set train.step_digests=true --set logging.tensorboard=false)
failed=0 parted=0 pairs=0

train() {  # NAME ENGINE [ENV=V...] -- ARGS...: one run into $tmp/NAME; its log beside it
  local name="$1" engine="$2"; shift 2
  local envs=()
  while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout -k 10 900 "$@" >"$tmp/$name.log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "  $name: the run failed (exit $rc): $(grep -v '^-*$' "$tmp/$name.log" | tail -n 1)"
    failed=$((failed + 1))
    return 1
  fi
}

compare() {  # LABEL DIR_A DIR_B
  pairs=$((pairs + 1))
  local out
  local bisect
  bisect="$("$new" bisect "$2" "$3" 2>&1)"
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "$1: PARTED"; echo "$bisect" | sed 's/^/    /'
    parted=$((parted + 1)); return
  fi
  if ! out="$("$new" diff "$2/last.h5" "$3/last.h5" 2>&1)"; then
    echo "$1: last.h5 differs"; grep -v ': identical$' <<<"$out" | sed 's/^/    /'
    parted=$((parted + 1)); return
  fi
  echo "$1: identical (step digests through step $(grep -o 'identical through step [0-9]*' <<<"$bisect" | grep -o '[0-9]*$'), last.h5)"
}

both() {  # LABEL [ENV=V...] -- COMMAND...: the same run with the old and the new CLI, the
          # word ENGINE of COMMAND standing for each
  local label="$1"; shift
  local envs=()
  while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  local slug="${label//[^A-Za-z0-9]/_}" which
  for which in old new; do
    local engine="${!which}" cmd=() word
    for word in "$@"; do [[ "$word" == ENGINE ]] && cmd+=("$engine") || cmd+=("$word"); done
    train "$slug.$which" "$engine" "${envs[@]}" -- "${cmd[@]}" --run-dir "$tmp/$slug.$which" || return
  done
  compare "$label" "$tmp/$slug.old" "$tmp/$slug.new"
}

echo "old: $old"
echo "new: $new"
both "straight" -- ENGINE train "$config" --device cpu "${common[@]}" --fresh

# Resumed: the new CLI stops after epoch 1 and resumes; the old CLI's straight run is
# the reference.
if train resumed.new "$new" -- "$new" train "$config" --device cpu "${common[@]}" --run-dir "$tmp/resumed.new" \
     --stop-after-epochs 1 --fresh &&
   train resumed.new2 "$new" -- "$new" resume "$tmp/resumed.new"; then
  compare "resumed (new) against straight (old)" "$tmp/straight.old" "$tmp/resumed.new"
fi

if [[ -n "$mpirun" ]]; then
  for np in 2 4; do
    both "ranks $np" -- "$mpirun" --oversubscribe --bind-to none -np "$np" \
      ENGINE train "$config" --device cpu "${common[@]}" --fresh
  done
else
  echo "ranks 2, 4: skipped (no mpirun)"
fi

for path in avx512 avx2 portable; do
  if ! ENGINE_CPU_KERNELS="$path" "$new" --version >/dev/null 2>&1; then
    echo "path $path: not on this CPU, skipped"; continue
  fi
  both "path $path" ENGINE_CPU_KERNELS="$path" -- ENGINE train "$config" --device cpu "${common[@]}" --fresh
done

if [[ -n "$old_emu" && -n "$new_emu" ]]; then
  saved_old="$old" saved_new="$new"
  old="$old_emu" new="$new_emu"
  for prec in fp32 fp16 bf16; do
    both "emulated $prec whole" -- ENGINE train "$config" --device cuda "${common[@]}" --set "precision.mode=$prec" \
      --set cuda.batch_chunks=false --set cuda.graphs=false --fresh
    both "emulated $prec whole, graphs" -- ENGINE train "$config" --device cuda "${common[@]}" --set "precision.mode=$prec" \
      --set cuda.batch_chunks=false --set cuda.graphs=true --fresh
    both "emulated $prec chunks" -- ENGINE train "$config" --device cuda "${common[@]}" --set "precision.mode=$prec" \
      --set cuda.batch_chunks=true --fresh
  done
  old="$saved_old" new="$saved_new"
else
  echo "emulated device: skipped (give --old-emulated and --new-emulated)"
fi

echo "$pairs pairs compared: $((pairs - parted)) identical, $parted parted; $failed runs failed"
[[ $failed -eq 0 ]] || exit 2
[[ $parted -eq 0 ]] || exit 1
exit 0
