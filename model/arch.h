// Which architectures strata knows, and what each checkpoint tensor name means.
//
// A `model_type` (config.json) maps to an architecture family: the families share checkpoint
// naming, and later their layer forward. Names are the checkpoint's own hub names
// (../shared/spec/architectures.md); per family, the decoder-layer names recognised are:
//
//   every family   model.embed_tokens.weight, model.norm.weight, lm_head.weight,
//                  model.layers.N.{input_layernorm,post_attention_layernorm}.weight
//   kLlama         self_attn.{q,k,v,o}_proj (weight, bias), self_attn.{q,k}_norm (Qwen3),
//                  mlp.{gate,up,down}_proj
//   kQwenMoe       kLlama's attention; mlp.gate (router), mlp.experts.E.{gate,up,down}_proj,
//                  mlp.shared_expert.{gate,up,down}_proj + mlp.shared_expert_gate (Qwen2-MoE),
//                  mlp.{gate,up,down}_proj (layers in mlp_only_layers)
//   kMixtral       kLlama's attention; block_sparse_moe.gate, block_sparse_moe.experts.E.w1/w2/w3
//   kDeepseekV3    MLA self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj},
//                  self_attn.{kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj};
//                  mlp.{gate,up,down}_proj (first dense layers), mlp.gate (+
//                  e_score_correction_bias), mlp.experts.E.*, mlp.shared_experts.*; layers N >=
//                  num_hidden_layers are MTP
//   kKimiLinear    KDA self_attn.{q,k,v,o}_proj, {q,k,v}_conv1d, f_a/f_b/b/g_a/g_b_proj, A_log,
//                  dt_bias, o_norm; MLA self_attn.{q_proj, kv_a_proj_with_mqa, kv_a_layernorm,
//                  kv_b_proj}; block_sparse_moe.{gate (+ e_score_correction_bias),
//                  experts.E.w1/w2/w3, shared_experts.*}; the dense layers' mlp.{gate,up,down}_proj
//                  (hub) or block_sparse_moe.{gate,up,down}_proj (transformers 5.x save_pretrained)
//   kQwen3Next     kLlama's attention with q/k norms (q_proj also gives the output gate);
//                  linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias, norm, out_proj};
//                  kQwenMoe's MoE names; mtp.* is MTP
//   kQwen35Moe     kQwen3Next's, the Gated DeltaNet's inputs apart: linear_attn.{in_proj_qkv,
//                  in_proj_z, in_proj_b, in_proj_a}; every layer MoE (fused experts on the hub);
//                  the wrapper qwen3_5_moe keeps it under model.language_model., its vision tower
//                  under model.visual.; mtp.* (top level) is MTP
//   kGlm4Moe       kLlama's attention (biases, q/k norms); kDeepseekV3's dense and MoE names
//                  (mlp.gate + e_score_correction_bias, mlp.experts.E.*, mlp.shared_experts.*);
//                  layers N >= num_hidden_layers are MTP
//   kMiniMaxM2     kLlama's attention (q_norm / k_norm over all heads); block_sparse_moe.gate,
//                  block_sparse_moe.e_score_correction_bias, block_sparse_moe.experts.E.w1/w2/w3
//   kGptOss        self_attn.{q,k,v,o}_proj (weight, bias), self_attn.sinks; mlp.router (weight,
//                  bias); one module per expert and projection as the forward reads them,
//                  mlp.experts.E.{gate_up_proj [2I, H] (gate/up rows interleaved), down_proj},
//                  and the fused tensors the checkpoint stores (served per expert, see below):
//                  mlp.experts.{gate_up_proj, down_proj} [E, in, out] (bf16) or their MXFP4
//                  `_blocks`/`_scales`, with mlp.experts.{gate_up_proj,down_proj}_bias [E, out]
//   kDeepseekV32   kDeepseekV3's names plus the lightning indexer's self_attn.indexer.{wq_b, wk,
//                  k_norm (weight, bias), weights_proj}
//
// The MoE families also name transformers v5's fused `mlp.experts.gate_up_proj` [E, 2I, H] and
// `mlp.experts.down_proj` [E, H, I]; opening a checkpoint serves that layout (and gpt-oss's) per
// expert (io/fused_experts.h), so these names remain only where it is left fused (and refused).
// Multimodal wrappers (kimi_vl, kimi_k25, qwen3_5_moe) keep the language model under
// `language_model.model.` / `language_model.lm_head.` (or `model.language_model.`), the vision
// tower under `vision_tower.` (or `visual.`, `vision_model.`) and the projector under
// `multi_modal_projector.` or `mm_projector.`; their family comes from text_config's model_type.
//
// Parameters of quantized sources (`weight_scale_inv`, `weight_packed`, `weight_scale`,
// `weight_blocks`, `weight_scales` (MXFP4), `weight_shape`, `weight_zero_point`, `weight_g_idx`,
// `input_scale`, `weight_scale_2`, `k_scale`, `v_scale`) are recognised on every linear module.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/hf_config.h"

namespace strata {

enum class ArchFamily : uint8_t {
  kLlama,        // llama, mistral, qwen2, qwen3
  kQwenMoe,      // qwen2_moe, qwen3_moe
  kMixtral,      // mixtral
  kDeepseekV3,   // deepseek_v3, kimi_k2
  kKimiLinear,   // kimi_linear
  kQwen3Next,    // qwen3_next
  kQwen35Moe,    // qwen3_5_moe_text, and the multimodal wrapper qwen3_5_moe
  kGlm4Moe,      // glm4_moe
  kMiniMaxM2,    // minimax_m2
  kGptOss,       // gpt_oss
  kDeepseekV32,  // deepseek_v32
};

std::string_view arch_family_name(ArchFamily family);  // "llama", "deepseek_v3", ...

struct ArchEntry {
  std::string_view model_type;
  ArchFamily family;  // for a wrapper: the family its text model is expected to have
  bool multimodal;    // a wrapper whose family is read from text_config.model_type
};

// Every model_type strata knows, in a fixed order.
std::span<const ArchEntry> known_archs();
// nullptr when unknown.
const ArchEntry* find_arch(std::string_view model_type);

// What a checkpoint is, resolved from its config.
struct ArchInfo {
  ArchFamily family = ArchFamily::kLlama;
  bool multimodal = false;
  int64_t num_hidden_layers = 0;  // the language model's
  // Multimodal wrappers, found in the checkpoint's names by resolve_wrapper_prefixes: the
  // language model's decoder lives under `lm_prefix` (`<lm_prefix>layers.N.`,
  // `<lm_prefix>embed_tokens.weight`, `<lm_prefix>norm.weight`) and its head at
  // `<head_prefix>lm_head.weight`. Empty: the fixed wrapper layouts listed above.
  std::string lm_prefix, head_prefix;
};

// How many wrapper levels resolve_wrapper_prefixes unwraps at most (a prefix of more
// dot-separated components is refused).
inline constexpr int kMaxWrapperDepth = 4;

// Finds where a multimodal wrapper keeps its language model, however it is nested (up to
// kMaxWrapperDepth components): the one `<P>embed_tokens.weight` whose P is a chain of
// non-numeric components with `<P>layers.` tensors beside it, and the one `<Q>lm_head.weight`
// (absent when tied). None, two candidates, or a deeper nesting is a strata::Error naming `what`
// (the checkpoint) and the names found. Sets arch.lm_prefix / arch.head_prefix; a no-op for a
// checkpoint that is not multimodal.
void resolve_wrapper_prefixes(ArchInfo& arch, const std::vector<std::string>& names,
                              const std::string& what);

// Resolves a config: an unknown model_type, or a wrapper whose text model_type is unknown, is a
// strata::Error naming config.path and the key.
ArchInfo resolve_arch(const ModelConfig& config);

enum class TensorKind : uint8_t {
  kAttention,      // attention / linear-attention mixers (projections, convs, gates)
  kDenseMlp,       // a dense SwiGLU MLP
  kRoutedExperts,  // MoE routed experts
  kSharedExperts,  // MoE shared experts
  kRouter,         // MoE router weight and bias, the shared-expert gate
  kEmbedding,      // token embeddings
  kLmHead,         // the output head
  kNorm,           // RMSNorm / LayerNorm weights, incl. q/k norms and MLA latent norms
  kVision,         // the vision tower of a multimodal wrapper
  kProjector,      // the multimodal projector
  kMtp,            // multi-token-prediction layers (DeepSeek and GLM layers >= num_hidden_layers,
                   // Qwen3-Next's and Qwen3.5's mtp.*)
  kOther,          // recognised, none of the above (e.g. rotary_emb.inv_freq)
  kUnrecognized,
};
inline constexpr int kNumTensorKinds = static_cast<int>(TensorKind::kUnrecognized) + 1;

std::string_view tensor_kind_name(TensorKind kind);  // "attention", "dense_mlp", ...

// What a tensor is within its module.
enum class TensorRole : uint8_t {
  kLinearWeight,  // the [out, in] weight of a linear layer (or [E, out, in] fused experts), or a
                  // quantized source's packed weight (weight_packed, weight_blocks)
  kBias,          // a linear layer's bias
  kQuantAux,      // scales and metadata of an already-quantized source (weight_scale_inv, ...)
  kParam,         // anything else (norm weights, conv weights, A_log, router bias, ...)
};

struct TensorClass {
  TensorKind kind = TensorKind::kUnrecognized;
  TensorRole role = TensorRole::kParam;
  int64_t layer = -1;  // decoder layer index; -1 outside the decoder layers
};

TensorClass classify_tensor(const ArchInfo& arch, std::string_view name);

// Whether transformers holds checkpoint tensor `name` in fp32 whatever dtype the checkpoint stores
// (its model class's `_keep_in_fp32_modules_strict`), so that ModelOpt's export writes it as F32:
// the MoE router's e_score_correction_bias of DeepSeek-V3 (also Kimi-K2 and the text model of
// Kimi-K2.5) and GLM-4.5. Kimi-Linear's and MiniMax-M2's stay in the checkpoint's dtype, and so do
// MTP layers' (the HF model never loads them; ModelOpt copies them as stored).
bool tensor_kept_in_fp32(const ArchInfo& arch, std::string_view name);

// Whether the default recipes quantize the linear weights of this kind: attention, dense MLP,
// routed and shared experts. Routers, lm_head, embeddings, norms, the vision tower, the
// projector and MTP layers stay in their source dtype.
bool kind_is_quantized_by_default(TensorKind kind);

// Whether decoder layer `layer` has an MoE block (false for dense families), from the config
// fields architectures.md names for the family.
// Kimi-Linear: mlp_layer_types (transformers 5.x) or first_k_dense_replace / moe_layer_freq (the
// remote code); both present must agree.
bool layer_is_moe(const ArchInfo& arch, const ModelConfig& config, int64_t layer);

// Whether decoder layer `layer` is a linear-attention layer (Kimi-Linear KDA, Qwen3-Next and
// Qwen3.5 Gated DeltaNet): it has no KV cache, so no k/v scales. Kimi-Linear: layer_types
// (transformers 5.x) or linear_attn_config.kda_layers (1-based, the remote code); both present must
// agree, neither is an error.
bool layer_is_linear_attention(const ArchInfo& arch, const ModelConfig& config, int64_t layer);

// The sliding window (in tokens, the query's own included) of decoder layer `layer`'s attention;
// 0 when it attends to the whole causal prefix. gpt-oss: `sliding_window` on the layers whose
// layer_types entry is `sliding_attention` (without layer_types, transformers' default: the
// even layers); a sliding layer without a positive sliding_window is an error. Other families: 0.
int64_t layer_sliding_window(const ArchInfo& arch, const ModelConfig& config, int64_t layer);

}  // namespace strata
