// Llama family: llama, mistral, qwen2, qwen3 (spec/architectures.md §1).
//   h   = x + o_proj(attention(rope(q_norm(q_proj(n1))), rope(k_norm(k_proj(n1))), v_proj(n1)))
//   out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))
// with n1 = RMSNorm_in(x), n2 = RMSNorm_post(h); q/k norms only where the checkpoint has them.
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "model/common.h"
#include "model/families.h"

namespace strata::model {

void check_llama_config(const ModelConfig& c) {
  const Json& t = c.text;
  if (t.contains("hidden_act") && !t["hidden_act"].is_null()) {
    STRATA_CHECK(t["hidden_act"] == "silu", c.path, ": hidden_act '", t["hidden_act"].dump(),
                 "' is not supported (only silu)");
  }
  if (t.contains("mlp_bias") && t["mlp_bias"].is_boolean()) {
    STRATA_CHECK(!t["mlp_bias"].get<bool>(), c.path, ": mlp_bias true is not supported");
  }
  if (t.contains("use_sliding_window") && t["use_sliding_window"].is_boolean()) {
    STRATA_CHECK(
        !t["use_sliding_window"].get<bool>(), c.path,
        ": use_sliding_window true is not supported (sliding-window attention changes the math)");
  }
  if (t.contains("sliding_window") && t["sliding_window"].is_number_integer() &&
      !(t.contains("use_sliding_window") && t["use_sliding_window"].is_boolean())) {
    // Mistral-style: a window shorter than any calibration sequence would change the math.
    log_debug(c.path, ": sliding_window is set; strata checks each sequence is within it");
  }
}

namespace {

class LlamaLayer : public DecoderLayer {
 public:
  explicit LlamaLayer(const LayerContext& ctx) : c_(ctx.config) {
    const int64_t H = c_.hidden_size;
    in_norm_ = load_weight(ctx.ckpt, ctx.prefix + "input_layernorm.weight", {H});
    post_norm_ = load_weight(ctx.ckpt, ctx.prefix + "post_attention_layernorm.weight", {H});
    attn_ = GqaAttention::load(c_, ctx.ckpt, ctx.prefix + "self_attn.");
    const std::string m = ctx.prefix + "mlp.";
    mlp_ = load_swiglu(ctx.ckpt, m + "gate_proj", m + "up_proj", m + "down_proj", H,
                       c_.intermediate_size);
  }

  void forward(const Batch& batch, float* x, Observer* observer) override {
    const int64_t T = batch.n_tokens(), H = c_.hidden_size;
    residual_layer(
        T, H, static_cast<float>(c_.rms_norm_eps), in_norm_, post_norm_, x,
        [&](const float* n, float* y) { attn_.forward(batch, n, y, observer); },
        [&](const float* n, float* y) { swiglu_mlp(mlp_, n, T, H, y, observer); });
  }

 private:
  const ModelConfig& c_;
  std::vector<float> in_norm_, post_norm_;
  GqaAttention attn_;
  SwigluWeights mlp_;
};

}  // namespace

std::unique_ptr<DecoderLayer> make_llama_layer(const LayerContext& ctx) {
  return std::make_unique<LlamaLayer>(ctx);
}

}  // namespace strata::model
