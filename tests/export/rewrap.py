#!/usr/bin/env python3
"""Copies a checkpoint with its tensor-name prefixes rewritten (a multimodal wrapper nested
another way), for tests/export/multimodal_test.sh:

    python3 tests/export/rewrap.py SRC_DIR OUT_DIR OLD=NEW [OLD=NEW ...]

Each tensor name starting with OLD gets NEW in its place (the first matching rule applies);
bytes, dtypes and shapes are unchanged; the other files are copied. numpy only.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_modelopt_export as ck  # noqa: E402


def main():
    src_dir, out_dir, rules = sys.argv[1], sys.argv[2], [r.split("=", 1) for r in sys.argv[3:]]
    tensors = {}
    for n, sf in ck.load_dir_tensors(src_dir).items():
        new = n
        for old, rep in rules:
            if n.startswith(old):
                new = rep + n[len(old):]
                break
        dt, shape = sf.tensors[n][:2]
        tensors[new] = (dt, tuple(shape), sf.raw(n))
    os.makedirs(out_dir, exist_ok=True)
    ck.write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
    for f in os.listdir(src_dir):
        p = os.path.join(src_dir, f)
        if os.path.isfile(p) and not f.endswith(".safetensors") and f != "model.safetensors.index.json":
            shutil.copy(p, out_dir)


if __name__ == "__main__":
    main()
