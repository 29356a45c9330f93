#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each for a
# bounded time: scripts/fuzz.sh [seconds per target, default 60].
#
# Each target starts from its seed corpus in fuzz/corpus/<target>/ and keeps what it learns in
# fuzz/corpus-work/<target>/ (ignored by git). An input that crashes, hangs or runs out of memory
# is moved to tests/io/fuzz_regressions/<target>-<kind>-<hash>, where io_test replays it; the
# script then exits non-zero. Fix the bug and commit the input with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)" --target safetensors_fuzz index_fuzz

found=0
for target in safetensors index; do
  work=fuzz/corpus-work/$target
  artifacts=build/fuzz/artifacts/$target
  mkdir -p "$work" "$artifacts"
  echo "== ${target}_fuzz for ${seconds}s =="
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build/fuzz/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=4096 -dict="fuzz/${target}.dict" -artifact_prefix="$artifacts/" \
    -print_final_stats=1 "$work" "fuzz/corpus/$target" 2>&1 | tail -n 40
  set -e
  for f in "$artifacts"/crash-* "$artifacts"/timeout-* "$artifacts"/oom-* "$artifacts"/leak-*; do
    [ -e "$f" ] || continue
    dest="tests/io/fuzz_regressions/${target}-$(basename "$f")"
    mv "$f" "$dest"
    echo "finding: $dest"
    found=1
  done
done
if [ "$found" -ne 0 ]; then
  echo "fuzzing found inputs that fail; they are in tests/io/fuzz_regressions/" >&2
  exit 1
fi
echo "no findings"
