// Kimi-Linear's settings read from the config and checkpoint, shared by the CPU forward
// (model/kimi_linear.cpp) and the GPU forward (model/cuda/gpu_forward.cpp), so that both run the
// same shapes and routing. Math: spec/architectures.md §4 and the header of kimi_linear.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/deepseek_v3.h"

namespace strata::model {

// The KDA layers' shape: n_heads heads of head_dim key (= value) channels, short convolutions of
// conv_kernel taps. Each is spelled flat (transformers 5.x) or under linear_attn_config.
struct KdaShape {
  int64_t n_heads = 0, head_dim = 0, conv_kernel = 0;
};
KdaShape kda_shape(const ModelConfig& c);

// The MoE layers' routing and sizes (num_expert_group or n_group, topk_group,
// routed_scaling_factor, norm_topk_prob, moe_intermediate_size, n_shared_experts); fails on a
// use_grouped_topk false with several groups.
SigmoidMoeConfig kimi_linear_moe_config(const ModelConfig& c);

// The module prefix of a dense layer's SwiGLU: layer_prefix + "mlp." as on the hub, or
// layer_prefix + "block_sparse_moe." where transformers 5.x save_pretrained renamed it.
std::string kimi_linear_dense_prefix(const Checkpoint& ckpt, const std::string& layer_prefix);

}  // namespace strata::model
