// The forward pass, driven one decoder layer at a time (the engine's view of a model).
//
//   auto fwd = ModelForward::create(config, checkpoint);   // resolves the family, checks fields
//   fwd->embed(batch, hidden);                             // [T, H]
//   for each layer i: fwd->layer(i)->forward(batch, hidden, observer);
//   fwd->logits(batch, hidden, logits);                    // final norm + lm_head: [T, vocab]
//
// A Batch is ragged sequences concatenated along the token axis, with no padding: attention
// runs per sequence, so nothing leaks between them.
//
// Observers see every quantizable input under a stable hub name before it is used:
//   "<module>"                         the input of linear <module> (e.g.
//                                      "model.layers.3.self_attn.q_proj",
//                                      "model.layers.3.mlp.experts.7.down_proj"); fused inputs
//                                      (q/k/v, gate/up) are reported once per module
//   "<layers.N>.self_attn.k_cache"     K after RoPE, before head repetition [T, nKV·dk]
//   "<layers.N>.self_attn.v_cache"     V [T, nKV·dv]
//                                      (none from linear-attention layers: they have no KV cache)
//                                      k_cache and v_cache are also reported per sequence
//                                      (Observer::observe_sequences, by Batch::seq_ids) for the
//                                      affine KV cache's biases
// Routed experts report only the rows routed to them (possibly none: rows == 0 is reported too).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "ops/backend.h"

namespace strata {

struct Batch {
  std::vector<int32_t> tokens;       // all sequences, concatenated
  std::vector<int64_t> seq_offsets;  // sequence s spans [seq_offsets[s], seq_offsets[s+1])
  std::vector<int64_t> positions;    // per token, 0-based within its sequence
  std::vector<int64_t> seq_ids;      // sequence s's index in the calibration set

  // The sequences are those of the calibration set from index first_seq on.
  static Batch from_sequences(const std::vector<std::vector<int32_t>>& seqs, int64_t first_seq = 0);
  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_seqs() const { return static_cast<int64_t>(seq_offsets.size()) - 1; }
};

struct ForwardOptions {
  // Round the hidden states to bf16 after the embedding and after every decoder layer, as the
  // source model runs in Hugging Face (docs/DESIGN.md). Off: everything stays fp32.
  bool bf16_between_layers = true;
  // Inside each layer, round to bf16 after every op where transformers' bf16 model rounds
  // (ops::Backend::set_bf16_ops; `--calib_precision bf16_ops`, docs/FORWARD.md "Calibration
  // precision"). Off: the layer computes in fp32 (`fp32_layers`, the default).
  bool bf16_ops = false;
  // Expert parallelism; nullptr: every routed expert is loaded and computed here.
  ExpertExchange* experts = nullptr;
  // Run a ModelOpt export as a server runs it (strata compare, docs/COMPARE.md), beyond
  // dequantizing its weights (which the forward always does): `activations` quantizes the input
  // of every quantized linear as its tensors say (model/common.h served_input_quant); a
  // `kv_cache` format other than kNone (hf_quant_config's kv_cache_quant_algo: kFp8 or kNvfp4)
  // stores every attention layer's K and V through it with the exported k/v scales
  // (served_kv_quant). The CPU forward only.
  bool simulate_activations = false;
  ActQuant::Kind kv_cache = ActQuant::Kind::kNone;
};

// The final norm and lm_head, read once and held: logits of any rows.
class LogitsHead {
 public:
  virtual ~LogitsHead() = default;
  // out[n, vocab] = lm_head(final_norm(hidden[n, H])).
  virtual void logits(const float* hidden, int64_t n, float* out) const = 0;
};

// Where the final norm and lm_head are (model/common.h Ends), for a head held elsewhere (strata
// compare's on the GPU): logits = lm_head · (x / sqrt(mean(x^2) + eps) * (norm_offset + norm)).
struct HeadSpec {
  std::string norm, lm_head;  // checkpoint tensors [hidden], [vocab, hidden]
  int64_t hidden = 0, vocab = 0;
  float eps = 0.0f, norm_offset = 0.0f;
};

class DecoderLayer {
 public:
  virtual ~DecoderLayer() = default;
  // hidden [T, H] is updated in place.
  virtual void forward(const Batch& batch, float* hidden, Observer* observer) = 0;
};

class ModelForward {
 public:
  virtual ~ModelForward() = default;
  // Throws strata::Error for an unknown model_type or a config field that changes the math and
  // is not understood.
  static std::unique_ptr<ModelForward> create(const ModelConfig& config, const Checkpoint& ckpt,
                                              ForwardOptions options = {});

  virtual int64_t hidden_size() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_layers() const = 0;
  // hidden [T, H] = embedding rows of batch.tokens.
  virtual void embed(const Batch& batch, float* hidden) const = 0;
  // The same as bf16 bits [T, H], each the value embed() gives when the hidden states are
  // rounded to bf16 between layers (what a bf16 activation store holds).
  virtual void embed_bf16(const Batch& batch, uint16_t* hidden) const = 0;
  // Reads layer i's weights from the checkpoint.
  virtual std::unique_ptr<DecoderLayer> layer(int64_t i) const = 0;
  // logits [T, vocab] = lm_head(final_norm(hidden)).
  virtual void logits(const Batch& batch, const float* hidden, float* out) const = 0;
  // The same held in memory, for logits computed a slice of tokens at a time.
  virtual std::unique_ptr<LogitsHead> head() const = 0;
  virtual HeadSpec head_spec() const = 0;
};

}  // namespace strata
