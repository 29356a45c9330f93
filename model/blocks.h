// The building blocks the family files compose (model/<family>.cpp), each written once against
// the backend (ops/backend.h): bind() names the block's weights under a prefix, forward() runs
// it. Math: spec/architectures.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/layer.h"
#include "ops/backend.h"
#include "ops/ops.h"

namespace strata::model {

// A SwiGLU MLP's weights under module names prefix + {gate, up, down}; a routed expert not held
// here (expert parallelism) keeps only its names.
struct MlpLeaves {
  const char *gate = "gate_proj", *up = "up_proj", *down = "down_proj";
};
ops::Mlp bind_mlp(Binder& b, const std::string& prefix, int64_t hidden, int64_t inter,
                  MlpLeaves leaves = {}, bool held = true);

// A layer's FFN that is either its MoE block or a dense MLP (the first dense layers,
// mlp_only_layers): y[T, H] from n[T, H].
template <typename Moe>
void moe_or_dense(ops::Backend& be, bool moe, Moe& experts, const ops::Mlp& dense, const float* n,
                  int64_t T, float* y) {
  if (moe) {
    experts.forward(be, n, T, y);
  } else {
    be.mlp(dense, n, T, y);
  }
}

// The decoder layer every family shares, in place on x[T, H]:
//   x += mixer(RMSNorm(x; in_norm));  x += ffn(RMSNorm(x; post_norm))
// mixer and ffn read n[T, H] and write y[T, H].
struct Residual {
  int64_t H = 0;
  float eps = 0.0f;
  ops::Weight in_norm, post_norm;
  void bind(Binder& b, const ModelConfig& c, const std::string& layer_prefix);
  template <typename Mixer, typename Ffn>
  void forward(ops::Backend& be, int64_t T, float* x, Mixer&& mixer, Ffn&& ffn) {
    ops::ScratchScope scope(be);
    float* n = be.take(T * H);  // [T, H]
    float* y = be.take(T * H);  // [T, H]
    be.phase(ops::Phase::kStart);
    be.rms_norm(x, T, H, in_norm, eps, n);
    be.phase(ops::Phase::kNorms);
    {
      ops::ScratchScope inner(be);
      mixer(n, y);
    }
    be.phase(ops::Phase::kMixer);
    be.add(x, y, T * H);
    be.rms_norm(x, T, H, post_norm, eps, n);
    be.phase(ops::Phase::kNorms);
    {
      ops::ScratchScope inner(be);
      ffn(n, y);
    }
    be.phase(ops::Phase::kFfn);
    be.add(x, y, T * H);
  }
};

// RoPE parameters from the config's normalised rope fields; an unknown rope type is an error.
ops::RopeParams rope_params(const ModelConfig& config);

// Grouped-query self-attention with optional q/k/v (and o) biases and q/k RMSNorm, per head
// (Qwen3, GLM-4.5) or over all heads at once (MiniMax-M2), before half-split RoPE over the first
// rot_dim dims of each head (all of them unless partial), and optionally an output gate
// (Qwen3-Next, Qwen3.5). Observers: q/k/v_proj (one input), k_cache, v_cache, o_proj. gpt-oss
// sets `sinks`, `window` and `eager` after bind() (ops::AttentionVariant).
struct GqaOptions {
  // Fraction of each head that RoPE rotates: rot_dim = int(head_dim · factor), as transformers'
  // default rope init; < 0: the config's partial_rotary_factor (1 when absent).
  double partial_rotary_factor = -1.0;
  // q_norm [nH·d] and k_norm [nKV·d] normalise the whole projection (MiniMax-M2) instead of
  // each head with a [d] weight.
  bool qk_norm_all_heads = false;
  // q_proj [nH·2d, H] gives each head's query and then its output gate g [d]: the attention's
  // output is multiplied by sigmoid(g) before o_proj (Qwen3-Next, Qwen3.5).
  bool output_gate = false;
};
struct GqaAttention {
  int64_t H = 0, n_heads = 0, n_kv = 0, head_dim = 0, rot_dim = 0;
  float qk_norm_eps = 0.0f;
  bool qk_norm_all_heads = false, output_gate = false;
  ops::Weight wq, wk, wv, wo;  // [nH·d (·2 with the output gate), H], [nKV·d, H] x2, [H, nH·d]
  ops::Weight bq, bk, bv, bo;  // undefined when there are no biases
  ops::Weight sinks;           // [nH] fp32, undefined without attention sinks
  int64_t window = 0;          // sliding window in tokens, 0: the whole causal prefix
  bool eager = false;          // bf16_ops: rounds as transformers' eager attention (gpt-oss)
  ops::Weight q_norm, k_norm;  // [d] ([nH·d], [nKV·d] over all heads), undefined when absent
  double attention_factor = 1.0;
  std::vector<double> inv_freq;  // [rot_dim / 2]
  std::vector<std::string> qkv_names, k_cache, v_cache, o_names;
  ActQuant k_quant, v_quant;  // the KV cache as a server stores it (Binder::kv_quant)

  void bind(Binder& b, const ModelConfig& c, const std::string& prefix,  // "...self_attn."
            GqaOptions options = {});
  // out[T, H] = attention(x[T, H]) (x already normalised).
  void forward(ops::Backend& be, const ops::Tokens& t, const float* x, float* out) const;
};

// Multi-head latent attention, per token x (already RMSNorm'd):
//   q      = q_b_proj(RMSNorm_1e-6(q_a_proj x))  or  q_proj x          [nH, d_n + d_r]
//   c | kr = kv_a_proj_with_mqa x                                       [r_kv + d_r]
//   kv     = kv_b_proj(RMSNorm_1e-6(c))                                 [nH, d_n + d_v]
//   k_h = [k_n,h | kr] (kr shared by all heads); RoPE on q's last d_r dims and on kr unless
//   `nope` (Kimi-Linear: the d_r dims are used unrotated and the scale has no mscale).
// Observers: q_proj or q_a_proj and q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, and the
// k_cache [T, nH·(d_n+d_r)] / v_cache [T, nH·d_v] of the layer.
struct MlaParams {
  int64_t H = 0, nH = 0, q_rank = 0, kv_rank = 0, dn = 0, dr = 0, dv = 0;
  bool nope = false;
  std::vector<double> inv_freq;  // [dr / 2], empty when nope
  double attention_factor = 1.0;
  bool interleaved = true;
  float scale = 1.0f;  // (dn + dr)^-1/2, times yarn's mscale² when it applies
};
MlaParams mla_params(const ModelConfig& c, bool nope);

// DeepSeek-V3.2's lightning indexer (transformers' DeepseekV32Indexer), per token x (the layer's
// normalised input) and c_q (MLA's RMSNorm'd q_a_proj output):
//   q = wq_b c_q  [nI, d];   k = LayerNorm_1e-6(wk x)  [d] (weight and bias);
//   half-split RoPE on the first d_r dims of each q head and of k (MLA's frequencies);
//   w = weights_proj x  [nI] (fp32 weight), times nI^-1/2;
//   s_ij = sum_h w_h · relu(d^-1/2 · q_h·k_j);  query i attends to the index_topk keys j <= i
//   with the largest s_ij (every j <= i while i < index_topk).
// No fp8 simulation and no Hadamard rotation (transformers 5.17 has neither; docs/FORWARD.md).
// Observers: wq_b (c_q), wk and weights_proj (x).
struct LightningIndexer {
  int64_t H = 0, q_rank = 0, n_heads = 0, head_dim = 0, rope_dim = 0, top_k = 0;
  std::vector<double> inv_freq;  // [rope_dim / 2], MLA's
  double attention_factor = 1.0;
  ops::Weight wq_b, wk, k_norm, k_norm_bias, weights_proj;  // weights_proj [nI, H] fp32
  std::vector<std::string> q_names, x_names;

  // Names under prefix ("...self_attn.indexer."); sizes from index_n_heads, index_head_dim,
  // index_topk.
  void bind(Binder& b, const ModelConfig& c, const std::string& prefix, const MlaParams& mla);
  // Observes the inputs; when a sequence of t is longer than top_k, writes keep [T, words] for
  // AttentionVariant::keep and returns true (false: every query keeps all its keys).
  bool forward(ops::Backend& be, const ops::Tokens& t, const float* x, const float* cq,
               int32_t* keep, int64_t words) const;
};

struct MlaAttention : MlaParams {
  ops::Weight wq, wqa, q_a_norm, wqb, wkva, kv_a_norm, wkvb, wo;
  std::vector<std::string> in_names, qb_names, kvb_names, k_cache, v_cache, o_names;
  ActQuant k_quant, v_quant;  // per head K and V as a server stores them (Binder::kv_quant)
  bool indexed = false;       // DeepSeek-V3.2: attention restricted to the indexer's keys
  LightningIndexer indexer;

  // `indexed`: bind the lightning indexer under prefix + "indexer." (needs q_lora_rank).
  void bind(Binder& b, const ModelConfig& c, const std::string& prefix, bool nope,
            bool indexed = false);
  void forward(ops::Backend& be, const ops::Tokens& t, const float* x, float* out) const;
};

// Softmax-routed experts (Qwen MoE, Mixtral): p = softmax_fp32(gate(n)) over E experts; top-k
// of p; w = p_top (/ Σ p_top when renormalize); y = Σ_j w_j · expert_{e_j}(n), plus, when
// present, σ(shared_expert_gate·n) · shared_expert(n).
struct SoftmaxMoe {
  int64_t H = 0, E = 0, K = 0;
  bool renormalize = false;
  // bf16_ops: the routing weights are cast to bf16 (Qwen MoE's router); Mixtral keeps them fp32.
  bool bf16_weights = true;
  ops::Weight router;  // [E, H] fp32
  std::vector<ops::Mlp> experts;
  ops::Mlp shared;          // inter 0 when absent
  ops::Weight shared_gate;  // [1, H] fp32, undefined without a shared expert gate
  std::string router_name;  // block + "gate": the routing is observed under it

  // Router block + "gate", experts block + "experts.E." + leaves.
  void bind(Binder& b, const std::string& block, int64_t hidden, int64_t experts, int64_t top_k,
            int64_t inter, bool renormalize, MlpLeaves leaves, const std::string& config_path);
  void forward(ops::Backend& be, const float* n, int64_t T, float* y) const;
};

// Sigmoid-routed experts with group-limited selection (DeepSeek-V3 noaux_tc) and plain shared
// experts (one SwiGLU of width inter · n_shared, added as is).
struct SigmoidMoeConfig {
  int64_t experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  int64_t inter = 0;     // moe_intermediate_size
  int64_t n_shared = 0;  // shared experts, fused into one SwiGLU of width inter · n_shared
  float routed_scaling = 1.0f;
  bool renormalize = false;  // norm_topk_prob
  // bf16_ops: the router is a bf16 linear in the source (MiniMax-M2), whose logits are rounded;
  // DeepSeek's, GLM-4.5's and Kimi-Linear's routers compute in fp32.
  bool bf16_logits = false;
};
// DeepSeek-V3 / Kimi-K2's MoE settings from the config (n_group, topk_group,
// routed_scaling_factor, norm_topk_prob, moe_intermediate_size, n_shared_experts).
SigmoidMoeConfig deepseek_moe_config(const ModelConfig& c);

struct SigmoidMoe {
  SigmoidMoeConfig cfg;
  int64_t H = 0;
  ops::Weight router, bias;  // [E, H], [E] (bias undefined when the checkpoint has none)
  std::vector<ops::Mlp> experts;
  ops::Mlp shared;
  std::string router_name;  // block + "gate": the routing is observed under it

  // Module names: block + "gate", block + "experts.E." + leaves, block + "shared_experts.*";
  // the routing bias block + `bias_leaf` (DeepSeek's sits in the router, MiniMax-M2's beside it),
  // optional unless `bias_required`.
  void bind(Binder& b, const std::string& block, MlpLeaves leaves, int64_t hidden,
            const SigmoidMoeConfig& config, const std::string& config_path,
            const std::string& bias_leaf = "gate.e_score_correction_bias",
            bool bias_required = false);
  void forward(ops::Backend& be, const float* n, int64_t T, float* y) const;
};

}  // namespace strata::model
