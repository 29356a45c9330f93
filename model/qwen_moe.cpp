// Qwen MoE family: qwen2_moe, qwen3_moe (spec/architectures.md §2).
// Attention as Llama/Qwen3. The FFN of an MoE layer:
//   p = softmax_fp32(gate(n2))  over E experts;  top-k of p;  w = p_top (/ Σ p_top if
//   norm_topk_prob);  y = Σ_j w_j · SwiGLU_{e_j}(n2)  [+ σ(shared_expert_gate·n2) · shared(n2)]
// Layer i is MoE iff i ∉ mlp_only_layers, E > 0 and (i+1) % decoder_sparse_step == 0; other
// layers have a dense mlp.{gate,up,down}_proj.
#include <vector>

#include "core/error.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/families.h"

namespace strata::model {
namespace {

class QwenMoeLayer : public DecoderLayer {
 public:
  explicit QwenMoeLayer(const LayerContext& ctx) : c_(ctx.config), exchange_(ctx.experts) {
    const int64_t H = c_.hidden_size;
    in_norm_ = load_weight(ctx.ckpt, ctx.prefix + "input_layernorm.weight", {H});
    post_norm_ = load_weight(ctx.ckpt, ctx.prefix + "post_attention_layernorm.weight", {H});
    attn_ = GqaAttention::load(c_, ctx.ckpt, ctx.prefix + "self_attn.");
    const std::string m = ctx.prefix + "mlp.";
    ArchInfo arch = resolve_arch(c_);
    moe_ = layer_is_moe(arch, c_, ctx.index);
    if (!moe_) {
      dense_ = load_swiglu(ctx.ckpt, m + "gate_proj", m + "up_proj", m + "down_proj", H,
                           c_.intermediate_size);
      return;
    }
    const int64_t E = c_.num_experts, I = c_.moe_intermediate_size;
    STRATA_CHECK(c_.num_experts_per_tok > 0 && c_.num_experts_per_tok <= E, c_.path,
                 ": num_experts_per_tok (", c_.num_experts_per_tok,
                 ") must be in [1, num_experts = ", E, "]");
    router_ = load_weight(ctx.ckpt, m + "gate.weight", {E, H});
    experts_.reserve(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = m + "experts." + std::to_string(e) + ".";
      experts_.push_back(
          holds_expert(exchange_, e, E)
              ? load_swiglu(ctx.ckpt, p + "gate_proj", p + "up_proj", p + "down_proj", H, I)
              : swiglu_names(p + "gate_proj", p + "up_proj", p + "down_proj", I));
    }
    if (ctx.ckpt.has(m + "shared_expert.gate_proj.weight")) {
      const int64_t Is = ctx.ckpt.entry(m + "shared_expert.gate_proj.weight").shape[0];
      shared_ = load_swiglu(ctx.ckpt, m + "shared_expert.gate_proj", m + "shared_expert.up_proj",
                            m + "shared_expert.down_proj", H, Is);
      shared_gate_ = load_weight(ctx.ckpt, m + "shared_expert_gate.weight", {1, H});
    }
  }

  void forward(const Batch& batch, float* x, Observer* observer) override {
    const int64_t T = batch.n_tokens(), H = c_.hidden_size;
    residual_layer(
        T, H, static_cast<float>(c_.rms_norm_eps), in_norm_, post_norm_, x,
        [&](const float* n, float* y) { attn_.forward(batch, n, y, observer); },
        [&](const float* n, float* y) {
          if (moe_) {
            moe(n, T, y, observer);
          } else {
            swiglu_mlp(dense_, n, T, H, y, observer);
          }
        });
  }

 private:
  void moe(const float* n, int64_t T, float* y, Observer* observer) const {
    const int64_t H = c_.hidden_size, E = c_.num_experts, K = c_.num_experts_per_tok;
    std::vector<float> probs(T * E);  // [T, E]
    ops::linear(n, T, H, router_.data(), E, probs.data());
    ops::softmax(probs.data(), T, E);
    std::vector<int32_t> chosen(T * K);  // [T, K] expert ids, best first
    std::vector<float> weight(T * K);    // [T, K]
    for (int64_t t = 0; t < T; ++t) {
      auto idx = ops::top_k(&probs[t * E], E, K);
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j)
        sum += probs[t * E + idx[j]];
      for (int64_t j = 0; j < K; ++j) {
        chosen[t * K + j] = idx[j];
        weight[t * K + j] = probs[t * E + idx[j]] / (c_.norm_topk_prob ? sum : 1.0f);
      }
    }
    moe_dispatch_combine(experts_, n, T, H, K, chosen, weight, y, observer, exchange_);
    if (!shared_gate_.empty()) {
      std::vector<float> s(T * H), g(T);
      swiglu_mlp(shared_, n, T, H, s.data(), observer);
      ops::linear(n, T, H, shared_gate_.data(), 1, g.data());
      for (int64_t t = 0; t < T; ++t) {
        const float w = ops::sigmoid(g[t]);
        for (int64_t c = 0; c < H; ++c)
          y[t * H + c] += w * s[t * H + c];
      }
    }
  }

  const ModelConfig& c_;
  ExpertExchange* exchange_ = nullptr;  // expert parallelism; nullptr: every expert here
  bool moe_ = false;
  std::vector<float> in_norm_, post_norm_;
  GqaAttention attn_;
  SwigluWeights dense_;
  std::vector<float> router_;  // [E, H]
  std::vector<SwigluWeights> experts_;
  SwigluWeights shared_;
  std::vector<float> shared_gate_;  // [1, H], empty without a shared expert
};

}  // namespace

std::unique_ptr<DecoderLayer> make_qwen_moe_layer(const LayerContext& ctx) {
  return std::make_unique<QwenMoeLayer>(ctx);
}

}  // namespace strata::model
