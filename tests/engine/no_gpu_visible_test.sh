#!/usr/bin/env bash
# strata quantize built with CUDA where no GPU is visible (CUDA_VISIBLE_DEVICES empty): the device
# probe runs beside the run's start (cli/quantize.cpp choose_device) and is read at the device
# choice. --device cuda is then a one-line refusal with nothing written; without --device the run
# calibrates on the CPU and its export is the --device cpu run's, byte for byte. Exit 77 (skipped)
# for a strata built without CUDA.
#   tests/engine/no_gpu_visible_test.sh STRATA
set -euo pipefail
strata=$1
if ! "$strata" --version 2>&1 | grep -q "CUDA backend built"; then
  echo "strata built without CUDA: skipped"
  exit 77
fi
src=tests/fixtures/models/qwen3_moe
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
run() {  # export folder, flags...
  local out=$1
  shift
  CUDA_VISIBLE_DEVICES="" "$strata" quantize -q --model "$src" --recipe nvfp4-kv_fp8 \
    --calib_data "$work/tokens.jsonl" --calib_size "$count" --calib_min_tokens 1 \
    --export_path "$work/$out" "$@"
}
if run refused --device cuda > "$work/refused.log" 2>&1; then
  cat "$work/refused.log"; echo "FAIL: --device cuda ran with no GPU visible"; exit 1
fi
grep -q "error: --device cuda: no CUDA device is visible" "$work/refused.log" ||
  { cat "$work/refused.log"; echo "FAIL: not the no-device refusal"; exit 1; }
[ "$(grep -c . "$work/refused.log")" = 1 ] || { cat "$work/refused.log"; echo "FAIL: more than one line"; exit 1; }
[ ! -e "$work/refused" ] || { ls -la "$work/refused"; echo "FAIL: the refused run wrote its export folder"; exit 1; }
run auto > "$work/auto.log" 2>&1 || { cat "$work/auto.log"; echo "FAIL: the default device failed"; exit 1; }
run cpu --device cpu > "$work/cpu.log" 2>&1 || { cat "$work/cpu.log"; echo "FAIL: --device cpu failed"; exit 1; }
n=0
for f in "$work"/cpu/*.safetensors; do
  cmp "$f" "$work/auto/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs"; exit 1; }
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "FAIL: no shards written"; exit 1; }
echo "PASS: refused with --device cuda; the default ran on the CPU ($n shards as --device cpu's)"
