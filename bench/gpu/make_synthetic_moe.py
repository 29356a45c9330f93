#!/usr/bin/env python3
"""Writes a synthetic Qwen3-MoE checkpoint (random bf16 weights, no tokenizer) and token-id
JSONL calibration data, for timing `strata quantize --device cuda` at realistic layer shapes.
numpy only; weights are slices of one random pool (independence does not matter for timing).

  make_synthetic_moe.py OUT_DIR --layers 2 --experts 64 --seqs 64 --seq_len 512
"""
import argparse
import json
import os
import struct

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv_heads", type=int, default=4)
    ap.add_argument("--head_dim", type=int, default=128)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top_k", type=int, default=8)
    ap.add_argument("--moe_inter", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--seq_len", type=int, default=512)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    H, E, I, D = a.hidden, a.experts, a.moe_inter, a.head_dim
    cfg = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": H, "num_hidden_layers": a.layers, "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads, "head_dim": D, "intermediate_size": 4 * H,
        "moe_intermediate_size": I, "num_experts": E, "num_experts_per_tok": a.top_k,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "vocab_size": a.vocab, "rms_norm_eps": 1e-6, "hidden_act": "silu",
        "rope_theta": 1000000.0, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "attention_bias": False, "torch_dtype": "bfloat16",
    }
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=2)
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(1 << 26, dtype=np.float32) * 0.02).view(np.uint32) >> 16
    pool = pool.astype(np.uint16)

    def tensor(shape, ones=False):
        n = int(np.prod(shape))
        if ones:
            return np.full(n, 0x3F80, dtype=np.uint16)  # bf16 1.0
        out = np.empty(n, dtype=np.uint16)
        at = 0
        while at < n:
            off = int(rng.integers(0, pool.size // 2))
            take = min(n - at, pool.size - off)
            out[at:at + take] = pool[off:off + take]
            at += take
        return out

    specs = [("model.embed_tokens.weight", [a.vocab, H], False)]
    for l in range(a.layers):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", [H], True),
                  (p + "post_attention_layernorm.weight", [H], True),
                  (p + "self_attn.q_proj.weight", [a.heads * D, H], False),
                  (p + "self_attn.k_proj.weight", [a.kv_heads * D, H], False),
                  (p + "self_attn.v_proj.weight", [a.kv_heads * D, H], False),
                  (p + "self_attn.o_proj.weight", [H, a.heads * D], False),
                  (p + "self_attn.q_norm.weight", [D], True),
                  (p + "self_attn.k_norm.weight", [D], True),
                  (p + "mlp.gate.weight", [E, H], False)]
        for e in range(E):
            q = p + f"mlp.experts.{e}."
            specs += [(q + "gate_proj.weight", [I, H], False), (q + "up_proj.weight", [I, H], False),
                      (q + "down_proj.weight", [H, I], False)]
    specs += [("model.norm.weight", [H], True), ("lm_head.weight", [a.vocab, H], False)]
    specs.sort(key=lambda s: s[0])
    header, off = {}, 0
    for name, shape, _ in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shape, ones in specs:
            f.write(tensor(shape, ones).tobytes())
    with open(os.path.join(a.out, "calib.jsonl"), "w") as f:
        for s in range(a.seqs):
            f.write(json.dumps(rng.integers(0, a.vocab, a.seq_len).tolist()) + "\n")
    print("wrote", a.out, "%.2f GB" % ((8 + len(hb) + off) / 1e9))


if __name__ == "__main__":
    main()
