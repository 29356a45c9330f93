// Which linear modules consumers fuse, and so must share formats and scales
// (spec/format.md §4), by hub module name:
//   <p>.q_proj, k_proj, v_proj                       -> "<p>.{q,k,v}_proj"      (qkv_proj)
//   <p>.gate_proj, up_proj                           -> "<p>.{gate,up}_proj"    (gate_up_proj;
//   dense,
//                                                       shared experts, each routed expert)
//   <p>.w1, w3                                       -> "<p>.{w1,w3}"           (Mixtral w13)
//   <p>.q_a_proj, kv_a_proj_with_mqa                 -> "<p>.{q_a_proj,kv_a_proj_with_mqa}"
//   <p>.in_proj_qkv, in_proj_z                       -> "<p>.{in_proj_qkv,in_proj_z}"
//   <p>.in_proj_b, in_proj_a                         -> "<p>.{in_proj_b,in_proj_a}"
//                                                       (Qwen3.5's Gated DeltaNet: vLLM loads them
//                                                       as in_proj_qkvz and in_proj_ba)
// Any other module is its own group (the key is its name).
//
// Scales are shared more widely, by every quantized linear that reads the same input tensor, as
// ModelOpt 0.47's export fuses them for NVFP4 (unified_export_hf.py _fuse_shared_input_modules,
// grouping the enabled quantized linears by the identity of their input in a dummy forward; FP8 is
// not fused there). Within an attention block the projections that read the block's input are
//   <p>.q_proj, k_proj, v_proj, q_a_proj, kv_a_proj_with_mqa (MLA with or without q LoRA),
//   f_a_proj, g_a_proj, b_proj (Kimi-Linear KDA),
//   indexer.wk, indexer.weights_proj (DeepSeek-V3.2) -> "<p>.{attention input}"
//   <p>.q_b_proj, indexer.wq_b (MLA's q LoRA output) -> "<p>.{q_b_proj input}"
// and any other module shares with its fused group (shared_input_group_key).
//
// Routed experts also share the input scale of each projection across the experts of a layer:
//   <p>.experts.E.{gate_proj,up_proj,w1,w3}          -> "<p>.experts.*.gate_up"
//   <p>.experts.E.{down_proj,w2}                     -> "<p>.experts.*.down"
#pragma once

#include <string>
#include <string_view>

namespace strata {

// The fused group a module belongs to (weights share NVFP4 weight_scale_2 in a group).
std::string fused_group_key(std::string_view module);
// The modules reading the same input as `module` (see the top): the attention-input key for
// the projections listed there, else fused_group_key.
std::string shared_input_group_key(std::string_view module);
// The group whose members share one input scale: the MoE layer-wide key for routed experts,
// else shared_input_group_key.
std::string input_scale_group_key(std::string_view module);
// Index of a routed expert ("...experts.17.down_proj" -> 17), or -1.
int64_t routed_expert_index(std::string_view module);

}  // namespace strata
