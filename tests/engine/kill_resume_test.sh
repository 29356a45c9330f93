#!/usr/bin/env bash
# Kills `strata quantize` with SIGKILL at random moments and resumes it until it completes; every
# resumed output must equal an uninterrupted run's, file for file (sha256 of every file, hidden
# ones included), with no resume folder left behind; the same command run once more on the
# finished export says "already complete", exits 0 and changes no file's bytes or mtime. Then: a
# damaged hidden-state file (truncated, one byte flipped) is detected and the run starts over to
# the same bytes, as does a run whose export directory was removed; a damaged manifest is refused in one line; a changed recipe or calibration is
# refused naming the change, for an interrupted run and for a finished export; a non-empty
# directory without a manifest is refused; and --overwrite starts over.
#   tests/engine/kill_resume_test.sh STRATA [MODEL] [TRIALS] [SEED] [FLAGS...]
# FLAGS go to every run (e.g. --test_activation_budget 1: the store spilled). --test_slow_layer_ms
# (a test hook of engine/quantize.cpp) makes every step sleep after its tensors are written and
# before it is committed, so that kills land mid-run on tiny fixtures.
set -euo pipefail
strata=$1 model=${2:-qwen3_moe} trials=${3:-24} seed=${4:-20240601}
shift $(($# < 4 ? $# : 4))
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
# Shards of ~52 KiB: several shards, some spanning two layers, so partly written shards are hit.
common=(quantize --model "$src" --calib_data "$work/tokens.jsonl" --calib_size "$count"
        --calib_min_tokens 1 --batch_size 2 --max_shard_size_gb 0.00005 "$@")
args=("${common[@]}" --recipe nvfp4-kv_fp8)

sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
stamps() { (cd "$1" && find . -type f -printf '%p %s %T@\n' | sort); }
fail() { echo "FAIL: $*"; exit 1; }

"$strata" "${args[@]}" -q --export_path "$work/ref" > /dev/null
sums "$work/ref" > "$work/ref.sums"
[ "$(wc -l < "$work/ref.sums")" -ge 5 ] || fail "reference export has too few files"
[ ! -e "$work/ref.strata_resume" ] || fail "reference run left its resume folder"

# Kill delays are drawn over the length of one slowed run, measured here, so that they land
# mid-run on fast and slow builds alike (the sanitizer build starts several times slower).
t0=$(date +%s%N)
"$strata" "${args[@]}" --test_slow_layer_ms 25 -q --export_path "$work/timed" > /dev/null
run_ms=$((($(date +%s%N) - t0) / 1000000))
rm -rf "$work/timed"
[ "$run_ms" -ge 20 ] || run_ms=20

RANDOM=$seed
resumed=0 kills=0
for ((t = 0; t < trials; t++)); do
  out=$work/t$t log=$work/t$t.log
  : > "$log"
  # One to three killed attempts, each after a random delay, then one left to finish. In every
  # other trial the first attempt's delay counts from the first committed step (the manifest
  # names a hidden-state file), and is under two slowed steps: that kill lands mid-run however
  # the machine's load changed since run_ms was measured (a busy machine made delays drawn from
  # one timed run miss, as a CI-like run under load saw).
  rounds=$((1 + RANDOM % 3))
  for ((r = 0; r < rounds; r++)); do
    "$strata" "${args[@]}" --test_slow_layer_ms 25 --export_path "$out" >> "$log" 2>&1 &
    pid=$!
    delay_ms=$(((RANDOM * 32768 + RANDOM) % run_ms))
    if [ $((t % 2)) -eq 0 ] && [ "$r" -eq 0 ]; then
      for _ in $(seq 1500); do  # up to 30 s: slow starts under the sanitizers
        grep -q '"hidden_file": "[^"]*hidden-' "$out.strata_resume/manifest.json" 2> /dev/null && break
        sleep 0.02
      done
      delay_ms=$((RANDOM % 50))
    fi
    sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
    if kill -9 "$pid" 2> /dev/null; then kills=$((kills + 1)); fi
    wait "$pid" 2> /dev/null || true
  done
  # The same command finishes the run (a kill after its manifest was removed left a complete
  # export: "already complete").
  "$strata" "${args[@]}" --export_path "$out" >> "$log" 2>&1 || { cat "$log"; fail "trial $t: resumed run failed"; }
  grep -q "resuming at" "$log" && resumed=$((resumed + 1))
  sums "$out" > "$work/t$t.sums"
  diff "$work/ref.sums" "$work/t$t.sums" > /dev/null || { diff "$work/ref.sums" "$work/t$t.sums"; cat "$log"; fail "trial $t: output differs from the uninterrupted run"; }
  [ ! -e "$out.strata_resume" ] || fail "trial $t: resume folder left behind"
  # Once more on the finished export: nothing to do, not a byte or an mtime changed.
  stamps "$out" > "$work/before.stamps"
  "$strata" "${args[@]}" -q --export_path "$out" > "$work/again.out" 2>&1 || { cat "$work/again.out"; fail "trial $t: re-run of the finished command failed"; }
  [ "$(cat "$work/again.out")" = "$out: already complete (the same command finished it before; its strata_run.json matches this run); nothing to do" ] || { cat "$work/again.out"; fail "trial $t: re-run did not say already complete"; }
  diff "$work/before.stamps" <(stamps "$out") || fail "trial $t: re-run touched the finished export"
  diff "$work/ref.sums" <(sums "$out") > /dev/null || fail "trial $t: re-run changed the finished export"
  [ ! -e "$out.strata_resume" ] || fail "trial $t: re-run left a resume folder"
  rm -rf "$out"
done
echo "$trials trials, $kills kills, $resumed trials resumed an interrupted run; every output identical"
# A kill before the first layer is committed restarts rather than resumes; a third of the trials
# resuming shows the kills land mid-run (observed with delays drawn from the timed run alone: about
# 9 in 10 in release builds, 4 in 10 under the sanitizers, whose start-up takes much of the run;
# half the trials now kill after a committed step).
[ "$resumed" -ge $((trials / 3)) ] || fail "only $resumed of $trials trials resumed: kills missed the run"

# A manifest exists from the first moment of a run: kill one once it is there.
"$strata" "${args[@]}" --test_slow_layer_ms 2000 --export_path "$work/x" > "$work/x.log" 2>&1 &
pid=$!
for _ in $(seq 1500); do  # up to 30 s: slow starts under the sanitizers
  [ -f "$work/x.strata_resume/manifest.json" ] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.02
done
kill -9 "$pid" 2> /dev/null || true
wait "$pid" 2> /dev/null || true
[ -f "$work/x.strata_resume/manifest.json" ] || { cat "$work/x.log"; fail "no manifest after starting a run"; }

# A damaged resume record: the hidden states the manifest names, truncated or with one byte
# flipped, are detected (one warning naming the file) and the run starts over, to the bytes of
# an uninterrupted run. The kill lands once the manifest names a hidden-state file.
kill_with_hidden() {  # out
  "$strata" "${args[@]}" --test_slow_layer_ms 300 --export_path "$1" > /dev/null 2>&1 &
  local pid=$! hidden=""
  for _ in $(seq 1500); do  # up to 30 s: slow starts under the sanitizers
    hidden=$(grep -o '"hidden_file": "[^"]*hidden-[^"]*"' "$1.strata_resume/manifest.json" 2> /dev/null || true)
    [ -n "$hidden" ] && break
    sleep 0.02
  done
  kill -9 "$pid" 2> /dev/null || true  # (gone already: the check below says so)
  wait "$pid" 2> /dev/null || true
  [ -n "$hidden" ] || fail "no hidden-state file named by the manifest"
}
hidden_path() {  # out: the file the manifest names, as a path
  local h
  h=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["hidden_file"])' "$1.strata_resume/manifest.json")
  case $h in /*) echo "$h" ;; *) echo "$1.strata_resume/$h" ;; esac
}
for damage in truncate flip; do
  out=$work/d-$damage
  kill_with_hidden "$out"
  h=$(hidden_path "$out")
  [ -f "$h" ] || fail "$damage: the manifest names $h, which is not there"
  if [ $damage = truncate ]; then
    truncate -s $(($(stat -c %s "$h") - 3)) "$h"
  else
    python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-1] ^= 0x10; open(p, "wb").write(b)' "$h"
  fi
  "$strata" "${args[@]}" -q --export_path "$out" > /dev/null 2> "$work/d.err" || { cat "$work/d.err"; fail "$damage: the run with damaged hidden states failed"; }
  [ "$(grep -c "damaged and not trusted" "$work/d.err")" -eq 1 ] && grep -qF "$h" "$work/d.err" || { cat "$work/d.err"; fail "$damage: no single warning naming $h"; }
  diff "$work/ref.sums" <(sums "$out") || fail "$damage: output differs from the uninterrupted run"
  [ ! -e "$out.strata_resume" ] || fail "$damage: resume folder left behind"
done
# The export directory of an interrupted run removed (its resume folder left): the shards the
# manifest vouches for are gone, so the run starts over, with one warning, to the same bytes.
kill_with_hidden "$work/gone"
rm -rf "$work/gone"
"$strata" "${args[@]}" -q --export_path "$work/gone" > /dev/null 2> "$work/g.err" || { cat "$work/g.err"; fail "the run whose export was removed failed"; }
[ "$(grep -c "was removed after the interrupted run" "$work/g.err")" -eq 1 ] || { cat "$work/g.err"; fail "no single warning about the removed export"; }
diff "$work/ref.sums" <(sums "$work/gone") || fail "removed export: output differs from the uninterrupted run"
[ ! -e "$work/gone.strata_resume" ] || fail "removed export: resume folder left behind"
# A damaged manifest is refused in one line.
kill_with_hidden "$work/m"
echo '{"format": "strata-resume-2", "identity": {' > "$work/m.strata_resume/manifest.json"

expect_refused() {  # expected-substring, args...
  local want=$1; shift
  if "$strata" "$@" -q > "$work/r.out" 2> "$work/r.err"; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$work/r.err" || { cat "$work/r.err"; fail "stderr lacks: $want"; }
  [ "$(wc -l < "$work/r.err")" -eq 1 ] || { cat "$work/r.err"; fail "expected one line on stderr"; }
}
expect_refused "damaged resume manifest" "${args[@]}" --export_path "$work/m"
expect_refused "another job (changed: recipe)" "${common[@]}" --recipe fp8-kv_fp8 --export_path "$work/x"
expect_refused "--overwrite" "${common[@]}" --recipe fp8-kv_fp8 --export_path "$work/x"
expect_refused "(changed: calibration)" "${args[@]}" --calib_size 2 --export_path "$work/x"
# Another command on a finished export is refused naming what differs; the export is untouched.
stamps "$work/ref" > "$work/ref.stamps"
expect_refused "holds the finished export of another job (changed: recipe); add --overwrite" "${common[@]}" --recipe fp8-kv_fp8 --export_path "$work/ref"
expect_refused "(changed: calibration)" "${args[@]}" --calib_size 2 --export_path "$work/ref"
diff "$work/ref.stamps" <(stamps "$work/ref") || fail "a refused run touched the finished export"
mkdir "$work/y" && echo keep > "$work/y/notes.txt"
expect_refused "is not empty and holds no interrupted strata run" "${args[@]}" --export_path "$work/y"
[ -f "$work/y/notes.txt" ] || fail "a refused run touched the directory"

# --overwrite starts over: the result equals a fresh fp8 run.
"$strata" "${common[@]}" --recipe fp8-kv_fp8 -q --export_path "$work/x" --overwrite > /dev/null
"$strata" "${common[@]}" --recipe fp8-kv_fp8 -q --export_path "$work/fp8" > /dev/null
sums "$work/fp8" > "$work/fp8.sums"
sums "$work/x" > "$work/x.sums"
diff "$work/fp8.sums" "$work/x.sums" || fail "--overwrite output differs from a fresh run"
# --overwrite replaces a finished export of another job.
cp -r "$work/ref" "$work/z"
"$strata" "${common[@]}" --recipe fp8-kv_fp8 -q --export_path "$work/z" --overwrite > /dev/null
diff "$work/fp8.sums" <(sums "$work/z") || fail "--overwrite of a finished export differs from a fresh run"
[ ! -e "$work/x.strata_resume" ] || fail "--overwrite run left its resume folder"
"$strata" "${args[@]}" -q --export_path "$work/y" --overwrite > /dev/null
diff "$work/ref.sums" <(sums "$work/y") || fail "--overwrite of a foreign directory differs"
echo ok
