#!/usr/bin/env bash
# GPU vs CPU export of one fixture (ctest label gpu; exit 77 = skipped without a GPU):
#   quantize with --device cpu and with --device cuda, calibrating on the fixture's tokens, then
#   - weights byte-identical, activation scales within the bound (compare_exports.py);
#   - the GPU export passes the independent consumer-contract checker (with the transformers
#     amax comparison for fp32 GEMMs);
#   - each run's peak RSS within its printed memory bound.
#   tests/engine/gpu_vs_cpu_test.sh STRATA MODEL RECIPE GEMM REL [FLAGS...]
# GEMM: bf16 (the default GPU path) or fp32 (--gpu_gemm fp32). REL: the bound on
# |scale_gpu - scale_cpu| / scale_cpu, justified in docs/CUDA.md "GPU vs CPU". FLAGS go to both
# runs (switches and test hooks such as --gpu_quantize off or --test_gpu_host_store; the CPU run
# ignores the GPU's).
set -euo pipefail
strata=$1 model=$2 recipe=$3 gemm=$4 rel=$5
shift 5
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU: skipped"
  exit 77
fi
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The reference's tokens, or fixed ids for the compressed fixtures (no reference).
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
common=(quantize -q --model "$src" --recipe "$recipe" --calib_data "$work/tokens.jsonl"
        --calib_size "$count" --calib_min_tokens 1 --batch_size 2 "$@")
"$strata" "${common[@]}" --device cpu --export_path "$work/cpu" | tee "$work/cpu.log"
"$strata" "${common[@]}" --device cuda --gpu_gemm "$gemm" --max_gpu_memory_gb 1 \
  --export_path "$work/gpu" | tee "$work/gpu.log"
# Each run's measured peak RSS within its memory bound (tests/memory_bound.sh); the GPU run's
# bound holds the CUDA context's host memory as measured and the pinned buffers.
source tests/memory_bound.sh
peak_within_bound "$work/cpu.log" "$model cpu"
peak_within_bound "$work/gpu.log" "$model cuda"
python3 tests/engine/compare_exports.py "$work/cpu" "$work/gpu" --rel "$rel"
# The checker's 1% comparison with transformers' fp32 amaxes holds for fp32 GEMMs; bf16 GEMMs
# are bounded against the CPU run above instead, and nvfp4_act_headroom's input scales sit above
# the max by design (tests/export/run_export_check.sh).
amax=()
[ "$gemm" = fp32 ] && [ -f "$src/reference.safetensors" ] && [[ $recipe != *act_headroom* ]] &&
  amax=(--amax "$src/reference.safetensors")
python3 tests/export/check_modelopt_export.py "$src" "$work/gpu" "${amax[@]}"
