// Llama family: llama, mistral, qwen2, qwen3 (spec/architectures.md §1).
//   h   = x + o_proj(attention(rope(q_norm(q_proj(n1))), rope(k_norm(k_proj(n1))), v_proj(n1)))
//   out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))
// with n1 = RMSNorm_in(x), n2 = RMSNorm_post(h); q/k norms only where the checkpoint has them.
#include "core/error.h"
#include "core/log.h"
#include "model/blocks.h"
#include "model/layer.h"

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

class LlamaLayer : public Layer {
 public:
  LlamaLayer(const ModelConfig& c, std::string prefix) : c_(c), p_(std::move(prefix)) {}

  void bind(Binder& b) override {
    res_.bind(b, c_, p_);
    attn_.bind(b, c_, p_ + "self_attn.");
    mlp_ = bind_mlp(b, p_ + "mlp.", c_.hidden_size, c_.intermediate_size);
  }

  void forward(ops::Backend& be, const ops::Tokens& t, float* x) override {
    res_.forward(
        be, t.tokens, x, [&](const float* n, float* y) { attn_.forward(be, t, n, y); },
        [&](const float* n, float* y) { be.mlp(mlp_, n, t.tokens, y); });
  }

 private:
  const ModelConfig& c_;
  std::string p_;
  Residual res_;
  GqaAttention attn_;
  ops::Mlp mlp_;
};

}  // namespace

std::unique_ptr<Layer> make_llama_layer(const ModelConfig& c, int64_t /*index*/,
                                        const std::string& prefix) {
  return std::make_unique<LlamaLayer>(c, prefix);
}

}  // namespace strata::model
