#!/usr/bin/env python3
"""ModelOpt 0.47 as a peer: quantize a fixture with ModelOpt itself, then compare its export with
strata's tensor by tensor. Run by tests/peer/peer.sh on a CUDA machine with torch and
transformers (and nvidia-modelopt 0.47.0 importable, e.g. from the wheels peer.sh installs).

    modelopt_peer.py export  MODEL_DIR TOKENS_JSONL RECIPE OUT_DIR
    modelopt_peer.py compare STRATA_OUT MODELOPT_OUT LABEL [--scale_tol 0.02] [--json FILE]

RECIPE is strata's recipe name: "<qformat>-kv_<kv>" (hf_ptq --qformat <qformat>
--kv_cache_qformat <kv>: ModelOpt's QUANT_CFG_CHOICES preset with its KV_QUANT_CFG_CHOICES entry)
or "general/ptq/<name>" (hf_ptq --recipe general/ptq/<name>) or "models/<org>/<model>/ptq/<name>"
(ModelOpt's per-model recipe, by the same load_recipe). hf_ptq.py's VLM handling and MTP
exclusions are not applied (0.47 has no per-family disables left): the peer runs the recipe as
written, which is what strata's recipes mirror.

Calibration: every sequence of TOKENS_JSONL (the ids strata calibrates with in
tests/export/run_export_check.sh) in its own unpadded forward, batch 1, on the bf16 model as
transformers loads it (torch_dtype from config.json), in the order strata calibrates them
(calib/dataset.h's shuffle with the default --seed 1234, every record taken): max calibration
does not depend on the order, the affine KV cache's amax does (calib/max_calib.h).

compare prints one verdict line, "PEER <label>: PASS|FAIL ...", and the differences above it:
  - names: tensors only one side writes (ModelOpt writing transformers' in-memory names instead
    of the checkpoint's, which servers do not load, is said so);
  - dtype and shape of every common tensor;
  - bytes of every common tensor except the calibrated scalars (input_scale, k_scale, v_scale),
    which are compared by relative difference (--scale_tol), and the affine KV cache's k_bias /
    v_bias, compared element by element within --scale_tol of the tensor's largest |value|; a packed weight or block scale that
    differs where its weight_scale_2 / weight_scale also differs is counted apart ("follows from
    a differing scale");
  - hf_quant_config.json's "quantization" and config.json's "quantization_config" (producer
    version ignored; exclude_modules / ignore compared as lists).
Standard library, numpy and the repo's tests/export/check_modelopt_export.py only (compare needs
no torch).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "export"))
import check_modelopt_export as ck  # noqa: E402

SCALARS = (".input_scale", ".k_scale", ".v_scale", "_input_scale")
GLOBALS = (".weight_scale_2", "_weight_scale_2")
# The affine KV cache's biases (k_proj.k_bias, v_proj.v_bias [1, heads, 1, head_dim]): means of
# K/V that the two forwards compute in their own precision, compared element by element within
# scale_tol of the tensor's largest |value| (a mean near zero has no meaningful relative error).
BIASES = (".k_bias", ".v_bias")


# ------------------------------------------------------------------------------------- export

def modelopt_cfg(recipe):
    """The quant_cfg dict hf_ptq 0.47 would pass to mtq.quantize for strata's recipe name."""
    import copy

    import modelopt.torch.quantization as mtq
    from modelopt.recipe import load_recipe
    from modelopt.recipe.presets import KV_CACHE_NONE, KV_QUANT_CFG_CHOICES, QUANT_CFG_CHOICES

    if recipe.startswith(("general/", "models/")):
        return load_recipe(recipe).quantize.model_dump()
    qformat, kv = recipe.rsplit("-kv_", 1)
    if qformat.endswith("_mla_bf16"):
        raise SystemExit(f"{recipe}: strata's own qformat, no ModelOpt preset to compare with")
    cfg = copy.deepcopy(QUANT_CFG_CHOICES[qformat])
    if kv != KV_CACHE_NONE:
        cfg = mtq.update_quant_cfg_with_kv_cache_quant(cfg, KV_QUANT_CFG_CHOICES[kv]["quant_cfg"])
    return cfg


def _splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def strata_order(n, seed=1234, source=0):
    """The record numbers of a source of n records in the order strata's calibration takes them
    (calib/dataset.h: Fisher-Yates driven by SplitMix64 seeded with seed ^ (golden x (source+1)),
    j uniform in [0, i] by rejection)."""
    p = list(range(n))
    state = (seed ^ ((0x9E3779B97F4A7C15 * (source + 1)) & M64)) & M64
    for i in range(n - 1, 0, -1):
        rng = i + 1
        threshold = (1 << 64) % rng
        while True:
            state, x = _splitmix64(state)
            if x >= threshold:
                break
        j = x % rng
        p[i], p[j] = p[j], p[i]
    return p


M64 = (1 << 64) - 1


def load_model(model_dir):
    import torch
    import transformers

    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    errors = []
    for cls in ("AutoModelForCausalLM", "AutoModelForImageTextToText"):
        try:
            model = getattr(transformers, cls).from_pretrained(model_dir, dtype="auto")
            return model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
        except Exception as e:  # noqa: BLE001 - try the next class, report all at the end
            errors.append(f"{cls}: {type(e).__name__}: {e}")
    raise SystemExit(f"{model_dir} ({cfg.get('model_type')}): transformers cannot load it: "
                     + " | ".join(errors))


def export(model_dir, tokens_path, recipe, out_dir):
    import torch

    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    model = load_model(model_dir)
    device = next(model.parameters()).device
    seqs = [json.loads(line) for line in open(tokens_path) if line.strip()]
    seqs = [seqs[i] for i in strata_order(len(seqs))]  # as strata calibrates them

    def forward_loop(m):
        with torch.no_grad():
            for ids in seqs:  # one unpadded sequence per forward
                m(input_ids=torch.tensor([ids], dtype=torch.long, device=device))

    mtq.quantize(model, modelopt_cfg(recipe), forward_loop=forward_loop)
    export_hf_checkpoint(model, export_dir=out_dir)
    print(f"modelopt export of {model_dir} with {recipe}: {out_dir}")


# ------------------------------------------------------------------------------------ compare

def tensors(d):
    """name -> (dtype, shape, bytes) of a checkpoint directory's weight files."""
    sf = ck.load_dir_tensors(d)
    return {n: (f.tensors[n][0], tuple(f.tensors[n][1]), f.raw(n)) for n, f in sf.items()}


def raw(t, n):
    return t[n][2]


def f32(t, n):
    return float(np.frombuffer(raw(t, n), np.float32).reshape(-1)[0])


# Kimi-Linear: ModelOpt 0.47 writes transformers 5's in-memory module names (its reverse name
# mapping does not cover this model), which no server loads; mapped back to the checkpoint's names
# here so that the numbers can be compared. The KDA q/k/v short convolutions are one fused
# `self_attn.conv1d` [3C, 1, K] in memory.
KIMI_LINEAR_RENAMES = [
    (r"\.mlp\.experts\.(\d+)\.gate_proj\.", r".block_sparse_moe.experts.\1.w1."),
    (r"\.mlp\.experts\.(\d+)\.up_proj\.", r".block_sparse_moe.experts.\1.w3."),
    (r"\.mlp\.experts\.(\d+)\.down_proj\.", r".block_sparse_moe.experts.\1.w2."),
    (r"\.mlp\.", ".block_sparse_moe."),
    (r"\.mlp$", ".block_sparse_moe"),
    (r"\.self_attn\.forget_gate\.", ".self_attn."),
]


def rename_kimi_linear(t):
    import re
    out = {}
    for n, (dt, shp, b) in t.items():
        if n.endswith(".self_attn.conv1d.weight") and shp and shp[0] % 3 == 0:
            third = len(b) // 3
            for i, x in enumerate("qkv"):
                out[n.replace(".conv1d.", f".{x}_conv1d.")] = (dt, (shp[0] // 3,) + shp[1:],
                                                              b[i * third:(i + 1) * third])
            continue
        for pat, rep in KIMI_LINEAR_RENAMES:
            n = re.sub(pat, rep, n)
        out[n] = (dt, shp, b)
    return out


# exclude_modules / ignore entries of ModelOpt's Kimi-Linear export that name in-memory modules:
# its summary "self_attn.forget_gate*" covers the forget gate's two projections (f_a_proj and
# f_b_proj in the checkpoint, which strata lists one by one), and the fused in-memory
# "self_attn.conv1d" (listed when the recipe leaves its Conv1d quantizer disabled) is no module of
# the checkpoint: its q/k/v_conv1d are convolutions no server quantizes or looks up in the list.
KIMI_LINEAR_EXCLUDE_RENAMES = [
    (r"\.self_attn\.forget_gate\*$", [".self_attn.f_a_proj", ".self_attn.f_b_proj"]),
    (r"\.self_attn\.conv1d$", []),
]


def rename_names(names, notes=None):
    import re
    out = []
    for n in names:
        for pat, reps in KIMI_LINEAR_EXCLUDE_RENAMES:
            if re.search(pat, n):
                base = re.sub(pat, "", n)
                if notes is not None:
                    notes.add(f"{n} -> {[base + r for r in reps] or 'nothing (in-memory fused conv)'}")
                out.extend(base + r for r in reps)
                break
        else:
            for pat, rep in KIMI_LINEAR_RENAMES:
                n = re.sub(pat, rep, n + "." if not n.endswith("*") else n).rstrip(".")
            out.append(n)
    return sorted(set(out))


def module_of(n):
    for suffix in (".weight_scale_2", ".weight_scale", ".input_scale", ".weight"):
        if n.endswith(suffix):
            return n[: -len(suffix)]
    for suffix in ("_weight_scale_2", "_weight_scale", "_input_scale"):
        if n.endswith(suffix):
            return n[: -len(suffix)]
    return None


def config_quant(d, rename=False, notes=None):
    out = {}
    p = os.path.join(d, "hf_quant_config.json")
    if os.path.exists(p):
        out["hf_quant_config"] = dict(json.load(open(p)).get("quantization") or {})
    p = os.path.join(d, "config.json")
    if os.path.exists(p):
        qc = dict(json.load(open(p)).get("quantization_config") or {})
        qc.pop("producer", None)
        out["quantization_config"] = qc
    if rename:
        for sec, key in (("hf_quant_config", "exclude_modules"), ("quantization_config", "ignore")):
            if isinstance(out.get(sec, {}).get(key), list):
                out[sec][key] = rename_names(out[sec][key], notes)
    return out


def model_type(d):
    try:
        return json.load(open(os.path.join(d, "config.json"))).get("model_type")
    except (OSError, ValueError):
        return None


def in_memory_name(n):
    """Names transformers holds in memory but no server loads (fused expert parameters)."""
    return n.endswith(("experts.gate_up_proj", "experts.down_proj")) or ".experts.gate_up_proj_" in n \
        or ".experts.down_proj_" in n


def ulps(a_raw, b_raw):
    """Largest ulp distance between two F32 tensors' elements (same sign assumed: scales)."""
    a, b = (np.frombuffer(x, np.int32).astype(np.int64) for x in (a_raw, b_raw))
    return int(np.abs(a - b).max()) if a.size else 0


def compare(strata_dir, modelopt_dir, label, scale_tol, json_path=None, ulp=0):
    s, m = tensors(strata_dir), tensors(modelopt_dir)
    lines = []
    renamed = model_type(strata_dir) == "kimi_linear" and any(
        ".self_attn.forget_gate." in n or ".self_attn.conv1d." in n for n in m)
    if renamed:
        m = rename_kimi_linear(m)
        lines.append("  note: ModelOpt wrote transformers' in-memory Kimi-Linear names (mlp.*, "
                     "self_attn.forget_gate.*, fused self_attn.conv1d), which servers do not load; "
                     "mapped to the checkpoint's names for the comparison (renamed)")
    only_s, only_m = sorted(set(s) - set(m)), sorted(set(m) - set(s))
    for n in only_s[:20]:
        lines.append(f"  strata only: {n} {s[n][0]} {list(s[n][1])}")
    for n in only_m[:20]:
        why = " (transformers' in-memory layout: servers load the checkpoint's names)" \
            if in_memory_name(n) else ""
        lines.append(f"  modelopt only: {n} {m[n][0]} {list(m[n][1])}{why}")
    meta_bad, byte_bad, byte_follow, scale_rel, scale_bad, rounding = [], [], [], {}, [], []
    common = sorted(set(s) & set(m))
    # F32 weight scales: per tensor (0-d), or FP8 per 128x128 block (fp8_pb_wo, F32 of any shape).
    differing_globals = {module_of(n) for n in common if n.endswith(GLOBALS + (".weight_scale",))
                         and (s[n][1] == () or s[n][0] == "F32") and raw(s, n) != raw(m, n)}
    for n in common:
        (sd, ss), (md, ms) = s[n][:2], m[n][:2]
        if (sd, tuple(ss)) != (md, tuple(ms)):
            meta_bad.append(n)
            lines.append(f"  dtype/shape: {n} strata {sd} {list(ss)}, modelopt {md} {list(ms)}")
            continue
        if n.endswith(SCALARS):
            a, b = f32(s, n), f32(m, n)
            rel = abs(a - b) / max(abs(b), 1e-30)
            scale_rel[n] = rel
            if rel > scale_tol:
                scale_bad.append(n)
                lines.append(f"  scale: {n} strata {a:.7g}, modelopt {b:.7g} (rel {rel:.2%})")
            continue
        if n.endswith(BIASES) and sd in ("BF16", "F16", "F32"):
            a, b = (ck.float_array(sd, np.frombuffer(raw(t, n), ck.ST_DTYPES[sd][0]))
                    for t in (s, m))
            rel = float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30)) if b.size else 0.0
            scale_rel[n] = rel
            if not np.isfinite(a).all() or rel > scale_tol:
                scale_bad.append(n)
                lines.append(f"  bias: {n} differs by {rel:.2%} of its largest |value|")
            continue
        if raw(s, n) == raw(m, n):
            continue
        if module_of(n) in differing_globals and not n.endswith(GLOBALS) and \
                not (n.endswith(".weight_scale") and (ss == () or sd == "F32")):
            byte_follow.append(n)
        elif ulp and sd == "F32" and (ss == () or n.endswith(".weight_scale")) and \
                ulps(raw(s, n), raw(m, n)) <= ulp:
            # --ulp: a peer that rounds scales otherwise (ModelOpt on a CPU divides where the
            # GPU multiplies by the reciprocal); also each block scale of an FP8 per-block weight
            rounding.append(n)
        else:
            byte_bad.append(n)
            extra = ""
            if ss == () and sd == "F32":
                extra = f" ({f32(s, n):.9g} vs {f32(m, n):.9g})"
            lines.append(f"  bytes: {n} {sd} {list(ss)}{extra}")
    exclude_notes = set()
    cs, cm = config_quant(strata_dir), config_quant(modelopt_dir, renamed, exclude_notes)
    for note in sorted(exclude_notes)[:6]:
        lines.append(f"  note: ModelOpt's exclude entry for an in-memory module mapped: {note}")
    cfg_diff = []
    for k in sorted(set(cs) | set(cm)):
        a, b = cs.get(k), cm.get(k)
        if a == b:
            continue
        for key in sorted(set(a or {}) | set(b or {})):
            va, vb = (a or {}).get(key), (b or {}).get(key)
            if va != vb:
                cfg_diff.append(f"{k}.{key}")
                if isinstance(va, list) and isinstance(vb, list):
                    lines.append(f"  {k}.{key}: strata only {sorted(set(va) - set(vb))[:10]}, "
                                 f"modelopt only {sorted(set(vb) - set(va))[:10]}")
                else:
                    lines.append(f"  {k}.{key}: strata {json.dumps(va)[:200]}, "
                                 f"modelopt {json.dumps(vb)[:200]}")
    if rounding:
        byte_follow = [n for n in byte_follow if module_of(n) not in {module_of(r) for r in rounding}] \
            + [f"{n} (after a scale {ulp} ulp off)" for n in byte_follow
               if module_of(n) in {module_of(r) for r in rounding}]
    ok = not (only_s or only_m or meta_bad or byte_bad or scale_bad or cfg_diff) and \
        (not byte_follow or bool(ulp))
    # ModelOpt matches a recipe's patterns against transformers' in-memory module names. A pattern
    # written with the checkpoint's name (Kimi-K3's `*block_sparse_moe.experts.*`,
    # `*self_attn.f_a_proj*`) matches nothing where transformers 5 renames the module in memory
    # (`mlp` in Mixtral, MiniMax-M2 and Kimi-Linear; Kimi-Linear's `forget_gate`), so ModelOpt
    # leaves those modules in bf16; strata matches the checkpoint's names, as servers load them,
    # and quantizes them. Said so when that is every tensor difference.
    renamed_in_memory = (".block_sparse_moe.", ".self_attn.f_a_proj", ".self_attn.f_b_proj")
    missed = {module_of(n) for n in only_s + meta_bad}
    pattern_miss = bool(missed) and not (only_m or byte_bad or scale_bad) and all(
        mod is not None and any(seg in mod for seg in renamed_in_memory)
        and m.get(mod + ".weight", ("",))[0] in ("BF16", "F16", "F32") for mod in missed)
    if pattern_miss:
        lines.append(f"  note: ModelOpt left {len(missed)} modules in bf16 whose checkpoint names "
                     f"({', '.join(sorted({seg.strip('.') for seg in renamed_in_memory if any(seg in x for x in missed)}))}) "
                     "transformers 5 renames in memory, where the recipe's checkpoint-name patterns "
                     "match nothing; strata quantizes them by the checkpoint's names, which servers "
                     "load (ModelOpt's pattern miss)")
    worst = max(scale_rel.values(), default=0.0)
    tags = [t for t, on in (("renamed", renamed), ("ModelOpt's pattern miss", pattern_miss)) if on]
    verdict = (f"PEER {label}: {'PASS' if ok else 'FAIL'}{' (' + ', '.join(tags) + ')' if tags else ''} "
               f"tensors {len(common)} common, "
               f"{len(only_s)} strata-only, {len(only_m)} modelopt-only; dtype/shape {len(meta_bad)} "
               f"differ; bytes {len(byte_bad)} differ (+{len(byte_follow)} from a differing scale); "
               + (f"{len(rounding)} F32 scales within {ulp} ulp; " if ulp else "")
               + f"scales {len(scale_rel)} max rel {worst:.3%} ({len(scale_bad)} over {scale_tol:.1%}); "
               f"config {'equal' if not cfg_diff else 'differs: ' + ','.join(cfg_diff)}")
    for line in lines:
        print(line)
    print(verdict)
    if json_path:
        json.dump({"label": label, "ok": ok, "only_strata": only_s, "only_modelopt": only_m,
                   "dtype_shape": meta_bad, "bytes": byte_bad, "bytes_from_scale": byte_follow,
                   "scales_over_tol": scale_bad, "max_scale_rel": worst, "config": cfg_diff},
                  open(json_path, "w"), indent=1)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("model")
    e.add_argument("tokens")
    e.add_argument("recipe")
    e.add_argument("out")
    c = sub.add_parser("compare")
    c.add_argument("strata")
    c.add_argument("modelopt")
    c.add_argument("label")
    c.add_argument("--scale_tol", type=float, default=0.02)
    c.add_argument("--json")
    c.add_argument("--ulp", type=int, default=0,
                   help="count F32 scales (scalar, or FP8 block scales) this many ulps apart (and the weights quantized "
                        "with them) as rounding, not differences: ModelOpt run on a CPU divides "
                        "where its GPU kernels multiply by the reciprocal (spec/format.md §1)")
    a = ap.parse_args()
    if a.cmd == "export":
        export(a.model, a.tokens, a.recipe, a.out)
        return 0
    return 0 if compare(a.strata, a.modelopt, a.label, a.scale_tol, a.json, a.ulp) else 1


if __name__ == "__main__":
    sys.exit(main())
