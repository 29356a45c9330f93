#!/usr/bin/env bash
# One export test: quantize a transformers fixture with a recipe, calibrating on exactly the
# tokens transformers saw, then run the independent consumer-contract checker on the result
# (with the transformers amaxes for the 1% scale check). On the CPU path (--device cpu) also on
# a GPU machine; tests/engine/gpu_vs_cpu_test.sh checks the GPU path. The run's peak RSS must be
# within its printed memory bound.
#   tests/export/run_export_check.sh STRATA MODEL RECIPE
set -euo pipefail
strata=$1 model=$2 recipe=$3
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
"$strata" quantize -q --device cpu --model "$src" --recipe "$recipe" --calib_data "$work/tokens.jsonl" --calib_size "$count" \
  --calib_min_tokens 1 --batch_size 2 --export_path "$work/out" | tee "$work/log"
# The measured peak RSS within the run's memory bound (tests/memory_bound.sh).
source tests/memory_bound.sh
peak_within_bound "$work/log" "$model $recipe"
if [[ $recipe == *input_scale1* || $recipe == *Kimi-K3* ]]; then
  # Expert input scales pinned to 1.0 (input_amax 2688) instead of calibrated: no --amax
  # comparison, but every routed expert's input_scale must be exactly 1.0 (Kimi-K3's recipe: where
  # its block_sparse_moe experts exist).
  python3 tests/export/check_modelopt_export.py "$src" "$work/out"
  python3 - "$work/out" "$recipe" <<'PY'
import sys
sys.path.insert(0, "tests/export")
import numpy as np
from check_modelopt_export import load_dir_tensors
t = load_dir_tensors(sys.argv[1])
names = [n for n in t if ".experts." in n and n.endswith(".input_scale")]
if not names and "Kimi-K3" in sys.argv[2]:
    sys.exit(0)  # its expert rule names block_sparse_moe: none on this family
assert names, "no expert input_scale in the export"
bad = [n for n in names if t[n].array(n).reshape(-1).view(np.uint32)[0] != 0x3F800000]
assert not bad, f"expert input_scale not exactly 1.0: {bad[:3]}"
print(f"{len(names)} expert input scales are exactly 1.0")
PY
elif [[ $recipe == *act_headroom* ]]; then
  # nvfp4_act_headroom input scales sit far above the calibrated max by design (headroom): the
  # checker without --amax; calib/max_calib.h's tests and tests/peer check the statistic.
  python3 tests/export/check_modelopt_export.py "$src" "$work/out"
else
  python3 tests/export/check_modelopt_export.py "$src" "$work/out" --amax "$src/reference.safetensors"
fi
# gpt-oss: the checker must catch a flipped byte of a fused expert tensor, experts' rows written
# untransposed, and a shared scale off (tests/export/gptoss_mutate.py).
if [[ $model == gpt_oss* ]]; then
  x=model.layers.1.mlp.experts
  for bad in "$x.down_proj flip" "$x.gate_up_proj untransposed" "$x.down_proj_weight_scale untransposed" \
             "$x.gate_up_proj_weight_scale scale"; do
    read -r victim how <<< "$bad"
    rm -rf "$work/bad"
    cp -r "$work/out" "$work/bad"
    rc=0
    python3 tests/export/gptoss_mutate.py "$work/bad" "$victim" "$how" || rc=$?
    [ "$rc" -ne 3 ] || continue  # does not apply (FP8's scalar weight_scale)
    [ "$rc" -eq 0 ] || exit 1
    if python3 tests/export/check_modelopt_export.py "$src" "$work/bad" > "$work/check" 2>&1; then
      echo "FAIL: the checker passed $victim $how"; exit 1
    fi
    grep -q "FAIL \[gptoss\]" "$work/check" || { cat "$work/check"; echo "FAIL: no [gptoss] failure for $victim $how"; exit 1; }
    echo "checker: $victim $how caught"
  done
fi
# The block-32 weight-only formats (MXFP4, NVFP4 bs32): the checker must catch a corrupted block
# scale (a flipped bit of the first weight_scale byte of the first quantized MLP).
# Kimi-K3's recipe: the same for the F32 block scale of the first FP8 per-block attention weight.
if [[ $recipe == *mxfp4_mlp_weight_only* || $recipe == *nvfp4_mlp_weight_only* ||
      $recipe == *fp8_pb_attention* ]]; then
  part=.mlp.
  [[ $recipe == *fp8_pb_attention* ]] && part=.self_attn.
  victim=$(python3 - "$work/out" "$part" <<'PY'
import sys
sys.path.insert(0, "tests/export")
from check_modelopt_export import load_dir_tensors
print(sorted(n for n in load_dir_tensors(sys.argv[1]) if sys.argv[2] in n and n.endswith(".weight_scale"))[0])
PY
)
  rm -rf "$work/bad"
  cp -r "$work/out" "$work/bad"
  python3 tests/export/flip_byte.py "$work/bad" "$victim"
  if python3 tests/export/check_modelopt_export.py "$src" "$work/bad" > "$work/check" 2>&1; then
    echo "FAIL: the checker passed a corrupted $victim"; exit 1
  fi
  grep -q "FAIL \[numerics\].*weight_scale" "$work/check" \
    || { cat "$work/check"; echo "FAIL: no [numerics] weight_scale failure for $victim"; exit 1; }
  echo "checker: corrupted $victim caught"
fi
