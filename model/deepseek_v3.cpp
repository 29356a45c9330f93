// DeepSeek-V3 family: deepseek_v3, kimi_k2 (spec/architectures.md §3).
//
// MLA attention, per token x (already RMSNorm'd):
//   q      = q_b_proj(RMSNorm_1e-6(q_a_proj x))  or  q_proj x          [nH, d_n + d_r]
//   c | kr = kv_a_proj_with_mqa x                                       [r_kv + d_r]
//   kv     = kv_b_proj(RMSNorm_1e-6(c))                                 [nH, d_n + d_v]
//   RoPE on q's last d_r dims per head and on kr (shared by all heads); interleaved pairs when
//   rope_interleave (HF de-interleaves then rotates half-split: the same dot products).
//   k_h = [k_n,h | kr], scores scaled by (d_n + d_r)^-1/2 · m², m = 0.1·mscale_all_dim·ln s + 1.
// MoE (noaux_tc): s = σ(gate x) in fp32; choice = s + e_score_correction_bias; keep the
// topk_group groups whose top-2 choice sum is largest (others -inf); top-k of choice; weights
// are the unbiased s, renormalised when norm_topk_prob, times routed_scaling_factor; plus the
// shared experts (one SwiGLU of width moe_intermediate_size · n_shared_experts).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/deepseek_v3.h"
#include "model/families.h"

namespace strata::model {
namespace {

double number_or(const Json& j, const char* key, double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  STRATA_CHECK(j[key].is_number(), "config.json: '", key, "' must be a number");
  return j[key].get<double>();
}

}  // namespace

MlaParams mla_params(const ModelConfig& c, bool nope) {
  MlaParams m;
  m.nope = nope;
  m.H = c.hidden_size;
  m.nH = c.num_attention_heads;
  m.q_rank = c.q_lora_rank;
  m.kv_rank = c.kv_lora_rank;
  m.dn = c.qk_nope_head_dim;
  m.dr = c.qk_rope_head_dim;
  m.dv = c.v_head_dim;
  STRATA_CHECK(m.kv_rank > 0 && m.dr > 0 && m.dr % 2 == 0 && m.dv > 0, c.path,
               ": MLA needs kv_lora_rank, an even qk_rope_head_dim and v_head_dim");
  double s = 1.0 / std::sqrt(static_cast<double>(m.dn + m.dr));
  if (nope) {
    m.scale = static_cast<float>(s);
    return m;
  }
  ops::RopeParams rp = rope_params(c);
  m.inv_freq = ops::rope_inv_freq(rp, m.dr);
  m.attention_factor = rp.attention_factor;
  const Json& t = c.text;
  m.interleaved = !t.contains("rope_interleave") || t["rope_interleave"].is_null() ||
                  t["rope_interleave"].get<bool>();
  if (c.rope.type == "yarn" && c.rope.mscale_all_dim > 0.0 && c.rope.factor > 1.0) {
    const double ms = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    s *= ms * ms;
  }
  m.scale = static_cast<float>(s);
  return m;
}

void MlaAttention::load(const ModelConfig& c, const Checkpoint& ckpt, const std::string& p,
                        bool no_rope) {
  static_cast<MlaParams&>(*this) = mla_params(c, no_rope);
  prefix = p;
  const int64_t dq = dn + dr;
  if (q_rank > 0) {
    wqa = load_weight(ckpt, p + "q_a_proj.weight", {q_rank, H});
    q_a_norm = load_weight(ckpt, p + "q_a_layernorm.weight", {q_rank});
    wqb = load_weight(ckpt, p + "q_b_proj.weight", {nH * dq, q_rank});
  } else {
    wq = load_weight(ckpt, p + "q_proj.weight", {nH * dq, H});
  }
  wkva = load_weight(ckpt, p + "kv_a_proj_with_mqa.weight", {kv_rank + dr, H});
  kv_a_norm = load_weight(ckpt, p + "kv_a_layernorm.weight", {kv_rank});
  wkvb = load_weight(ckpt, p + "kv_b_proj.weight", {nH * (dn + dv), kv_rank});
  wo = load_weight(ckpt, p + "o_proj.weight", {H, nH * dv});
}

void MlaAttention::forward(const Batch& batch, const float* x, float* out, Observer* obs) const {
  const int64_t T = batch.n_tokens(), dq = dn + dr;
  std::vector<float> q(T * nH * dq);  // [T, nH, dn + dr]
  if (q_rank > 0) {
    if (obs) obs->observe(prefix + "q_a_proj", x, T, H);
    std::vector<float> cq(T * q_rank);  // [T, r_q]
    ops::linear(x, T, H, wqa.data(), q_rank, cq.data());
    ops::rms_norm(cq.data(), T, q_rank, q_a_norm.data(), 1e-6f, cq.data());
    if (obs) obs->observe(prefix + "q_b_proj", cq.data(), T, q_rank);
    ops::linear(cq.data(), T, q_rank, wqb.data(), nH * dq, q.data());
  } else {
    if (obs) obs->observe(prefix + "q_proj", x, T, H);
    ops::linear(x, T, H, wq.data(), nH * dq, q.data());
  }
  if (obs) obs->observe(prefix + "kv_a_proj_with_mqa", x, T, H);
  std::vector<float> ckr(T * (kv_rank + dr));  // [T, r_kv + d_r]
  ops::linear(x, T, H, wkva.data(), kv_rank + dr, ckr.data());
  std::vector<float> c(T * kv_rank), kr(T * dr);  // [T, r_kv], [T, d_r]
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(&ckr[t * (kv_rank + dr)], kv_rank, &c[t * kv_rank]);
    std::copy_n(&ckr[t * (kv_rank + dr) + kv_rank], dr, &kr[t * dr]);
  }
  ops::rms_norm(c.data(), T, kv_rank, kv_a_norm.data(), 1e-6f, c.data());
  if (obs) obs->observe(prefix + "kv_b_proj", c.data(), T, kv_rank);
  std::vector<float> kv(T * nH * (dn + dv));  // [T, nH, dn + dv]
  ops::linear(c.data(), T, kv_rank, wkvb.data(), nH * (dn + dv), kv.data());
  if (!nope) {
    ops::rope(q.data(), T, nH, dq, dn, dr, batch.positions.data(), inv_freq, attention_factor,
              interleaved);
    ops::rope(kr.data(), T, 1, dr, 0, dr, batch.positions.data(), inv_freq, attention_factor,
              interleaved);
  }
  // Full K and V per head: k [T, nH, dn + dr], v [T, nH, dv].
  std::vector<float> k(T * nH * dq), v(T * nH * dv);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nH; ++h) {
      const float* src = &kv[(t * nH + h) * (dn + dv)];
      std::copy_n(src, dn, &k[(t * nH + h) * dq]);
      std::copy_n(&kr[t * dr], dr, &k[(t * nH + h) * dq + dn]);
      std::copy_n(src + dn, dv, &v[(t * nH + h) * dv]);
    }
  }
  if (obs) {
    obs->observe(prefix + "k_cache", k.data(), T, nH * dq);
    obs->observe(prefix + "v_cache", v.data(), T, nH * dv);
  }
  std::vector<float> attn(T * nH * dv);  // [T, nH, dv]
  for (int64_t s = 0; s < batch.n_seqs(); ++s) {
    const int64_t b = batch.seq_offsets[s], len = batch.seq_offsets[s + 1] - b;
    ops::attention_causal(&q[b * nH * dq], nH * dq, &k[b * nH * dq], nH * dq, &v[b * nH * dv],
                          nH * dv, len, nH, nH, dq, dv, scale, &attn[b * nH * dv]);
  }
  if (obs) obs->observe(prefix + "o_proj", attn.data(), T, nH * dv);
  ops::linear(attn.data(), T, nH * dv, wo.data(), H, out);
}

void SigmoidMoe::load(const Checkpoint& ckpt, const std::string& block,
                      const char* const expert_leaves[3], int64_t hidden,
                      const SigmoidMoeConfig& config, const std::string& config_path,
                      ExpertExchange* exchange_in) {
  cfg = config;
  exchange = exchange_in;
  H = hidden;
  const int64_t E = cfg.experts, K = cfg.top_k;
  STRATA_CHECK(cfg.n_group > 0 && E % cfg.n_group == 0 && cfg.topk_group >= 1 &&
                   cfg.topk_group <= cfg.n_group,
               config_path, ": n_group (", cfg.n_group, ") must divide the routed experts (", E,
               ") and topk_group (", cfg.topk_group, ") must be in [1, n_group]");
  STRATA_CHECK(K >= 1 && K <= cfg.topk_group * (E / cfg.n_group), config_path,
               ": num_experts_per_tok (", K, ") exceeds the experts in topk_group groups");
  router = load_weight(ckpt, block + "gate.weight", {E, H});
  bias = ckpt.has(block + "gate.e_score_correction_bias")
             ? load_weight(ckpt, block + "gate.e_score_correction_bias", {E})
             : std::vector<float>(static_cast<size_t>(E), 0.0f);
  experts.clear();
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = block + "experts." + std::to_string(e) + ".";
    experts.push_back(holds_expert(exchange, e, E)
                          ? load_swiglu(ckpt, p + expert_leaves[0], p + expert_leaves[1],
                                        p + expert_leaves[2], H, cfg.inter)
                          : swiglu_names(p + expert_leaves[0], p + expert_leaves[1],
                                         p + expert_leaves[2], cfg.inter));
  }
  if (cfg.n_shared > 0) {
    const std::string p = block + "shared_experts.";
    shared = load_swiglu(ckpt, p + "gate_proj", p + "up_proj", p + "down_proj", H,
                         cfg.inter * cfg.n_shared);
  }
}

SigmoidMoeConfig deepseek_moe_config(const ModelConfig& c) {
  const Json& t = c.text;
  SigmoidMoeConfig mc;
  mc.experts = c.num_experts;
  mc.top_k = c.num_experts_per_tok;
  mc.n_group = static_cast<int64_t>(number_or(t, "n_group", 1));
  mc.topk_group = static_cast<int64_t>(number_or(t, "topk_group", 1));
  mc.routed_scaling = static_cast<float>(number_or(t, "routed_scaling_factor", 1.0));
  mc.renormalize = c.norm_topk_prob;
  mc.inter = c.moe_intermediate_size;
  mc.n_shared = c.n_shared_experts;
  return mc;
}

// Chosen experts and weights of one token from its router scores s[E].
void SigmoidMoe::route(const float* s, int32_t* chosen, float* weight) const {
  const int64_t E = cfg.experts, K = cfg.top_k, n_group = cfg.n_group;
  std::vector<float> choice(E);
  for (int64_t e = 0; e < E; ++e)
    choice[e] = s[e] + bias[e];
  const int64_t per = E / n_group;
  std::vector<float> group_score(n_group);
  for (int64_t g = 0; g < n_group; ++g) {
    auto top = ops::top_k(&choice[g * per], per, std::min<int64_t>(2, per));
    float sum = 0.0f;
    for (int32_t i : top)
      sum += choice[g * per + i];
    group_score[g] = sum;
  }
  auto keep = ops::top_k(group_score.data(), n_group, cfg.topk_group);
  std::vector<float> masked(E, -INFINITY);
  for (int32_t g : keep)
    std::copy_n(&choice[g * per], per, &masked[g * per]);
  auto idx = ops::top_k(masked.data(), E, K);
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j)
    sum += s[idx[j]];
  for (int64_t j = 0; j < K; ++j) {
    chosen[j] = idx[j];
    float w = s[idx[j]];
    if (cfg.renormalize) w /= (sum + 1e-20f);
    weight[j] = w * cfg.routed_scaling;
  }
}

void SigmoidMoe::forward(const float* n, int64_t T, float* y, Observer* obs) const {
  const int64_t E = cfg.experts, K = cfg.top_k;
  std::vector<float> s(T * E);  // [T, E] sigmoid scores, fp32
  ops::linear(n, T, H, router.data(), E, s.data());
  for (float& v : s)
    v = ops::sigmoid(v);
  std::vector<int32_t> chosen(T * K);
  std::vector<float> weight(T * K);
  for (int64_t t = 0; t < T; ++t)
    route(&s[t * E], &chosen[t * K], &weight[t * K]);
  moe_dispatch_combine(experts, n, T, H, K, chosen, weight, y, obs, exchange);
  if (cfg.n_shared > 0) {
    std::vector<float> sh(T * H);
    swiglu_mlp(shared, n, T, H, sh.data(), obs);
    for (int64_t i = 0; i < T * H; ++i)
      y[i] += sh[i];
  }
}

namespace {

class DeepseekV3Layer : public DecoderLayer {
 public:
  explicit DeepseekV3Layer(const LayerContext& ctx) : c_(ctx.config) {
    const int64_t H = c_.hidden_size;
    in_norm_ = load_weight(ctx.ckpt, ctx.prefix + "input_layernorm.weight", {H});
    post_norm_ = load_weight(ctx.ckpt, ctx.prefix + "post_attention_layernorm.weight", {H});
    attn_.load(c_, ctx.ckpt, ctx.prefix + "self_attn.", /*nope=*/false);
    const std::string m = ctx.prefix + "mlp.";
    is_moe_ = layer_is_moe(resolve_arch(c_), c_, ctx.index);
    if (!is_moe_) {
      dense_ = load_swiglu(ctx.ckpt, m + "gate_proj", m + "up_proj", m + "down_proj", H,
                           c_.intermediate_size);
      return;
    }
    static constexpr const char* kLeaves[3] = {"gate_proj", "up_proj", "down_proj"};
    moe_.load(ctx.ckpt, m, kLeaves, H, deepseek_moe_config(c_), c_.path, ctx.experts);
  }

  void forward(const Batch& batch, float* x, Observer* obs) override {
    const int64_t T = batch.n_tokens(), H = c_.hidden_size;
    residual_layer(
        T, H, static_cast<float>(c_.rms_norm_eps), in_norm_, post_norm_, x,
        [&](const float* n, float* y) { attn_.forward(batch, n, y, obs); },
        [&](const float* n, float* y) {
          if (is_moe_) {
            moe_.forward(n, T, y, obs);
          } else {
            swiglu_mlp(dense_, n, T, H, y, obs);
          }
        });
  }

 private:
  const ModelConfig& c_;
  std::vector<float> in_norm_, post_norm_;
  MlaAttention attn_;
  bool is_moe_ = false;
  SwigluWeights dense_;
  SigmoidMoe moe_;
};

}  // namespace

void check_deepseek_v3_config(const ModelConfig& c) {
  const Json& t = c.text;
  auto string_is = [&](const char* key, std::initializer_list<const char*> allowed) {
    if (!t.contains(key) || t[key].is_null()) return;
    STRATA_CHECK(t[key].is_string(), c.path, ": '", key, "' must be a string");
    const std::string v = t[key].get<std::string>();
    for (const char* a : allowed) {
      if (v == a) return;
    }
    fail(c.path, ": ", key, " '", v, "' is not supported by the deepseek_v3 forward");
  };
  string_is("scoring_func", {"sigmoid"});
  string_is("topk_method", {"noaux_tc"});
  string_is("hidden_act", {"silu"});
  STRATA_CHECK(c.kv_lora_rank > 0, c.path, ": kv_lora_rank must be set for MLA");
}

std::unique_ptr<DecoderLayer> make_deepseek_v3_layer(const LayerContext& ctx) {
  return std::make_unique<DeepseekV3Layer>(ctx);
}

}  // namespace strata::model
