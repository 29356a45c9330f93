#!/usr/bin/env bash
# The fuzzing campaign docs/FUZZING.md records: each fuzz target for a given number of CPU
# seconds (default one CPU-hour), measured, not assumed from wall time:
#   scripts/fuzz_campaign.sh [CPU seconds per target, default 3600]
#                            [processes per target, default nproc] [target ...]
# A target runs in slices (scripts/fuzz.sh with -jobs/-workers = processes, sharing its learnt
# corpus) until the CPU seconds its slices used reach the budget, so a machine that other work
# shares still gives each target its CPU time; every slice's summary line is printed, then one
# `campaign:` line per target with the total.
#
# STRATA_FUZZ_CONCURRENT=1 runs the targets at the same time (each with its processes; give each
#   fewer processes); default one after another.
# STRATA_FUZZ_SLICE: the longest slice in wall seconds (default 600).
# STRATA_FUZZ_DEADLINE: wall seconds after which no slice starts and running slices are cut to
#   end by then (a GPU-machine call has a time limit); the totals then fall short and say so.
# STRATA_FUZZ_BIN / STRATA_FUZZ_OUT / STRATA_FUZZ_WORK: as in scripts/fuzz.sh.
# Findings go where scripts/fuzz.sh puts them, and the script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
cpu_budget=${1:-3600}
procs=${2:-$(nproc)}
shift $(($# < 2 ? $# : 2))
all=(safetensors index tokenizer_json tiktoken recipe resume)
targets=("${@:-${all[@]}}")
slice_max=${STRATA_FUZZ_SLICE:-600}
start=$(date +%s)
deadline=$((start + ${STRATA_FUZZ_DEADLINE:-1000000000}))
commit=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
[ -f "${STRATA_FUZZ_BIN:-/nonexistent}/COMMIT" ] && commit=$(cat "$STRATA_FUZZ_BIN/COMMIT")
echo "campaign $(date -u +%FT%TZ) at $commit:" \
  "${cpu_budget} CPU seconds per target, $procs processes each, targets ${targets[*]}"

# Builds once (the slices then find the targets built) unless they were built elsewhere.
if [ -z "${STRATA_FUZZ_BIN:-}" ]; then
  preset=${STRATA_FUZZ_PRESET:-fuzz}
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "${STRATA_FUZZ_JOBS:-$(nproc)}" \
    --target "${targets[@]/%/_fuzz}" >/dev/null
fi

run_target() {
  local target=$1 total=0 slices=0 rc=0 now wall out cpu
  while [ "$total" -lt "$cpu_budget" ]; do
    now=$(date +%s)
    wall=$(((cpu_budget - total + procs - 1) / procs))
    [ "$wall" -gt "$slice_max" ] && wall=$slice_max
    [ $((deadline - now)) -lt "$wall" ] && wall=$((deadline - now))
    [ "$wall" -lt 10 ] && break
    # Each concurrent target keeps its own log folder (fuzz.sh clears it per slice).
    out=$(STRATA_FUZZ_SKIP_BUILD=1 FUZZ_FLAGS="-jobs=$procs -workers=$procs ${FUZZ_FLAGS:-}" \
      scripts/fuzz.sh "$wall" "$target" 2>&1) || rc=1
    echo "$out" | grep -E '^(summary|finding):' | sed "s/^/[$target slice $slices] /"
    cpu=$(echo "$out" | grep -oE 'cpu_s=[0-9]+' | tail -n 1 | cut -d= -f2)
    total=$((total + ${cpu:-0}))
    slices=$((slices + 1))
    [ "$rc" -ne 0 ] && { echo "$out" | tail -n 70; break; }
  done
  local short=""
  [ "$total" -lt "$cpu_budget" ] && short=" (short of $cpu_budget: deadline)"
  echo "campaign: ${target}_fuzz cpu_s=$total slices=$slices findings=$rc$short"
  return "$rc"
}

failed=0
if [ "${STRATA_FUZZ_CONCURRENT:-0}" = 1 ]; then
  pids=()
  for t in "${targets[@]}"; do
    run_target "$t" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
else
  for t in "${targets[@]}"; do run_target "$t" || failed=1; done
fi
echo "campaign took $(($(date +%s) - start)) s of wall time"
exit "$failed"
