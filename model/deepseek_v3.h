// The two blocks of the DeepSeek-V3 family (model/deepseek_v3.cpp) that Kimi-Linear reuses
// (model/kimi_linear.cpp): multi-head latent attention and the sigmoid-routed (noaux_tc) MoE with
// shared experts. Math: spec/architectures.md §3 (and §4 for Kimi-Linear's NoPE).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/common.h"
#include "model/forward.h"

namespace strata::model {

// MLA, per token x (already RMSNorm'd):
//   q      = q_b_proj(RMSNorm_1e-6(q_a_proj x))  or  q_proj x          [nH, d_n + d_r]
//   c | kr = kv_a_proj_with_mqa x                                       [r_kv + d_r]
//   kv     = kv_b_proj(RMSNorm_1e-6(c))                                 [nH, d_n + d_v]
//   k_h = [k_n,h | kr] (kr shared by all heads); RoPE on q's last d_r dims and on kr unless
//   `nope` (Kimi-Linear: the d_r dims are used unrotated and the scale has no mscale).
// Observers: q_proj or q_a_proj and q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj, and the
// k_cache [T, nH·(d_n+d_r)] / v_cache [T, nH·d_v] of the layer.
// MLA's sizes and scalars from the config (shared with the GPU forward, model/cuda/).
struct MlaParams {
  int64_t H = 0, nH = 0, q_rank = 0, kv_rank = 0, dn = 0, dr = 0, dv = 0;
  bool nope = false;
  std::vector<double> inv_freq;  // [dr / 2], empty when nope
  double attention_factor = 1.0;
  bool interleaved = true;
  float scale = 1.0f;  // (dn + dr)^-1/2, times yarn's mscale² when it applies
};
MlaParams mla_params(const ModelConfig& c, bool nope);

struct MlaAttention : MlaParams {
  std::string prefix;  // "model.layers.N.self_attn."
  std::vector<float> wq, wqa, q_a_norm, wqb, wkva, kv_a_norm, wkvb, wo;

  void load(const ModelConfig& c, const Checkpoint& ckpt, const std::string& prefix, bool nope);
  // out[T, H] = attention(x[T, H]).
  void forward(const Batch& batch, const float* x, float* out, Observer* obs) const;
};

struct SigmoidMoeConfig {
  int64_t experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  int64_t inter = 0;     // moe_intermediate_size
  int64_t n_shared = 0;  // shared experts, fused into one SwiGLU of width inter · n_shared
  float routed_scaling = 1.0f;
  bool renormalize = false;  // norm_topk_prob
};

// DeepSeek-V3 / Kimi-K2's MoE settings from the config (n_group, topk_group,
// routed_scaling_factor, norm_topk_prob, moe_intermediate_size, n_shared_experts).
SigmoidMoeConfig deepseek_moe_config(const ModelConfig& c);

// noaux_tc routing: s = σ(gate x) in fp32; choice = s + e_score_correction_bias; keep the
// topk_group groups whose top-2 choice sum is largest (others -inf); top-k of choice; weights are
// the unbiased s, renormalised when asked, times routed_scaling_factor; plus the shared experts.
struct SigmoidMoe {
  SigmoidMoeConfig cfg;
  int64_t H = 0;
  std::vector<float> router, bias;     // [E, H], [E]
  std::vector<SwigluWeights> experts;  // weights only for the experts held here
  SwigluWeights shared;
  ExpertExchange* exchange = nullptr;  // expert parallelism; nullptr: every expert here

  // Module names: block + "gate", block + "experts.E." + expert_leaves[0..2] (gate, up, down),
  // block + "shared_experts.{gate,up,down}_proj".
  void load(const Checkpoint& ckpt, const std::string& block, const char* const expert_leaves[3],
            int64_t hidden, const SigmoidMoeConfig& config, const std::string& config_path,
            ExpertExchange* exchange);
  // y[T, H] = moe(n[T, H]).
  void forward(const float* n, int64_t T, float* y, Observer* obs) const;

 private:
  void route(const float* s, int32_t* chosen, float* weight) const;
};

}  // namespace strata::model
