# Shared by tests/engine/mpi_test.sh (CPU ranks) and mpi_gpu_test.sh (GPU ranks); sourced.
# Expects: strata, work, launch (the mpirun command as an array), args (the quantize arguments),
# extra (arguments for the ranked runs only; may be empty), and the functions mpi N ARGS...,
# fail MESSAGE and same DIR WHAT (compares DIR with the one-process export).
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
# The strata ranks under the launcher started as pid $1 (`timeout [env] mpirun ...`).
ranks_of() { pgrep -P "$(pgrep -f -P "$1" "^mpirun")" strata; }
next_step() { grep -o '"next_step": *[0-9]*' "$1.strata_resume/manifest.json" 2> /dev/null | grep -o '[0-9]*$' || echo 0; }

# Every rank killed (SIGKILL) once a layer is committed, resumed with another rank count:
# 2 -> 3, then 3 -> 1 (a single process); each must give the one-process bytes.
kill_and_resume() {
  local pair from to out pid
  for pair in "2 3" "3 1"; do
    read -r from to <<< "$pair"
    out=$work/stop$from
    "${launch[@]}" -np "$from" "$strata" "${args[@]}" "${extra[@]}" --test_slow_layer_ms 1000 -q --export_path "$out" > /dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1200); do [ "$(next_step "$out")" -ge 2 ] && break; sleep 0.05; done
    [ "$(next_step "$out")" -ge 2 ] || fail "-np $from: no layer committed"
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
