#include "model/forward.h"

#include <deque>

#include "core/error.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/layer.h"
#include "ops/cpu_backend.h"

namespace strata {

Batch Batch::from_sequences(const std::vector<std::vector<int32_t>>& seqs, int64_t first_seq) {
  Batch b;
  b.seq_offsets.push_back(0);
  for (const auto& s : seqs) {
    b.seq_ids.push_back(first_seq + static_cast<int64_t>(b.seq_ids.size()));
    for (size_t i = 0; i < s.size(); ++i) {
      b.tokens.push_back(s[i]);
      b.positions.push_back(static_cast<int64_t>(i));
    }
    b.seq_offsets.push_back(static_cast<int64_t>(b.tokens.size()));
  }
  return b;
}

namespace {

// Weights read from the checkpoint into fp32 (decompressed where the source is compressed),
// owned by the layer; routed experts of other ranks are not read.
class CpuBinder final : public model::Binder {
 public:
  CpuBinder(const Checkpoint& ckpt, const ExpertExchange* exchange)
      : ckpt_(ckpt), exchange_(exchange) {}
  ops::Weight matrix(const std::string& name, const Shape& shape) override {
    return load(name, shape, false);
  }
  ops::Weight vector(const std::string& name, const Shape& shape) override {
    return load(name, shape, true);
  }
  bool has(const std::string& name) const override { return ckpt_.has(name); }
  Shape shape_of(const std::string& name) const override { return ckpt_.entry(name).shape; }
  bool holds_expert(int64_t e, int64_t experts) const override {
    return !exchange_ || expert_owner(e, experts, exchange_->ranks()) == exchange_->rank();
  }

 private:
  ops::Weight load(const std::string& name, const Shape& shape, bool f32) {
    storage_.push_back(model::load_weight(ckpt_, name, shape));
    return ops::Weight{storage_.back().data(), shape, f32};
  }
  const Checkpoint& ckpt_;
  const ExpertExchange* exchange_;
  std::deque<std::vector<float>> storage_;
};

// A family's layer with its weights in host memory, run by the CPU backend.
class CpuLayer : public DecoderLayer {
 public:
  CpuLayer(std::unique_ptr<model::Layer> layer, const Checkpoint& ckpt, ExpertExchange* exchange,
           const ForwardOptions& options)
      : layer_(std::move(layer)),
        binder_(ckpt, exchange),
        exchange_(exchange),
        bf16_ops_(options.bf16_ops) {
    // With the serving simulation on (ForwardOptions), the matrices carry the export's input
    // quantization and the attention its KV-cache quantization.
    model::ServedBinder served(binder_, ckpt, options.simulate_activations, options.kv_cache);
    layer_->bind(served);
  }
  void forward(const Batch& batch, float* x, Observer* observer) override {
    ops::CpuBackend be(observer, exchange_);
    be.set_bf16_ops(bf16_ops_);
    ops::Tokens t;
    t.tokens = batch.n_tokens();
    t.positions = batch.positions.data();
    t.seq_bounds = batch.seq_offsets;
    t.seq_ids = batch.seq_ids;
    layer_->forward(be, t, x);
  }

 private:
  std::unique_ptr<model::Layer> layer_;
  CpuBinder binder_;
  ExpertExchange* exchange_;
  bool bf16_ops_;
};

class DecoderModel : public ModelForward {
 public:
  DecoderModel(const ModelConfig& config, const Checkpoint& ckpt, ForwardOptions options,
               const model::Family& family)
      : config_(config),
        ckpt_(ckpt),
        options_(options),
        family_(family),
        prefixes_(model::find_prefixes(config, ckpt)),
        ends_(config, ckpt, prefixes_, family.norm_offset) {}

  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t num_layers() const override { return config_.num_hidden_layers; }

  void embed(const Batch& batch, float* hidden) const override {
    ends_.embed(batch, hidden, options_.bf16_between_layers);
  }
  void embed_bf16(const Batch& batch, uint16_t* hidden) const override {
    ends_.embed_bf16(batch, hidden);
  }

  std::unique_ptr<DecoderLayer> layer(int64_t i) const override {
    STRATA_ASSERT(i >= 0 && i < num_layers());
    auto inner = std::make_unique<CpuLayer>(
        family_.make_layer(config_, i, prefixes_.model + "layers." + std::to_string(i) + "."),
        ckpt_, options_.experts, options_);
    if (!options_.bf16_between_layers) return inner;
    return std::make_unique<RoundingLayer>(std::move(inner), config_.hidden_size);
  }

  void logits(const Batch& batch, const float* hidden, float* out) const override {
    ends_.logits(hidden, batch.n_tokens(), out);
  }
  std::unique_ptr<LogitsHead> head() const override { return ends_.head(); }
  HeadSpec head_spec() const override { return ends_.spec(); }

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
  const model::Family& family_;
  model::Prefixes prefixes_;
  model::Ends ends_;
};

}  // namespace

std::unique_ptr<ModelForward> ModelForward::create(const ModelConfig& config,
                                                   const Checkpoint& ckpt, ForwardOptions options) {
  const model::Family& family = model::family_of(config);
  family.check_config(config);
  return std::make_unique<DecoderModel>(config, ckpt, options, family);
}

}  // namespace strata
