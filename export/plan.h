// The quantization plan: every linear module of the checkpoint with the format its recipe gives
// it, checked before any work (formats a shape cannot take, fused groups split across formats,
// rules that match nothing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/source_weights.h"
#include "model/arch.h"
#include "quant/recipe.h"

namespace strata {

struct PlannedModule {
  std::string module;  // hub name, e.g. "model.layers.0.self_attn.q_proj"
  QFormat format = QFormat::kNone;
  int rule = -1;       // deciding rule in Recipe::rules, -1 when none matched
  int64_t layer = -1;  // decoder layer, -1 outside
  TensorKind kind = TensorKind::kUnrecognized;
  DType dtype = DType::kBF16;  // as read: bf16 for a compressed source (decompressed)
  Shape shape;                 // of the weight, [out, in]
  SourceCompression source = SourceCompression::kNone;  // how the source stores it
};

struct QuantPlan {
  Recipe recipe;
  std::vector<PlannedModule> modules;  // sorted by name
  std::vector<int64_t> kv_layers;      // decoder layers that get FP8 k/v scales
  int64_t num_layers = 0;
  std::vector<std::string> warnings;  // rules that matched nothing, ...

  const PlannedModule* find(std::string_view module) const;
  // "NVFP4", "FP8", ... or "MIXED_PRECISION"; "" when nothing is quantized.
  std::string quant_algo() const;
};

// Checks the source's own quantization_config against what strata decompresses
// (io/source_weights.h): DeepSeek-style fp8 with 128x128 blocks, compressed-tensors
// pack-quantized symmetric INT4 with group-wise scales, mxfp4; a module stored compressed that the
// config's ignore list names, or an INT4 group size the config does not declare, is an error.
// A checkpoint without quantization_config passes (its layouts are detected from the tensors).
void check_source_quantization(const ModelConfig& config, const Checkpoint& ckpt,
                               const std::vector<PlannedModule>& modules);

// Builds and checks the plan. Throws strata::Error naming the rule and module when the recipe
// cannot apply (an input width the format cannot take, a fused group given two formats, a
// weight that is not 2-D floating).
QuantPlan make_plan(const ModelConfig& config, const Checkpoint& ckpt, const Recipe& recipe);

// Why make_plan refuses tensor `name` as it is stored (a layout strata does not read: fused
// expert tensors left fused by io/fused_experts.h, a per-expert view of a fused tensor under
// names the family does not use), or "" when it takes it; `strata inspect` lists these.
std::string tensor_layout_refusal(const ArchInfo& arch, const Checkpoint& ckpt,
                                  const std::string& name);

}  // namespace strata
