#!/usr/bin/env python3
# Regenerate with:  python3 demo/make_demo.py demo/tiny-llama
#
# Writes a tiny Llama-architecture checkpoint with random bf16 weights: hidden 256, 4 layers,
# 8 query heads and 2 KV heads of dim 32, intermediate 512, vocab 2048, untied lm_head,
# llama3 rope scaling. Two safetensors shards plus model.safetensors.index.json, config.json
# and generation_config.json. The Python standard library only: the safetensors bytes are
# written here, independently of strata's reader, so the demo also tests that reader. The same
# command always gives the same bytes (a fixed-seed splitmix64 stream, no dict-order or
# platform dependence).
import json
import os
import struct
import sys
from array import array

HIDDEN = 256
LAYERS = 4
HEADS = 8
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 512
VOCAB = 2048
SEED = 20261202

MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def f32_bits_to_bf16(bits):
    """Round-to-nearest-even from fp32 bits to bf16 bits (inputs here are finite)."""
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def uniform_bf16(rng, count, bound):
    """count bf16 values uniform in [-bound, bound), as little-endian bytes."""
    out = array("H")
    pack, unpack = struct.Struct("<f").pack, struct.Struct("<I").unpack
    for _ in range(count):
        u = (rng.next() >> 11) * (1.0 / (1 << 53))  # [0, 1)
        bits = unpack(pack((2.0 * u - 1.0) * bound))[0]
        out.append(f32_bits_to_bf16(bits))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def ones_bf16(count):
    return struct.pack("<H", 0x3F80) * count


def tensors_in_order():
    """(name, shape, kind) in the order they are written; kind is 'linear', 'embed' or 'norm'."""
    q_out, kv_out = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    items = [("model.embed_tokens.weight", [VOCAB, HIDDEN], "embed")]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        items += [
            (p + "input_layernorm.weight", [HIDDEN], "norm"),
            (p + "self_attn.q_proj.weight", [q_out, HIDDEN], "linear"),
            (p + "self_attn.k_proj.weight", [kv_out, HIDDEN], "linear"),
            (p + "self_attn.v_proj.weight", [kv_out, HIDDEN], "linear"),
            (p + "self_attn.o_proj.weight", [HIDDEN, q_out], "linear"),
            (p + "post_attention_layernorm.weight", [HIDDEN], "norm"),
            (p + "mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN], "linear"),
            (p + "mlp.up_proj.weight", [INTERMEDIATE, HIDDEN], "linear"),
            (p + "mlp.down_proj.weight", [HIDDEN, INTERMEDIATE], "linear"),
        ]
    items += [
        ("model.norm.weight", [HIDDEN], "norm"),
        ("lm_head.weight", [VOCAB, HIDDEN], "linear"),
    ]
    return items


def tensor_bytes(rng, shape, kind):
    count = 1
    for d in shape:
        count *= d
    if kind == "norm":
        return ones_bf16(count)
    if kind == "embed":
        return uniform_bf16(rng, count, 0.02 * 3**0.5)  # std 0.02
    return uniform_bf16(rng, count, 1.0 / shape[1] ** 0.5)  # Kaiming-uniform-like: 1/sqrt(in)


def write_safetensors(path, tensors):
    """tensors: [(name, shape, bytes)], written in that order, back to back (the reference
    safetensors library refuses gaps between tensors)."""
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    chunks = []
    for name, shape, data in tensors:
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_demo.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = SplitMix64(SEED)
    items = [(n, s, tensor_bytes(rng, s, k)) for n, s, k in tensors_in_order()]

    # Shard 1: embeddings and layers 0-1; shard 2: layers 2-3, the final norm and lm_head.
    split = next(i for i, (n, _, _) in enumerate(items) if n.startswith("model.layers.2."))
    shards = [items[:split], items[split:]]
    names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    weight_map = {}
    for shard, fname in zip(shards, names):
        write_safetensors(os.path.join(out, fname), shard)
        for n, _, _ in shard:
            weight_map[n] = fname
    total = sum(len(d) for _, _, d in items)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}

    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "num_key_value_heads": KV_HEADS,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 1024,
            "rope_type": "llama3",
        },
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
    }
    generation = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}
    for fname, obj in [
        ("model.safetensors.index.json", index),
        ("config.json", config),
        ("generation_config.json", generation),
    ]:
        with open(os.path.join(out, fname), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
