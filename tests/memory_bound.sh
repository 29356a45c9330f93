# Sourced by the test scripts and the benchmarks that run `strata quantize`:
#   peak_within_bound LOG [WHAT]
# reads the summary line "peak RSS P MiB; bound B MiB; ..." from LOG (the run's stdout), prints
# "WHAT: peak RSS P MiB, bound B MiB" and returns 1 when the measured peak exceeds the bound
# (docs/QUANTIZE.md "Memory and progress"), 2 when LOG holds no summary line. Under the sanitizers
# (scripts/test.sh sets ASAN_OPTIONS) the numbers are printed, not asserted: ASan's shadow memory
# and its quarantine of freed blocks are no part of the bound (CI measured peaks 0.3-1.8 MiB above
# it on the ~100 MiB fixture runs). Nor under compute-sanitizer (scripts/gpu_sanitize.py sets
# STRATA_TEST_SANITIZER): racecheck's host-side state lives in the process (on the H200, 59 GPU runs
# of the fixtures peaked 2 MiB to 2.4 GiB above bounds of about 1.5 GiB; under memcheck and
# initcheck every run stayed within its bound).
peak_within_bound() {
  local log=$1 what=${2:-$1} line peak bound
  line=$(grep -m1 '^peak RSS ' "$log") || { echo "$what: no 'peak RSS' summary line in $log"; return 2; }
  peak=$(sed -n 's/^peak RSS \([0-9.]*\) MiB; bound \([0-9.]*\) MiB.*/\1/p' <<< "$line")
  bound=$(sed -n 's/^peak RSS \([0-9.]*\) MiB; bound \([0-9.]*\) MiB.*/\2/p' <<< "$line")
  [ -n "$peak" ] && [ -n "$bound" ] || { echo "$what: unreadable summary: $line"; return 2; }
  if [ -n "${ASAN_OPTIONS:-}" ] || [ -n "${STRATA_TEST_SANITIZER:-}" ]; then
    echo "$what: peak RSS $peak MiB, bound $bound MiB (under a sanitizer: not asserted)"
    return 0
  fi
  if awk -v p="$peak" -v b="$bound" 'BEGIN { exit !(p > b) }'; then
    echo "$what: FAIL: peak RSS $peak MiB above the memory bound $bound MiB"
    grep -m1 '^memory bound: ' "$log" || true
    return 1
  fi
  echo "$what: peak RSS $peak MiB, bound $bound MiB"
}
# The least --max_cpu_memory_gb the summary in LOG printed ("least L MiB (--max_cpu_memory_gb G)").
least_cap_gb() {
  sed -n 's/^peak RSS .*(--max_cpu_memory_gb \([0-9.]*\))$/\1/p' "$1" | head -1
}
