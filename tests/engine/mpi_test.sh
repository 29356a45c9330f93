#!/usr/bin/env bash
# Ranks under mpirun give the bytes of one process (docs/SCALEOUT.md), file for file (sha256 of
# every file): `mpirun -np 2` and `-np 3` on CPU ranks, oversubscribed; a run of 2 ranks stopped
# mid-way and resumed with 3 ranks, and one of 3 ranks resumed by a single process; the bytes the
# ranks read of the checkpoint add up to one process's (each tensor read by one rank).
#   tests/engine/mpi_test.sh STRATA MODEL [plain|failure|expert] [quick] [FLAGS...]
# FLAGS go to every run, the one-process reference included (e.g. --test_activation_budget 1).
# With "expert": the same with --expert_parallel (the routed experts split over the ranks, rows
# exchanged between them); the reference stays a single process without it.
# With "quick": -np 2 and -np 3 only, without the runs stopped and resumed (resuming with another
# rank count does not depend on the family; other fixtures run it in full).
# With "failure": one rank that fails (test hook --test_fail_rank/--test_fail_layer of
# engine/parallel.h) or is killed makes the others stop with a non-zero exit in bounded time, and
# a later run with another rank count resumes the state it left to the same bytes.
# Exits 77 (ctest: skipped) when mpirun is not installed.
set -euo pipefail
strata=$1 model=$2 mode=${3:-plain} quick=
shift $(($# < 3 ? $# : 3))
case $mode in plain | failure | expert) ;; quick) mode=plain quick=quick ;; *) echo "unknown mode $mode" >&2; exit 2 ;; esac
if [ "${1:-}" = quick ]; then quick=quick; shift; fi
command -v mpirun > /dev/null || { echo "mpirun not found: skipped"; exit 77; }
case $model in
  tiny-moe) src=demo/tiny-moe ;;
  *) src=tests/fixtures/models/$model ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Open MPI's session folder goes under TMPDIR (/tmp/ompi.<host>.<uid> by default, shared): two
# mpiruns starting at once (ctest -j) race to create it ("File exists"). One per test instead.
mkdir "$work/tmp" && export TMPDIR=$work/tmp
# Tests run as root in CI; local ranks over shared memory without single-copy (containers).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
# Under the sanitizers, ranks skip the leak check: Open MPI's allocations outlive MPI_Finalize,
# many in components it has unloaded (no module to suppress by). Single processes keep it.
launch=(timeout 120 env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
        mpirun --oversubscribe --bind-to none)  # a hang fails, it does not stall CI
mpi() {  # N, args...
  local n=$1; shift
  "${launch[@]}" -np "$n" "$strata" "$@"
}
if [ -f "$src/tokenizer.json" ] && [ ! -f "$src/reference.safetensors" ]; then
  data=(--calib_size 12 --calib_seq 24)  # the bundled corpus through the model's tokenizer
else  # the reference's tokens, or fixed ids for fixtures without one (tokens_jsonl.py)
  python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
  count=$(wc -l < "$work/tokens.jsonl")
  data=(--calib_data "$work/tokens.jsonl" --calib_size "$count" --calib_min_tokens 1)
fi
# Micro-batches of 2 sequences (several per rank); shards of ~52 KiB, some shared by two layers
# and so written by several ranks.
args=(quantize --model "$src" "${data[@]}" --batch_size 2 --max_shard_size_gb 0.00005
      --recipe nvfp4-kv_fp8 "$@")
extra=()
[ "$mode" != expert ] || extra=(--expert_parallel)
fail() { echo "FAIL: $*"; exit 1; }
source tests/engine/mpi_lib.sh  # sums, same, ranks_of, next_step, kill_and_resume

"$strata" "${args[@]}" -q --export_path "$work/ref" > "$work/ref.out"
one_read=$(sed -n 's/^checkpoint bytes read: //p' "$work/ref.out")
[ -n "$one_read" ] || fail "one process reported no bytes read"
sums "$work/ref" > "$work/ref.sums"
[ "$(wc -l < "$work/ref.sums")" -ge 5 ] || fail "reference export has too few files"

if [ "$mode" != failure ]; then
  for n in 2 3; do
    mpi "$n" "${args[@]}" "${extra[@]}" --export_path "$work/np$n" --log_dir "$work/logs$n" > "$work/np$n.out" 2> "$work/np$n.err" || { cat "$work/np$n.err"; fail "-np $n failed"; }
    same "$work/np$n" "-np $n"
    if [ "$n" -eq 3 ]; then  # again on the finished export: rank 0 says so, nothing is touched
      stamps() { (cd "$1" && find . -type f -printf '%p %s %T@\n' | sort); }
      stamps "$work/np$n" > "$work/np$n.stamps"
      mpi "$n" "${args[@]}" "${extra[@]}" -q --export_path "$work/np$n" > "$work/again.out" 2>&1 || { cat "$work/again.out"; fail "-np $n: re-run of the finished command failed"; }
      [ "$(grep -c "already complete" "$work/again.out")" -eq 1 ] || { cat "$work/again.out"; fail "-np $n: re-run did not say already complete once"; }
      diff "$work/np$n.stamps" <(stamps "$work/np$n") || fail "-np $n: re-run touched the finished export"
    fi
    grep -q "^wrote " "$work/np$n.out" || fail "-np $n: rank 0 printed no summary"
    [ "$(grep -c "^wrote " "$work/np$n.out")" -eq 1 ] || fail "-np $n: more than one rank printed the summary"
    # Each tensor read by one rank: the ranks' reads add up to one process's.
    sum=$(sed -n 's/^ranks: .*(sum \([0-9]*\))$/\1/p' "$work/np$n.out")
    [ "$sum" = "$one_read" ] || { grep "^ranks:" "$work/np$n.out"; fail "-np $n read $sum bytes in total, one process $one_read"; }
    for ((r = 0; r < n; r++)); do [ -s "$work/logs$n/rank-$r.log" ] || fail "-np $n: no log of rank $r"; done
    if [ "$mode" = expert ]; then
      grep -q "expert parallel: " "$work/np$n.err" || fail "-np $n: expert parallelism did not engage"
      # Rows crossed between ranks: some rank sent some.
      sent=$(sed -n 's/^expert exchange per rank (bytes sent to other ranks, ms): //p' "$work/np$n.out")
      [ -n "$sent" ] || fail "-np $n: no expert exchange reported"
      awk -v s="$sent" 'BEGIN { n = split(s, a, " "); t = 0; for (i = 1; i <= n; i += 2) t += a[i]; exit !(t > 0) }' ||
        fail "-np $n: no expert rows were exchanged ($sent)"
    fi
  done
  if [ "$quick" = quick ]; then
    echo "ok: -np 2 and -np 3 give one process's bytes${extra:+ (${extra[*]})}"
    exit 0
  fi
  kill_and_resume
  echo "ok: -np 2, -np 3 and resumed runs (2 -> 3, 3 -> 1) give one process's bytes${extra:+ (${extra[*]})}"
  exit 0
fi

# A rank that fails: every rank stops, non-zero, in bounded time; the message names the rank.
out=$work/failed
t0=$(date +%s)
rc=0
mpi 3 "${args[@]}" --test_fail_rank 1 --test_fail_layer 1 -q --export_path "$out" > /dev/null 2> "$work/fail.err" || rc=$?
[ "$rc" -ne 0 ] || fail "a failing rank gave exit 0"
[ "$rc" -ne 124 ] || fail "a failing rank left the others hanging (timeout)"
[ $(($(date +%s) - t0)) -lt 60 ] || fail "the ranks took too long to stop"
grep -q "rank 1 of 3: test hook" "$work/fail.err" || { cat "$work/fail.err"; fail "no error naming rank 1"; }
[ "$(next_step "$out")" -eq 2 ] || fail "the failed run did not leave layer 0 committed"
mpi 2 "${args[@]}" --export_path "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "resume after a failed rank failed"; }
grep -q "resuming at" "$out.log" || fail "the run after a failed rank did not resume"
same "$out" "failed rank, resumed with -np 2"

# A rank that dies (SIGKILL): the others are stopped by the launcher, non-zero, in bounded time.
out=$work/killed
t0=$(date +%s)
"${launch[@]}" -np 2 "$strata" "${args[@]}" --test_slow_layer_ms 1000 -q --export_path "$out" > /dev/null 2>&1 &
pid=$!
for _ in $(seq 1200); do [ "$(next_step "$out")" -ge 2 ] && break; sleep 0.05; done
victim=$(ranks_of "$pid" | tail -1)
[ -n "$victim" ] || fail "no rank process found"
kill -9 "$victim"
rc=0
wait "$pid" || rc=$?
[ "$rc" -ne 0 ] || fail "a killed rank gave exit 0"
[ "$rc" -ne 124 ] || fail "a killed rank left the others hanging (timeout)"
[ $(($(date +%s) - t0)) -lt 60 ] || fail "the ranks took too long to stop"
"$strata" "${args[@]}" --export_path "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "resume after a killed rank failed"; }
same "$out" "killed rank, resumed by one process"
echo "ok: a failed or killed rank stops every rank; the state left resumes with another rank count"
