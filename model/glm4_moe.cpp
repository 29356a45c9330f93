// GLM-4.5 / 4.6 family: glm4_moe (transformers Glm4MoeForCausalLM).
//
// Attention: GQA with q/k/v biases when attention_bias, per-head q/k RMSNorm (eps rms_norm_eps)
// when use_qk_norm, then half-split RoPE on the first int(head_dim · partial_rotary_factor) dims
// of each head (transformers' Glm4MoeConfig sets the factor to 0.5 when the config has none);
// scores scaled by head_dim^-1/2; o_proj without bias.
// FFN: layers below first_k_dense_replace are a dense SwiGLU mlp.{gate,up,down}_proj of width
// intermediate_size; the others DeepSeek-V3's noaux_tc MoE (model/blocks.h SigmoidMoe):
//   s = σ(gate(n2)) in fp32;  choice = s + e_score_correction_bias;  keep the topk_group of
//   n_group groups by their top-2 choice sums;  top-k of choice;  w = s (/ (Σ + 1e-20) when
//   norm_topk_prob) · routed_scaling_factor;  y = Σ_j w_j · expert_j(n2) + shared_experts(n2)
// with the shared experts one SwiGLU of width moe_intermediate_size · n_shared_experts.
// Defaults where the config is silent are Glm4MoeConfig's: n_shared_experts 1, norm_topk_prob
// true, first_k_dense_replace 1 (model/arch.cpp), n_group / topk_group 1, scaling 1.
// Layers from num_hidden_layers on are MTP (model/arch.h): never run.
#include "core/error.h"
#include "model/blocks.h"
#include "model/common.h"
#include "model/layer.h"

namespace strata::model {
namespace {

bool bool_or(const Json& t, const char* key, bool fallback, const std::string& path) {
  if (!has_key(t, key)) return fallback;
  STRATA_CHECK(t[key].is_boolean(), path, ": '", key, "' must be true or false");
  return t[key].get<bool>();
}

// transformers' Glm4MoeConfig puts partial_rotary_factor 0.5 into rope_parameters when the
// config gives none (at the top level, in rope_parameters or rope_scaling).
double glm_partial_rotary_factor(const ModelConfig& c) {
  const Json& t = c.text;
  const bool given =
      has_key(t, "partial_rotary_factor") ||
      (has_key(t, "rope_parameters") && has_key(t["rope_parameters"], "partial_rotary_factor")) ||
      (has_key(t, "rope_scaling") && has_key(t["rope_scaling"], "partial_rotary_factor"));
  return given ? c.rope.partial_rotary_factor : 0.5;
}

SigmoidMoeConfig glm_moe_config(const ModelConfig& c) {
  SigmoidMoeConfig mc = deepseek_moe_config(c);
  const Json& t = c.text;
  mc.renormalize = bool_or(t, "norm_topk_prob", true, c.path);
  if (!has_key(t, "n_shared_experts")) mc.n_shared = 1;
  return mc;
}

class Glm4MoeLayer : public Layer {
 public:
  Glm4MoeLayer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), p_(std::move(prefix)), moe_(layer_is_moe(resolve_arch(c), c, index)) {}

  void bind(Binder& b) override {
    const std::string a = p_ + "self_attn.";
    // transformers builds the biases and the q/k norms from the config alone: a checkpoint that
    // disagrees would be loaded with those tensors missing or ignored.
    const bool qk_norm = bool_or(c_.text, "use_qk_norm", false, c_.path);
    STRATA_CHECK(b.has(a + "q_norm.weight") == qk_norm, c_.path, ": use_qk_norm is ",
                 qk_norm ? "true" : "false", " but '", a, "q_norm.weight' is ",
                 qk_norm ? "missing" : "present", "; the checkpoint does not match its config");
    STRATA_CHECK(b.has(a + "q_proj.bias") == c_.attention_bias, c_.path, ": attention_bias is ",
                 c_.attention_bias ? "true" : "false", " but '", a, "q_proj.bias' is ",
                 c_.attention_bias ? "missing" : "present",
                 "; the checkpoint does not match its config");
    res_.bind(b, c_, p_);
    GqaOptions opt;
    opt.partial_rotary_factor = glm_partial_rotary_factor(c_);
    attn_.bind(b, c_, a, opt);
    const std::string m = p_ + "mlp.";
    if (moe_) {
      experts_.bind(b, m, {}, c_.hidden_size, glm_moe_config(c_), c_.path,
                    "gate.e_score_correction_bias", /*bias_required=*/true);
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
  GqaAttention attn_;
  ops::Mlp dense_;
  SigmoidMoe experts_;
};

}  // namespace

void check_glm4_moe_config(const ModelConfig& c) {
  const Json& t = c.text;
  if (has_key(t, "hidden_act")) {
    STRATA_CHECK(t["hidden_act"] == "silu", c.path, ": hidden_act ", t["hidden_act"].dump(),
                 " is not supported by the glm4_moe forward (only silu)");
  }
  STRATA_CHECK(c.num_experts > 0, c.path,
               ": n_routed_experts must be positive for a glm4_moe model");
  STRATA_CHECK(c.moe_intermediate_size > 0, c.path,
               ": moe_intermediate_size must be positive for a glm4_moe model");
}

std::unique_ptr<Layer> make_glm4_moe_layer(const ModelConfig& c, int64_t index,
                                           const std::string& prefix) {
  return std::make_unique<Glm4MoeLayer>(c, index, prefix);
}

}  // namespace strata::model
