#!/usr/bin/env python3
"""Breaks a gpt-oss export in place (negative tests of the checker's [gptoss] rules):

    python3 tests/export/gptoss_mutate.py OUT_DIR TENSOR (flip|untransposed|scale)

flip: one bit of the first byte; untransposed: each expert's [out, in/k] rows written as they
are into the fused [E, in/k, out] (an exporter that forgot the transpose); scale: one scalar
scale times 1.25.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_modelopt_export as ck  # noqa: E402

out_dir, name, how = sys.argv[1:4]
path = [os.path.join(out_dir, f) for f in os.listdir(out_dir) if f.endswith(".safetensors")
        and name in ck.SafeFile(os.path.join(out_dir, f)).tensors][0]
sf = ck.SafeFile(path)
dt, shape, begin, end = sf.tensors[name][:4]
a = sf.array(name).copy()
if how == "flip":
    a.reshape(-1).view(np.uint8)[0] ^= 0x01
elif how == "untransposed":
    if a.ndim != 3:
        sys.exit(3)  # not applicable: a scalar (FP8's weight_scale)
    a = np.stack([a[e].T.copy().reshape(a.shape[1:]) for e in range(a.shape[0])])
elif how == "scale":
    a = (a.astype(np.float32) * np.float32(1.25)).astype(a.dtype)
else:
    sys.exit(f"unknown mutation {how}")
raw = a.tobytes()
assert len(raw) == end - begin
with open(path, "r+b") as f:
    f.seek(sf.data_start + begin)
    f.write(raw)
