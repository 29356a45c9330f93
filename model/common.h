// What the CPU forward shares outside the layers (model/forward.cpp): weight loading with shape
// checks, the model's prefixes, embedding, the final norm and lm_head, RoPE parameters.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"
#include "ops/ops.h"

namespace strata::model {

// Reads `name` as fp32, checking its shape; a missing tensor or another shape is a
// strata::Error naming the tensor.
std::vector<float> load_weight(const Checkpoint& ckpt, const std::string& name, const Shape& shape);

// Whether the JSON object `j` holds `key` with a value other than null (hub configs write null
// for a setting left at the model class's default).
bool has_key(const Json& j, const char* key);

// RoPE parameters from the config's normalised rope fields; an unknown rope type is an error.
ops::RopeParams rope_params(const ModelConfig& config);

// The prefix of the language model's tensors: "model." or "language_model.model." etc.,
// detected from where the embedding lives; and the lm_head name.
struct Prefixes {
  std::string model;    // "model."
  std::string lm_head;  // "lm_head.weight" (or the embedding, when tied)
};
Prefixes find_prefixes(const ModelConfig& config, const Checkpoint& ckpt);

// Embedding, final norm and lm_head: the steps outside the decoder layers.
class Ends {
 public:
  // norm_offset: the final norm multiplies by norm_offset + its weight (model/layer.h Family).
  Ends(const ModelConfig& config, const Checkpoint& ckpt, const Prefixes& prefixes,
       float norm_offset = 0.0f);
  void embed(const Batch& batch, float* hidden, bool round_bf16) const;
  void logits(const float* hidden, int64_t n_tokens, float* out) const;

 private:
  const Checkpoint& ckpt_;
  std::string embed_name_, norm_name_, head_name_;
  int64_t hidden_, vocab_;
  float eps_;
  float norm_offset_;
};

}  // namespace strata::model
