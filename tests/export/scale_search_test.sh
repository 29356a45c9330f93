#!/usr/bin/env bash
# Weight scale search end to end (docs/QUANTIZE.md "Scale search"): quantize a fixture with a
# searching recipe and with its max twin on the same tokens; the search export passes the
# consumer-contract checker (--searched-scales: block scales are the search's, the codes must be the
# encoding under them; weight_scale_2 and input scales keep the max formula and the transformers
# amaxes), and differs from the max export only in the searched modules' weight and weight_scale.
#   tests/export/scale_search_test.sh STRATA MODEL SEARCH_RECIPE MAX_RECIPE SEARCHED_GLOB
set -euo pipefail
strata=$1 model=$2 search=$3 max=$4 searched=$5
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
run() {
  "$strata" quantize -q --device cpu --model "$src" --recipe "$1" --calib_data "$work/tokens.jsonl" \
    --calib_size "$count" --calib_min_tokens 1 --batch_size 2 --export_path "$2"
}
run "$search" "$work/search"
run "$max" "$work/max"
python3 tests/export/check_modelopt_export.py "$src" "$work/search" --searched-scales \
  --amax "$src/reference.safetensors"
python3 - "$work/search" "$work/max" "$searched" <<'PY'
import fnmatch, sys
sys.path.insert(0, "tests/export")
from check_modelopt_export import load_dir_tensors
s, m, glob = load_dir_tensors(sys.argv[1]), load_dir_tensors(sys.argv[2]), sys.argv[3]
assert sorted(s) == sorted(m), "the two exports hold different tensor names"
differ = {}
for n in s:
    a, b = s[n].raw(n), m[n].raw(n)
    if a == b:
        continue
    module, field = n.rsplit(".", 1)
    assert field in ("weight", "weight_scale") and fnmatch.fnmatch(module, glob), \
        f"{n} differs from the max export but is not a searched module's weight or weight_scale"
    differ.setdefault(module, set()).add(field)
assert differ, "no searched module differs from max calibration"
scales = sum("weight_scale" in f for f in differ.values())
print(f"{len(differ)} searched modules differ from max calibration ({scales} in weight_scale); "
      "every other tensor is identical")
PY
for f in config.json hf_quant_config.json; do
  cmp "$work/search/$f" "$work/max/$f"
done
