// gpt-oss family: gpt_oss (transformers GptOssForCausalLM; docs/FORWARD.md "gpt-oss").
//
// Attention: GQA with q/k/v/o biases, half-split RoPE (YaRN), scores q·k / √d over the causal
// prefix, or over the last `sliding_window` tokens on the layers layer_types marks
// sliding_attention, and one sink logit per head in the softmax's denominator:
//   p_ij = exp(s_ij − m) / (Σ_j' exp(s_ij' − m) + exp(sink_h − m))
// MoE on every layer:
//   logits = router.weight · n + router.bias;  w = softmax(top-k logits)
//   gu = gate_up_proj[e] n + gate_up_proj_bias[e]      gate = gu[2i], up = gu[2i + 1]
//   h  = (clamp(up, −7, 7) + 1) · g · σ(1.702 g),  g = min(gate, 7)
//   y  = Σ_j w_j (down_proj[e_j] h + down_proj_bias[e_j])
// Experts are read one module per expert and projection: mlp.experts.E.gate_up_proj ([2I, H],
// gate/up rows interleaved, bias [2I]) and mlp.experts.E.down_proj ([H, I], bias [H]), which the
// checkpoint reader cuts out of the fused tensors (docs/QUANTIZE.md "gpt-oss").
#include "core/error.h"
#include "model/blocks.h"
#include "model/layer.h"

namespace strata::model {

namespace {

// GptOssExperts' constants (not config fields).
constexpr float kAlpha = 1.702f;
constexpr float kLimit = 7.0f;

class GptOssLayer : public Layer {
 public:
  GptOssLayer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), index_(index), p_(std::move(prefix)) {}

  void bind(Binder& b) override {
    const int64_t H = c_.hidden_size, E = c_.num_experts, K = c_.num_experts_per_tok,
                  I = c_.intermediate_size;
    STRATA_CHECK(E > 0 && K > 0 && K <= E, c_.path, ": num_experts_per_tok (", K,
                 ") must be in [1, num_local_experts = ", E, "]");
    res_.bind(b, c_, p_);
    res_.in_norm.norm_fp32 = true;  // GptOssRMSNorm multiplies by its weight in fp32
    res_.post_norm.norm_fp32 = true;
    const std::string a = p_ + "self_attn.";
    attn_.bind(b, c_, a);
    attn_.eager = true;  // transformers runs the sinks in its eager attention
    STRATA_CHECK(attn_.bq.defined() && attn_.bo.defined(), c_.path, ": '", a,
                 "q_proj.bias' and 'o_proj.bias' are missing; gpt-oss's attention has biases");
    attn_.sinks = b.vector(a + "sinks", {c_.num_attention_heads});
    attn_.window = layer_sliding_window(resolve_arch(c_), c_, index_);
    const std::string m = p_ + "mlp.";
    router_ = b.vector(m + "router.weight", {E, H});
    router_bias_ = b.vector(m + "router.bias", {E});
    experts_.clear();
    experts_.reserve(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      ops::Mlp mlp;
      mlp.hidden = H;
      mlp.inter = I;
      mlp.interleaved = true;
      mlp.alpha = kAlpha;
      mlp.limit = kLimit;
      mlp.gate_up_names = {x + "gate_up_proj"};
      mlp.down_names = {x + "down_proj"};
      if (b.holds_expert(e, E)) {
        mlp.gate_up = b.matrix(x + "gate_up_proj.weight", {2 * I, H});
        mlp.gate_up_bias = b.vector(x + "gate_up_proj.bias", {2 * I});
        mlp.down = b.matrix(x + "down_proj.weight", {H, I});
        mlp.down_bias = b.vector(x + "down_proj.bias", {H});
      }
      experts_.push_back(std::move(mlp));
    }
  }

  void forward(ops::Backend& be, const ops::Tokens& t, float* x) override {
    res_.forward(
        be, t.tokens, x, [&](const float* n, float* y) { attn_.forward(be, t, n, y); },
        [&](const float* n, float* y) { moe(be, n, t.tokens, y); });
  }

 private:
  // The router's softmax over the top-k logits is the softmax over all E renormalised over the
  // top-k (route_softmax with renormalize): the same weights, the same choice.
  void moe(ops::Backend& be, const float* n, int64_t T, float* y) const {
    const int64_t E = c_.num_experts, K = c_.num_experts_per_tok;
    float* logits = be.take(T * E);  // [T, E]
    float* weight = be.take(T * K);  // [T, K]
    int32_t* chosen = be.take_i32(T * K);
    be.linear(n, T, router_, logits, &router_bias_);
    be.route_softmax(logits, T, E, K, {/*renormalize=*/true, /*bf16_weights=*/true}, chosen,
                     weight);
    be.observe_routing(p_ + "mlp.router", chosen, T, K);
    be.moe(n, T, c_.hidden_size, K, chosen, weight, experts_, y);
  }

  const ModelConfig& c_;
  int64_t index_;
  std::string p_;
  Residual res_;
  GqaAttention attn_;
  ops::Weight router_, router_bias_;  // [E, H], [E] fp32
  std::vector<ops::Mlp> experts_;
};

}  // namespace

void check_gpt_oss_config(const ModelConfig& c) {
  const Json& t = c.text;
  STRATA_CHECK(c.num_experts > 0, c.path, ": num_local_experts must be positive for gpt_oss");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    layer_sliding_window(resolve_arch(c), c, l);  // layer_types and sliding_window are sound
  // The released configs carry swiglu_limit 7.0; transformers ignores the field and uses its
  // constants, so another value would change the math in a way strata cannot match.
  auto constant = [&](const char* key, double want) {
    if (!t.contains(key) || t[key].is_null()) return;
    STRATA_CHECK(t[key].is_number() && t[key].get<double>() == want, c.path, ": '", key, "' is ",
                 t[key].dump(), "; gpt-oss's forward (as transformers runs it) uses ", want);
  };
  constant("swiglu_limit", kLimit);
  constant("swiglu_alpha", kAlpha);
}

std::unique_ptr<Layer> make_gpt_oss_layer(const ModelConfig& c, int64_t index,
                                          const std::string& prefix) {
  return std::make_unique<GptOssLayer>(c, index, prefix);
}

}  // namespace strata::model
