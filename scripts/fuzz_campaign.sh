#!/usr/bin/env bash
# The fuzzing campaign docs/FUZZING.md records: every fuzz target for a given number of CPU
# seconds (default one CPU-hour), spread over this machine's cores:
#   scripts/fuzz_campaign.sh [CPU seconds per target, default 3600] [processes, default nproc]
#                            [target ...]
# Each target runs <processes> libFuzzer processes at once (-jobs/-workers) for
# (CPU seconds / processes) seconds of wall time, sharing fuzz/corpus-work/<target>/; on a
# 16-core machine the default is 225 s per target, 23 minutes in all. The summary line of each
# target (executions, coverage, corpus, CPU seconds) is what docs/FUZZING.md's table records;
# findings go where scripts/fuzz.sh puts them, and the script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
cpu_seconds=${1:-3600}
procs=${2:-$(nproc)}
shift $(($# < 2 ? $# : 2))
wall=$(((cpu_seconds + procs - 1) / procs))
echo "campaign $(date -u +%FT%TZ) at $(git rev-parse --short HEAD): ${cpu_seconds} CPU seconds" \
  "per target, $procs processes of ${wall}s"
FUZZ_FLAGS="-jobs=$procs -workers=$procs ${FUZZ_FLAGS:-}" exec scripts/fuzz.sh "$wall" "$@"
