// Mixtral family: mixtral (transformers MixtralForCausalLM).
// Attention as Llama (GQA, no biases, no q/k norm, RoPE over the whole head). Every layer's FFN
// is a sparse MoE under `block_sparse_moe.`:
//   p = softmax_fp32(gate(n2))  over E = num_local_experts;  top-k (num_experts_per_tok) of p;
//   w = p_top / Σ p_top  (always renormalised);  y = Σ_j w_j · SwiGLU_{e_j}(n2)
// with expert e's SwiGLU in experts.e.{w1 (gate), w3 (up), w2 (down)}, each of width
// intermediate_size. No shared expert, no dense layers. The config check is Llama's
// (check_llama_config, in the family table of model/families.cpp).
#include "core/error.h"
#include "model/blocks.h"
#include "model/layer.h"

namespace strata::model {

namespace {

class MixtralLayer : public Layer {
 public:
  MixtralLayer(const ModelConfig& c, std::string prefix) : c_(c), p_(std::move(prefix)) {}

  void bind(Binder& b) override {
    STRATA_CHECK(c_.num_experts > 0, c_.path,
                 ": num_local_experts must be positive for a mixtral model");
    res_.bind(b, c_, p_);
    attn_.bind(b, c_, p_ + "self_attn.");
    experts_.bind(b, p_ + "block_sparse_moe.", c_.hidden_size, c_.num_experts,
                  c_.num_experts_per_tok, c_.intermediate_size, /*renormalize=*/true,
                  {"w1", "w3", "w2"}, c_.path);
    experts_.bf16_weights = false;  // MixtralTopKRouter keeps the routing weights in fp32
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
  SoftmaxMoe experts_;
};

}  // namespace

std::unique_ptr<Layer> make_mixtral_layer(const ModelConfig& c, int64_t /*index*/,
                                          const std::string& prefix) {
  return std::make_unique<MixtralLayer>(c, prefix);
}

}  // namespace strata::model
