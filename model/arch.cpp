#include "model/arch.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/error.h"

namespace strata {

std::string_view arch_family_name(ArchFamily family) {
  switch (family) {
    case ArchFamily::kLlama:
      return "llama";
    case ArchFamily::kQwenMoe:
      return "qwen_moe";
    case ArchFamily::kMixtral:
      return "mixtral";
    case ArchFamily::kDeepseekV3:
      return "deepseek_v3";
    case ArchFamily::kKimiLinear:
      return "kimi_linear";
    case ArchFamily::kQwen3Next:
      return "qwen3_next";
    case ArchFamily::kQwen35Moe:
      return "qwen3_5_moe";
    case ArchFamily::kGlm4Moe:
      return "glm4_moe";
    case ArchFamily::kMiniMaxM2:
      return "minimax_m2";
    case ArchFamily::kGptOss:
      return "gpt_oss";
    case ArchFamily::kDeepseekV32:
      return "deepseek_v32";
  }
  STRATA_ASSERT(false, "unhandled ArchFamily ", static_cast<int>(family));
}

namespace {

constexpr std::array<ArchEntry, 19> kArchs = {{
    {"llama", ArchFamily::kLlama, false},
    {"mistral", ArchFamily::kLlama, false},
    {"qwen2", ArchFamily::kLlama, false},
    {"qwen3", ArchFamily::kLlama, false},
    {"qwen2_moe", ArchFamily::kQwenMoe, false},
    {"qwen3_moe", ArchFamily::kQwenMoe, false},
    {"mixtral", ArchFamily::kMixtral, false},
    {"deepseek_v3", ArchFamily::kDeepseekV3, false},
    {"kimi_k2", ArchFamily::kDeepseekV3, false},
    {"kimi_linear", ArchFamily::kKimiLinear, false},
    {"qwen3_next", ArchFamily::kQwen3Next, false},
    {"qwen3_5_moe_text", ArchFamily::kQwen35Moe, false},
    {"glm4_moe", ArchFamily::kGlm4Moe, false},
    {"minimax_m2", ArchFamily::kMiniMaxM2, false},
    {"gpt_oss", ArchFamily::kGptOss, false},
    {"deepseek_v32", ArchFamily::kDeepseekV32, false},
    {"kimi_vl", ArchFamily::kDeepseekV3, true},
    {"kimi_k25", ArchFamily::kDeepseekV3, true},
    {"qwen3_5_moe", ArchFamily::kQwen35Moe, true},
}};

std::string known_list() {
  std::string s;
  for (const ArchEntry& a : kArchs) {
    if (!s.empty()) s += ", ";
    s += a.model_type;
  }
  return s;
}

}  // namespace

std::span<const ArchEntry> known_archs() {
  return kArchs;
}

const ArchEntry* find_arch(std::string_view model_type) {
  for (const ArchEntry& a : kArchs) {
    if (a.model_type == model_type) return &a;
  }
  return nullptr;
}

ArchInfo resolve_arch(const ModelConfig& config) {
  const ArchEntry* entry = find_arch(config.model_type);
  STRATA_CHECK(entry, config.path, ": model_type '", config.model_type,
               "' is not supported; strata knows ", known_list());
  ArchInfo info;
  info.family = entry->family;
  info.multimodal = entry->multimodal;
  if (entry->multimodal && !config.text_model_type.empty() &&
      config.text_model_type != config.model_type) {
    const ArchEntry* text = find_arch(config.text_model_type);
    STRATA_CHECK(text && !text->multimodal, config.path, ": ", config.text_key, ".model_type '",
                 config.text_model_type, "' is not a supported language model; ", "strata knows ",
                 known_list());
    info.family = text->family;
  }
  info.num_hidden_layers = config.num_hidden_layers;
  STRATA_CHECK(info.num_hidden_layers > 0, config.path,
               ": num_hidden_layers must be a positive integer, got ", info.num_hidden_layers);
  return info;
}

namespace {

// The number of components of a prefix "a.b.c." when each is a non-empty, non-numeric name;
// -1 otherwise. "" has 0.
int wrapper_depth(std::string_view prefix) {
  if (prefix.empty()) return 0;
  if (prefix.back() != '.') return -1;
  int n = 0;
  size_t start = 0;
  while (start < prefix.size()) {
    const size_t dot = prefix.find('.', start);
    const std::string_view c = prefix.substr(start, dot - start);
    if (c.empty() || (c[0] >= '0' && c[0] <= '9')) return -1;
    ++n;
    start = dot + 1;
  }
  return n;
}

}  // namespace

void resolve_wrapper_prefixes(ArchInfo& arch, const std::vector<std::string>& names,
                              const std::string& what) {
  if (!arch.multimodal) return;
  constexpr std::string_view kEmbed = "embed_tokens.weight", kHead = "lm_head.weight";
  std::vector<std::string> lm, heads, too_deep;
  for (const std::string& n : names) {
    for (std::string_view leaf : {kEmbed, kHead}) {
      if (!n.ends_with(leaf)) continue;
      const std::string p = n.substr(0, n.size() - leaf.size());
      const int depth = wrapper_depth(p);
      if (depth < 0) continue;
      if (depth > kMaxWrapperDepth) {
        too_deep.push_back(n);
        continue;
      }
      if (leaf == kHead) {
        heads.push_back(p);
        continue;
      }
      if (depth == 0) continue;  // a wrapper keeps its language model under a prefix
      bool has_layers = false;
      for (const std::string& m : names) {
        if (m.starts_with(p + "layers.")) {
          has_layers = true;
          break;
        }
      }
      if (has_layers) lm.push_back(p);
    }
  }
  auto list = [](const std::vector<std::string>& v, std::string_view leaf) {
    std::string s;
    for (const std::string& x : v)
      s += (s.empty() ? "'" : ", '") + x + std::string(leaf) + "'";
    return s;
  };
  if (lm.empty()) {
    STRATA_CHECK(too_deep.empty(), what, ": the language model is wrapped more than ",
                 kMaxWrapperDepth, " levels deep (", list(too_deep, ""),
                 "); strata unwraps at most ", kMaxWrapperDepth);
    fail(what, ": no <prefix>embed_tokens.weight with <prefix>layers.N tensors beside it; cannot ",
         "find the language model inside this multimodal checkpoint");
  }
  STRATA_CHECK(lm.size() == 1, what, ": several language models: ", list(lm, kEmbed),
               "; which one to quantize is ambiguous");
  STRATA_CHECK(heads.size() <= 1, what, ": several lm_heads: ", list(heads, kHead),
               "; which one belongs to the language model is ambiguous");
  arch.lm_prefix = lm[0];
  arch.head_prefix = heads.empty() ? std::string() : heads[0];
}

std::string_view tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::kAttention:
      return "attention";
    case TensorKind::kDenseMlp:
      return "dense_mlp";
    case TensorKind::kRoutedExperts:
      return "routed_experts";
    case TensorKind::kSharedExperts:
      return "shared_experts";
    case TensorKind::kRouter:
      return "router";
    case TensorKind::kEmbedding:
      return "embeddings";
    case TensorKind::kLmHead:
      return "lm_head";
    case TensorKind::kNorm:
      return "norms";
    case TensorKind::kVision:
      return "vision_tower";
    case TensorKind::kProjector:
      return "projector";
    case TensorKind::kMtp:
      return "mtp";
    case TensorKind::kOther:
      return "other";
    case TensorKind::kUnrecognized:
      return "unrecognized";
  }
  STRATA_ASSERT(false, "unhandled TensorKind ", static_cast<int>(kind));
}

bool kind_is_quantized_by_default(TensorKind kind) {
  switch (kind) {
    case TensorKind::kAttention:
    case TensorKind::kDenseMlp:
    case TensorKind::kRoutedExperts:
    case TensorKind::kSharedExperts:
      return true;
    case TensorKind::kRouter:
    case TensorKind::kEmbedding:
    case TensorKind::kLmHead:
    case TensorKind::kNorm:
    case TensorKind::kVision:
    case TensorKind::kProjector:
    case TensorKind::kMtp:
    case TensorKind::kOther:
    case TensorKind::kUnrecognized:
      return false;
  }
  STRATA_ASSERT(false, "unhandled TensorKind ", static_cast<int>(kind));
}

namespace {

// config.text[key][layer], which must be a string among `allowed`.
std::string layer_type_at(const ModelConfig& config, const char* key, int64_t layer,
                          std::initializer_list<std::string_view> allowed) {
  const Json& list = config.text[key];
  STRATA_CHECK(list.is_array() && static_cast<int64_t>(list.size()) == config.num_hidden_layers,
               config.path, ": '", key, "' must be a list of ", config.num_hidden_layers,
               " strings (one per layer)");
  const Json& v = list[static_cast<size_t>(layer)];
  STRATA_CHECK(v.is_string(), config.path, ": '", key, "'[", layer, "] must be a string");
  const std::string type = v.get<std::string>();
  std::string names;
  for (std::string_view a : allowed) {
    if (type == a) return type;
    names += names.empty() ? "" : ", ";
    names += a;
  }
  fail(config.path, ": '", key, "'[", layer, "] is '", type, "'; strata knows ", names);
}

// Whether layer + 1 is listed in obj[key], a list of 1-based layer numbers.
bool one_based_member(const ModelConfig& config, const Json& obj, const char* key, int64_t layer) {
  STRATA_CHECK(obj.contains(key) && obj[key].is_array(), config.path, ": linear_attn_config.", key,
               " must be a list of 1-based layer numbers");
  bool found = false;
  for (const Json& v : obj[key]) {
    STRATA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 &&
                     v.get<int64_t>() <= config.num_hidden_layers,
                 config.path, ": linear_attn_config.", key, " holds ", v.dump(),
                 "; entries are 1-based layer numbers in [1, ", config.num_hidden_layers, "]");
    found = found || v.get<int64_t>() == layer + 1;
  }
  return found;
}

}  // namespace

bool layer_is_moe(const ArchInfo& arch, const ModelConfig& config, int64_t layer) {
  switch (arch.family) {
    case ArchFamily::kLlama:
      return false;
    case ArchFamily::kMixtral:
    case ArchFamily::kMiniMaxM2:
    case ArchFamily::kGptOss:
      return config.num_experts > 0;
    case ArchFamily::kQwen35Moe:
      // transformers' Qwen3_5MoeDecoderLayer: every layer is MoE (the config class drops
      // mlp_only_layers and decoder_sparse_step, so neither counts).
      return config.num_experts > 0;
    case ArchFamily::kQwenMoe:
    case ArchFamily::kQwen3Next: {
      // architectures.md §2: MoE iff not in mlp_only_layers, E > 0, (i+1) % step == 0.
      if (config.num_experts <= 0 || config.decoder_sparse_step <= 0) return false;
      const auto& only = config.mlp_only_layers;
      if (std::find(only.begin(), only.end(), layer) != only.end()) return false;
      return (layer + 1) % config.decoder_sparse_step == 0;
    }
    case ArchFamily::kDeepseekV3:
      // architectures.md §3: dense below first_k_dense_replace, then every moe_layer_freq-th.
      if (config.num_experts <= 0 || config.moe_layer_freq <= 0) return false;
      return layer >= config.first_k_dense_replace && layer % config.moe_layer_freq == 0;
    case ArchFamily::kDeepseekV32: {
      // transformers' DeepseekV32DecoderLayer: mlp_layer_types ("dense" / "sparse"), which
      // DeepseekV32Config fills as first_k_dense_replace (3 when absent) dense layers, then MoE;
      // moe_layer_freq is not read.
      const Json& t = config.text;
      if (t.contains("mlp_layer_types") && !t["mlp_layer_types"].is_null()) {
        const bool sparse =
            layer_type_at(config, "mlp_layer_types", layer, {"dense", "sparse"}) == "sparse";
        STRATA_CHECK(!sparse || config.num_experts > 0, config.path, ": mlp_layer_types[", layer,
                     "] is 'sparse' but the config has no experts");
        return sparse;
      }
      const bool given =
          t.contains("first_k_dense_replace") && !t["first_k_dense_replace"].is_null();
      return config.num_experts > 0 && layer >= (given ? config.first_k_dense_replace : 3);
    }
    case ArchFamily::kGlm4Moe: {
      // transformers' Glm4MoeDecoderLayer: MoE from first_k_dense_replace on (no moe_layer_freq);
      // Glm4MoeConfig's default is 1.
      const Json& t = config.text;
      const bool given =
          t.contains("first_k_dense_replace") && !t["first_k_dense_replace"].is_null();
      return config.num_experts > 0 && layer >= (given ? config.first_k_dense_replace : 1);
    }
    case ArchFamily::kKimiLinear: {
      // transformers 5.x: mlp_layer_types ("dense" / "sparse"); the remote code:
      // first_k_dense_replace and moe_layer_freq as DeepSeek. Both present: they must agree.
      const Json& t = config.text;
      const bool have_list = t.contains("mlp_layer_types") && !t["mlp_layer_types"].is_null();
      const bool have_k =
          t.contains("first_k_dense_replace") && !t["first_k_dense_replace"].is_null();
      STRATA_CHECK(have_list || have_k, config.path,
                   ": kimi_linear config has neither mlp_layer_types nor first_k_dense_replace; "
                   "which layers are MoE is unknown");
      const bool by_k = config.num_experts > 0 && config.moe_layer_freq > 0 &&
                        layer >= config.first_k_dense_replace && layer % config.moe_layer_freq == 0;
      if (!have_list) return by_k;
      const std::string type = layer_type_at(config, "mlp_layer_types", layer, {"dense", "sparse"});
      const bool by_list = type == "sparse";
      STRATA_CHECK(!have_k || by_list == by_k, config.path, ": mlp_layer_types[", layer, "] is '",
                   type, "' but first_k_dense_replace / moe_layer_freq make layer ", layer,
                   by_k ? " MoE" : " dense", "; they must agree");
      STRATA_CHECK(!by_list || config.num_experts > 0, config.path, ": mlp_layer_types[", layer,
                   "] is 'sparse' but the config has no experts");
      return by_list;
    }
  }
  STRATA_ASSERT(false, "unhandled ArchFamily ", static_cast<int>(arch.family));
}

bool layer_is_linear_attention(const ArchInfo& arch, const ModelConfig& config, int64_t layer) {
  const Json& t = config.text;
  switch (arch.family) {
    case ArchFamily::kLlama:
    case ArchFamily::kQwenMoe:
    case ArchFamily::kMixtral:
    case ArchFamily::kDeepseekV3:
    case ArchFamily::kDeepseekV32:
    case ArchFamily::kGlm4Moe:
    case ArchFamily::kMiniMaxM2:
    case ArchFamily::kGptOss:
      return false;
    case ArchFamily::kQwen3Next:
    case ArchFamily::kQwen35Moe: {
      // architectures.md §5: layer_types, else every full_attention_interval-th layer is full.
      if (t.contains("layer_types") && !t["layer_types"].is_null()) {
        return layer_type_at(config, "layer_types", layer,
                             {"linear_attention", "full_attention"}) == "linear_attention";
      }
      int64_t interval = 4;
      if (t.contains("full_attention_interval") && t["full_attention_interval"].is_number_integer())
        interval = t["full_attention_interval"].get<int64_t>();
      STRATA_CHECK(interval > 0, config.path, ": full_attention_interval must be positive");
      return (layer + 1) % interval != 0;
    }
    case ArchFamily::kKimiLinear: {
      // architectures.md §4: transformers 5.x writes layer_types; the remote code
      // linear_attn_config.kda_layers / full_attn_layers, 1-based. Both present: they must agree.
      std::optional<bool> by_list, by_kda;
      if (t.contains("layer_types") && !t["layer_types"].is_null()) {
        by_list = layer_type_at(config, "layer_types", layer,
                                {"linear_attention", "full_attention"}) == "linear_attention";
      }
      if (t.contains("linear_attn_config") && t["linear_attn_config"].is_object()) {
        const Json& lac = t["linear_attn_config"];
        const bool kda = one_based_member(config, lac, "kda_layers", layer);
        const bool full = one_based_member(config, lac, "full_attn_layers", layer);
        STRATA_CHECK(kda != full, config.path, ": layer ", layer, " (1-based ", layer + 1, ") is ",
                     kda ? "in both" : "in neither", " linear_attn_config.kda_layers and ",
                     "full_attn_layers");
        by_kda = kda;
      }
      STRATA_CHECK(
          by_list || by_kda, config.path,
          ": kimi_linear config has neither layer_types nor linear_attn_config.kda_layers; "
          "which layers are KDA is unknown");
      STRATA_CHECK(!by_list || !by_kda || *by_list == *by_kda, config.path, ": layer_types[", layer,
                   "] and linear_attn_config.kda_layers (1-based) disagree on layer ", layer);
      return by_list ? *by_list : *by_kda;
    }
  }
  STRATA_ASSERT(false, "unhandled ArchFamily ", static_cast<int>(arch.family));
}

int64_t layer_sliding_window(const ArchInfo& arch, const ModelConfig& config, int64_t layer) {
  switch (arch.family) {
    case ArchFamily::kLlama:
    case ArchFamily::kQwenMoe:
    case ArchFamily::kMixtral:
    case ArchFamily::kDeepseekV3:
    case ArchFamily::kDeepseekV32:
    case ArchFamily::kKimiLinear:
    case ArchFamily::kQwen3Next:
    case ArchFamily::kQwen35Moe:
    case ArchFamily::kGlm4Moe:
    case ArchFamily::kMiniMaxM2:
      return 0;
    case ArchFamily::kGptOss: {
      const Json& t = config.text;
      const bool sliding =
          t.contains("layer_types") && !t["layer_types"].is_null()
              ? layer_type_at(config, "layer_types", layer,
                              {"sliding_attention", "full_attention"}) == "sliding_attention"
              : layer % 2 == 0;
      if (!sliding) return 0;
      const bool have = t.contains("sliding_window") && t["sliding_window"].is_number_integer() &&
                        t["sliding_window"].get<int64_t>() > 0;
      STRATA_CHECK(have, config.path, ": layer ", layer,
                   " is a sliding_attention layer but sliding_window is not a positive integer");
      return t["sliding_window"].get<int64_t>();
    }
  }
  STRATA_ASSERT(false, "unhandled ArchFamily ", static_cast<int>(arch.family));
}

// ---- the name classifier -------------------------------------------------------------------

namespace {

enum class Match : uint8_t {
  kModule,         // pattern is a module: "<pattern>.<param>" with a linear layer's params
  kTensor,         // pattern is the whole tensor name
  kFusedExperts,   // pattern is a whole [E, out, in] expert tensor (transformers v5 layout)
  kFusedBias,      // the biases of fused experts [E, out] (gpt-oss)
  kFusedQuantAux,  // the scales of fused MXFP4 experts (gpt-oss)
};

struct NameRule {
  std::string_view pattern;  // '#' stands for a decimal index (an expert number)
  TensorKind kind;
  Match match;
};

using K = TensorKind;
using M = Match;

// Inside model.layers.N.
constexpr NameRule kLayerCommon[] = {
    {"input_layernorm.weight", K::kNorm, M::kTensor},
    {"post_attention_layernorm.weight", K::kNorm, M::kTensor},
    {"self_attn.rotary_emb.inv_freq", K::kOther, M::kTensor},
};
constexpr NameRule kGqaAttention[] = {
    {"self_attn.q_proj", K::kAttention, M::kModule},
    {"self_attn.k_proj", K::kAttention, M::kModule},
    {"self_attn.v_proj", K::kAttention, M::kModule},
    {"self_attn.o_proj", K::kAttention, M::kModule},
    {"self_attn.q_norm.weight", K::kNorm, M::kTensor},
    {"self_attn.k_norm.weight", K::kNorm, M::kTensor},
};
constexpr NameRule kDenseMlp[] = {
    {"mlp.gate_proj", K::kDenseMlp, M::kModule},
    {"mlp.up_proj", K::kDenseMlp, M::kModule},
    {"mlp.down_proj", K::kDenseMlp, M::kModule},
};
constexpr NameRule kFusedExperts[] = {
    {"mlp.experts.gate_up_proj", K::kRoutedExperts, M::kFusedExperts},
    {"mlp.experts.down_proj", K::kRoutedExperts, M::kFusedExperts},
};
constexpr NameRule kQwenMoe[] = {
    {"mlp.gate", K::kRouter, M::kModule},
    {"mlp.experts.#.gate_proj", K::kRoutedExperts, M::kModule},
    {"mlp.experts.#.up_proj", K::kRoutedExperts, M::kModule},
    {"mlp.experts.#.down_proj", K::kRoutedExperts, M::kModule},
    {"mlp.shared_expert.gate_proj", K::kSharedExperts, M::kModule},
    {"mlp.shared_expert.up_proj", K::kSharedExperts, M::kModule},
    {"mlp.shared_expert.down_proj", K::kSharedExperts, M::kModule},
    {"mlp.shared_expert_gate", K::kRouter, M::kModule},
};
constexpr NameRule kMixtralMoe[] = {
    {"block_sparse_moe.gate", K::kRouter, M::kModule},
    {"block_sparse_moe.experts.#.w1", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.experts.#.w2", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.experts.#.w3", K::kRoutedExperts, M::kModule},
};
// MiniMax-M2: Mixtral's names plus the routing bias, which sits beside the router.
constexpr NameRule kMiniMaxM2Moe[] = {
    {"block_sparse_moe.gate", K::kRouter, M::kModule},
    {"block_sparse_moe.e_score_correction_bias", K::kRouter, M::kTensor},
    {"block_sparse_moe.experts.#.w1", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.experts.#.w2", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.experts.#.w3", K::kRoutedExperts, M::kModule},
};
constexpr NameRule kMla[] = {
    {"self_attn.q_proj", K::kAttention, M::kModule},  // q_lora_rank null
    {"self_attn.q_a_proj", K::kAttention, M::kModule},
    {"self_attn.q_a_layernorm.weight", K::kNorm, M::kTensor},
    {"self_attn.q_b_proj", K::kAttention, M::kModule},
    {"self_attn.kv_a_proj_with_mqa", K::kAttention, M::kModule},
    {"self_attn.kv_a_layernorm.weight", K::kNorm, M::kTensor},
    {"self_attn.kv_b_proj", K::kAttention, M::kModule},
    {"self_attn.o_proj", K::kAttention, M::kModule},
};
// DeepSeek-V3.2's lightning indexer, beside MLA (kMla).
constexpr NameRule kMlaIndexer[] = {
    {"self_attn.indexer.wq_b", K::kAttention, M::kModule},
    {"self_attn.indexer.wk", K::kAttention, M::kModule},
    {"self_attn.indexer.k_norm.weight", K::kNorm, M::kTensor},
    {"self_attn.indexer.k_norm.bias", K::kNorm, M::kTensor},
    {"self_attn.indexer.weights_proj", K::kAttention, M::kModule},
};
constexpr NameRule kDeepseekMoe[] = {
    {"mlp.gate", K::kRouter, M::kModule},
    {"mlp.gate.e_score_correction_bias", K::kRouter, M::kTensor},
    {"mlp.experts.#.gate_proj", K::kRoutedExperts, M::kModule},
    {"mlp.experts.#.up_proj", K::kRoutedExperts, M::kModule},
    {"mlp.experts.#.down_proj", K::kRoutedExperts, M::kModule},
    {"mlp.shared_experts.gate_proj", K::kSharedExperts, M::kModule},
    {"mlp.shared_experts.up_proj", K::kSharedExperts, M::kModule},
    {"mlp.shared_experts.down_proj", K::kSharedExperts, M::kModule},
};
// Kimi-Linear: KDA layers and MLA layers (q_lora_rank null) share self_attn.
constexpr NameRule kKimiLinearAttention[] = {
    {"self_attn.q_proj", K::kAttention, M::kModule},
    {"self_attn.k_proj", K::kAttention, M::kModule},
    {"self_attn.v_proj", K::kAttention, M::kModule},
    {"self_attn.o_proj", K::kAttention, M::kModule},
    {"self_attn.q_conv1d.weight", K::kAttention, M::kTensor},
    {"self_attn.k_conv1d.weight", K::kAttention, M::kTensor},
    {"self_attn.v_conv1d.weight", K::kAttention, M::kTensor},
    {"self_attn.f_a_proj", K::kAttention, M::kModule},
    {"self_attn.f_b_proj", K::kAttention, M::kModule},
    {"self_attn.b_proj", K::kAttention, M::kModule},
    {"self_attn.g_a_proj", K::kAttention, M::kModule},
    {"self_attn.g_b_proj", K::kAttention, M::kModule},
    {"self_attn.A_log", K::kAttention, M::kTensor},
    {"self_attn.dt_bias", K::kAttention, M::kTensor},
    {"self_attn.o_norm.weight", K::kNorm, M::kTensor},
    {"self_attn.kv_a_proj_with_mqa", K::kAttention, M::kModule},
    {"self_attn.kv_a_layernorm.weight", K::kNorm, M::kTensor},
    {"self_attn.kv_b_proj", K::kAttention, M::kModule},
};
// transformers 5.x save_pretrained renames every `mlp.` to `block_sparse_moe.`, the dense first
// layer's too; the hub checkpoints keep that layer under `mlp.`.
constexpr NameRule kKimiLinearDense[] = {
    {"mlp.gate_proj", K::kDenseMlp, M::kModule},
    {"mlp.up_proj", K::kDenseMlp, M::kModule},
    {"mlp.down_proj", K::kDenseMlp, M::kModule},
    {"block_sparse_moe.gate_proj", K::kDenseMlp, M::kModule},
    {"block_sparse_moe.up_proj", K::kDenseMlp, M::kModule},
    {"block_sparse_moe.down_proj", K::kDenseMlp, M::kModule},
};
constexpr NameRule kKimiLinearMoe[] = {
    {"block_sparse_moe.gate", K::kRouter, M::kModule},
    {"block_sparse_moe.gate.e_score_correction_bias", K::kRouter, M::kTensor},
    {"block_sparse_moe.experts.#.w1", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.experts.#.w2", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.experts.#.w3", K::kRoutedExperts, M::kModule},
    {"block_sparse_moe.shared_experts.gate_proj", K::kSharedExperts, M::kModule},
    {"block_sparse_moe.shared_experts.up_proj", K::kSharedExperts, M::kModule},
    {"block_sparse_moe.shared_experts.down_proj", K::kSharedExperts, M::kModule},
};
constexpr NameRule kGatedDeltaNet[] = {
    {"linear_attn.in_proj_qkvz", K::kAttention, M::kModule},
    {"linear_attn.in_proj_ba", K::kAttention, M::kModule},
    {"linear_attn.conv1d.weight", K::kAttention, M::kTensor},
    {"linear_attn.A_log", K::kAttention, M::kTensor},
    {"linear_attn.dt_bias", K::kAttention, M::kTensor},
    {"linear_attn.norm.weight", K::kNorm, M::kTensor},
    {"linear_attn.out_proj", K::kAttention, M::kModule},
};
// Qwen3.5: the Gated DeltaNet with its input projections apart (qkv, z, b, a).
constexpr NameRule kGatedDeltaNetSplit[] = {
    {"linear_attn.in_proj_qkv", K::kAttention, M::kModule},
    {"linear_attn.in_proj_z", K::kAttention, M::kModule},
    {"linear_attn.in_proj_b", K::kAttention, M::kModule},
    {"linear_attn.in_proj_a", K::kAttention, M::kModule},
    {"linear_attn.conv1d.weight", K::kAttention, M::kTensor},
    {"linear_attn.A_log", K::kAttention, M::kTensor},
    {"linear_attn.dt_bias", K::kAttention, M::kTensor},
    {"linear_attn.norm.weight", K::kNorm, M::kTensor},
    {"linear_attn.out_proj", K::kAttention, M::kModule},
};

// gpt-oss: attention with biases and sinks, the router with a bias, the experts fused on disk
// (bf16 or MXFP4) and per expert as the forward and the plan read them.
constexpr NameRule kGptOssAttention[] = {
    {"self_attn.q_proj", K::kAttention, M::kModule},
    {"self_attn.k_proj", K::kAttention, M::kModule},
    {"self_attn.v_proj", K::kAttention, M::kModule},
    {"self_attn.o_proj", K::kAttention, M::kModule},
    {"self_attn.sinks", K::kAttention, M::kTensor},
};
constexpr NameRule kGptOssMoe[] = {
    {"mlp.router", K::kRouter, M::kModule},
    {"mlp.experts.gate_up_proj", K::kRoutedExperts, M::kFusedExperts},
    {"mlp.experts.down_proj", K::kRoutedExperts, M::kFusedExperts},
    {"mlp.experts.gate_up_proj_blocks", K::kRoutedExperts, M::kFusedExperts},
    {"mlp.experts.down_proj_blocks", K::kRoutedExperts, M::kFusedExperts},
    {"mlp.experts.gate_up_proj_scales", K::kRoutedExperts, M::kFusedQuantAux},
    {"mlp.experts.down_proj_scales", K::kRoutedExperts, M::kFusedQuantAux},
    {"mlp.experts.gate_up_proj_bias", K::kRoutedExperts, M::kFusedBias},
    {"mlp.experts.down_proj_bias", K::kRoutedExperts, M::kFusedBias},
    {"mlp.experts.#.gate_up_proj", K::kRoutedExperts, M::kModule},
    {"mlp.experts.#.down_proj", K::kRoutedExperts, M::kModule},
};

// Outside the decoder layers (after any multimodal prefix is removed).
constexpr NameRule kTopLevel[] = {
    {"model.embed_tokens.weight", K::kEmbedding, M::kTensor},
    {"model.norm.weight", K::kNorm, M::kTensor},
    {"model.rotary_emb.inv_freq", K::kOther, M::kTensor},
    {"lm_head", K::kLmHead, M::kModule},
};

using RuleSet = std::span<const NameRule>;

std::array<RuleSet, 6> layer_rules(ArchFamily family) {
  switch (family) {
    case ArchFamily::kLlama:
      return {kLayerCommon, kGqaAttention, kDenseMlp, {}, {}, {}};
    case ArchFamily::kQwenMoe:
      return {kLayerCommon, kGqaAttention, kDenseMlp, kQwenMoe, kFusedExperts, {}};
    case ArchFamily::kMixtral:
      return {kLayerCommon, kGqaAttention, kMixtralMoe, kFusedExperts, {}, {}};
    case ArchFamily::kDeepseekV3:
      return {kLayerCommon, kMla, kDenseMlp, kDeepseekMoe, kFusedExperts, {}};
    case ArchFamily::kDeepseekV32:
      return {kLayerCommon, kMla, kMlaIndexer, kDenseMlp, kDeepseekMoe, kFusedExperts};
    case ArchFamily::kKimiLinear:
      return {kLayerCommon, kKimiLinearAttention, kKimiLinearDense, kKimiLinearMoe, {}, {}};
    case ArchFamily::kQwen3Next:
      // Qwen3-Next has both attention kinds; kQwenMoe carries its shared expert and gate.
      return {kLayerCommon, kGqaAttention, kGatedDeltaNet, kDenseMlp, kQwenMoe, kFusedExperts};
    case ArchFamily::kQwen35Moe:
      // Qwen3.5's hub checkpoints keep the routed experts fused (mlp.experts.gate_up_proj).
      return {kLayerCommon, kGqaAttention, kGatedDeltaNetSplit, kQwenMoe, kFusedExperts, {}};
    case ArchFamily::kGlm4Moe:
      return {kLayerCommon, kGqaAttention, kDenseMlp, kDeepseekMoe, kFusedExperts, {}};
    case ArchFamily::kMiniMaxM2:
      return {kLayerCommon, kGqaAttention, kMiniMaxM2Moe, kFusedExperts, {}, {}};
    case ArchFamily::kGptOss:
      return {kLayerCommon, kGptOssAttention, kGptOssMoe, {}, {}, {}};
  }
  STRATA_ASSERT(false, "unhandled ArchFamily ", static_cast<int>(family));
}

// Matches `pattern` ('#' = one or more decimal digits) against all of `s`.
bool match_pattern(std::string_view pattern, std::string_view s) {
  size_t i = 0;
  for (char p : pattern) {
    if (p == '#') {
      size_t start = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9')
        ++i;
      if (i == start) return false;
      continue;
    }
    if (i >= s.size() || s[i] != p) return false;
    ++i;
  }
  return i == s.size();
}

// Parameters a linear module may carry, and what each is.
bool module_param_role(std::string_view param, TensorRole* role) {
  if (param == "weight" || param == "weight_packed" || param == "weight_blocks") {
    *role = TensorRole::kLinearWeight;
    return true;
  }
  if (param == "bias") {
    *role = TensorRole::kBias;
    return true;
  }
  static constexpr std::string_view kAux[] = {
      "weight_scale_inv",  "weight_scale", "weight_scale_2", "input_scale", "weight_shape",
      "weight_zero_point", "weight_g_idx", "k_scale",        "v_scale",     "weight_scales",
  };
  for (std::string_view a : kAux) {
    if (param == a) {
      *role = TensorRole::kQuantAux;
      return true;
    }
  }
  return false;
}

bool match_rule(const NameRule& rule, std::string_view name, TensorClass* out) {
  switch (rule.match) {
    case Match::kTensor:
      if (!match_pattern(rule.pattern, name)) return false;
      out->kind = rule.kind;
      out->role = TensorRole::kParam;
      return true;
    case Match::kFusedExperts:
    case Match::kFusedBias:
    case Match::kFusedQuantAux:
      if (!match_pattern(rule.pattern, name)) return false;
      out->kind = rule.kind;
      out->role = rule.match == Match::kFusedExperts ? TensorRole::kLinearWeight
                  : rule.match == Match::kFusedBias  ? TensorRole::kBias
                                                     : TensorRole::kQuantAux;
      return true;
    case Match::kModule: {
      size_t dot = name.rfind('.');
      if (dot == std::string_view::npos) return false;
      TensorRole role;
      if (!module_param_role(name.substr(dot + 1), &role)) return false;
      if (!match_pattern(rule.pattern, name.substr(0, dot))) return false;
      out->kind = rule.kind;
      out->role = role;
      return true;
    }
  }
  STRATA_ASSERT(false, "unhandled Match ", static_cast<int>(rule.match));
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Parses "N.rest" with N a decimal without leading zeros; false when malformed.
bool split_layer(std::string_view s, int64_t* layer, std::string_view* rest) {
  size_t i = 0;
  int64_t n = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i < 9) {
    n = n * 10 + (s[i] - '0');
    ++i;
  }
  if (i == 0 || i >= s.size() || s[i] != '.') return false;
  if (i > 1 && s[0] == '0') return false;
  *layer = n;
  *rest = s.substr(i + 1);
  return !rest->empty();
}

}  // namespace

bool tensor_kept_in_fp32(const ArchInfo& arch, std::string_view name) {
  switch (arch.family) {
    case ArchFamily::kDeepseekV3:
    case ArchFamily::kDeepseekV32:
    case ArchFamily::kGlm4Moe:
      return name.ends_with(".e_score_correction_bias") &&
             classify_tensor(arch, name).kind == TensorKind::kRouter;
    case ArchFamily::kLlama:
    case ArchFamily::kQwenMoe:
    case ArchFamily::kMixtral:
    case ArchFamily::kKimiLinear:
    case ArchFamily::kQwen3Next:
    case ArchFamily::kQwen35Moe:
    case ArchFamily::kMiniMaxM2:
    case ArchFamily::kGptOss:
      return false;
  }
  return false;
}

TensorClass classify_tensor(const ArchInfo& arch, std::string_view name) {
  TensorClass out;
  // Qwen3-Next's and Qwen3.5's MTP module sits at the top level, beside any wrapper prefix. Its
  // linear weights (mtp.fc, and in mtp.layers.N. what the decoder layer's rules call one) have
  // that role, so that the export lists them in exclude_modules (`mtp.*`), as ModelOpt does.
  if ((arch.family == ArchFamily::kQwen3Next || arch.family == ArchFamily::kQwen35Moe) &&
      starts_with(name, "mtp.")) {
    out.kind = TensorKind::kMtp;
    const std::string_view rest = name.substr(4);
    int64_t layer = -1;
    std::string_view inner;
    TensorClass found;
    if (rest == "fc.weight") {
      out.role = TensorRole::kLinearWeight;
    } else if (starts_with(rest, "layers.") && split_layer(rest.substr(7), &layer, &inner)) {
      for (RuleSet rules : layer_rules(arch.family)) {
        for (const NameRule& rule : rules) {
          if (match_rule(rule, inner, &found)) {
            out.role = found.role;
            return out;
          }
        }
      }
    }
    return out;
  }
  std::string normalized;  // the language model's name without a multimodal prefix
  if (arch.multimodal && !arch.lm_prefix.empty()) {
    // The prefixes resolve_wrapper_prefixes found; the tower and projector under any wrapper
    // prefix of at most kMaxWrapperDepth components.
    if (starts_with(name, arch.lm_prefix)) {
      normalized = "model." + std::string(name.substr(arch.lm_prefix.size()));
    } else if (starts_with(name, arch.head_prefix + "lm_head.")) {
      normalized = std::string(name.substr(arch.head_prefix.size()));
    } else {
      size_t at = 0;
      for (int depth = 0; depth <= kMaxWrapperDepth; ++depth) {
        const std::string_view rest = name.substr(at);
        for (std::string_view v : {"vision_tower.", "visual.", "vision_model."}) {
          if (starts_with(rest, v)) {
            out.kind = TensorKind::kVision;
            return out;
          }
        }
        for (std::string_view v : {"multi_modal_projector.", "mm_projector."}) {
          if (starts_with(rest, v)) {
            out.kind = TensorKind::kProjector;
            return out;
          }
        }
        const size_t dot = name.find('.', at);
        if (dot == std::string_view::npos) break;
        at = dot + 1;
      }
      return out;
    }
    name = normalized;
  } else if (arch.multimodal) {
    if (starts_with(name, "vision_tower.") || starts_with(name, "model.vision_tower.")) {
      out.kind = TensorKind::kVision;
      return out;
    }
    if (starts_with(name, "multi_modal_projector.") ||
        starts_with(name, "model.multi_modal_projector.") || starts_with(name, "mm_projector.")) {
      out.kind = TensorKind::kProjector;
      return out;
    }
    if (starts_with(name, "language_model.model.")) {
      normalized =
          "model." + std::string(name.substr(std::string_view("language_model.model.").size()));
    } else if (starts_with(name, "language_model.lm_head.")) {
      normalized = std::string(name.substr(std::string_view("language_model.").size()));
    } else if (starts_with(name, "model.language_model.")) {
      normalized =
          "model." + std::string(name.substr(std::string_view("model.language_model.").size()));
    } else if (starts_with(name, "lm_head.")) {
      normalized = std::string(name);
    } else {
      return out;  // unrecognized: a wrapper's language model lives under a prefix
    }
    name = normalized;
  }

  constexpr std::string_view kLayers = "model.layers.";
  if (starts_with(name, kLayers)) {
    int64_t layer = -1;
    std::string_view rest;
    if (!split_layer(name.substr(kLayers.size()), &layer, &rest)) return out;
    TensorClass found;
    bool matched = false;
    // FP8 KV-cache scales of an export (format.md §3) carry this name form in every family,
    // MLA included (which has no k_proj / v_proj module of its own).
    if (rest == "self_attn.k_proj.k_scale" || rest == "self_attn.v_proj.v_scale") {
      found.kind = TensorKind::kAttention;
      found.role = TensorRole::kQuantAux;
      matched = true;
    }
    for (RuleSet rules : layer_rules(arch.family)) {
      if (matched) break;
      for (const NameRule& rule : rules) {
        if (match_rule(rule, rest, &found)) {
          matched = true;
          break;
        }
      }
      if (matched) break;
    }
    if (layer >= arch.num_hidden_layers) {
      // DeepSeek's (V3, V3.2) and GLM-4.5's MTP layers follow the decoder layers and carry extra
      // modules (enorm, hnorm, eh_proj, shared_head, embed_tokens); any other family has no layer
      // there.
      if (arch.family != ArchFamily::kDeepseekV3 && arch.family != ArchFamily::kDeepseekV32 &&
          arch.family != ArchFamily::kGlm4Moe)
        return out;
      out.kind = TensorKind::kMtp;
      out.role = matched ? found.role : TensorRole::kParam;
      out.layer = layer;
      return out;
    }
    if (!matched) return out;
    found.layer = layer;
    return found;
  }

  for (const NameRule& rule : kTopLevel) {
    if (match_rule(rule, name, &out)) return out;
  }
  return TensorClass{};
}

}  // namespace strata
