#!/usr/bin/env bash
# GPU ranks under mpirun give the bytes of one process on the GPU (docs/SCALEOUT.md "GPU ranks and
# NCCL"), file for file (sha256 of every file): `mpirun -np 2` and `-np 3 strata quantize --device
# cuda` (ranks may share one GPU: rank r uses GPU local_rank mod the device count); the bytes the
# ranks read of the checkpoint add up to one process's (each tensor read by one rank).
#   tests/engine/mpi_gpu_test.sh STRATA MODEL [quick|full] [FLAGS...]
# With "full" also: -np 4 (a rank without micro-batches), a run of 2 ranks killed (SIGKILL) once a layer is committed and resumed with 3
# ranks, one of 3 ranks resumed by one process, and a rank that fails (test hook
# --test_fail_rank/--test_fail_layer) stopping every rank, its state resumed with 2 ranks: each
# gives the same bytes. FLAGS go to every run, the one-process reference included (e.g.
# --gpu_quantize off, --test_gpu_host_store).
# Exits 77 (ctest: skipped) without a GPU, without mpirun, or when STRATA was built without MPI.
set -euo pipefail
strata=$1 model=$2 mode=${3:-quick}
shift $(($# < 3 ? $# : 3))
nvidia-smi -L > /dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
command -v mpirun > /dev/null || { echo "mpirun not found: skipped"; exit 77; }
"$strata" --version | grep -q "MPI" || { echo "strata built without MPI: skipped"; exit 77; }
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Open MPI's session folder goes under TMPDIR (/tmp/ompi.<host>.<uid> by default, shared): two
# mpiruns starting at once (ctest -j) race to create it ("File exists"). One per test instead.
mkdir "$work/tmp" && export TMPDIR=$work/tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
launch=(timeout 120 mpirun --oversubscribe --bind-to none)  # a hang fails
mpi() {  # N, args...
  local n=$1; shift
  "${launch[@]}" -np "$n" "$strata" "$@"
}
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
# Micro-batches of 2 sequences; shards of ~52 KiB, some shared by two layers and so written by
# several ranks. Each rank's GPU budget is 1 GiB (the fixtures need far less). --resume_every 0:
# layer steps are recorded as the bytes rule allows, so that kills land after recorded layers.
args=(quantize --model "$src" --calib_data "$work/tokens.jsonl" --calib_size "$count"
      --calib_min_tokens 1 --batch_size 2 --max_shard_size_gb 0.00005 --recipe nvfp4-kv_fp8
      --device cuda --max_gpu_memory_gb 1 --resume_every 0 "$@")
extra=()
fail() { echo "FAIL: $*"; exit 1; }
source tests/engine/mpi_lib.sh  # sums, same, ranks_of, next_step, kill_and_resume

"$strata" "${args[@]}" --export_path "$work/ref" > "$work/ref.out" 2> "$work/ref.err" || { cat "$work/ref.err"; fail "one process failed"; }
grep -q "GPU: " "$work/ref.err" || { cat "$work/ref.err"; fail "one process did not run on the GPU"; }
one_read=$(sed -n 's/^checkpoint bytes read: //p' "$work/ref.out")
[ -n "$one_read" ] || fail "one process reported no bytes read"
sums "$work/ref" > "$work/ref.sums"
[ "$(wc -l < "$work/ref.sums")" -ge 5 ] || fail "reference export has too few files"

counts="2 3"
[ "$mode" = full ] && counts="2 3 4"  # 4: more ranks than the fixture's 3 micro-batches
for n in $counts; do
  mpi "$n" "${args[@]}" --export_path "$work/np$n" --log_dir "$work/logs$n" > "$work/np$n.out" 2> "$work/np$n.err" || { cat "$work/np$n.err"; fail "-np $n failed"; }
  grep -q "GPU: " "$work/np$n.err" || { cat "$work/np$n.err"; fail "-np $n did not run on the GPU"; }
  grep -q "calibrating on the CPU" "$work/np$n.err" && fail "-np $n fell back to the CPU"
  same "$work/np$n" "-np $n"
  [ "$(grep -c "^wrote " "$work/np$n.out")" -eq 1 ] || fail "-np $n: not exactly one summary"
  sum=$(sed -n 's/^ranks: .*(sum \([0-9]*\))$/\1/p' "$work/np$n.out")
  [ "$sum" = "$one_read" ] || { grep "^ranks:" "$work/np$n.out"; fail "-np $n read $sum bytes in total, one process $one_read"; }
  grep "^ranks:" "$work/np$n.out"
done
echo "ok: -np $counts on the GPU give one process's bytes; reads sum to one process's ($one_read)"
[ "$mode" = full ] || exit 0

# Every rank killed once a layer is committed, resumed with another rank count: 2 -> 3, 3 -> 1.
kill_and_resume

# A rank that fails: every rank stops, non-zero, in bounded time; the message names the rank.
out=$work/failed
t0=$(date +%s)
rc=0
mpi 2 "${args[@]}" --test_fail_rank 1 --test_fail_layer 1 -q --export_path "$out" > /dev/null 2> "$work/fail.err" || rc=$?
[ "$rc" -ne 0 ] || fail "a failing rank gave exit 0"
[ "$rc" -ne 124 ] || fail "a failing rank left the others hanging (timeout)"
[ $(($(date +%s) - t0)) -lt 60 ] || fail "the ranks took too long to stop"
grep -q "rank 1 of 2: test hook" "$work/fail.err" || { cat "$work/fail.err"; fail "no error naming rank 1"; }
mpi 2 "${args[@]}" --export_path "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "resume after a failed rank failed"; }
same "$out" "failed rank, resumed with -np 2"
echo "ok: killed runs resumed 2 -> 3 and 3 -> 1, and a failed rank's state resumed, give the same bytes"
