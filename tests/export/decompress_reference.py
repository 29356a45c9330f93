#!/usr/bin/env python3
"""Writes the decompressed bf16 equivalent of a compressed source checkpoint (format.md §8):

    python3 tests/export/decompress_reference.py SRC_DIR OUT_DIR

Every compressed linear weight (DeepSeek FP8 blocks, compressed-tensors pack-quantized INT4,
MXFP4 blocks) becomes M.weight BF16 [out, in], decompressed by check_modelopt_export.py's own
numpy code (independent of strata); its packed tensors and scales are dropped. gpt-oss's fused
MXFP4 experts (<p>.experts.P_blocks / _scales) become <p>.experts.P BF16 [E, in, out], the layout
transformers saves its bf16 GptOssExperts in. Every other tensor
is copied. config.json loses quantization_config (also one nested in text_config); the other
files are copied. numpy only.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_modelopt_export as ck  # noqa: E402


def main():
    src_dir, out_dir = sys.argv[1], sys.argv[2]
    src = ck.Source(src_dir)
    dropped = set()
    tensors = {}
    for m, (layout, stored) in src.compressed.items():
        dropped.update(stored)
        w = src.weight(m)
        tensors[m + ".weight"] = ("BF16", tuple(w.shape), ck.bf16_bytes(w))
    for x, projs in src.gptoss.items():
        for p, (kind, stored) in projs.items():
            if kind != "mxfp4":
                continue
            dropped.update(stored)
            w = src.gptoss_weight(x, p).transpose(0, 2, 1)  # [E, out, in] -> [E, in, out]
            tensors[x + p] = ("BF16", tuple(w.shape), ck.bf16_bytes(w))
    for n, sf in src.tensors.items():
        if n in dropped:
            continue
        dt, shape = sf.tensors[n][:2]
        tensors[n] = (dt, tuple(shape), sf.raw(n))
    os.makedirs(out_dir, exist_ok=True)
    ck.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    for f in os.listdir(src_dir):
        p = os.path.join(src_dir, f)
        if f.endswith(".safetensors") or f == "model.safetensors.index.json" or not os.path.isfile(p):
            continue
        if f == "config.json":
            c = json.load(open(p))
            c.pop("quantization_config", None)
            for sub in ("text_config", "language_config"):
                if isinstance(c.get(sub), dict):
                    c[sub].pop("quantization_config", None)
            with open(os.path.join(out_dir, f), "w") as fh:
                json.dump(c, fh, indent=2)
        else:
            shutil.copy(p, out_dir)
    print(f"{len(src.compressed)} compressed modules decompressed to bf16 in {out_dir}")


if __name__ == "__main__":
    main()
