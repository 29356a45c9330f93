#!/usr/bin/env bash
# GPU engine modes that must not change a byte (ctest label gpu; exit 77 = skipped without a
# GPU): the fixture quantized on the GPU as the engine chooses, then again with the flags given
# after GEMM (a switch such as --gpu_weight_buffers 1), with the same chunking (one micro-batch
# per chunk in both, --test_gpu_host_store); the two exports must be identical file for file, and
# each run's peak RSS within its printed memory bound.
#   tests/engine/gpu_modes_test.sh STRATA MODEL GEMM FLAGS...
set -euo pipefail
strata=$1 model=$2 gemm=$3
shift 3
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU: skipped"
  exit 77
fi
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
args=(quantize -q --model "$src" --recipe nvfp4-kv_fp8 --calib_data "$work/tokens.jsonl"
      --calib_size "$count" --calib_min_tokens 1 --batch_size 2 --device cuda
      --max_gpu_memory_gb 1 --test_gpu_host_store --gpu_gemm "$gemm")
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
"$strata" "${args[@]}" --export_path "$work/a" | tee "$work/a.log"
"$strata" "${args[@]}" "$@" --export_path "$work/b" | tee "$work/b.log"
# Both runs' measured peak RSS within their memory bound (tests/memory_bound.sh).
source tests/memory_bound.sh
peak_within_bound "$work/a.log" "$model"
peak_within_bound "$work/b.log" "$model $*"
if ! diff <(sums "$work/a") <(sums "$work/b"); then
  echo "FAIL: $* changed the export of $model"
  exit 1
fi
echo "$model: identical with $*"
