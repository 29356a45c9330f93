# Shared by tests/engine/mpi_test.sh (CPU ranks), mpi_gpu_test.sh (GPU ranks) and
# mpi_gpu_expert_test.sh (expert parallel GPU ranks); sourced.
# Expects: strata, work, launch (the mpirun command as an array), args (the quantize arguments),
# extra (arguments for the ranked runs only; may be empty), optionally rank_cmd (an array run
# before strata on every rank, e.g. tests/engine/gpu_rank_env.sh), and the functions mpi N ARGS...,
# fail MESSAGE, and optionally pass MESSAGE (called for each comparison that passes).
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
# DIR against the one-process export $work/ref (its sums in $work/ref.sums): every file the same
# bytes, no resume folder left behind; on a difference, what compare_exports.py finds.
same() {  # dir, what
  if ! diff "$work/ref.sums" <(sums "$1") > /dev/null; then
    diff "$work/ref.sums" <(sums "$1") || true
    python3 tests/engine/compare_exports.py "$work/ref" "$1" --rel 1 || true
    fail "$2: output differs from one process's"
  fi
  [ ! -e "$1.strata_resume" ] || fail "$2: resume folder left behind"
  if declare -F pass > /dev/null; then pass "$2: every file byte-identical to one process's"; fi
}
# The strata ranks under the launcher started as pid $1 (`timeout [env] mpirun ...`); none when
# the launcher has already gone.
ranks_of() {
  local m
  m=$(pgrep -f -P "$1" "^mpirun") || return 0
  pgrep -P "$m" strata || true
}
next_step() { grep -o '"next_step": *[0-9]*' "$1.strata_resume/manifest.json" 2> /dev/null | grep -o '[0-9]*$' || echo 0; }

# Every rank killed (SIGKILL) once a layer is committed, resumed with another rank count: each
# "FROM TO" pair given (default 2 -> 3, then 3 -> 1, a single process) must give the one-process
# bytes.
kill_and_resume() {
  local pair from to out pid pairs=("$@")
  [ ${#pairs[@]} -gt 0 ] || pairs=("2 3" "3 1")
  for pair in "${pairs[@]}"; do
    read -r from to <<< "$pair"
    out=$work/stop$from-$to
    # $! must be the launcher's pid (ranks_of), so not through mpi().
    "${launch[@]}" -np "$from" ${rank_cmd[@]+"${rank_cmd[@]}"} "$strata" "${args[@]}" "${extra[@]}" \
      --test_slow_layer_ms 1000 -q --export_path "$out" > "$out.first" 2>&1 &
    pid=$!
    for _ in $(seq 1200); do [ "$(next_step "$out")" -ge 2 ] && break; sleep 0.05; done
    [ "$(next_step "$out")" -ge 2 ] || { cat "$out.first"; fail "-np $from: no layer committed"; }
    kill -9 $(ranks_of "$pid") 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
    [ -f "$out.strata_resume/manifest.json" ] || fail "-np $from stopped: no manifest left to resume"
    if [ "$to" -eq 1 ]; then
      "$strata" "${args[@]}" --export_path "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "resume by one process failed"; }
    else
      mpi "$to" "${args[@]}" "${extra[@]}" --export_path "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "resume with -np $to failed"; }
    fi
    grep -q "resuming at" "$out.log" || { cat "$out.log"; fail "-np $from -> $to did not resume"; }
    same "$out" "stopped with -np $from, resumed with -np $to"
  done
}
