#!/usr/bin/env bash
# strata compare on an export whose routed experts do not share one input scale (ctest label gpu;
# exit 77 = skipped without a GPU): the GPU simulates one input scale per MoE layer, as ModelOpt
# exports them, so such an export is compared on the CPU. Without --device the run warns and
# compares on the CPU; with --device cuda it is a one-line error naming the layer.
#   tests/engine/gpu_compare_fallback_test.sh STRATA
set -euo pipefail
strata=$1
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU: skipped"
  exit 77
fi
src=tests/fixtures/models/qwen3_moe
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
"$strata" quantize -q --model "$src" --recipe nvfp4-kv_fp8 --calib_data "$work/tokens.jsonl" \
  --calib_size "$count" --calib_min_tokens 1 --device cpu --export_path "$work/export" >/dev/null
# Expert 0's gate input scale of the first MoE layer, doubled in place.
victim=$(python3 - "$work/export" <<'PY'
import os, struct, sys
sys.path.insert(0, "tests/export")
import check_modelopt_export as ck
out = sys.argv[1]
names = sorted(n for n in ck.load_dir_tensors(out) if n.endswith("experts.0.gate_proj.input_scale"))
name = names[0]
for f in sorted(os.listdir(out)):
    if not f.endswith(".safetensors"):
        continue
    sf = ck.SafeFile(os.path.join(out, f))
    if name not in sf.tensors:
        continue
    dtype, shape, begin = sf.tensors[name][0], sf.tensors[name][1], sf.tensors[name][2]
    assert dtype == "F32", dtype
    with open(os.path.join(out, f), "r+b") as fh:
        fh.seek(sf.data_start + begin)
        (v,) = struct.unpack("<f", fh.read(4))
        fh.seek(sf.data_start + begin)
        fh.write(struct.pack("<f", 2 * v))
print(name)
PY
)
echo "doubled $victim"
"$strata" compare "$src" "$work/export" --tokens "$work/tokens.jsonl" --json "$work/auto.json" \
  > "$work/auto.log" 2>&1 || { cat "$work/auto.log"; echo "FAIL: compare without --device failed"; exit 1; }
grep -q "different gate/up input scales" "$work/auto.log" ||
  { cat "$work/auto.log"; echo "FAIL: no warning naming the differing input scales"; exit 1; }
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['device']=='cpu', d['device']" \
  "$work/auto.json"
if "$strata" compare -q "$src" "$work/export" --tokens "$work/tokens.jsonl" --device cuda \
  > "$work/cuda.log" 2>&1; then
  echo "FAIL: --device cuda compared an export the GPU cannot simulate"
  exit 1
fi
grep -q "different gate/up input scales.*--device cpu" "$work/cuda.log" ||
  { cat "$work/cuda.log"; echo "FAIL: --device cuda's error does not say why"; exit 1; }
echo "fallback to the CPU and the --device cuda error as expected"
