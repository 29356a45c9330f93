#!/usr/bin/env bash
# A compressed source whose quantization_config strata cannot honour is refused before any work,
# with one line naming the key or module (export/plan.cpp check_source_quantization).
#   tests/export/source_refusals.sh STRATA
set -euo pipefail
strata=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
expect() {  # NAME PYTHON-EDIT-OF-c MESSAGE
  local d="$work/$1"
  cp -r tests/fixtures/models/kimi_k25_int4 "$d"
  python3 -c "
import json, sys
p = sys.argv[1]; c = json.load(open(p)); q = c['quantization_config']
$2
json.dump(c, open(p, 'w'))" "$d/config.json"
  if "$strata" quantize -q --model "$d" --recipe nvfp4-kv_fp8 --export_path "$work/out_$1" 2> "$work/err"; then
    echo "FAIL: $1 was not refused"; exit 1
  fi
  grep -qF "$3" "$work/err" || { cat "$work/err"; echo "FAIL: $1: message lacks: $3"; exit 1; }
  [ "$(wc -l < "$work/err")" -eq 1 ] || { cat "$work/err"; echo "FAIL: $1: not one line"; exit 1; }
  [ ! -e "$work/out_$1" ] || { echo "FAIL: $1 wrote output"; exit 1; }
  echo "refused $1: $(cat "$work/err")"
}
expect ignored "q['ignore'].append('re:.*experts.*')" \
  "ignore names 'language_model.model.layers.1.mlp.experts.0.down_proj' but the checkpoint stores it pack-quantized"
# An ignore regex that does not compile (Python's re would raise too) names the pattern.
expect bad_regex "q['ignore'].append('re:model.(layers')" \
  "quantization_config.ignore: the pattern 'model.(layers' does not compile (missing closing parenthesis"
expect group "q['config_groups']['group_0']['weights']['group_size'] = 64" "has INT4 groups of 32 but"
expect asymmetric "q['config_groups']['group_0']['weights']['symmetric'] = False" "symmetric 4-bit int weights"
expect method "q['quant_method'] = 'gptq'" "quant_method is 'gptq'"
expect format "q['format'] = 'int-quantized'" "'pack-quantized' INT4 only"
# FP8 blocks: the format's two spellings (DeepSeek-V3's "e4m3", MiniMax-M2's "float8_e4m3fn")
# are planned, another format refused.
fp8_fmt() {  # FMT: the deepseek_v3_fp8 fixture's quantization_config.fmt set to FMT
  rm -rf "$work/fp8"
  cp -r tests/fixtures/models/deepseek_v3_fp8 "$work/fp8"
  python3 -c "
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c['quantization_config']['fmt'] = sys.argv[2]
json.dump(c, open(p, 'w'))" "$work/fp8/config.json" "$1"
}
fp8_fmt float8_e4m3fn
"$strata" quantize -q --model "$work/fp8" --recipe nvfp4-kv_fp8 --dry-run > /dev/null \
  || { echo "FAIL: fmt float8_e4m3fn (MiniMax-M2's spelling of e4m3) was refused"; exit 1; }
fp8_fmt e5m2
if "$strata" quantize -q --model "$work/fp8" --recipe nvfp4-kv_fp8 --dry-run 2> "$work/err" > /dev/null; then
  echo "FAIL: fmt e5m2 was not refused"; exit 1
fi
grep -qF 'quantization_config.fmt is "e5m2"; strata decompresses e4m3 FP8 blocks only' "$work/err" \
  || { cat "$work/err"; echo "FAIL: unclear refusal of fmt e5m2"; exit 1; }
echo "fp8 fmt: float8_e4m3fn planned, e5m2 refused"
# Fused MXFP4 experts in a layout strata does not split (here [E, in/32, 16], one dimension short):
# refused, not silently skipped.
python3 tests/export/rewrap.py tests/fixtures/models/deepseek_v3_mxfp4 "$work/fused" \
  model.layers.1.mlp.experts.0.gate_proj.weight_blocks=model.layers.1.mlp.experts.gate_up_proj_blocks
if "$strata" quantize -q --model "$work/fused" --recipe nvfp4-kv_fp8 --export_path "$work/out_fused" 2> "$work/err"; then
  echo "FAIL: fused MXFP4 experts were not refused"; exit 1
fi
grep -qF "'model.layers.1.mlp.experts.gate_up_proj_blocks' is a fused MXFP4 tensor in a layout strata does not split" "$work/err" \
  || { cat "$work/err"; echo "FAIL: unclear refusal of fused MXFP4 experts"; exit 1; }
echo "refused fused: $(cat "$work/err")"
# inspect lists that layout among the ones quantize refuses, in its report and its JSON.
"$strata" inspect "$work/fused" > "$work/inspect" \
  || { cat "$work/inspect"; echo "FAIL: inspect failed on the fused checkpoint"; exit 1; }
grep -q "^layouts quantize refuses: 1 tensors" "$work/inspect" \
  && grep -qF "'model.layers.1.mlp.experts.gate_up_proj_blocks' is a fused MXFP4 tensor" "$work/inspect" \
  || { cat "$work/inspect"; echo "FAIL: inspect does not flag the fused MXFP4 experts"; exit 1; }
"$strata" inspect --json "$work/fused" | python3 -c "
import json, sys
r = json.load(sys.stdin)['refused']
assert [x['tensor'] for x in r] == ['model.layers.1.mlp.experts.gate_up_proj_blocks'], r
" || { echo "FAIL: inspect --json does not list the fused MXFP4 experts"; exit 1; }
"$strata" inspect tests/fixtures/models/deepseek_v3_mxfp4 | grep -q "^layouts quantize refuses: none" \
  || { echo "FAIL: inspect flags a layout of the per-module MXFP4 fixture"; exit 1; }
echo "inspect flags the fused layout"
# Fused experts in the split layout, in a family whose experts have other names (Mixtral's
# w1/w2/w3): refused naming the fused tensor and the family, not run with missing experts.
python3 - tests/fixtures/models/mixtral "$work/mixtral_fused" << 'EOF2'
import os, re, shutil, sys
sys.path.insert(0, "tests/export")
import check_modelopt_export as ck
src, out = sys.argv[1:]
t, ex = {}, {}
for n, sf in ck.load_dir_tensors(src).items():
    m = re.match(r"(.*)block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$", n)
    if m:
        ex.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = sf.array(n).view("u2")
    else:
        dt, shape = sf.tensors[n][:2]
        t[n] = (dt, tuple(shape), sf.raw(n))
import numpy as np
for p, w in ex.items():
    E = 1 + max(e for e, _ in w)
    gu = np.stack([np.concatenate([w[(e, "w1")], w[(e, "w3")]]) for e in range(E)])
    dn = np.stack([w[(e, "w2")] for e in range(E)])
    t[p + "mlp.experts.gate_up_proj"] = ("BF16", gu.shape, gu.tobytes())
    t[p + "mlp.experts.down_proj"] = ("BF16", dn.shape, dn.tobytes())
os.makedirs(out)
ck.write_safetensors(out + "/model.safetensors", t)
shutil.copy(src + "/config.json", out)
EOF2
if "$strata" quantize -q --model "$work/mixtral_fused" --recipe nvfp4-kv_fp8 --export_path "$work/out_mixtral" 2> "$work/err"; then
  echo "FAIL: fused Mixtral experts were not refused"; exit 1
fi
grep -qF "'model.layers.0.mlp.experts.down_proj' holds fused experts, which strata reads per expert as 'model.layers.0.mlp.experts.0.down_proj.weight', a name the mixtral family does not use" "$work/err" \
  && [ "$(wc -l < "$work/err")" -eq 1 ] && [ ! -e "$work/out_mixtral" ] \
  || { cat "$work/err"; echo "FAIL: unclear refusal of fused Mixtral experts"; exit 1; }
echo "refused mixtral fused: $(cat "$work/err")"
