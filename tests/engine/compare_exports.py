#!/usr/bin/env python3
"""Compares two ModelOpt exports of the same checkpoint and recipe (the CPU and the GPU run):
every tensor name, dtype and shape must match; weight tensors (everything but the activation
scales) must be byte-identical, since they depend only on the source weights; activation scales
(input_scale, k_scale, v_scale) must agree within --rel (relative to the CPU value), and the
affine KV cache's biases (k_bias, v_bias: means of K/V, calibrated like the scales) element by
element within --rel of the CPU tensor's largest |value|. Prints the largest relative difference
seen. numpy only.

  compare_exports.py CPU_DIR GPU_DIR --rel 0.01
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# "_input_scale": gpt-oss's fused experts (<p>.experts.gate_up_proj_input_scale).
SCALE_SUFFIXES = (".input_scale", "_input_scale", ".k_scale", ".v_scale")
BIAS_SUFFIXES = (".k_bias", ".v_bias")


def floats(dtype, b):
    if dtype == "BF16":
        return (np.frombuffer(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(b, dtype={"F16": np.float16, "F32": np.float32}[dtype])


def read_dir(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(d, f), "rb") as fh:
            data = fh.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            b, end = e["data_offsets"]
            out[name] = (e["dtype"], tuple(e["shape"]), data[base + b:base + end])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cpu")
    ap.add_argument("gpu")
    ap.add_argument("--rel", type=float, required=True)
    a = ap.parse_args()
    cpu, gpu = read_dir(a.cpu), read_dir(a.gpu)
    errors = []
    if set(cpu) != set(gpu):
        errors.append("tensor names differ: only CPU %s, only GPU %s" %
                      (sorted(set(cpu) - set(gpu))[:5], sorted(set(gpu) - set(cpu))[:5]))
    worst, worst_name, scales, weights = 0.0, "", 0, 0
    for name in sorted(set(cpu) & set(gpu)):
        (cd, cs, cb), (gd, gs, gb) = cpu[name], gpu[name]
        if (cd, cs) != (gd, gs):
            errors.append("%s: CPU %s %s, GPU %s %s" % (name, cd, cs, gd, gs))
            continue
        if name.endswith(BIAS_SUFFIXES):
            c, g = (floats(cd, x).astype(np.float64) for x in (cb, gb))
            rel = float(np.max(np.abs(g - c)) / max(float(np.max(np.abs(c))), 1e-30))
            scales += 1
            if rel > worst:
                worst, worst_name = rel, name
            if not rel <= a.rel:
                errors.append("%s: differs by %.3g of its largest |value| > %.3g" % (name, rel, a.rel))
            continue
        if name.endswith(SCALE_SUFFIXES):
            assert cd == "F32", name
            c = np.frombuffer(cb, dtype=np.float32).astype(np.float64)
            g = np.frombuffer(gb, dtype=np.float32).astype(np.float64)
            rel = float(np.max(np.abs(g - c) / np.maximum(np.abs(c), 1e-30)))
            scales += 1
            if rel > worst:
                worst, worst_name = rel, name
            if not rel <= a.rel:
                errors.append("%s: CPU %s GPU %s (relative difference %.3g > %.3g)" %
                              (name, c.tolist(), g.tolist(), rel, a.rel))
        else:
            weights += 1
            if cb != gb:
                errors.append("%s: weight bytes differ" % name)
    for f in ("config.json", "hf_quant_config.json"):
        pc, pg = os.path.join(a.cpu, f), os.path.join(a.gpu, f)
        if os.path.exists(pc) and open(pc).read() != open(pg).read():
            errors.append(f + " differs")
    print("compared %d weight tensors (identical bytes required) and %d activation scales "
          "(largest relative difference %.3g at %s, bound %.3g)" %
          (weights, scales, worst, worst_name or "-", a.rel))
    for e in errors[:20]:
        print("FAIL", e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
