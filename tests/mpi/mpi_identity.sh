#!/usr/bin/env bash
# `engine train` under mpirun on 1, 2, 3 and 4 CPU ranks (and 2 over TCP only) writes the
# checkpoint of the run without mpirun, bit for bit (`engine diff`), and the same step
# digests at every step (`engine bisect`); more ranks than
# dist.chunks are refused with a message naming the key. CTest label `mpi` (docs/distributed.md).
#   mpi_identity.sh ENGINE MPIRUN CONFIG DATA_DIR TMP
set -euo pipefail
engine="$1" mpirun="$2" config="$3" data="$4" tmp="$5"
[[ -d "$data" ]] || { echo "no data set at $data: skipped"; exit 77; }
rm -rf "$tmp" && mkdir -p "$tmp"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# 600 images in batches of 72: 8 full batches and a ragged one of 24; two epochs with
# validation; a test evaluation of 200 images (batches of 72, 72, 56).
sets=(--set "data.dir=$data" --set data.train_limit=600 --set data.val_split=200 --set data.test_limit=200
      --set data.batch_size=72 --set train.epochs=2 --set checkpoint.verify=false --set logging.tensorboard=false)
mpi=("$mpirun" --oversubscribe --bind-to none)
fail() { echo "FAIL: $*" >&2; exit 1; }

"$engine" train "$config" --device cpu --run-dir "$tmp/plain" "${sets[@]}" >"$tmp/plain.log" 2>&1 \
  || { cat "$tmp/plain.log"; fail "the run without mpirun failed"; }
grep '^test:' "$tmp/plain.log"

compare() {  # NAME: the run in $tmp/NAME against the plain run
  local name="$1"
  "$engine" diff "$tmp/plain/last.h5" "$tmp/$name/last.h5" >"$tmp/$name.diff" 2>&1 \
    || { cat "$tmp/$name.diff"; fail "$name: last.h5 differs from the run without mpirun"; }
  grep -q '^verdict: identical' "$tmp/$name.diff" || { cat "$tmp/$name.diff"; fail "$name: no identical verdict"; }
  diff <(grep '^test:' "$tmp/plain.log") <(grep '^test:' "$tmp/$name.log") || fail "$name: test metrics differ"
  # Every step's digests too (docs/replay.md): the same at every world size.
  "$engine" bisect "$tmp/plain" "$tmp/$name" >"$tmp/$name.bisect" 2>&1 \
    || { cat "$tmp/$name.bisect"; fail "$name: bisect finds the runs part"; }
  grep -q '^identical through step 18 (from the recorded step digests)' "$tmp/$name.bisect" \
    || { cat "$tmp/$name.bisect"; fail "$name: not identical through step 18 by the step digests"; }
  echo "$name: last.h5, every step's digests and test metrics identical to the run without mpirun"
}

for np in 1 2 3 4; do
  "${mpi[@]}" -np "$np" "$engine" train "$config" --device cpu --run-dir "$tmp/np$np" "${sets[@]}" \
    >"$tmp/np$np.log" 2>&1 || { cat "$tmp/np$np.log"; fail "mpirun -np $np failed"; }
  # Only rank 0 prints: one test line.
  [[ "$(grep -c '^test:' "$tmp/np$np.log")" == 1 ]] || { cat "$tmp/np$np.log"; fail "np $np: not exactly one rank printed"; }
  # Ranks on one host: the batch norm's sums are exchanged by groups of channels.
  [[ $np == 1 ]] || grep -q "^data-parallel on $np ranks (mpi, one host)" "$tmp/np$np.log" ||
    { cat "$tmp/np$np.log"; fail "np $np: no 'data-parallel on $np ranks (mpi, one host)'"; }
  compare "np$np"
done

# The transport that crosses machines.
"${mpi[@]}" --mca btl tcp,self -np 2 "$engine" train "$config" --device cpu --run-dir "$tmp/tcp2" "${sets[@]}" \
  >"$tmp/tcp2.log" 2>&1 || { cat "$tmp/tcp2.log"; fail "mpirun --mca btl tcp,self -np 2 failed"; }
compare tcp2

# More ranks than the batch's chunks (dist.chunks) are refused, naming the key.
if "${mpi[@]}" -np 3 "$engine" train "$config" --device cpu --run-dir "$tmp/np3c2" "${sets[@]}" --set dist.chunks=2 \
  >"$tmp/np3c2.log" 2>&1; then
  cat "$tmp/np3c2.log"; fail "3 ranks with dist.chunks=2 were not refused"
fi
grep -q 'world size 3 is above dist.chunks = 2' "$tmp/np3c2.log" || { cat "$tmp/np3c2.log"; fail "the refusal does not name dist.chunks"; }
echo "np3 with dist.chunks=2: refused: $(grep -m1 'world size 3' "$tmp/np3c2.log")"
echo "all identical"
