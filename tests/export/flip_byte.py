#!/usr/bin/env python3
"""Flips one bit of the first byte of a tensor in an export, in place (negative tests):

    python3 tests/export/flip_byte.py OUT_DIR TENSOR_NAME
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_modelopt_export as ck  # noqa: E402

out_dir, name = sys.argv[1], sys.argv[2]
sf = ck.load_dir_tensors(out_dir)[name]
begin = sf.tensors[name][2]
del sf
path = [os.path.join(out_dir, f) for f in os.listdir(out_dir) if f.endswith(".safetensors")
        and name in ck.SafeFile(os.path.join(out_dir, f)).tensors][0]
data_start = ck.SafeFile(path).data_start
with open(path, "r+b") as f:
    f.seek(data_start + begin)
    b = f.read(1)
    f.seek(data_start + begin)
    f.write(bytes([b[0] ^ 0x01]))
