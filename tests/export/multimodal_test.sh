#!/usr/bin/env bash
# Multimodal wrappers (format.md §6) on the Kimi-K2.5 fixture (INT4 experts, vision tower,
# projector), as shipped and re-nested the transformers-v5 way and one level deeper:
#   * each export passes the independent checker (tower and projector bit-identical, excluded,
#     config.json the parent's) and `strata inspect` reads the export as the parent model type
#     with every tensor recognised;
#   * the re-nested exports hold the same tensors (bytes) under the re-nested names;
#   * a nesting deeper than strata unwraps is refused with a clear message.
#   tests/export/multimodal_test.sh STRATA
set -euo pipefail
strata=$1
src=tests/fixtures/models/kimi_k25_int4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py tests/fixtures/models/deepseek_v3/reference.safetensors > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
quantize() {
  "$strata" quantize -q --model "$1" --recipe nvfp4-kv_fp8 --calib_data "$work/tokens.jsonl" \
    --calib_size "$count" --calib_min_tokens 1 --batch_size 2 --export_path "$2"
}
python3 tests/export/rewrap.py "$src" "$work/v5" language_model.model.=model.language_model. \
  language_model.lm_head.=lm_head. vision_tower.=model.vision_tower. mm_projector.=model.mm_projector.
python3 tests/export/rewrap.py "$src" "$work/deep" language_model.model.=wrapper.model.language_model.model. \
  language_model.lm_head.=wrapper.model.language_model.lm_head. vision_tower.=wrapper.vision_tower. \
  mm_projector.=wrapper.mm_projector.
python3 tests/export/rewrap.py "$src" "$work/too_deep" language_model.=a.b.c.d.language_model.
for v in "$src" "$work/v5" "$work/deep"; do
  out="$work/out_$(basename "$v")"
  quantize "$v" "$out"
  python3 tests/export/check_modelopt_export.py "$v" "$out"
  "$strata" inspect --json "$out" > "$work/inspect.json"
  python3 - "$work/inspect.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["model_type"] == "kimi_k25" and r["multimodal"] and r["text_model_type"] == "kimi_k2", r["model_type"]
assert r["unrecognized"] == [], r["unrecognized"]
assert r["kinds"]["vision_tower"]["tensors"] == 10 and r["kinds"]["projector"]["tensors"] == 6, r["kinds"]
print("inspect: the export reads as", r["model_type"], "with", r["tensors"], "tensors, none unrecognized")
PY
done
# The same tensors under each nesting.
python3 tests/export/rewrap.py "$work/out_v5" "$work/back_v5" model.language_model.=language_model.model. \
  lm_head.=language_model.lm_head. model.vision_tower.=vision_tower. model.mm_projector.=mm_projector.
python3 tests/export/rewrap.py "$work/out_deep" "$work/back_deep" wrapper.model.language_model.=language_model. \
  wrapper.vision_tower.=vision_tower. wrapper.mm_projector.=mm_projector.
python3 tests/export/rewrap.py "$work/out_kimi_k25_int4" "$work/back_orig"
for v in back_v5 back_deep; do
  cmp "$work/back_orig/model.safetensors" "$work/$v/model.safetensors" || { echo "FAIL: $v tensors differ"; exit 1; }
done
# The checker fails a vision tensor that is not bit-identical.
python3 tests/export/flip_byte.py "$work/out_kimi_k25_int4" vision_tower.encoder.blocks.0.wqkv.weight
if python3 tests/export/check_modelopt_export.py "$src" "$work/out_kimi_k25_int4" > "$work/check" 2>&1; then
  echo "FAIL: the checker passed a modified vision tensor"; exit 1
fi
grep -q "\[multimodal\] vision_tower.encoder.blocks.0.wqkv.weight: not copied bit-identical" "$work/check" \
  || { cat "$work/check"; echo "FAIL: the checker missed the modified vision tensor"; exit 1; }
if quantize "$work/too_deep" "$work/out_too_deep" 2> "$work/err"; then
  echo "FAIL: a 5-level nesting was not refused"; exit 1
fi
grep -q "wrapped more than 4 levels deep" "$work/err" || { cat "$work/err"; echo "FAIL: unclear refusal"; exit 1; }
echo "multimodal: 3 nestings exported alike; 5 levels refused: $(head -1 "$work/err")"
