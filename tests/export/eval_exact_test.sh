#!/usr/bin/env bash
# An MXFP4 source exported with --exact_mxfp4 under an experts-only NVFP4 recipe (no KV scales)
# dequantizes to the source's expert weights exactly and leaves every other tensor as it is, so
# `strata eval` of the export (which reads ModelOpt exports, dequantizing on load; for gpt-oss
# the fused experts per expert, io/fused_experts.h) must give the source's logits bit for bit.
#   tests/export/eval_exact_test.sh STRATA MODEL
set -euo pipefail
strata=$1 model=$2
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
"$strata" quantize -q --device cpu --model "$src" --recipe nvfp4_experts_only-kv_none --exact_mxfp4 \
  --calib_data "$work/tokens.jsonl" --calib_size "$count" --calib_min_tokens 1 --batch_size 2 \
  --export_path "$work/out" > /dev/null
grep -q '"NVFP4"' "$work/out/hf_quant_config.json" || { echo "FAIL: the export is not NVFP4"; exit 1; }
"$strata" eval --model "$src" --tokens "$work/tokens.jsonl" --dump-logits "$work/src.safetensors" 2> /dev/null
"$strata" eval --model "$work/out" --tokens "$work/tokens.jsonl" --dump-logits "$work/out.safetensors" 2> /dev/null
python3 - "$work/src.safetensors" "$work/out.safetensors" << 'EOF2'
import os, sys
sys.path.insert(0, os.path.join("tests", "export"))
import check_modelopt_export as ck
a, b = ck.SafeFile(sys.argv[1]), ck.SafeFile(sys.argv[2])
assert sorted(a.tensors) == sorted(b.tensors) and a.tensors, "FAIL: different logits tensors"
diff = [n for n in sorted(a.tensors) if a.raw(n) != b.raw(n)]
assert not diff, f"FAIL: logits of {diff} differ between the source and its exact export"
print(f"identical logits of {len(a.tensors)} sequences from the source and its exact NVFP4 export")
EOF2
