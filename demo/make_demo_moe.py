#!/usr/bin/env python3
"""The bundled demo: a tiny Qwen3-MoE, built with transformers' own classes and briefly trained
on the bundled calibration corpus so that its perplexity means something.

Regenerate (needs torch and transformers; CPU is enough, about 3 minutes on 2 cores):

    python3 demo/make_demo_moe.py --out demo/tiny-moe

Architecture: hidden 128, 4 decoder layers (layer 0 dense, layers 1-3 MoE with 16 experts,
top-4, expert width 64), 4 query / 2 KV heads of 32, vocab 2048. Tokenizer: the Qwen2-style
BPE tokenizer of tests/tokenizer/fixtures/qwen2 (trained with Hugging Face tokenizers on the
corpus). Training: next-token prediction on data/calib/*.txt (AdamW, fixed seed, fixed steps).
Saved in bf16 with save_pretrained. On one machine the bytes are reproducible; other CPUs
may round the training differently.
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(ROOT, "tests", "tokenizer", "fixtures", "qwen2")
# The corpus as it was when the demo was made (listed so that adding text does not change it).
TRAINING_FILES = ['chat_en.txt', 'code.txt', 'code_extra.txt', 'code_more.txt', 'data_formats.txt', 'essays_asia_ru.txt', 'essays_en.txt', 'everyday_en.txt', 'explainers_science_en.txt', 'explainers_society_en.txt', 'fiction_more_en.txt', 'howto_en.txt', 'howto_more_en.txt', 'math_en.txt', 'multilingual.txt', 'multilingual_chat.txt', 'multilingual_more.txt', 'science_en.txt', 'stories_en.txt', 'tech_chat_en.txt']


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "demo", "tiny-moe"))
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    tok = Tokenizer.from_file(os.path.join(TOKENIZER, "tokenizer.json"))
    text = "\n".join(open(os.path.join(ROOT, "data", "calib", f), encoding="utf-8").read() for f in TRAINING_FILES)
    ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.long)
    print(f"training tokens: {ids.numel()}")

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=2048, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0], rms_norm_eps=1e-6,
        max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"))
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(1)
    seq, batch = 128, 16
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=g)
        x = torch.stack([ids[s:s + seq] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f}")
    model.eval()
    shutil.rmtree(args.out, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, name), os.path.join(args.out, name))
    print("saved", sorted(os.listdir(args.out)))


if __name__ == "__main__":
    main()
