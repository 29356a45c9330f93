#include "io/hf_config.h"

#include <filesystem>
#include <system_error>

#include "core/error.h"

namespace strata {

namespace {

// Reads typed fields of one JSON object. `prefix` ("" or "text_config.") makes messages name
// the key as it is spelled in the file. A missing key and a JSON null read the same: absent.
struct Fields {
  const Json& obj;
  const std::string& what;
  std::string prefix;

  const Json* get(const std::string& key) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }
  [[noreturn]] void wrong_type(const std::string& key, const char* expected) const {
    fail(what, ": key \"", prefix, key, "\" must be ", expected, ", got ", obj[key].dump());
  }
  std::optional<int64_t> int_opt(const std::string& key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer()) wrong_type(key, "an integer");
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      wrong_type(key, "an integer that fits in 64 bits");
    }
    const int64_t x = v->get<int64_t>();
    if (x < 0) wrong_type(key, "a non-negative integer");
    return x;
  }
  int64_t int_or(const std::string& key, int64_t fallback) const {
    return int_opt(key).value_or(fallback);
  }
  std::optional<double> num_opt(const std::string& key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) wrong_type(key, "a number");
    return v->get<double>();
  }
  double num_or(const std::string& key, double fallback) const {
    return num_opt(key).value_or(fallback);
  }
  std::optional<bool> bool_opt(const std::string& key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean()) wrong_type(key, "true or false");
    return v->get<bool>();
  }
  std::optional<std::string> str_opt(const std::string& key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) wrong_type(key, "a string");
    return v->get<std::string>();
  }
  const Json* object_opt(const std::string& key) const {
    const Json* v = get(key);
    if (v != nullptr && !v->is_object()) wrong_type(key, "an object");
    return v;
  }
  std::vector<int64_t> int_list(const std::string& key) const {
    std::vector<int64_t> out;
    const Json* v = get(key);
    if (v == nullptr) return out;
    if (!v->is_array()) wrong_type(key, "an array of integers");
    for (const Json& x : *v) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) {
        wrong_type(key, "an array of non-negative integers");
      }
      out.push_back(x.get<int64_t>());
    }
    return out;
  }
};

// One value that several spellings may carry. Each spelling found is offered in turn; the first
// sets the value and every later one must agree with it, else the error names both keys.
template <typename T>
struct Agreed {
  std::optional<T> value;
  std::string source;

  void offer(const std::optional<T>& v, const std::string& key, const std::string& what) {
    if (!v) return;
    if (!value) {
      value = v;
      source = key;
      return;
    }
    if (*value != *v) {
      fail(what, ": \"", source, "\" is ", *value, " but \"", key, "\" is ", *v,
           "; they describe the same setting and must agree");
    }
  }
};

// Offers every RoPE key of one object ({rope_scaling} / {rope_parameters} / the config itself
// for the 4.x top-level rope_theta) to the accumulators.
struct RopeFields {
  Agreed<std::string> type;
  Agreed<double> theta, factor, low_freq_factor, high_freq_factor, beta_fast, beta_slow, mscale,
      mscale_all_dim, attention_factor, partial_rotary_factor;
  Agreed<int64_t> original_max;
  Agreed<bool> truncate;

  void read(const Fields& f, const std::string& what) {
    const std::string& p = f.prefix;
    type.offer(f.str_opt("rope_type"), p + "rope_type", what);
    type.offer(f.str_opt("type"), p + "type", what);
    theta.offer(f.num_opt("rope_theta"), p + "rope_theta", what);
    factor.offer(f.num_opt("factor"), p + "factor", what);
    original_max.offer(f.int_opt("original_max_position_embeddings"),
                       p + "original_max_position_embeddings", what);
    low_freq_factor.offer(f.num_opt("low_freq_factor"), p + "low_freq_factor", what);
    high_freq_factor.offer(f.num_opt("high_freq_factor"), p + "high_freq_factor", what);
    beta_fast.offer(f.num_opt("beta_fast"), p + "beta_fast", what);
    beta_slow.offer(f.num_opt("beta_slow"), p + "beta_slow", what);
    mscale.offer(f.num_opt("mscale"), p + "mscale", what);
    mscale_all_dim.offer(f.num_opt("mscale_all_dim"), p + "mscale_all_dim", what);
    attention_factor.offer(f.num_opt("attention_factor"), p + "attention_factor", what);
    partial_rotary_factor.offer(f.num_opt("partial_rotary_factor"), p + "partial_rotary_factor",
                                what);
    truncate.offer(f.bool_opt("truncate"), p + "truncate", what);
  }
};

RopeConfig parse_rope(const Fields& text, const std::string& what) {
  RopeFields r;
  // 4.x: rope_theta (and partial_rotary_factor) at the top of the (text) config.
  r.theta.offer(text.num_opt("rope_theta"), text.prefix + "rope_theta", what);
  r.partial_rotary_factor.offer(text.num_opt("partial_rotary_factor"),
                                text.prefix + "partial_rotary_factor", what);
  // 4.x: rope_scaling {type | rope_type, factor, ...}.
  if (const Json* scaling = text.object_opt("rope_scaling")) {
    r.read(Fields{*scaling, what, text.prefix + "rope_scaling."}, what);
  }
  // 5.x: rope_parameters {rope_type, rope_theta, ...}.
  if (const Json* params = text.object_opt("rope_parameters")) {
    for (const auto& [k, v] : params->items()) {
      STRATA_CHECK(!v.is_object(), what, ": \"", text.prefix, "rope_parameters.", k,
                   "\" is an object: RoPE parameters per layer type are not supported yet");
    }
    r.read(Fields{*params, what, text.prefix + "rope_parameters."}, what);
  }
  RopeConfig rope;
  rope.type = r.type.value.value_or(rope.type);
  rope.theta = r.theta.value.value_or(rope.theta);
  rope.factor = r.factor.value.value_or(rope.factor);
  rope.original_max_position_embeddings = r.original_max.value.value_or(0);
  rope.low_freq_factor = r.low_freq_factor.value.value_or(rope.low_freq_factor);
  rope.high_freq_factor = r.high_freq_factor.value.value_or(rope.high_freq_factor);
  rope.beta_fast = r.beta_fast.value.value_or(rope.beta_fast);
  rope.beta_slow = r.beta_slow.value.value_or(rope.beta_slow);
  rope.mscale = r.mscale.value.value_or(rope.mscale);
  rope.mscale_all_dim = r.mscale_all_dim.value.value_or(rope.mscale_all_dim);
  rope.attention_factor = r.attention_factor.value;
  rope.partial_rotary_factor = r.partial_rotary_factor.value.value_or(1.0);
  rope.truncate = r.truncate.value.value_or(rope.truncate);
  STRATA_CHECK(rope.theta > 0, what, ": rope_theta must be positive, got ", rope.theta);
  STRATA_CHECK(rope.partial_rotary_factor > 0 && rope.partial_rotary_factor <= 1, what,
               ": partial_rotary_factor must be in (0, 1], got ", rope.partial_rotary_factor);
  return rope;
}

}  // namespace

ModelConfig parse_model_config(const Json& j, const std::string& what) {
  STRATA_CHECK(j.is_object(), what, ": config must be a JSON object, got ", j.type_name());
  ModelConfig c;
  c.path = what;
  c.raw = j;
  const Fields top{j, what, ""};

  // Multimodal wrappers: the language model's fields live in a nested object, unwrapped level
  // by level (a wrapper of a wrapper keeps its own text_config inside), at most kMaxConfigDepth.
  constexpr int kMaxConfigDepth = 4;
  const Json* level = &j;
  for (int depth = 0;; ++depth) {
    std::string found;
    const Json* next = nullptr;
    const Fields f{*level, what, c.text_key.empty() ? "" : c.text_key + "."};
    for (const char* key : {"text_config", "language_config"}) {
      if (const Json* sub = f.object_opt(key)) {
        STRATA_CHECK(found.empty(), what, ": both \"", f.prefix, found, "\" and \"", f.prefix, key,
                     "\" are present; which one is the language model is ambiguous");
        found = key;
        next = sub;
      }
    }
    if (!next) break;
    STRATA_CHECK(depth < kMaxConfigDepth, what,
                 ": the language model's config is nested more than ", kMaxConfigDepth,
                 " levels deep (", f.prefix, found, "); strata unwraps at most ", kMaxConfigDepth);
    c.text_key = f.prefix + found;
    level = next;
  }
  c.text = *level;
  const Fields text{c.text, what, c.text_key.empty() ? "" : c.text_key + "."};

  c.model_type = top.str_opt("model_type").value_or("");
  STRATA_CHECK(!c.model_type.empty(), what, ": missing \"model_type\"");
  c.text_model_type = c.text_key.empty() ? c.model_type : text.str_opt("model_type").value_or("");
  if (const Json* arch = top.get("architectures")) {
    if (!arch->is_array()) top.wrong_type("architectures", "an array of strings");
    for (const Json& a : *arch) {
      if (!a.is_string()) top.wrong_type("architectures", "an array of strings");
      c.architectures.push_back(a.get<std::string>());
    }
  }

  // torch_dtype (4.x) / dtype (5.x); nested configs may carry their own.
  Agreed<std::string> dtype;
  const Fields& dtype_src = (text.get("torch_dtype") || text.get("dtype")) ? text : top;
  dtype.offer(dtype_src.str_opt("torch_dtype"), dtype_src.prefix + "torch_dtype", what);
  dtype.offer(dtype_src.str_opt("dtype"), dtype_src.prefix + "dtype", what);
  c.torch_dtype = dtype.value.value_or("");

  c.vocab_size = text.int_or("vocab_size", 0);
  c.hidden_size = text.int_or("hidden_size", 0);
  c.intermediate_size = text.int_or("intermediate_size", 0);
  c.num_hidden_layers = text.int_or("num_hidden_layers", 0);
  c.num_attention_heads = text.int_or("num_attention_heads", 0);
  c.num_key_value_heads = text.int_or("num_key_value_heads", c.num_attention_heads);
  if (auto hd = text.int_opt("head_dim")) {
    c.head_dim = *hd;
  } else if (c.num_attention_heads > 0) {
    STRATA_CHECK(c.hidden_size % c.num_attention_heads == 0, what, ": no \"", text.prefix,
                 "head_dim\" and hidden_size ", c.hidden_size, " is not a multiple of ",
                 "num_attention_heads ", c.num_attention_heads, "; head_dim cannot be derived");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.num_key_value_heads > 0 && c.num_attention_heads > 0) {
    STRATA_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, what, ": ", text.prefix,
                 "num_attention_heads ", c.num_attention_heads,
                 " is not a multiple of num_key_value_heads ", c.num_key_value_heads);
  }
  c.max_position_embeddings = text.int_or("max_position_embeddings", 0);
  c.rms_norm_eps = text.num_or("rms_norm_eps", c.rms_norm_eps);
  c.attention_bias = text.bool_opt("attention_bias").value_or(false);
  c.tie_word_embeddings = text.bool_opt("tie_word_embeddings")
                              .value_or(top.bool_opt("tie_word_embeddings").value_or(false));
  c.rope = parse_rope(text, what);

  // Experts: one setting, three spellings.
  Agreed<int64_t> experts;
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    experts.offer(text.int_opt(key), text.prefix + key, what);
  }
  c.num_experts = experts.value.value_or(0);
  // Kimi-Linear (remote code and transformers 5.x) spells three of these its own way.
  Agreed<int64_t> top_k, shared;
  top_k.offer(text.int_opt("num_experts_per_tok"), text.prefix + "num_experts_per_tok", what);
  top_k.offer(text.int_opt("num_experts_per_token"), text.prefix + "num_experts_per_token", what);
  c.num_experts_per_tok = top_k.value.value_or(0);
  c.moe_intermediate_size = text.int_or("moe_intermediate_size", 0);
  shared.offer(text.int_opt("n_shared_experts"), text.prefix + "n_shared_experts", what);
  shared.offer(text.int_opt("num_shared_experts"), text.prefix + "num_shared_experts", what);
  c.n_shared_experts = shared.value.value_or(0);
  c.first_k_dense_replace = text.int_or("first_k_dense_replace", 0);
  c.moe_layer_freq = text.int_or("moe_layer_freq", 1);
  c.decoder_sparse_step = text.int_or("decoder_sparse_step", 1);
  c.mlp_only_layers = text.int_list("mlp_only_layers");
  Agreed<bool> renormalize;
  renormalize.offer(text.bool_opt("norm_topk_prob"), text.prefix + "norm_topk_prob", what);
  renormalize.offer(text.bool_opt("moe_renormalize"), text.prefix + "moe_renormalize", what);
  c.norm_topk_prob = renormalize.value.value_or(false);
  if (c.num_experts > 0) {
    STRATA_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_experts, what, ": ",
                 text.prefix, "num_experts_per_tok ", c.num_experts_per_tok,
                 " must be between 1 and the number of experts, ", c.num_experts);
  }

  c.q_lora_rank = text.int_or("q_lora_rank", 0);
  c.kv_lora_rank = text.int_or("kv_lora_rank", 0);
  c.qk_nope_head_dim = text.int_or("qk_nope_head_dim", 0);
  c.qk_rope_head_dim = text.int_or("qk_rope_head_dim", 0);
  c.v_head_dim = text.int_or("v_head_dim", 0);

  if (const Json* q = top.object_opt("quantization_config")) {
    c.quantization_config = *q;
  } else if (const Json* tq = text.object_opt("quantization_config")) {
    c.quantization_config = *tq;
  }
  return c;
}

ModelConfig read_model_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  STRATA_CHECK(std::filesystem::is_regular_file(path, ec), dir,
               ": no config.json (expected a Hugging Face checkpoint directory)");
  return parse_model_config(json_read_file(path), path);
}

}  // namespace strata
