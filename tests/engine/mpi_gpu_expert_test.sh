#!/usr/bin/env bash
# Expert parallelism on GPU ranks (docs/SCALEOUT.md "Expert parallel on GPU ranks"):
# `mpirun -np N strata quantize --device cuda --expert_parallel` with N = 2, 3 and 4 ranks sharing
# the GPUs there are (one H200 on the test machine) gives the bytes of one process on the GPU,
# file for file (sha256 of every file; compare_exports.py prints what differs); the bytes the
# ranks read of the checkpoint add up to one process's read, each rank reads fewer bytes than one
# process (it holds only its experts), and expert rows crossed ranks (the summary's exchange line).
# Then runs killed (SIGKILL, every rank) once a layer is committed and resumed with another rank
# count: 2 -> 3, 4 -> 2 and 3 -> 1 (one process), each giving the same bytes.
#   tests/engine/mpi_gpu_expert_test.sh STRATA MODEL [FLAGS...]
# FLAGS go to every run, the one-process reference included. Every check prints a PASS or FAIL
# line; the last line is "PASS: ..." or "FAIL: ...". Exits 77 (ctest: skipped) without a GPU,
# without mpirun, or when STRATA was built without MPI.
# Ranks start through tests/engine/gpu_rank_env.sh, which gives each rank an NCCL host identifier
# of its own so that ranks may share one GPU.
set -euo pipefail
strata=$1 model=$2
shift 2
nvidia-smi -L > /dev/null 2>&1 || { echo "no GPU: skipped"; exit 77; }
command -v mpirun > /dev/null || { echo "mpirun not found: skipped"; exit 77; }
"$strata" --version | grep -q "MPI" || { echo "strata built without MPI: skipped"; exit 77; }
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tmp" && export TMPDIR=$work/tmp  # one Open MPI session folder per test
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # NCCL's own account of a failure, in the output
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launch=(timeout 240 mpirun --oversubscribe --bind-to none)  # a hang fails
mpi() {  # N, args...
  local n=$1; shift
  "${launch[@]}" -np "$n" bash "$here/gpu_rank_env.sh" "$strata" "$@"
}
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
# Micro-batches of 2 sequences; shards of ~52 KiB, some written by several ranks; layer steps
# recorded as the bytes rule allows (--resume_every 0), so that kills land after recorded layers.
args=(quantize --model "$src" --calib_data "$work/tokens.jsonl" --calib_size "$count"
      --calib_min_tokens 1 --batch_size 2 --max_shard_size_gb 0.00005 --recipe nvfp4-kv_fp8
      --device cuda --max_gpu_memory_gb 1 --resume_every 0 "$@")
pass() { echo "PASS: $model: $*"; }
fail() { echo "FAIL: $model: $*"; exit 1; }
source tests/engine/mpi_lib.sh  # sums, same, ranks_of, next_step, kill_and_resume
on_gpu() {  # stderr file, what
  grep -q "GPU: " "$1" || { cat "$1"; fail "$2 did not run on the GPU"; }
  if grep -q "calibrating on the CPU" "$1"; then cat "$1"; fail "$2 fell back to the CPU"; fi
}

"$strata" "${args[@]}" --export_path "$work/ref" > "$work/ref.out" 2> "$work/ref.err" || { cat "$work/ref.err"; fail "one process failed"; }
on_gpu "$work/ref.err" "one process"
one_read=$(sed -n 's/^checkpoint bytes read: //p' "$work/ref.out")
[ -n "$one_read" ] || fail "one process reported no bytes read"
sums "$work/ref" > "$work/ref.sums"
[ "$(wc -l < "$work/ref.sums")" -ge 5 ] || fail "reference export has too few files"
pass "one process on the GPU: $(wc -l < "$work/ref.sums") files, $one_read bytes read"

for n in 2 3 4; do
  out=$work/np$n
  mpi "$n" "${args[@]}" --expert_parallel --export_path "$out" --log_dir "$work/logs$n" > "$out.out" 2> "$out.err" || { cat "$out.err"; tail -n 30 "$work/logs$n"/rank-*.log 2> /dev/null || true; fail "-np $n --expert_parallel failed"; }
  on_gpu "$out.err" "-np $n"
  grep -q "expert parallel: " "$out.err" || { cat "$out.err"; fail "-np $n: expert parallelism was not used"; }
  same "$out" "-np $n --expert_parallel"
  [ "$(grep -c "^wrote " "$out.out")" -eq 1 ] || fail "-np $n: not exactly one summary"
  line=$(grep "^ranks:" "$out.out") || fail "-np $n: no per-rank read line"
  sum=$(sed -n 's/^ranks: .*(sum \([0-9]*\))$/\1/p' <<< "$line")
  [ "$sum" = "$one_read" ] || fail "-np $n read $sum bytes in total, one process $one_read ($line)"
  for b in $(sed 's/^ranks: [0-9]*; checkpoint bytes read per rank://; s/ (sum .*//' <<< "$line"); do
    [ "$b" -lt "$one_read" ] || fail "-np $n: a rank read $b bytes, not less than one process's $one_read"
  done
  pass "-np $n: bytes read per rank sum to one process's ($line)"
  xline=$(grep "^expert exchange per rank" "$out.out") || fail "-np $n: no expert exchange line"
  sent=$(sed 's/^[^:]*://' <<< "$xline" | awk '{ for (i = 1; i <= NF; i += 2) s += $i } END { print s + 0 }')
  [ "$sent" -gt 0 ] || fail "-np $n: no expert rows crossed ranks ($xline)"
  pass "-np $n: expert rows crossed ranks over NCCL ($xline)"
  grep -h "expert all-to-all: layer" "$work/logs$n"/rank-*.log | head -n 3 || true
done

# Killed with one rank count once a layer is committed, resumed with another.
extra=(--expert_parallel)
rank_cmd=(bash "$here/gpu_rank_env.sh")
kill_and_resume "2 3" "4 2" "3 1"
pass "expert parallel on GPU ranks: -np 2, 3, 4 and kill/resume 2 -> 3, 4 -> 2, 3 -> 1 give one process's bytes"
