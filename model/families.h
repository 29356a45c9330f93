// One decoder-layer builder per architecture family (one file each: llama.cpp, qwen_moe.cpp,
// ...). forward.cpp dispatches on ArchFamily; adding a family adds one file and one case there.
#pragma once

#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"

namespace strata::model {

struct LayerContext {
  const ModelConfig& config;
  const Checkpoint& ckpt;
  std::string prefix;  // "model.layers.N."
  int64_t index;
  ExpertExchange* experts = nullptr;  // ForwardOptions::experts
};

// Llama, Mistral, Qwen2, Qwen3: GQA attention (+ q/k norm) and a dense SwiGLU MLP.
std::unique_ptr<DecoderLayer> make_llama_layer(const LayerContext& ctx);
// Qwen2-MoE, Qwen3-MoE: GQA attention and a softmax-routed MoE (or a dense MLP on the layers
// the config keeps dense).
std::unique_ptr<DecoderLayer> make_qwen_moe_layer(const LayerContext& ctx);

// DeepSeek-V3, Kimi-K2: MLA attention and a sigmoid-routed (noaux_tc) MoE with shared experts.
std::unique_ptr<DecoderLayer> make_deepseek_v3_layer(const LayerContext& ctx);

// Kimi-Linear: KDA or NoPE MLA attention; a dense SwiGLU or the DeepSeek-style MoE.
std::unique_ptr<DecoderLayer> make_kimi_linear_layer(const LayerContext& ctx);

// Stop with a strata::Error when config.json asks for math the family does not implement.
void check_llama_config(const ModelConfig& config);
void check_deepseek_v3_config(const ModelConfig& config);
void check_kimi_linear_config(const ModelConfig& config);

}  // namespace strata::model
