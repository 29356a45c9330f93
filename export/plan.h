// The quantization plan: every linear module of the checkpoint with the format its recipe gives
// it, checked before any work (formats a shape cannot take, fused groups split across formats,
// rules that match nothing).
#pragma once

#include <cstdint>
#include <optional>
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
  int rule = -1;  // deciding rule in Recipe::rules, -1 when none matched
  // The deciding format rule's input_amax: a constant activation amax instead of a calibrated
  // one (NVFP4/FP8 input scale from it; no calibration needed for this module).
  std::optional<float> input_amax;
  int64_t layer = -1;  // decoder layer, -1 outside
  TensorKind kind = TensorKind::kUnrecognized;
  DType dtype = DType::kBF16;  // as read: bf16 for a compressed source (decompressed)
  Shape shape;                 // of the weight, [out, in]
  SourceCompression source = SourceCompression::kNone;  // how the source stores it
  int64_t source_group = 0;  // its group (SourceWeight::group): INT4 group, FP8 block, MXFP4 block
};

struct QuantPlan {
  Recipe recipe;
  std::vector<PlannedModule> modules;  // sorted by name
  std::vector<int64_t> kv_layers;      // decoder layers that get k/v scales (calibrated KV modes)
  int64_t num_layers = 0;
  std::vector<std::string> warnings;  // rules that matched nothing, ...
  // gpt-oss (docs/QUANTIZE.md "gpt-oss"): the routed experts are planned one module per expert
  // and projection but written fused, as ModelOpt writes transformers' fused parameters; all
  // experts of one projection in a layer then share the weight amax (NVFP4 weight_scale_2, FP8
  // weight_scale) and all routed experts of a layer one format.
  bool fused_experts = false;
  // Modules without a linear weight that ModelOpt 0.47 still lists in exclude_modules, because
  // it gives every one of them a quantizer and disables it (its get_quant_config lists a module
  // with any quantizer): the token embedding, and lm_head when it is tied to the embedding (an
  // untied lm_head is a planned module). Names as the checkpoint's (model.embed_tokens).
  std::vector<std::string> excluded_extra;

  const PlannedModule* find(std::string_view module) const;
  // "NVFP4", "FP8", ... or "MIXED_PRECISION"; "" when nothing is quantized.
  std::string quant_algo() const;
};

// The group whose members share one weight amax (NVFP4 weight_scale_2; FP8 weight_scale where
// fp8_shares_weight_amax): the modules of model/groups.h shared_input_group_key given the same
// format by the plan (ModelOpt fuses only the enabled quantizers reading one input), or for a
// routed expert of a fused-experts plan all experts of its projection in the layer
// ("<p>.experts.*.gate_up"). The key ends in "#<format>".
std::string weight_group_key(const QuantPlan& plan, std::string_view module);
// The group whose members share one input scale: a routed expert's layer-wide
// input_scale_group_key, else the shared-input group's members of the module's format.
std::string input_group_key(const QuantPlan& plan, std::string_view module);
// Whether an FP8 module takes its weight scale from its weight_group_key group's amax rather than
// its own: every routed expert. ModelOpt 0.47 quantizes transformers 5's fused experts (every MoE
// family here: gate_up_proj [E, 2I, H]) with one weight quantizer per expert over gate and up
// (modelopt/torch/quantization/plugins/huggingface.py _QuantFusedExperts; for per-expert
// nn.Linear experts export/layer_utils.py sync_moe_gate_up_amax does the same), so each expert's
// gate_proj and up_proj share one FP8 weight_scale, and a fused-experts plan's experts of one
// projection share the layer's. Dense MLPs and shared experts keep one per module.
bool fp8_shares_weight_amax(std::string_view module);
// A fused-experts plan's routed expert "<p>.experts.E.<proj>" as its consumers name it, the
// layer's experts module "<p>.experts"; any other module's own name.
std::string consumer_module(const QuantPlan& plan, const std::string& module);

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
// The same for a tensor already classified: c = classify_tensor(arch, name).
std::string tensor_layout_refusal(const ArchInfo& arch, const Checkpoint& ckpt,
                                  const std::string& name, const TensorClass& c);

}  // namespace strata
