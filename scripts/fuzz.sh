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
# libFuzzer's output goes to build/<preset>/logs/<target>/ (fuzz.log, or fuzz-<job>.log per job);
# the script prints one summary line per target: executions (all jobs), coverage (cov: edges,
# ft: features, the largest of the jobs), corpus files, and CPU seconds (user + system).
#
# FUZZ_FLAGS adds libFuzzer flags: FUZZ_FLAGS="-jobs=16 -workers=16" runs 16 processes per target
# (scripts/fuzz_campaign.sh); STRATA_FUZZ_JOBS sets the build's parallelism (default: nproc).
# STRATA_FUZZ_PRESET picks the preset (default `fuzz`; scripts/test.sh uses `asan`, its -O0
# sanitizer build, which also builds the targets); its build folder holds the logs and
# artifacts. STRATA_FUZZ_WORK replaces fuzz/corpus-work as the folder of learnt corpora
# (scripts/test.sh starts from seeds). STRATA_FUZZ_BIN names a folder of targets built elsewhere
# (scripts/fuzz_bundle.sh: a machine without the toolchain): nothing is built, and the logs and
# artifacts go to STRATA_FUZZ_OUT (default: that folder).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
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
preset=${STRATA_FUZZ_PRESET:-fuzz}
work_root=$(realpath -m "${STRATA_FUZZ_WORK:-fuzz/corpus-work}")
if [ -n "${STRATA_FUZZ_BIN:-}" ]; then
  bin=$(realpath "$STRATA_FUZZ_BIN")
  build=$(realpath -m "${STRATA_FUZZ_OUT:-$bin}")
else
  build=$root/build/$preset
  bin=$build/fuzz
  if [ "${STRATA_FUZZ_SKIP_BUILD:-0}" != 1 ]; then  # scripts/fuzz_campaign.sh built them
    cmake --preset "$preset" >/dev/null
    cmake --build --preset "$preset" -j "${STRATA_FUZZ_JOBS:-$(nproc)}" --target "${build_targets[@]}"
  fi
fi

found=0
for target in "${targets[@]}"; do
  work=$work_root/$target
  artifacts=$build/artifacts/$target
  logs=$build/logs/$target
  mkdir -p "$work" "$artifacts"
  rm -rf "$logs" && mkdir -p "$logs"
  echo "== ${target}_fuzz for ${seconds}s =="
  set +e
  # In the log folder: with -jobs, libFuzzer writes fuzz-<job>.log into the working directory.
  # shellcheck disable=SC2086  # FUZZ_FLAGS is a list of flags
  cpu=$(
    cd "$logs" || exit 1
    TIMEFORMAT='%U %S'
    { time ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$bin/${target}_fuzz" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -max_len="$(max_len_of "$target")" -dict="$root/fuzz/${target}.dict" \
      -artifact_prefix="$artifacts/" -print_final_stats=1 ${FUZZ_FLAGS:-} \
      "$work" "$root/fuzz/corpus/$target" >fuzz.log 2>&1; } 2>&1
  )
  rc=$?
  set -e
  # Totals over the jobs' logs (with -jobs, fuzz.log repeats them), or the one log: executions
  # summed, coverage the largest seen.
  job_logs=("$logs"/fuzz-*.log)
  [ -e "${job_logs[0]}" ] || job_logs=("$logs/fuzz.log")
  execs=$(cat "${job_logs[@]}" | awk '/^stat::number_of_executed_units:/ {n += $2} END {print n + 0}')
  cov=$(cat "${job_logs[@]}" | grep -oE ' cov: [0-9]+' | awk '{if ($2 > m) m = $2} END {print m + 0}')
  ft=$(cat "${job_logs[@]}" | grep -oE ' ft: [0-9]+' | awk '{if ($2 > m) m = $2} END {print m + 0}')
  corpus=$(find "$work" -type f | wc -l)
  cpu_s=$(echo "$cpu" | tail -n 1 | awk '{printf "%.0f", $1 + $2}')
  echo "summary: ${target}_fuzz seconds=$seconds execs=$execs cov=$cov ft=$ft corpus=$corpus" \
    "cpu_s=$cpu_s exit=$rc"
  if [ "$rc" -ne 0 ]; then
    echo "${target}_fuzz exited $rc; the end of its log ($logs):"
    tail -n 60 "$(ls -t "$logs"/*.log | head -n 1)"
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
