#include "model/forward.h"

#include "core/error.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/families.h"

namespace strata {

Batch Batch::from_sequences(const std::vector<std::vector<int32_t>>& seqs) {
  Batch b;
  b.seq_offsets.push_back(0);
  for (const auto& s : seqs) {
    for (size_t i = 0; i < s.size(); ++i) {
      b.tokens.push_back(s[i]);
      b.positions.push_back(static_cast<int64_t>(i));
    }
    b.seq_offsets.push_back(static_cast<int64_t>(b.tokens.size()));
  }
  return b;
}

int expert_owner(int64_t e, int64_t experts, int ranks) {
  STRATA_ASSERT(e >= 0 && e < experts && ranks >= 1, "expert ", e, " of ", experts);
  int r = 0;
  while (experts * (r + 1) / ranks <= e)
    ++r;
  return r;
}

namespace {

using LayerFactory = std::unique_ptr<DecoderLayer> (*)(const model::LayerContext&);

class DecoderModel : public ModelForward {
 public:
  DecoderModel(const ModelConfig& config, const Checkpoint& ckpt, ForwardOptions options,
               LayerFactory factory)
      : config_(config),
        ckpt_(ckpt),
        options_(options),
        factory_(factory),
        prefixes_(model::find_prefixes(config, ckpt)),
        ends_(config, ckpt, prefixes_) {}

  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t num_layers() const override { return config_.num_hidden_layers; }

  void embed(const Batch& batch, float* hidden) const override {
    ends_.embed(batch, hidden, options_.bf16_between_layers);
  }

  std::unique_ptr<DecoderLayer> layer(int64_t i) const override {
    STRATA_ASSERT(i >= 0 && i < num_layers());
    model::LayerContext ctx{config_, ckpt_, prefixes_.model + "layers." + std::to_string(i) + ".",
                            i, options_.experts};
    auto inner = factory_(ctx);
    if (!options_.bf16_between_layers) return inner;
    return std::make_unique<RoundingLayer>(std::move(inner), config_.hidden_size);
  }

  void logits(const Batch& batch, const float* hidden, float* out) const override {
    ends_.logits(hidden, batch.n_tokens(), out);
  }

 private:
  // Rounds the layer's output to bf16, as the hidden states between HF decoder layers are.
  class RoundingLayer : public DecoderLayer {
   public:
    RoundingLayer(std::unique_ptr<DecoderLayer> inner, int64_t hidden)
        : inner_(std::move(inner)), hidden_(hidden) {}
    void forward(const Batch& batch, float* x, Observer* observer) override {
      inner_->forward(batch, x, observer);
      ops::round_bf16(x, batch.n_tokens() * hidden_);
    }

   private:
    std::unique_ptr<DecoderLayer> inner_;
    int64_t hidden_;
  };

  ModelConfig config_;
  const Checkpoint& ckpt_;
  ForwardOptions options_;
  LayerFactory factory_;
  model::Prefixes prefixes_;
  model::Ends ends_;
};

}  // namespace

std::unique_ptr<ModelForward> ModelForward::create(const ModelConfig& config,
                                                   const Checkpoint& ckpt, ForwardOptions options) {
  ArchInfo arch = resolve_arch(config);
  LayerFactory factory = nullptr;
  switch (arch.family) {
    case ArchFamily::kLlama:
      model::check_llama_config(config);
      factory = model::make_llama_layer;
      break;
    case ArchFamily::kQwenMoe:
      model::check_llama_config(config);
      factory = model::make_qwen_moe_layer;
      break;
    case ArchFamily::kDeepseekV3:
      model::check_deepseek_v3_config(config);
      factory = model::make_deepseek_v3_layer;
      break;
    case ArchFamily::kKimiLinear:
      model::check_kimi_linear_config(config);
      factory = model::make_kimi_linear_layer;
      break;
    case ArchFamily::kMixtral:
    case ArchFamily::kQwen3Next:
      fail(config.path, ": the forward pass for model_type '", config.text_model_type, "' (family ",
           arch_family_name(arch.family),
           ") is not implemented yet; supported: llama, mistral, qwen2, qwen3, "
           "qwen2_moe, qwen3_moe, deepseek_v3, kimi_k2, kimi_linear");
  }
  return std::make_unique<DecoderModel>(config, ckpt, options, factory);
}

}  // namespace strata
