#!/usr/bin/env bash
# Multi-token-prediction layers (DeepSeek-V3's and GLM-4.5's model.layers.N with N >=
# num_hidden_layers): a fixture with one appended (a copy of its last decoder layer plus the MTP
# modules eh_proj, enorm, hnorm, shared_head.norm) exports with that layer excluded as
# `model.layers.N.*` and copied byte for byte, no KV scales for it, and passes the independent
# checker. Qwen3-Next and Qwen3.5 keep theirs at the top level as the hub does (mtp.layers.0., a
# copy of the full-attention decoder layer 1, plus mtp.fc, mtp.norm, mtp.pre_fc_norm_*): excluded
# as `mtp.*`.
#   tests/export/mtp_test.sh STRATA MODEL
set -euo pipefail
strata=$1 model=$2
src=tests/fixtures/models/$model
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$src" "$work/src" <<'PY'
import json, os, shutil, sys
import numpy as np
sys.path.insert(0, "tests/export")
import check_modelopt_export as ck
src, dst = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
n = cfg.get("text_config", cfg)["num_hidden_layers"]
qwen = cfg["model_type"] in ("qwen3_next", "qwen3_5_moe")
lm = "model.language_model." if cfg["model_type"] == "qwen3_5_moe" else "model."
last, mtp = (lm + "layers.1.", "mtp.layers.0.") if qwen else (f"model.layers.{n - 1}.", f"model.layers.{n}.")
tensors = {}
for name, sf in ck.load_dir_tensors(src).items():
    dt, shape = sf.tensors[name][:2]
    tensors[name] = (dt, tuple(shape), sf.raw(name))
    if name.startswith(last):
        tensors[mtp + name[len(last):]] = (dt, tuple(shape), sf.raw(name))
H = ck.load_dir_tensors(src)[lm + "norm.weight"].tensors[lm + "norm.weight"][1][0]
rng = np.random.default_rng(7)
def bf16(shape):  # the top halves of fp32 values: valid bf16 bytes
    return (rng.normal(0, 0.1, shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
if qwen:
    tensors["mtp.fc.weight"] = ("BF16", (H, 2 * H), bf16((H, 2 * H)))
    for m in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        tensors["mtp." + m + ".weight"] = ("BF16", (H,), bf16((H,)))
else:
    tensors[mtp + "eh_proj.weight"] = ("BF16", (H, 2 * H), bf16((H, 2 * H)))
    for m in ("enorm", "hnorm", "shared_head.norm"):
        tensors[mtp + m + ".weight"] = ("BF16", (H,), bf16((H,)))
os.makedirs(dst)
ck.write_safetensors(os.path.join(dst, "model.safetensors"), tensors)
for f in os.listdir(src):
    if f not in ("model.safetensors", "reference.safetensors"):
        shutil.copy(os.path.join(src, f), dst)
print("appended MTP layer", mtp, "to", src)
PY
python3 tests/fixtures/tokens_jsonl.py "$src/reference.safetensors" > "$work/tokens.jsonl"
count=$(wc -l < "$work/tokens.jsonl")
"$strata" quantize -q --device cpu --model "$work/src" --recipe nvfp4-kv_fp8 --calib_data "$work/tokens.jsonl" \
  --calib_size "$count" --calib_min_tokens 1 --batch_size 2 --export_path "$work/out" > "$work/log"
python3 tests/export/check_modelopt_export.py "$work/src" "$work/out"
python3 - "$work/src" "$work/out" <<'PY'
import json, os, sys
sys.path.insert(0, "tests/export")
import check_modelopt_export as ck
src, out = sys.argv[1], sys.argv[2]
cfg = json.load(open(os.path.join(src, "config.json")))
n = cfg.get("text_config", cfg)["num_hidden_layers"]
mtp = "mtp." if cfg["model_type"] in ("qwen3_next", "qwen3_5_moe") else f"model.layers.{n}."
excl = json.load(open(os.path.join(out, "hf_quant_config.json")))["quantization"]["exclude_modules"]
# ModelOpt 0.47 (hf_ptq's MTP prefixes "model.layers.N" + "*", and its prefix-wildcard summary;
# Qwen3-Next's and Qwen3.5's top-level mtp.* modules summarised the same way as "mtp*")
summary = "mtp*" if mtp == "mtp." else f"model.layers.{n}*"
assert summary in excl, excl
s, o = ck.load_dir_tensors(src), ck.load_dir_tensors(out)
want = sorted(k for k in s if k.startswith(mtp))
got = sorted(k for k in o if k.startswith(mtp))
assert got == want, (set(got) ^ set(want))
for k in want:
    assert s[k].raw(k) == o[k].raw(k) and s[k].tensors[k][:2] == o[k].tensors[k][:2], k
print(f"MTP layer {summary}: excluded, its {len(want)} tensors copied byte for byte, no KV scales")
PY
