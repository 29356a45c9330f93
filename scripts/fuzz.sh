#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan) and runs each for a
# bounded time: scripts/fuzz.sh [seconds per target, default 60] [target ...] (default: all).
#
# Targets (fuzz/CMakeLists.txt; docs/FUZZING.md says what each checks):
#   safetensors     safetensors header          index      model.safetensors.index.json, config.json
#   tokenizer_json  tokenizer.json (+ config)   tiktoken   tiktoken.model (+ config, Python file)
#   recipe          recipe YAML                 resume     resume manifest, run record
#
# Each target starts from its seed corpus in fuzz/corpus/<target>/ and keeps what it learns in
# fuzz/corpus-work/<target>/ (ignored by git). An input that crashes, hangs or runs out of memory
# is moved to the fuzz_regressions/ folder of the module's tests (tests/io, tests/tokenizer,
# tests/quant, tests/engine), named <target>-<kind>-<hash>, where the module's test binary replays
# it; the script then exits non-zero. Fix the bug and commit the input with the fix.
#
# FUZZ_FLAGS adds libFuzzer flags, e.g. FUZZ_FLAGS="-jobs=16 -workers=16" for a long campaign
# (scripts/fuzz_campaign.sh); STRATA_FUZZ_JOBS sets the build's parallelism (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
all=(safetensors index tokenizer_json tiktoken recipe resume)
targets=("${@:-${all[@]}}")

regressions_of() {
  case $1 in
    safetensors | index) echo tests/io/fuzz_regressions ;;
    tokenizer_json | tiktoken) echo tests/tokenizer/fuzz_regressions ;;
    recipe) echo tests/quant/fuzz_regressions ;;
    resume) echo tests/engine/fuzz_regressions ;;
    *)
      echo "unknown fuzz target '$1' (targets: ${all[*]})" >&2
      exit 2
      ;;
  esac
}
# Tokenizer inputs hold whole (small) vocabularies; the other formats fit in 4 KiB.
max_len_of() {
  case $1 in
    tokenizer_json | tiktoken) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

build_targets=()
for target in "${targets[@]}"; do
  regressions_of "$target" >/dev/null
  build_targets+=("${target}_fuzz")
done
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "${STRATA_FUZZ_JOBS:-$(nproc)}" --target "${build_targets[@]}"

found=0
for target in "${targets[@]}"; do
  work=fuzz/corpus-work/$target
  artifacts=build/fuzz/artifacts/$target
  mkdir -p "$work" "$artifacts"
  echo "== ${target}_fuzz for ${seconds}s =="
  log=build/fuzz/logs/$target.log
  mkdir -p "$(dirname "$log")"
  set +e
  # shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build/fuzz/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len="$(max_len_of "$target")" -dict="fuzz/${target}.dict" -artifact_prefix="$artifacts/" \
    -print_final_stats=1 ${FUZZ_FLAGS:-} "$work" "fuzz/corpus/$target" >"$log" 2>&1
  rc=$?
  set -e
  # The start, the end and libFuzzer's totals; the whole log is in $log.
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^Done |^stat::|^(INFO|WARNING): .*(seed|corpus)' "$log" || true
  if [ "$rc" -ne 0 ]; then
    echo "${target}_fuzz exited $rc; the end of $log:"
    tail -n 60 "$log"
    found=1
  fi
  dest_dir=$(regressions_of "$target")
  for f in "$artifacts"/crash-* "$artifacts"/timeout-* "$artifacts"/oom-* "$artifacts"/leak-*; do
    [ -e "$f" ] || continue
    mkdir -p "$dest_dir"
    dest="$dest_dir/${target}-$(basename "$f")"
    mv "$f" "$dest"
    echo "finding: $dest"
    found=1
  done
done
if [ "$found" -ne 0 ]; then
  echo "fuzzing found inputs that fail (see above; inputs go to the fuzz_regressions/ folders named)" >&2
  exit 1
fi
echo "no findings"
