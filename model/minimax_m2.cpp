// MiniMax-M2 family: minimax_m2 (transformers MiniMaxM2ForCausalLM).
//
// Attention: GQA without biases; q = RMSNorm(q_proj x) over all nH·d values of a token with
// q_norm [nH·d], k = RMSNorm(k_proj x) over nKV·d with k_norm [nKV·d] (eps rms_norm_eps, the
// "per_layer" q/k norm), then half-split RoPE on the first rot_dim dims of each head, rot_dim =
// int(head_dim · partial_rotary_factor) (or the hub config's `rotary_dim` when it gives no
// factor); scores scaled by head_dim^-1/2.
// FFN: every layer is an MoE under `block_sparse_moe.` with sigmoid routing:
//   s = σ(gate(n2)) in fp32;  choice = s + e_score_correction_bias (beside the router, not in
//   it);  top-k of choice;  w = s_top / Σ s_top (always);  y = Σ_j w_j · expert_j(n2)
// with expert e's SwiGLU experts.e.{w1 (gate), w3 (up), w2 (down)} of width intermediate_size;
// no groups, no scaling, no shared expert, no dense layer (model/blocks.h SigmoidMoe).
#include "core/error.h"
#include "model/blocks.h"
#include "model/common.h"
#include "model/layer.h"

namespace strata::model {
namespace {

// Whether the config names a partial_rotary_factor (top level, rope_parameters, rope_scaling).
bool factor_given(const Json& t) {
  return has_key(t, "partial_rotary_factor") ||
         (has_key(t, "rope_parameters") &&
          has_key(t["rope_parameters"], "partial_rotary_factor")) ||
         (has_key(t, "rope_scaling") && has_key(t["rope_scaling"], "partial_rotary_factor"));
}

// The fraction of each head RoPE rotates: partial_rotary_factor (what transformers reads), or the
// hub config's rotary_dim / head_dim; both given must agree.
double minimax_partial_rotary_factor(const ModelConfig& c) {
  const Json& t = c.text;
  if (!has_key(t, "rotary_dim")) return c.rope.partial_rotary_factor;
  STRATA_CHECK(t["rotary_dim"].is_number_integer(), c.path, ": 'rotary_dim' must be an integer");
  const int64_t rotary_dim = t["rotary_dim"].get<int64_t>();
  STRATA_CHECK(rotary_dim > 0 && rotary_dim <= c.head_dim, c.path, ": rotary_dim ", rotary_dim,
               " must be in [1, head_dim = ", c.head_dim, "]");
  if (!factor_given(t)) return static_cast<double>(rotary_dim) / static_cast<double>(c.head_dim);
  const auto from_factor =
      static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor);
  STRATA_CHECK(from_factor == rotary_dim, c.path, ": rotary_dim ", rotary_dim,
               " disagrees with partial_rotary_factor ", c.rope.partial_rotary_factor,
               " (which rotates ", from_factor, " of head_dim ", c.head_dim,
               " dims); which one the model uses is ambiguous");
  return c.rope.partial_rotary_factor;
}

SigmoidMoeConfig minimax_moe_config(const ModelConfig& c) {
  SigmoidMoeConfig mc;
  mc.experts = c.num_experts;
  mc.top_k = c.num_experts_per_tok;
  mc.inter = c.intermediate_size;
  mc.renormalize = true;
  mc.bf16_logits = true;  // MiniMaxM2's router is a bf16 linear (sigmoid etc. in fp32)
  return mc;
}

class MiniMaxM2Layer : public Layer {
 public:
  MiniMaxM2Layer(const ModelConfig& c, std::string prefix) : c_(c), p_(std::move(prefix)) {}

  void bind(Binder& b) override {
    const std::string a = p_ + "self_attn.";
    res_.bind(b, c_, p_);
    // transformers always builds the q/k norms: a checkpoint without them is not this model.
    STRATA_CHECK(b.has(a + "q_norm.weight") && b.has(a + "k_norm.weight"), c_.path, ": '", a,
                 "q_norm.weight' or 'k_norm.weight' is missing; minimax_m2 normalises q and k");
    GqaOptions opt;
    opt.partial_rotary_factor = minimax_partial_rotary_factor(c_);
    opt.qk_norm_all_heads = true;
    attn_.bind(b, c_, a, opt);
    STRATA_CHECK(!attn_.bq.defined(), c_.path, ": '", a,
                 "q_proj.bias' is present; minimax_m2 attention has no biases");
    const bool bias =
        !has_key(c_.text, "use_routing_bias") || c_.text["use_routing_bias"] != Json(false);
    experts_.bind(b, p_ + "block_sparse_moe.", {"w1", "w3", "w2"}, c_.hidden_size,
                  minimax_moe_config(c_), c_.path, "e_score_correction_bias", bias);
  }

  void forward(ops::Backend& be, const ops::Tokens& t, float* x) override {
    res_.forward(
        be, t.tokens, x, [&](const float* n, float* y) { attn_.forward(be, t, n, y); },
        [&](const float* n, float* y) { experts_.forward(be, n, t.tokens, y); });
  }

 private:
  const ModelConfig& c_;
  std::string p_;
  Residual res_;
  GqaAttention attn_;
  SigmoidMoe experts_;
};

}  // namespace

void check_minimax_m2_config(const ModelConfig& c) {
  const Json& t = c.text;
  auto string_is = [&](const char* key, const char* want) {
    if (!has_key(t, key)) return;
    STRATA_CHECK(t[key] == want, c.path, ": ", key, " ", t[key].dump(),
                 " is not supported by the minimax_m2 forward (only \"", want, "\")");
  };
  string_is("hidden_act", "silu");
  string_is("scoring_func", "sigmoid");
  string_is("qk_norm_type", "per_layer");
  STRATA_CHECK(!has_key(t, "use_qk_norm") || t["use_qk_norm"] != Json(false), c.path,
               ": use_qk_norm false is not supported by the minimax_m2 forward (transformers "
               "applies q_norm and k_norm always)");
  for (const char* key : {"shared_intermediate_size", "n_shared_experts"}) {
    STRATA_CHECK(!has_key(t, key) || t[key] == Json(0), c.path, ": ", key, " ", t[key].dump(),
                 " is not supported: the minimax_m2 forward has no shared expert");
  }
  if (has_key(t, "routed_scaling_factor")) {
    STRATA_CHECK(
        t["routed_scaling_factor"].is_number() && t["routed_scaling_factor"].get<double>() == 1.0,
        c.path, ": routed_scaling_factor ", t["routed_scaling_factor"].dump(),
        " is not supported by the minimax_m2 forward (transformers scales by 1)");
  }
  if (has_key(t, "attn_type_list")) {
    STRATA_CHECK(t["attn_type_list"].is_array(), c.path, ": attn_type_list must be a list");
    for (const Json& v : t["attn_type_list"]) {
      STRATA_CHECK(v == Json(1), c.path, ": attn_type_list holds ", v.dump(),
                   "; the minimax_m2 forward has full softmax attention (1) on every layer only");
    }
  }
  if (has_key(t, "sliding_window")) {
    fail(c.path, ": sliding_window ", t["sliding_window"].dump(),
         " is not supported by the minimax_m2 forward (sliding-window attention changes the "
         "math)");
  }
  STRATA_CHECK(c.num_experts > 0, c.path,
               ": num_local_experts must be positive for a minimax_m2 model");
  STRATA_CHECK(c.intermediate_size > 0, c.path,
               ": intermediate_size (the experts' width) must be positive");
}

std::unique_ptr<Layer> make_minimax_m2_layer(const ModelConfig& c, int64_t /*index*/,
                                             const std::string& prefix) {
  return std::make_unique<MiniMaxM2Layer>(c, prefix);
}

}  // namespace strata::model
