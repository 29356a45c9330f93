// config.json of a Hugging Face checkpoint, read into the fields strata's architectures use.
//
// Both spellings transformers has used are accepted and normalised here, so that nothing else
// needs to know them:
//   rope:     4.x `rope_theta` + `rope_scaling` {type|rope_type, factor, ...}
//             5.x `rope_parameters` {rope_type, rope_theta, factor, ...}
//   experts:  `num_experts` (Qwen) / `num_local_experts` (Mixtral) / `n_routed_experts` (DeepSeek)
//             top-k `num_experts_per_tok` / `num_experts_per_token` (Kimi-Linear), shared experts
//             `n_shared_experts` / `num_shared_experts`, `norm_topk_prob` / `moe_renormalize`
//   multimodal wrappers keep the language model's fields under `text_config` (or
//   `language_config`), possibly nested again (unwrapped up to 4 levels; deeper is an error);
//   the text model's fields are read from the innermost one (`torch_dtype`,
//   `tie_word_embeddings` and `quantization_config` fall back to the top level).
//   dtype:    `torch_dtype` (4.x) / `dtype` (5.x)
// A JSON null means the key is absent (`"q_lora_rank": null` is a plain q_proj). When two
// spellings of one field are both present they must agree (rope_theta at the top level and in
// rope_parameters, rope_scaling's `type` and `rope_type`, ...); a disagreement is an error.
// rope_parameters keyed by layer type (Gemma-style {"full_attention": {...}, ...}) is refused
// for now. Keys strata does not know (mrope_section, ...) stay readable through `raw`/`text`.
// A field of the wrong JSON type is a strata::Error naming the file and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/json.h"

namespace strata {

struct RopeConfig {
  std::string type = "default";  // default, linear, dynamic, llama3, yarn, ...
  double theta = 10000.0;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  double mscale = 1.0;            // yarn (DeepSeek)
  double mscale_all_dim = 0.0;    // yarn (DeepSeek)
  std::optional<double> attention_factor;
  bool truncate = true;                // yarn: floor/ceil the correction range (false in gpt-oss)
  double partial_rotary_factor = 1.0;  // fraction of head_dim that is rotated
};

struct ModelConfig {
  std::string path;             // the file it came from, for messages
  Json raw;                     // the whole config.json
  Json text;                    // the language model's sub-config (== raw when not nested)
  std::string text_key;         // "", "text_config" / "language_config", or a nested path such as
                                // "text_config.text_config" (at most 4 levels)
  std::string model_type;       // the top-level model_type
  std::string text_model_type;  // the language model's model_type
  std::vector<std::string> architectures;
  std::string torch_dtype;  // `torch_dtype` (4.x) or `dtype` (5.x), may be empty

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  RopeConfig rope;

  // Mixture of experts (0 when dense).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = false;

  // Multi-head latent attention (DeepSeek-V3 / Kimi-K2); q_lora_rank 0 means a plain q_proj.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  std::optional<Json> quantization_config;  // a source checkpoint's own, if any
};

ModelConfig parse_model_config(const Json& j, const std::string& what);
// Reads <dir>/config.json.
ModelConfig read_model_config(const std::string& dir);

}  // namespace strata
