#!/usr/bin/env bash
# One export test: quantize a transformers fixture with a recipe, calibrating on exactly the
# tokens transformers saw, then run the independent consumer-contract checker on the result
# (with the transformers amaxes for the 1% scale check).
#   tests/export/run_export_check.sh STRATA MODEL RECIPE
set -euo pipefail
strata=$1 model=$2 recipe=$3
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$src/reference.safetensors" > "$work/tokens.jsonl" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
s = 0
while f"tokens.{s}" in header:
    a, z = header[f"tokens.{s}"]["data_offsets"]
    data = raw[8 + n + a:8 + n + z]
    print(json.dumps(list(struct.unpack(f"<{len(data) // 4}i", data))))
    s += 1
PY
count=$(wc -l < "$work/tokens.jsonl")
"$strata" quantize -q --model "$src" --recipe "$recipe" --calib_data "$work/tokens.jsonl" --calib_size "$count" \
  --calib_min_tokens 1 --batch_size 2 --export_path "$work/out"
python3 tests/export/check_modelopt_export.py "$src" "$work/out" --amax "$src/reference.safetensors"
