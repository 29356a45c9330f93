#!/usr/bin/env python3
"""Helpers of bench/gpu_bench.sh (docs/PERFORMANCE.md): the baseline a user has today, the
machine's bf16 matmul rate, and the FLOPs of a calibration forward.

  hf_baseline.py run --model DIR --tokens FILE [--micro_batch 16] [--device cuda] [--json OUT]
      Loads DIR with transformers onto the device (bf16), then pushes every token sequence of
      FILE (JSONL, one list of token ids per line) through it in micro-batches, with an amax
      hook on the input of every linear: a forward pre-hook on every nn.Linear, and for fused
      MoE experts (transformers 5's Qwen3MoeExperts and kin, which hold 3-D weights, not
      nn.Linear) the per-expert amax of both grouped matmuls' inputs. That is what max
      calibration computes. Nothing is written. Prints and writes JSON with the times.
  hf_baseline.py peak [--n 8192] [--iters 20]
      Times an n x n x n bf16 torch.matmul on random data (CUDA events, after warm-up) and
      prints the rate in TFLOP/s: the "bf16 matmul peak" the benchmark divides by.
  hf_baseline.py flops --config config.json --seqs N --seq_len L [--lm_head]
      Matmul FLOPs of one forward of N sequences of L tokens (see flops_per_sequence).
  hf_baseline.py export_bytes --config config.json
      Bytes of the nvfp4_experts_only export (see export_bytes).
"""
import argparse
import json
import os
import sys
import time


class Shapes:
    """The sizes both estimates below read from a Qwen3-MoE / Llama config.json, a DeepSeek-V3
    family one (deepseek_v3, kimi_k2: MLA attention, dense layers below first_k_dense_replace,
    routed and shared experts), or a gpt-oss one (routed experts in every layer)."""

    def __init__(self, cfg):
        self.h = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv = cfg.get("num_key_value_heads", self.heads)
        self.hd = cfg.get("head_dim") or self.h // self.heads
        self.layers = cfg["num_hidden_layers"]
        self.experts = (cfg.get("num_local_experts") or cfg.get("num_experts")
                        or cfg.get("n_routed_experts") or 0)
        self.top_k = cfg.get("num_experts_per_tok", 0)
        self.moe_i = cfg.get("moe_intermediate_size", 0)
        self.dense_i = cfg.get("intermediate_size", 0)
        # gpt-oss: every layer's experts are intermediate_size wide, gate and up fused into one
        # [2I, H] projection with biases (the same 3 x H x I weights an expert), a router with a
        # bias, attention with q/k/v/o biases and one sink per head.
        self.gpt_oss = cfg.get("model_type") == "gpt_oss"
        if self.gpt_oss:
            self.moe_i, self.dense_i = self.dense_i, 0
        self.vocab = cfg["vocab_size"]
        self.qk_norm = cfg.get("model_type") == "qwen3_moe"
        self._only = set(cfg.get("mlp_only_layers") or [])
        self._step = cfg.get("decoder_sparse_step", 1) or 1
        self.mla = bool(cfg.get("kv_lora_rank"))
        self.shared_i = self.moe_i * (cfg.get("n_shared_experts") or 0)
        self._first_dense = cfg.get("first_k_dense_replace")
        self._freq = cfg.get("moe_layer_freq", 1) or 1
        h, nh = self.h, self.heads
        if self.mla:  # q_a, q_b (or q_proj), kv_a_proj_with_mqa, kv_b, o; the two LoRA norms
            ql, kl = cfg.get("q_lora_rank") or 0, cfg["kv_lora_rank"]
            nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
            q = ql * h + nh * (nope + rope) * ql if ql else h * nh * (nope + rope)
            self.attn_weights = q + (kl + rope) * h + nh * (nope + v) * kl + h * nh * v
            self.attn_norms = ql + kl
            self.score_dims = nh * (nope + rope + v)  # QK^T over nope + rope, PV over v
        else:  # q, o and k, v
            self.attn_weights = 2 * h * nh * self.hd + 2 * h * self.kv * self.hd
            self.attn_norms = 2 * self.hd if self.qk_norm else 0
            self.score_dims = 2 * nh * self.hd

    def is_moe(self, layer):
        if self.experts == 0:
            return False
        if self._first_dense is not None:
            return layer >= self._first_dense and layer % self._freq == 0
        return layer not in self._only and (layer + 1) % self._step == 0


def flops_per_sequence(cfg, seq_len, lm_head):
    """Multiply-adds x 2 of every matmul of one causal forward over one sequence of seq_len
    tokens: the attention projections (q/k/v/o, or MLA's five), the attention scores and their
    product with V (each query sees (seq_len + 1) / 2 keys on average), the router, the top-k
    experts and any shared expert (MoE layers) or the dense MLP, and the lm_head if asked. Norms,
    softmax, RoPE and activations are left out (a few percent at most)."""
    s = Shapes(cfg)
    per_token_ctx = (seq_len + 1) / 2.0
    total = 0.0
    for layer in range(s.layers):
        t = 2 * s.attn_weights
        t += 2 * s.score_dims * per_token_ctx
        if s.is_moe(layer):
            t += 2 * s.h * s.experts + (s.top_k * s.moe_i + s.shared_i) * 2 * 3 * s.h
        else:
            t += 2 * 3 * s.h * s.dense_i
        total += t
    if lm_head:
        total += 2 * s.h * s.vocab
    return total * seq_len


def export_bytes(cfg):
    """Bytes of an nvfp4_experts_only export of a Qwen3-MoE / Llama / DeepSeek-V3-family or
    gpt-oss config: every routed expert's weights in NVFP4 (half a byte per value plus one FP8
    scale per 16; gpt-oss's fused [E, in/2, out] and [E, in/16, out] tensors hold the same bytes),
    everything else in bf16 (shared experts too; gpt-oss's expert and router biases, attention
    biases and sinks as the checkpoint stores them, bf16) but the DeepSeek-V3 family's routing
    correction bias, fp32 as its checkpoints store it. A compressed source (INT4, MXFP4)
    does not change it: its experts are written in NVFP4 all the same. Per-tensor scales and
    the config files are left out (kilobytes)."""
    s = Shapes(cfg)
    bf16 = 2 * s.vocab * s.h + s.h  # embedding, lm_head, final norm
    nvfp4 = f32 = 0
    for layer in range(s.layers):
        bf16 += s.attn_weights + s.attn_norms + 2 * s.h  # attention, its norms, two layer norms
        if s.gpt_oss:  # q/k/v/o biases and the sinks
            bf16 += s.heads * s.hd + 2 * s.kv * s.hd + s.h + s.heads
        if s.is_moe(layer):
            bf16 += s.experts * s.h + 3 * s.h * s.shared_i  # router, shared experts
            f32 += s.experts if s.mla else 0  # the routing correction bias
            if s.gpt_oss:  # the router's bias, the experts' gate_up and down biases
                bf16 += s.experts + s.experts * (2 * s.moe_i + s.h)
            nvfp4 += s.experts * 3 * s.h * s.moe_i
        else:
            bf16 += 3 * s.h * s.dense_i
    return int(2 * bf16 + 4 * f32 + nvfp4 * (0.5 + 1 / 16))


def cmd_export_bytes(a):
    with open(a.config) as f:
        print(export_bytes(json.load(f)))


def cmd_flops(a):
    with open(a.config) as f:
        cfg = json.load(f)
    print("%.6e" % (a.seqs * flops_per_sequence(cfg, a.seq_len, a.lm_head)))


def cmd_peak(a):
    import torch

    dev = torch.device("cuda")
    x = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(a.n, a.n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(x, y)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.iters):
        torch.matmul(x, y)
    stop.record()
    torch.cuda.synchronize()
    sec = start.elapsed_time(stop) / 1e3 / a.iters
    out = {
        "bf16_matmul_tflops": 2 * a.n ** 3 / sec / 1e12,
        "n": a.n,
        "iters": a.iters,
        "device": torch.cuda.get_device_name(0),
    }
    print(json.dumps(out))


def read_tokens(path):
    seqs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                seqs.append(json.loads(line))
    if not seqs or len({len(s) for s in seqs}) != 1:
        sys.exit("hf_baseline: %s must hold at least one sequence, all of one length" % path)
    return seqs


def cmd_run(a):
    import torch
    import transformers
    from torch import nn
    from transformers import AutoModelForCausalLM

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    tokens = torch.tensor(read_tokens(a.tokens), dtype=torch.long)
    with open(os.path.join(a.model, "config.json")) as f:
        cfg = json.load(f)

    # Fused experts: record per-expert amax of the input of both grouped matmuls (gate_up, then
    # down) by wrapping transformers' _grouped_linear; the experts module being run is set by a
    # forward pre-hook. offs[e] is the end row of expert e's group (rows sorted by expert).
    expert_amax = {}
    current = {"name": None, "calls": 0}
    grouped_calls = [0]
    try:
        from transformers.integrations import moe as hf_moe
    except ImportError:
        hf_moe = None
    if hf_moe is not None and hasattr(hf_moe, "_grouped_linear"):
        original = hf_moe._grouped_linear

        def recording_grouped_linear(input, weight, offs, *args, **kwargs):
            name = current["name"]
            if name is not None:
                which = ("gate_up_proj", "down_proj")[current["calls"] % 2]
                current["calls"] += 1
                grouped_calls[0] += 1
                n_exp = weight.shape[0]
                rows = input.abs().amax(dim=-1).float()  # [S]
                ids = torch.searchsorted(offs.to(torch.int64),
                                         torch.arange(rows.shape[0], device=rows.device),
                                         right=True).clamp_(max=n_exp - 1)
                key = name + "." + which
                acc = expert_amax.get(key)
                if acc is None:
                    acc = expert_amax[key] = torch.zeros(n_exp, device=rows.device)
                acc.scatter_reduce_(0, ids, rows, reduce="amax")
            return original(input, weight, offs, *args, **kwargs)

        hf_moe._grouped_linear = recording_grouped_linear

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    load_kwargs = dict(dtype=torch.bfloat16)
    if cuda:
        load_kwargs["device_map"] = a.device  # straight onto the GPU (needs accelerate)
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model, experts_implementation="grouped_mm",
                                                     **load_kwargs)
        experts_impl = "grouped_mm"
    except (ValueError, KeyError, TypeError) as e:  # no fused experts in this model
        print("hf_baseline: experts_implementation=grouped_mm refused (%s); default" % e,
              file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(a.model, **load_kwargs)
        experts_impl = "default"
    model.eval()
    if cuda:
        torch.cuda.synchronize()
    t_load = time.perf_counter() - t0
    load_peak = torch.cuda.max_memory_allocated() if cuda else 0

    linear_amax = {}
    hooks = []

    def linear_hook(name):
        def hook(module, args):
            x = args[0]
            lo, hi = torch.aminmax(x)
            a_ = torch.maximum(hi.float(), -lo.float())
            prev = linear_amax.get(name)
            linear_amax[name] = a_ if prev is None else torch.maximum(prev, a_)

        return hook

    def experts_hook(name):
        def hook(module, args):
            current["name"] = name
            current["calls"] = 0

        return hook

    n_linear = n_experts = 0
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            hooks.append(m.register_forward_pre_hook(linear_hook(name)))
            n_linear += 1
        elif type(m).__name__.endswith("Experts") and hasattr(m, "down_proj"):
            hooks.append(m.register_forward_pre_hook(experts_hook(name)))
            n_experts += 1

    n_seq, seq_len = tokens.shape
    if cuda:
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, n_seq, a.micro_batch):
            batch = tokens[i:i + a.micro_batch].to(dev, non_blocking=True)
            out = model(input_ids=batch, use_cache=False)
            del out
    if cuda:
        torch.cuda.synchronize()
    t_fwd = time.perf_counter() - t1
    finite = all(bool(torch.isfinite(v).all()) for v in linear_amax.values())
    finite = finite and all(bool(torch.isfinite(v).all()) for v in expert_amax.values())
    experts_seen = 0
    for k, v in expert_amax.items():
        if k.endswith("gate_up_proj"):
            experts_seen += int((v > 0).sum())
    result = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "experts_implementation": experts_impl,
        "load_s": t_load,
        "forward_s": t_fwd,
        "total_s": t_load + t_fwd,
        "sequences": n_seq,
        "seq_len": seq_len,
        "micro_batch": a.micro_batch,
        "linear_hooks": n_linear,
        "experts_modules_hooked": n_experts,
        "grouped_matmuls_recorded": grouped_calls[0],
        "experts_with_tokens": experts_seen,
        "amax_finite": finite,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else 0,
        "peak_gpu_bytes_after_load": load_peak,
        "flops": n_seq * flops_per_sequence(cfg, seq_len, lm_head=True),
    }
    if n_experts and not grouped_calls[0]:
        result["warning"] = "fused experts found but no grouped matmul recorded: expert inputs not hooked"
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--tokens", required=True)
    r.add_argument("--micro_batch", type=int, default=16)
    r.add_argument("--device", default="cuda")
    r.add_argument("--json")
    k = sub.add_parser("peak")
    k.add_argument("--n", type=int, default=8192)
    k.add_argument("--iters", type=int, default=20)
    f = sub.add_parser("flops")
    f.add_argument("--config", required=True)
    f.add_argument("--seqs", type=int, required=True)
    f.add_argument("--seq_len", type=int, required=True)
    f.add_argument("--lm_head", action="store_true")
    e = sub.add_parser("export_bytes")
    e.add_argument("--config", required=True)
    a = p.parse_args()
    {"run": cmd_run, "peak": cmd_peak, "flops": cmd_flops, "export_bytes": cmd_export_bytes}[a.cmd](a)


if __name__ == "__main__":
    main()
