#!/usr/bin/env bash
# The GPU path's resume cadence (engine/layer_loop.h ResumeCadence, --resume_every SECONDS): a
# layer step's hidden states are written for resume only once both 16 times their size of the
# checkpoint has been read (kResumeEvery) and --resume_every seconds have passed since the last
# durable step.
#   - --resume_every 0: the manifest names a hidden-state file at some point during the run (the
#     bytes rule alone, as before the time rule);
#   - the default (60 s) on a run of a few seconds: the manifest never names one, and the export is
#     the same bytes;
#   - the default, killed (SIGKILL) after its second layer was written: the manifest still records
#     only the head step, and the same command resumes at layer 1 (every layer computed again,
#     their shards rewritten) to the uninterrupted run's bytes, file for file.
# --test_slow_layer_ms makes every layer step sleep after its tensors are written, durable or not.
#   tests/engine/resume_cadence_test.sh STRATA [MODEL]
set -euo pipefail
strata=$1 model=${2:-qwen3_moe}
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
layers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' "$src/config.json")
args=(quantize --model "$src" --calib_data "$work/tokens.jsonl" --calib_size "$count"
      --calib_min_tokens 1 --batch_size 2 --max_shard_size_gb 0.00005 --recipe nvfp4-kv_fp8
      --device cuda)
fail() { echo "FAIL: $*"; exit 1; }
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
hidden_named() { grep -o '"hidden_file": "[^"]*hidden-[^"]*"' "$1.strata_resume/manifest.json" 2> /dev/null || true; }
next_step() { grep -o '"next_step": *[0-9]*' "$1.strata_resume/manifest.json" 2> /dev/null | grep -o '[0-9]*$' || echo 0; }

"$strata" "${args[@]}" -q --export_path "$work/ref" > /dev/null
sums "$work/ref" > "$work/ref.sums"
[ "$layers" -ge 3 ] || fail "$model has $layers layers; the kill below needs 3"

# Runs with FLAGS, slowed, polling the manifest; prints "named" if it ever named a hidden file.
watch_run() {  # out, flags...
  local out=$1 named=""
  shift
  "$strata" "${args[@]}" --test_slow_layer_ms 300 "$@" --export_path "$out" > "$out.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2> /dev/null; do
    [ -n "$(hidden_named "$out")" ] && named=named
    sleep 0.01
  done
  wait "$pid" || { cat "$out.log" >&2; fail "the run into $out failed"; }
  echo "$named"
}
[ "$(watch_run "$work/every" --resume_every 0)" = named ] ||
  fail "--resume_every 0: the manifest never named a hidden-state file"
[ -z "$(watch_run "$work/default")" ] ||
  fail "default cadence: a run of a few seconds recorded hidden states before its end"
diff "$work/ref.sums" <(sums "$work/default") > /dev/null || fail "default cadence: output differs"
diff "$work/ref.sums" <(sums "$work/every") > /dev/null || fail "--resume_every 0: output differs"

# Killed once two layers were written (the progress line), in the slowed step's sleep.
out=$work/killed
"$strata" "${args[@]}" --test_slow_layer_ms 1500 --export_path "$out" > "$out.first" 2>&1 &
pid=$!
for _ in $(seq 3000); do  # up to 60 s: slow starts under load
  grep -q "quantize: 2/$layers layers" "$out.first" 2> /dev/null && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.02
done
grep -q "quantize: 2/$layers layers" "$out.first" || { cat "$out.first"; fail "no progress line for the second layer"; }
kill -9 "$pid" 2> /dev/null || true
wait "$pid" 2> /dev/null || true
[ "$(next_step "$out")" = 1 ] || fail "killed after two layers: the manifest records step $(next_step "$out"), not the head's (1)"
[ -z "$(hidden_named "$out")" ] || fail "killed after two layers: the manifest names hidden states"
"$strata" "${args[@]}" --export_path "$out" > "$out.log" 2>&1 || { cat "$out.log"; fail "the resumed run failed"; }
grep -q "resuming at layer 1/$layers" "$out.log" || { cat "$out.log"; fail "the killed run did not resume at layer 1"; }
diff "$work/ref.sums" <(sums "$out") > /dev/null || fail "killed and resumed: output differs from the uninterrupted run"
[ ! -e "$out.strata_resume" ] || fail "killed and resumed: resume folder left behind"
echo "ok: --resume_every 0 records hidden states mid-run; the default records none in a short run, and a kill redoes every layer to the same bytes"
