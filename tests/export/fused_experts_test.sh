#!/usr/bin/env bash
# A checkpoint whose routed experts are stored fused (transformers 5's layout, io/fused_experts.h;
# written from the per-expert fixture by tests/fixtures/fuse_experts.py) must give the export of
# the same model stored per expert, byte for byte, read per expert without copying the fused
# tensors. gpt-oss fixtures are fused as transformers saves them; their per-expert copy is written
# by tests/fixtures/split_experts.py (the export is fused either way).
#   tests/export/fused_experts_test.sh STRATA MODEL RECIPE [FLAGS...]
# FLAGS go to both quantize runs (--device cuda: exit 77 without a GPU).
set -euo pipefail
strata=$1 model=$2 recipe=$3
shift 3
flags=("$@")
for f in "${flags[@]}"; do
  if [ "$f" = cuda ] && ! nvidia-smi -L >/dev/null 2>&1; then echo "no GPU: skipped"; exit 77; fi
done
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ $model == gpt_oss* ]]; then
  python3 tests/fixtures/split_experts.py "$src" "$work/per"
  per=$work/per fused=$src
else
  python3 tests/fixtures/fuse_experts.py "$src" "$work/fused"
  per=$src fused=$work/fused
fi
python3 - "$fused" "$per" << 'EOF2'
import json, re, struct, sys
raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
fused = [n for n in h if n.endswith(("experts.gate_up_proj", "experts.gate_up_proj_blocks"))]
per = [n for n in h if ".experts.0." in n]
assert fused and not per, f"FAIL: the fused copy has {len(fused)} fused and {len(per)} per-expert tensors"
raw = open(sys.argv[2] + "/model.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
fused = [n for n in h if re.search(r"experts\.(gate_up_proj|down_proj)(_blocks|_scales|_bias)?$", n)]
assert not fused, f"FAIL: the per-expert copy has fused tensors {fused[:2]}"
EOF2
# The fixtures calibrate on their reference tokens (compressed ones: deepseek_v3's).
ref=$src/reference.safetensors
[ -f "$ref" ] || ref=tests/fixtures/models/deepseek_v3/reference.safetensors
python3 tests/fixtures/tokens_jsonl.py "$ref" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
run() {
  "$strata" quantize -q --model "$1" --recipe "$recipe" --calib_data "$work/tokens.jsonl" --calib_size "$count" \
    --calib_min_tokens 1 --batch_size 2 --export_path "$2" "${flags[@]}"
}
"$strata" inspect "$fused" > "$work/inspect"
grep -q "layouts quantize refuses: none" "$work/inspect" || { cat "$work/inspect"; echo "FAIL: inspect refuses the fused layout"; exit 1; }
run "$per" "$work/out"
run "$fused" "$work/out_fused" | tee "$work/log"
source tests/memory_bound.sh
peak_within_bound "$work/log" "$model fused $recipe"
n=0
for f in "$work/out"/* "$work/out_fused"/*; do
  b=$(basename "$f")
  [ "$b" != strata_run.json ] || continue  # the run record: compared below
  cmp "$work/out/$b" "$work/out_fused/$b" || { echo "FAIL: $b differs between the per-expert and the fused source"; exit 1; }
  n=$((n + 1))
done
echo "identical: $((n / 2)) output files of the per-expert and of the fused source"
python3 - "$work/out/strata_run.json" "$work/out_fused/strata_run.json" << 'EOF2'
import json, sys
a, b = (json.load(open(p))["identity"] for p in sys.argv[1:])
diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
assert diff == ["source"], f"FAIL: the run records differ in {diff}, expected ['source']"
EOF2
