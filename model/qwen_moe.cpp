// Qwen MoE family: qwen2_moe, qwen3_moe (spec/architectures.md §2).
// Attention as Llama/Qwen3. The FFN of an MoE layer:
//   p = softmax_fp32(gate(n2))  over E experts;  top-k of p;  w = p_top (/ Σ p_top if
//   norm_topk_prob);  y = Σ_j w_j · SwiGLU_{e_j}(n2)  [+ σ(shared_expert_gate·n2) · shared(n2)]
// Layer i is MoE iff i ∉ mlp_only_layers, E > 0 and (i+1) % decoder_sparse_step == 0; other
// layers have a dense mlp.{gate,up,down}_proj.
#include "model/blocks.h"
#include "model/layer.h"

namespace strata::model {
namespace {

class QwenMoeLayer : public Layer {
 public:
  QwenMoeLayer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), p_(std::move(prefix)), moe_(layer_is_moe(resolve_arch(c), c, index)) {}

  void bind(Binder& b) override {
    const int64_t H = c_.hidden_size;
    res_.bind(b, c_, p_);
    attn_.bind(b, c_, p_ + "self_attn.");
    const std::string m = p_ + "mlp.";
    if (moe_) {
      experts_.bind(b, m, H, c_.num_experts, c_.num_experts_per_tok, c_.moe_intermediate_size,
                    c_.norm_topk_prob, {}, c_.path);
    } else {
      dense_ = bind_mlp(b, m, H, c_.intermediate_size);
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
  SoftmaxMoe experts_;
};

}  // namespace

std::unique_ptr<Layer> make_qwen_moe_layer(const ModelConfig& c, int64_t index,
                                           const std::string& prefix) {
  return std::make_unique<QwenMoeLayer>(c, index, prefix);
}

}  // namespace strata::model
