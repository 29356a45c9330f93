// What the CPU forward shares outside the layers (model/forward.cpp): weight loading with shape
// checks, the model's prefixes, embedding, the final norm and lm_head, RoPE parameters.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"
#include "model/layer.h"
#include "ops/ops.h"

namespace strata::model {

// Reads `name` as fp32, checking its shape; a missing tensor or another shape is a
// strata::Error naming the tensor.
std::vector<float> load_weight(const Checkpoint& ckpt, const std::string& name, const Shape& shape);

// How a server quantizes the input of the linear whose weight is `weight_name` in a ModelOpt
// export (spec/format.md): NVFP4 (a U8 weight with an F8_E4M3 weight_scale and an input_scale):
// 16-blocks under the static global input_scale; FP8 (an F8_E4M3 weight with a scalar F32
// weight_scale and an input_scale): per tensor, input_scale; MXFP8 (an F8_E4M3 weight with U8
// block scales): dynamic 32-blocks. None for an unquantized or weight-only (W4A16) module. A
// present input_scale that is not a positive finite F32 scalar is a strata::Error.
ActQuant served_input_quant(const Checkpoint& ckpt, const std::string& weight_name);

// How a server stores the KV cache observed under `cache` ("<...>.self_attn.k_cache" /
// "v_cache") when the export's kv_cache_quant_algo is `kv` (kFp8 or kNvfp4): the scale is the
// exported "<...>.self_attn.k_proj.k_scale" / "v_proj.v_scale", or 1.0 where the export has none
// (a cast KV cache; servers take 1.0 too). FP8: per tensor with that scale; NVFP4: 16-blocks
// along each head under the global scale fl32(scale · 448) · fl32(1/2688), as ModelOpt's fake
// quantizer takes the amax scale · 448.
ActQuant served_kv_quant(const Checkpoint& ckpt, ActQuant::Kind kv, const std::string& cache);

// strata compare's serving simulation over another binder, for one bind(): its matrices carry the
// export's input quantization (served_input_quant) when `activations`, the attention the KV
// cache's (served_kv_quant) for `kv`; every weight is the inner binder's. The CPU and GPU
// forwards wrap their binders in it when the simulation is on.
class ServedBinder final : public Binder {
 public:
  ServedBinder(Binder& inner, const Checkpoint& ckpt, bool activations, ActQuant::Kind kv)
      : inner_(inner), ckpt_(ckpt), activations_(activations), kv_(kv) {}
  ops::Weight matrix(const std::string& name, const Shape& shape) override;
  ops::Weight vector(const std::string& name, const Shape& shape) override {
    return inner_.vector(name, shape);
  }
  bool has(const std::string& name) const override { return inner_.has(name); }
  Shape shape_of(const std::string& name) const override { return inner_.shape_of(name); }
  bool holds_expert(int64_t e, int64_t experts) const override {
    return inner_.holds_expert(e, experts);
  }
  ActQuant kv_quant(const std::string& cache) const override {
    return served_kv_quant(ckpt_, kv_, cache);
  }

 private:
  Binder& inner_;
  const Checkpoint& ckpt_;
  bool activations_;
  ActQuant::Kind kv_;
};

// Whether the JSON object `j` holds `key` with a value other than null (hub configs write null
// for a setting left at the model class's default).
bool has_key(const Json& j, const char* key);

// The number `key` of the config object `j`, or `fallback` where it is absent or null; another
// type is a strata::Error naming the key.
double number_or(const Json& j, const char* key, double fallback);

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
  // hidden [T, H] = the embedding rows of batch.tokens, rounded to bf16 when round_bf16.
  void embed(const Batch& batch, float* hidden, bool round_bf16) const;
  // The same rounded to bf16, as bf16 bits: embed(batch, x, true) then the top half of each
  // value's bits, without the fp32 rows in between.
  void embed_bf16(const Batch& batch, uint16_t* hidden) const;
  void logits(const float* hidden, int64_t n_tokens, float* out) const;
  // The final norm and lm_head read once.
  std::unique_ptr<LogitsHead> head() const;
  HeadSpec spec() const { return {norm_name_, head_name_, hidden_, vocab_, eps_, norm_offset_}; }

 private:
  const Checkpoint& ckpt_;
  std::string embed_name_, norm_name_, head_name_;
  int64_t hidden_, vocab_;
  float eps_;
  float norm_offset_;
};

}  // namespace strata::model
