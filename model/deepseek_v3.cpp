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
#include "core/error.h"
#include "model/blocks.h"

namespace strata::model {
namespace {

class DeepseekV3Layer : public Layer {
 public:
  DeepseekV3Layer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), p_(std::move(prefix)), moe_(layer_is_moe(resolve_arch(c), c, index)) {}

  void bind(Binder& b) override {
    res_.bind(b, c_, p_);
    attn_.bind(b, c_, p_ + "self_attn.", /*nope=*/false);
    const std::string m = p_ + "mlp.";
    if (moe_) {
      experts_.bind(b, m, {}, c_.hidden_size, deepseek_moe_config(c_), c_.path);
    } else {
      dense_ = bind_mlp(b, m, c_.hidden_size, c_.intermediate_size);
    }
  }

  void forward(ops::Backend& be, const ops::Tokens& t, float* x) override {
    res_.forward(
        be, t.tokens, x, [&](const float* n, float* y) { attn_.forward(be, t, n, y); },
        [&](const float* n, float* y) {
          moe_or_dense(be, moe_, experts_, dense_, n, t.tokens, y);
        });
  }

 private:
  const ModelConfig& c_;
  std::string p_;
  bool moe_;
  Residual res_;
  MlaAttention attn_;
  ops::Mlp dense_;
  SigmoidMoe experts_;
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

std::unique_ptr<Layer> make_deepseek_v3_layer(const ModelConfig& c, int64_t index,
                                              const std::string& prefix) {
  return std::make_unique<DeepseekV3Layer>(c, index, prefix);
}

}  // namespace strata::model
