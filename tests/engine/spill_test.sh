#!/usr/bin/env bash
# The activation store spilled to files gives the same bytes as held in memory: a run whose store
# budget (--test_activation_budget, a test hook of engine/quantize.cpp) is one byte spills
# every micro-batch, into the resume folder or into --offload_folder, and every output file
# must equal an in-memory run's (sha256), also when killed and resumed. Every run's measured peak
# RSS is within its printed bound; the least --max_cpu_memory_gb the in-memory run printed runs
# (the same bytes, peak RSS within the cap). Then --max_cpu_memory_gb below the least a
# run needs is refused before anything is written, on one line that gives the numbers.
#   tests/engine/spill_test.sh STRATA [MODEL]
set -euo pipefail
strata=$(realpath "$1") model=${2:-qwen3_moe}
src=$PWD/tests/fixtures/models/$model
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
args=(quantize --device cpu --model "$src" --calib_data "$work/tokens.jsonl" --calib_size "$count"
      --calib_min_tokens 1 --batch_size 2 --max_shard_size_gb 0.00005 --recipe nvfp4-kv_fp8)
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
fail() { echo "FAIL: $*"; exit 1; }

"$strata" "${args[@]}" --export_path "$work/mem" > "$work/mem.log" 2>&1 || { cat "$work/mem.log"; fail "in-memory run failed"; }
grep -q "spilled" "$work/mem.log" && fail "the in-memory run spilled"
sums "$work/mem" > "$work/mem.sums"

"$strata" "${args[@]}" --test_activation_budget 1 --export_path "$work/spill" > "$work/spill.log" 2>&1 || { cat "$work/spill.log"; fail "spilled run failed"; }
grep -q "activation store spilled" "$work/spill.log" || { cat "$work/spill.log"; fail "the run did not spill"; }
diff "$work/mem.sums" <(sums "$work/spill") || fail "spilled output differs from the in-memory run"
[ ! -e "$work/spill.strata_resume" ] || fail "spilled run left its resume folder"

mkdir "$work/off"
"$strata" "${args[@]}" --test_activation_budget 1 --offload_folder "$work/off" --export_path "$work/spill2" > "$work/spill2.log" 2>&1 || { cat "$work/spill2.log"; fail "run with --offload_folder failed"; }
grep -q "spilled to $work/off" "$work/spill2.log" || { cat "$work/spill2.log"; fail "did not spill to --offload_folder"; }
diff "$work/mem.sums" <(sums "$work/spill2") || fail "--offload_folder output differs from the in-memory run"
[ -z "$(ls -A "$work/off")" ] || { ls -la "$work/off"; fail "spill files left in --offload_folder"; }

# Killed while its resume file is a spill file in a relative --offload_folder, then resumed. The
# subshell execs strata, so that $! is strata's pid and the kill reaches it (killing only the
# subshell would leave strata running beside the resumed run).
mkdir "$work/off3"
(cd "$work" && exec "$strata" "${args[@]}" --test_activation_budget 1 --test_slow_layer_ms 1000 \
  --offload_folder off3 --export_path spill3 > spill3.log 2>&1) &
pid=$!
for _ in $(seq 1200); do
  grep -q '"hidden_file": "/.*/off3/hidden-' "$work/spill3.strata_resume/manifest.json" 2> /dev/null && break
  sleep 0.05
done
kill -9 "$pid" 2> /dev/null || true; wait "$pid" 2> /dev/null || true
grep -q '"hidden_file": "/.*/off3/hidden-' "$work/spill3.strata_resume/manifest.json" || fail "no manifest naming a spill file"
(cd "$work" && "$strata" "${args[@]}" --test_activation_budget 1 --offload_folder off3 \
  --export_path spill3 > spill3b.log 2>&1) || { cat "$work/spill3b.log"; fail "resuming a spilled run failed"; }
grep -q "resuming at layer" "$work/spill3b.log" || { cat "$work/spill3b.log"; fail "did not resume"; }
diff "$work/mem.sums" <(sums "$work/spill3") || fail "resumed spilled output differs from the in-memory run"
[ -z "$(ls -A "$work/off3")" ] || { ls -la "$work/off3"; fail "spill files left in --offload_folder"; }

# The measured peak RSS within the memory bound, in memory and spilled (tests/memory_bound.sh).
source tests/memory_bound.sh
peak_within_bound "$work/mem.log" "$model in memory" || fail "peak RSS above the bound"
peak_within_bound "$work/spill.log" "$model spilled" || fail "peak RSS above the bound"

# The least the in-memory run printed, as --max_cpu_memory_gb: the run fits it (spilled where the
# store does not fit beside the rest; the fixtures' store is smaller than the printed least's
# margin), gives the same bytes, and its measured peak RSS stays within the cap and its bound.
least=$(least_cap_gb "$work/mem.log")
[ -n "$least" ] || { cat "$work/mem.log"; fail "no least --max_cpu_memory_gb in the summary"; }
"$strata" "${args[@]}" --max_cpu_memory_gb "$least" --export_path "$work/least" > "$work/least.log" 2>&1 || { cat "$work/least.log"; fail "--max_cpu_memory_gb $least, the printed least, was refused or failed"; }
diff "$work/mem.sums" <(sums "$work/least") || fail "output at the least cap differs from the in-memory run"
peak_within_bound "$work/least.log" "$model at --max_cpu_memory_gb $least" || fail "peak RSS above the bound"
peak=$(sed -n 's/^peak RSS \([0-9.]*\) MiB.*/\1/p' "$work/least.log")
[ -n "${ASAN_OPTIONS:-}${STRATA_TEST_SANITIZER:-}" ] || awk -v p="$peak" -v c="$least" 'BEGIN { exit !(p <= c * 1024) }' ||
  fail "peak RSS $peak MiB above the cap $least GiB"  # not under the sanitizers (memory_bound.sh)
echo "$model: the printed least, --max_cpu_memory_gb $least, ran with peak RSS $peak MiB"

# Refused up front, with the numbers, before the export directory exists.
if "$strata" "${args[@]}" -q --max_cpu_memory_gb 0.01 --export_path "$work/refused" > /dev/null 2> "$work/r.err"; then
  fail "--max_cpu_memory_gb 0.01 was accepted"
fi
[ "$(wc -l < "$work/r.err")" -eq 1 ] || { cat "$work/r.err"; fail "expected one line on stderr"; }
grep -q -- "--max_cpu_memory_gb 0.01 (10.24 MiB) is below the least this run needs, .* MiB with the activation store spilled: .* MiB = process baseline .*layer weights .*micro-batch working set .*threads" "$work/r.err" || { cat "$work/r.err"; fail "refusal lacks the numbers"; }
[ ! -e "$work/refused" ] || fail "a refused run created its export directory"
echo ok
