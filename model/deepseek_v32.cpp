// DeepSeek-V3.2 family: deepseek_v32 (transformers DeepseekV32ForCausalLM).
//
// DeepSeek-V3's layer (model/deepseek_v3.cpp: MLA, noaux_tc MoE with shared experts, dense first
// layers) with DeepSeek Sparse Attention: each layer's lightning indexer (model/blocks.h
// LightningIndexer) scores every causal key of each query and the MLA attention of a query sees
// only the index_topk keys it picks (all of them while the query has no more than index_topk).
// As transformers 5.17:
// - MLA always rotates interleaved pairs (the config's rope_interleave is not read); the indexer
//   rotates half-split pairs on the first qk_rope_head_dim dims of its heads and of its key.
// - q_lora_rank is required (the indexer reads q_a_proj's normalised output); no attention
//   biases.
// - MoE layers from mlp_layer_types, else from first_k_dense_replace (3 when absent);
//   moe_layer_freq is not read (model/arch.cpp).
// - Defaults where the config is silent are DeepseekV32Config's: n_group 8, topk_group 4,
//   routed_scaling_factor 2.5, norm_topk_prob true, n_shared_experts 1, index_n_heads 64,
//   index_head_dim 128, index_topk 2048.
// Layers from num_hidden_layers on are MTP (model/arch.h): never run.
#include "core/error.h"
#include "model/blocks.h"
#include "model/common.h"

namespace strata::model {
namespace {

SigmoidMoeConfig v32_moe_config(const ModelConfig& c) {
  SigmoidMoeConfig mc = deepseek_moe_config(c);
  const Json& t = c.text;
  if (!has_key(t, "n_group")) mc.n_group = 8;
  if (!has_key(t, "topk_group")) mc.topk_group = 4;
  if (!has_key(t, "routed_scaling_factor")) mc.routed_scaling = 2.5f;
  if (!has_key(t, "norm_topk_prob")) mc.renormalize = true;
  if (!has_key(t, "n_shared_experts")) mc.n_shared = 1;
  return mc;
}

class DeepseekV32Layer : public Layer {
 public:
  DeepseekV32Layer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), p_(std::move(prefix)), moe_(layer_is_moe(resolve_arch(c), c, index)) {}

  void bind(Binder& b) override {
    res_.bind(b, c_, p_);
    attn_.bind(b, c_, p_ + "self_attn.", /*nope=*/false, /*indexed=*/true);
    attn_.interleaved = true;
    const std::string m = p_ + "mlp.";
    if (moe_) {
      experts_.bind(b, m, {}, c_.hidden_size, v32_moe_config(c_), c_.path);
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

void check_deepseek_v32_config(const ModelConfig& c) {
  const Json& t = c.text;
  auto string_is = [&](const char* key, const char* allowed) {
    if (!has_key(t, key)) return;
    STRATA_CHECK(t[key].is_string() && t[key].get<std::string>() == allowed, c.path, ": ", key, " ",
                 t[key].dump(), " is not supported by the deepseek_v32 forward (only '", allowed,
                 "')");
  };
  string_is("scoring_func", "sigmoid");
  string_is("topk_method", "noaux_tc");
  string_is("hidden_act", "silu");
  STRATA_CHECK(c.kv_lora_rank > 0, c.path, ": kv_lora_rank must be set for MLA");
  STRATA_CHECK(c.q_lora_rank > 0, c.path,
               ": q_lora_rank must be set: DeepSeek-V3.2's indexer reads q_a_proj's output");
  STRATA_CHECK(!c.attention_bias, c.path,
               ": attention_bias true is not supported by the deepseek_v32 forward");
}

std::unique_ptr<Layer> make_deepseek_v32_layer(const ModelConfig& c, int64_t index,
                                               const std::string& prefix) {
  return std::make_unique<DeepseekV32Layer>(c, index, prefix);
}

}  // namespace strata::model
