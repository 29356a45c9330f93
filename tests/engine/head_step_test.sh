#!/usr/bin/env bash
# The head step (step 0) writes every tensor outside the decoder layers -- the embedding, the final
# norm, lm_head -- so that nothing is left to write after the layer loop (export/modelopt.h
# "Steps"). A run made to fail in its first layer (test hook --test_fail_rank 0 --test_fail_layer
# 0) must leave step 0 recorded (the manifest's next_step 1) and those tensors in its shards with
# the bytes of an uninterrupted run's export; the same command then resumes to that export's
# bytes, file for file.
#   tests/engine/head_step_test.sh STRATA [MODEL] [FLAGS...]
# FLAGS go to every run (e.g. --device cuda).
set -euo pipefail
strata=$1 model=${2:-qwen3_moe}
shift $(($# < 2 ? $# : 2))
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
# Shards of ~52 KiB: the head's tensors and the layers' spread over several shards.
args=(quantize --model "$src" --calib_data "$work/tokens.jsonl" --calib_size "$count"
      --calib_min_tokens 1 --batch_size 2 --max_shard_size_gb 0.00005 --recipe nvfp4-kv_fp8 -q "$@")
fail() { echo "FAIL: $*"; exit 1; }
sums() { (cd "$1" && find . -type f | sort | xargs sha256sum); }

"$strata" "${args[@]}" --export_path "$work/ref" > /dev/null
rc=0
"$strata" "${args[@]}" --test_fail_rank 0 --test_fail_layer 0 --export_path "$work/out" \
  > /dev/null 2> "$work/fail.err" || rc=$?
[ "$rc" -ne 0 ] || fail "the run with a failing layer 0 exited 0"
grep -q "fails at layer 0" "$work/fail.err" || fail "unexpected error: $(cat "$work/fail.err")"
next=$(grep -o '"next_step": *[0-9]*' "$work/out.strata_resume/manifest.json" | grep -o '[0-9]*$')
[ "$next" = 1 ] || fail "the manifest records next_step $next, not 1 (the head step)"

# Every tensor of the reference export outside model.layers.* must be in the failed run's shards
# (final or partial names) with the same dtype, shape and bytes.
python3 - "$work/ref" "$work/out" <<'PY'
import json, os, re, struct, sys

def tensors(folder):
    out = {}
    for f in sorted(os.listdir(folder)):
        if not re.fullmatch(r"\.?.*\.safetensors(\.partial)?", f):
            continue
        d = open(os.path.join(folder, f), "rb").read()
        n = struct.unpack("<Q", d[:8])[0]
        h = json.loads(d[8:8 + n])
        h.pop("__metadata__", None)
        for k, v in h.items():
            a, b = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], d[8 + n + a:8 + n + b])
    return out

ref, got = tensors(sys.argv[1]), tensors(sys.argv[2])
outside = sorted(k for k in ref if not k.startswith("model.layers."))
must = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")
missing = [k for k in must if k not in outside]
if missing:
    sys.exit(f"FAIL: the reference export has no {missing}")
for k in outside:
    if k not in got:
        sys.exit(f"FAIL: {k} is not in the failed run's shards")
    if got[k] != ref[k]:
        sys.exit(f"FAIL: {k} differs from the reference export's after the head step")
print(f"head step: {len(outside)} tensors outside the layers written with the reference bytes:",
      ", ".join(outside))
PY

"$strata" "${args[@]}" --export_path "$work/out" > /dev/null
[ ! -e "$work/out.strata_resume" ] || fail "the resumed run left its resume folder"
diff <(sums "$work/ref") <(sums "$work/out") > /dev/null || fail "the resumed export differs"
echo "PASS: $model $*: step 0 recorded the tensors outside the layers; the resumed export is the reference's"
