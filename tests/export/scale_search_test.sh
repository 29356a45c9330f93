#!/usr/bin/env bash
# Weight scale search end to end (docs/QUANTIZE.md "Scale search"): quantize a fixture with a
# searching recipe and with its max twin on the same tokens; the search export passes the
# consumer-contract checker (--searched-scales: block scales are the search's, the codes must be the
# encoding under them; weight_scale_2 and input scales keep the max formula and the transformers
# amaxes), and differs from the max export only in the searched modules' weight and weight_scale.
# DEVICE cuda (ctest label gpu; exit 77 = skipped without a GPU) runs both on the GPU (fp32 GEMMs,
# whose activations the checker's transformers amaxes bound), and compares the search's block
# scales with the CPU run's: the GPU's layer inputs differ from the CPU's by the GEMMs' rounding
# (docs/CUDA.md "GPU vs CPU"), so where two candidates' errors nearly tie a block may choose the
# other; at most 1% of blocks may differ.
#   tests/export/scale_search_test.sh STRATA MODEL SEARCH_RECIPE MAX_RECIPE SEARCHED_GLOB [DEVICE]
set -euo pipefail
strata=$1 model=$2 search=$3 max=$4 searched=$5 device=${6:-cpu}
device_flags=(--device cpu)
if [ "$device" = cuda ]; then
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU: skipped"
    exit 77
  fi
  device_flags=(--device cuda --gpu_gemm fp32 --max_gpu_memory_gb 1)
fi
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
run() {
  "$strata" quantize -q "${device_flags[@]}" --model "$src" --recipe "$1" \
    --calib_data "$work/tokens.jsonl" --calib_size "$count" --calib_min_tokens 1 --batch_size 2 \
    --export_path "$2"
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
# A module's codes and block scales: <M>.weight and <M>.weight_scale, or gpt-oss's fused experts'
# <P>.gate_up_proj and <P>.gate_up_proj_weight_scale (docs/QUANTIZE.md "gpt-oss").
def split(n):
    module, field = n.rsplit(".", 1)
    if field.endswith("_proj"):
        return n, "weight"
    if field.endswith("_proj_weight_scale"):
        return module + "." + field[: -len("_weight_scale")], "weight_scale"
    return module, field
for n in s:
    a, b = s[n].raw(n), m[n].raw(n)
    if a == b:
        continue
    module, field = split(n)
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
[ "$device" = cuda ] || exit 0
device_flags=(--device cpu)
run "$search" "$work/cpu_search"
python3 - "$work/search" "$work/cpu_search" <<'PY'
import sys
sys.path.insert(0, "tests/export")
from check_modelopt_export import load_dir_tensors
g, c = load_dir_tensors(sys.argv[1]), load_dir_tensors(sys.argv[2])
blocks = differ = 0
for n in g:
    if n.endswith(".weight_scale") and g[n].tensors[n][0] == "F8_E4M3":
        a, b = g[n].raw(n), c[n].raw(n)
        blocks += len(a)
        differ += sum(x != y for x, y in zip(a, b))
assert blocks > 0, "no NVFP4 block scales in the export"
print(f"GPU vs CPU search: {differ} of {blocks} block scales differ")
assert differ <= blocks // 100, "more than 1% of the GPU's searched block scales are not the CPU's"
PY
