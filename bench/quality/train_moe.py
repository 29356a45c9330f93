#!/usr/bin/env python3
"""Trains the quality benchmark's MoE (docs/QUALITY.md): a transformers Qwen3-MoE trained from
scratch in bf16 on the token ids of make_tokens.py for a fixed time, saved with save_pretrained.

    python3 bench/quality/train_moe.py --data DIR/quality_data --out DIR/model [--seconds 150]
                                       [--preset full|toy] [--device cuda|cpu]

Presets (any field can be overridden by its flag):
- full (the GPU run): hidden 768, 8 layers, every layer MoE with 32 experts of width 512, top-4,
  12 query / 4 KV heads of 64, vocabulary from the data (16384): 340 M parameters in all (302 M in
  routed experts), 76 M active per token. Batches of 64 x 512 tokens.
- toy (to check the pipeline on a CPU): hidden 64, 2 layers, 8 experts of width 32, top-2.

Training: next-token loss on random windows of the training stream, plus Qwen3-MoE's load
balancing loss (router_aux_loss_coef 0.01, so that experts are used). On the GPU the model's
parameters are bf16, so forward and backward run in bf16 (with transformers' grouped-GEMM experts),
and AdamW (betas 0.9/0.95, weight decay 0.1, gradient clipping 1.0) updates fp32 master copies;
on the CPU everything is fp32. The learning rate follows the clock, not a step count: linear warm-up over the first
5% of --seconds, then a cosine to 10% of --lr at --seconds, when training stops. Then the model is
saved in bf16 (safetensors) with the data's tokenizer, and its held-out perplexity is measured on
the saved bf16 weights: over the held-out stream (up to --eval_windows windows of --seq tokens)
and over heldout.jsonl, the sequences `strata compare --tokens` reads (strata's `ppl_source`
should be close to the latter: it computes in fp32 with bf16 between layers).
Writes OUT/train_summary.json (the loss curve, tokens seen, both perplexities, timings).
"""
import argparse
import json
import math
import os
import shutil
import time

import numpy as np
import torch
import transformers

PRESETS = {
    "full": dict(hidden=768, layers=8, heads=12, kv_heads=4, head_dim=64, experts=32, top_k=4,
                 expert_width=512, batch=64, seq=512, lr=2e-3),
    "toy": dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, experts=8, top_k=2,
                expert_width=32, batch=8, seq=128, lr=3e-3),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="the quality_data folder of make_tokens.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=150.0, help="training time (the clock, not steps)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                    help="parameter dtype (auto: bf16 on the GPU, fp32 on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval_windows", type=int, default=64)
    for k, v in PRESETS["full"].items():
        ap.add_argument(f"--{k}", type=type(v), default=None, help=f"override the preset (full: {v})")
    args = ap.parse_args()
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def make_model(args, meta):
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=meta["vocab_size"], hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, num_experts=args.experts, num_experts_per_tok=args.top_k,
        moe_intermediate_size=args.expert_width, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=meta["eos_token_id"], pad_token_id=meta["eos_token_id"],
        output_router_logits=True, router_aux_loss_coef=0.01, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def choose_experts_implementation(model, device, x):
    """The fastest experts kernel transformers offers that runs here (grouped GEMM on the GPU);
    tried on one batch, falling back to the per-expert loop ("eager")."""
    candidates = ["grouped_mm", "eager"] if device.type == "cuda" else ["eager"]
    for name in candidates:
        try:
            model.set_experts_implementation(name)
            model(input_ids=x, labels=x).loss.backward()
            model.zero_grad(set_to_none=True)
            return name
        except Exception as e:  # noqa: BLE001 - any failure means: try the next kernel
            print(f"experts implementation {name!r} failed here ({type(e).__name__}: {str(e)[:200]}); trying the next")
            model.zero_grad(set_to_none=True)
    raise SystemExit("train_moe: no experts implementation ran")


class MasterWeights:
    """Mixed precision without autocast: the model's parameters are bf16 (every op of forward and
    backward runs in bf16), AdamW updates fp32 copies of them, which are rounded back into the
    model after each step. On the CPU the model is fp32 and the copies are the parameters."""

    def __init__(self, model, lr, fused):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.same = self.params[0].dtype == torch.float32
        self.master = self.params if self.same else [p.detach().float().clone() for p in self.params]
        self.opt = torch.optim.AdamW(self.master, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)

    def step(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr
        if not self.same:
            for m, p in zip(self.master, self.params):
                m.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(self.master, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None
        if not self.same:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.master)


def lr_at(frac, peak):
    if frac < 0.05:
        return peak * max(frac / 0.05, 0.01)
    p = min(1.0, (frac - 0.05) / 0.95)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def perplexity(model, seqs, device, batch):
    """exp of the mean next-token NLL over every predicted position of `seqs` (a list of id lists
    of one length), the model in eval mode on `device`."""
    nll, count = 0.0, 0
    for i in range(0, len(seqs), batch):
        x = torch.tensor(seqs[i:i + batch], dtype=torch.long, device=device)
        logits = model(input_ids=x).logits.float()
        lp = torch.log_softmax(logits[:, :-1], dim=-1)
        nll -= lp.gather(-1, x[:, 1:, None]).sum().item()
        count += x[:, 1:].numel()
    return math.exp(nll / count)


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    meta = json.load(open(os.path.join(args.data, "meta.json")))
    train = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.u16"), dtype="<u2").astype(np.int64))
    held = np.fromfile(os.path.join(args.data, "heldout.u16"), dtype="<u2").astype(np.int64)
    compare_seqs = [json.loads(line) for line in open(os.path.join(args.data, "heldout.jsonl")) if line.strip()]
    train = train.to(device)
    t_start = time.time()

    # bf16 on the GPU (fp32 master weights in MasterWeights), fp32 on the CPU.
    bf16 = args.dtype == "bf16" or (args.dtype == "auto" and device.type == "cuda")
    model = make_model(args, meta).to(device=device, dtype=torch.bfloat16 if bf16 else torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    expert_params = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = n_params - expert_params + expert_params * args.top_k // args.experts
    print(f"model: {n_params / 1e6:.1f} M parameters ({expert_params / 1e6:.1f} M in routed experts, "
          f"{active / 1e6:.1f} M active per token); training tokens {train.numel()}, device {device}")

    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)

    def batch():
        starts = torch.randint(0, train.numel() - args.seq, (args.batch,), generator=g).to(device)
        idx = starts[:, None] + torch.arange(args.seq, device=device)[None, :]
        return train[idx]  # [batch, seq]

    model.train()
    impl = choose_experts_implementation(model, device, batch()[:2])
    opt = MasterWeights(model, args.lr, fused=device.type == "cuda")
    print(f"parameters {'bf16 (fp32 master weights)' if bf16 else 'fp32'}; experts implementation: {impl}; {args.batch} x {args.seq} tokens per step, peak lr {args.lr}, "
          f"{args.seconds:.0f} s (setup took {time.time() - t_start:.1f} s)")

    curve = []  # (seconds, step, tokens, loss)
    step, tokens, t0 = 0, 0, time.time()
    last_print = t0
    window = []
    while True:
        elapsed = time.time() - t0
        if elapsed >= args.seconds:
            break
        x = batch()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step(lr_at(elapsed / args.seconds, args.lr))
        step += 1
        tokens += x.numel()
        lm_loss = (out.loss - model.config.router_aux_loss_coef * out.aux_loss).item() \
            if out.aux_loss is not None else out.loss.item()
        window.append(lm_loss)
        now = time.time()
        if now - last_print >= max(5.0, args.seconds / 30) or step == 1:
            avg = sum(window) / len(window)
            curve.append((round(now - t0, 1), step, tokens, round(avg, 4)))
            print(f"  {now - t0:6.1f} s  step {step:5d}  tokens {tokens / 1e6:7.2f} M  loss {avg:.4f}  "
                  f"({tokens / (now - t0) / 1e3:.0f} k tokens/s)", flush=True)
            window, last_print = [], now
    train_s = time.time() - t0
    if window:
        curve.append((round(train_s, 1), step, tokens, round(sum(window) / len(window), 4)))
    print(f"trained {step} steps, {tokens / 1e6:.2f} M tokens ({tokens / train.numel():.2f} epochs) in {train_s:.1f} s")

    # Save in bf16 as a checkpoint for inference (no router logits, cache on).
    model.eval()
    model.config.output_router_logits = False
    model.config.use_cache = True
    shutil.rmtree(args.out, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.data, name), os.path.join(args.out, name))

    starts = np.linspace(0, len(held) - args.seq - 1, min(args.eval_windows, max(1, len(held) // args.seq)))
    held_seqs = [held[int(s):int(s) + args.seq].tolist() for s in starts.round()]
    ppl_held = perplexity(model, held_seqs, device, 16)
    ppl_compare = perplexity(model, compare_seqs, device, 16)
    ppl_train = perplexity(model, [batch()[0].tolist() for _ in range(16)], device, 16)
    print(f"perplexity of the saved bf16 model: held-out stream {ppl_held:.3f} ({len(held_seqs)} x {args.seq} tokens), "
          f"heldout.jsonl {ppl_compare:.3f} ({len(compare_seqs)} sequences), training windows {ppl_train:.3f}")
    summary = {"preset": args.preset, "config": {k: getattr(args, k) for k in PRESETS["full"]},
               "parameters": n_params, "expert_parameters": expert_params, "active_parameters": active,
               "experts_implementation": impl, "device": str(device), "bf16": bf16,
               "steps": step, "tokens": tokens, "epochs": tokens / train.numel(), "train_seconds": train_s,
               "total_seconds": time.time() - t_start, "loss_curve": curve,
               "ppl_heldout_stream": ppl_held, "ppl_heldout_jsonl": ppl_compare, "ppl_train_windows": ppl_train}
    with open(os.path.join(args.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"saved {args.out} ({time.time() - t_start:.1f} s in all)")


if __name__ == "__main__":
    main()
