#!/usr/bin/env bash
# A compressed source (format.md §8) quantized by strata must give the same bytes as its
# decompressed bf16 equivalent (written by tests/export/decompress_reference.py with the checker's
# own numpy decompression), and pass the independent consumer-contract checker; its peak RSS is
# within its printed memory bound.
#   tests/export/compressed_source_test.sh STRATA MODEL RECIPE [FLAGS...]
# FLAGS go to both quantize runs (e.g. --device cuda: the device decompresses the source; exit 77
# without a GPU), but --test_gpu_expert_slice N to the compressed source's only (a bf16 source has
# nothing to decompress in slices, and the hook refuses a run it cannot slice). With --exact_mxfp4 the output is not expected to equal the bf16 path (the
# weights are converted in closed form); the checker then verifies that the NVFP4 export
# dequantizes to the source exactly.
set -euo pipefail
strata=$1 model=$2 recipe=$3
shift 3
flags=("$@")
extra=""
bf16_flags=()
for ((i = 0; i < ${#flags[@]}; ++i)); do
  f=${flags[i]}
  [ "$f" = --exact_mxfp4 ] && extra=exact
  if [ "$f" = cuda ] && ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU: skipped"; exit 77; fi
  if [ "$f" = --test_gpu_expert_slice ]; then i=$((i + 1)); else bf16_flags+=("$f"); fi
done
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The fixture's own reference tokens and amaxes (the checker compares the input scales with them);
# the compressed fixtures built from deepseek_v3 have none and calibrate on its tokens.
ref=$src/reference.safetensors amax=(--amax "$src/reference.safetensors")
[ -f "$ref" ] || { ref=tests/fixtures/models/deepseek_v3/reference.safetensors; amax=(); }
python3 tests/fixtures/tokens_jsonl.py "$ref" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
run() {  # run SRC OUT FLAGS...
  local src=$1 out=$2
  shift 2
  "$strata" quantize -q --model "$src" --recipe "$recipe" --calib_data "$work/tokens.jsonl" --calib_size "$count" \
    --calib_min_tokens 1 --batch_size 2 --export_path "$out" "$@"
}
run "$src" "$work/out" "${flags[@]}" | tee "$work/log"
source tests/memory_bound.sh
peak_within_bound "$work/log" "$model $recipe"
python3 tests/export/check_modelopt_export.py "$src" "$work/out" "${amax[@]}"
# With the experts excluded (attention_fp8) they are written decompressed: the checker must fail
# one flipped bit of such a weight.
if [ -z "$extra" ] && [ "$(basename "$recipe")" = attention_fp8.yaml ]; then
  cp -r "$work/out" "$work/flipped"
  victim=$(python3 -c "
import sys
sys.path.insert(0, 'tests/export')
from check_modelopt_export import load_dir_tensors
m = load_dir_tensors(sys.argv[1])
print(sorted(n for n in m if '.experts.' in n and n.endswith('.weight')
             or n.endswith('experts.gate_up_proj'))[0])" "$work/flipped")
  python3 tests/export/flip_byte.py "$work/flipped" "$victim"
  if python3 tests/export/check_modelopt_export.py "$src" "$work/flipped" > "$work/check" 2>&1; then
    echo "FAIL: the checker passed a flipped decompressed weight $victim"; exit 1
  fi
  grep -q "bytes differ from the .* source decompressed to bf16" "$work/check" \
    || { cat "$work/check"; echo "FAIL: the checker missed the flipped $victim"; exit 1; }
  echo "checker: flipped $victim caught"
fi
if [ -z "$extra" ]; then
  python3 tests/export/decompress_reference.py "$src" "$work/bf16"
  run "$work/bf16" "$work/out_bf16" "${bf16_flags[@]}"
  n=0
  for f in "$work/out"/* "$work/out_bf16"/*; do
    b=$(basename "$f")
    [ "$b" != strata_run.json ] || continue  # the run record: compared below
    cmp "$work/out/$b" "$work/out_bf16/$b" || { echo "FAIL: $b differs between the compressed and the bf16 source"; exit 1; }
    n=$((n + 1))
  done
  echo "identical: $((n / 2)) output files of the compressed source and of its bf16 equivalent"
  # The run records differ in the source's identity alone (another checkpoint, the same job).
  python3 - "$work/out/strata_run.json" "$work/out_bf16/strata_run.json" << 'EOF2'
import json, sys
a, b = (json.load(open(p))["identity"] for p in sys.argv[1:])
diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
assert diff == ["source"], f"FAIL: the run records differ in {diff}, expected ['source']"
EOF2
fi
