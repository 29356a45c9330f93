// The name classifier against hand-written name lists, one per family (spec/architectures.md).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/json.h"
#include "model/arch.h"
#include "model/groups.h"

namespace strata {
namespace {

struct Expect {
  const char* name;
  TensorKind kind;
  int64_t layer;
  TensorRole role;
};

using K = TensorKind;
using R = TensorRole;

void check(const ArchInfo& arch, const std::vector<Expect>& cases) {
  for (const Expect& e : cases) {
    TensorClass c = classify_tensor(arch, e.name);
    EXPECT_EQ(tensor_kind_name(c.kind), tensor_kind_name(e.kind)) << e.name;
    EXPECT_EQ(c.layer, e.layer) << e.name;
    EXPECT_EQ(static_cast<int>(c.role), static_cast<int>(e.role)) << e.name;
  }
}

// Runs `fn`, expects a one-line strata::Error containing every one of `parts`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return;
  }
  ADD_FAILURE() << "expected a strata::Error mentioning " << *parts.begin();
}

ArchInfo arch_of(ArchFamily family, int64_t layers, bool multimodal = false) {
  ArchInfo a;
  a.family = family;
  a.num_hidden_layers = layers;
  a.multimodal = multimodal;
  return a;
}

TEST(Arch, ModelTypesFromTransformersConfigs) {
  // The config.json files transformers 5.17 wrote for the fixtures (tests/fixtures/models), and
  // the family each fixture was built as.
  const std::pair<const char*, ArchFamily> fixtures[] = {
      {"llama", ArchFamily::kLlama},
      {"llama_odd", ArchFamily::kLlama},
      {"qwen3", ArchFamily::kLlama},
      {"qwen3_moe", ArchFamily::kQwenMoe},
      {"qwen3_moe_nonorm", ArchFamily::kQwenMoe},
      {"deepseek_v3", ArchFamily::kDeepseekV3},
      {"deepseek_v3_noqlora", ArchFamily::kDeepseekV3},
      {"kimi_linear", ArchFamily::kKimiLinear},
      {"mixtral", ArchFamily::kMixtral},
      {"glm4_moe", ArchFamily::kGlm4Moe},
      {"minimax_m2", ArchFamily::kMiniMaxM2},
      {"gpt_oss", ArchFamily::kGptOss},
      {"qwen3_next", ArchFamily::kQwen3Next},
      {"qwen3_5_moe", ArchFamily::kQwen35Moe},
      {"deepseek_v32", ArchFamily::kDeepseekV32},
  };
  for (const auto& [dir, family] : fixtures) {
    ModelConfig c =
        read_model_config(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + dir);
    ArchInfo a = resolve_arch(c);
    EXPECT_EQ(a.family, family) << dir;
    // Qwen3.5-MoE is saved as the hub ships it: the multimodal wrapper.
    EXPECT_EQ(a.multimodal, std::string(dir) == "qwen3_5_moe") << dir;
  }
  // spec/architectures.md: Kimi-K2 is the DeepSeek-V3 architecture (§3); Kimi-VL and Kimi-K2.5
  // wrap a language model beside a vision tower (§6).
  ASSERT_NE(find_arch("kimi_k2"), nullptr);
  EXPECT_EQ(find_arch("kimi_k2")->family, ArchFamily::kDeepseekV3);
  ASSERT_NE(find_arch("kimi_k25"), nullptr);
  EXPECT_TRUE(find_arch("kimi_k25")->multimodal);
  ASSERT_NE(find_arch("kimi_vl"), nullptr);
  EXPECT_TRUE(find_arch("kimi_vl")->multimodal);
  EXPECT_EQ(find_arch("gpt2"), nullptr);
  EXPECT_EQ(find_arch("Llama"), nullptr);
  EXPECT_EQ(find_arch(""), nullptr);
}

TEST(Arch, ResolveFromConfig) {
  ModelConfig c;
  c.path = "/ckpt/config.json";
  c.model_type = "kimi_k25";
  c.text_model_type = "kimi_k2";
  c.text_key = "text_config";
  c.num_hidden_layers = 61;
  ArchInfo a = resolve_arch(c);
  EXPECT_EQ(a.family, ArchFamily::kDeepseekV3);
  EXPECT_TRUE(a.multimodal);
  EXPECT_EQ(a.num_hidden_layers, 61);

  c.model_type = "gpt2";
  c.text_model_type = "gpt2";
  try {
    resolve_arch(c);
    FAIL() << "gpt2 resolved";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("/ckpt/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'gpt2'"), std::string::npos) << msg;
  }

  c.model_type = "kimi_vl";
  c.text_model_type = "mystery";
  EXPECT_THROW(resolve_arch(c), Error);

  c.model_type = "llama";
  c.text_model_type = "llama";
  c.num_hidden_layers = 0;
  EXPECT_THROW(resolve_arch(c), Error);
}

TEST(Arch, Llama) {
  ArchInfo a = arch_of(ArchFamily::kLlama, 32);
  check(a, {
               {"model.embed_tokens.weight", K::kEmbedding, -1, R::kParam},
               {"model.norm.weight", K::kNorm, -1, R::kParam},
               {"lm_head.weight", K::kLmHead, -1, R::kLinearWeight},
               {"model.layers.0.input_layernorm.weight", K::kNorm, 0, R::kParam},
               {"model.layers.31.post_attention_layernorm.weight", K::kNorm, 31, R::kParam},
               {"model.layers.7.self_attn.q_proj.weight", K::kAttention, 7, R::kLinearWeight},
               {"model.layers.7.self_attn.k_proj.weight", K::kAttention, 7, R::kLinearWeight},
               {"model.layers.7.self_attn.v_proj.weight", K::kAttention, 7, R::kLinearWeight},
               {"model.layers.7.self_attn.o_proj.weight", K::kAttention, 7, R::kLinearWeight},
               {"model.layers.12.self_attn.q_proj.bias", K::kAttention, 12, R::kBias},  // qwen2
               {"model.layers.3.self_attn.q_norm.weight", K::kNorm, 3, R::kParam},      // qwen3
               {"model.layers.3.self_attn.k_norm.weight", K::kNorm, 3, R::kParam},
               {"model.layers.10.mlp.gate_proj.weight", K::kDenseMlp, 10, R::kLinearWeight},
               {"model.layers.10.mlp.up_proj.weight", K::kDenseMlp, 10, R::kLinearWeight},
               {"model.layers.10.mlp.down_proj.weight", K::kDenseMlp, 10, R::kLinearWeight},
               {"model.layers.2.self_attn.rotary_emb.inv_freq", K::kOther, 2, R::kParam},
               // A ModelOpt FP8 source.
               {"model.layers.4.mlp.down_proj.weight_scale", K::kDenseMlp, 4, R::kQuantAux},
               {"model.layers.4.mlp.down_proj.input_scale", K::kDenseMlp, 4, R::kQuantAux},
               // Unrecognised: beyond num_hidden_layers, MoE names, typos, malformed indices.
               {"model.layers.32.self_attn.q_proj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.1.mlp.experts.0.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.1.mlp.gate.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.1.self_attn.q_a_proj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.1.self_attn.qproj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.1.self_attn.q_proj.weights", K::kUnrecognized, -1, R::kParam},
               {"model.layers.1.self_attn.q_proj", K::kUnrecognized, -1, R::kParam},
               {"model.layers.01.input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.x.input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers..input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.3", K::kUnrecognized, -1, R::kParam},
               {"model.layers.3.", K::kUnrecognized, -1, R::kParam},
               {"layers.0.input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
               {"model.embed_tokens.bias", K::kUnrecognized, -1, R::kParam},
               {"vision_tower.blocks.0.attn.qkv.weight", K::kUnrecognized, -1, R::kParam},
               {"language_model.model.norm.weight", K::kUnrecognized, -1, R::kParam},
               {"", K::kUnrecognized, -1, R::kParam},
           });
}

TEST(Arch, QwenMoe) {
  ArchInfo a = arch_of(ArchFamily::kQwenMoe, 48);
  check(
      a,
      {
          {"model.layers.5.self_attn.q_norm.weight", K::kNorm, 5, R::kParam},
          {"model.layers.5.mlp.gate.weight", K::kRouter, 5, R::kLinearWeight},
          {"model.layers.5.mlp.experts.0.gate_proj.weight", K::kRoutedExperts, 5, R::kLinearWeight},
          {"model.layers.5.mlp.experts.127.up_proj.weight", K::kRoutedExperts, 5, R::kLinearWeight},
          {"model.layers.47.mlp.experts.64.down_proj.weight", K::kRoutedExperts, 47,
           R::kLinearWeight},
          {"model.layers.5.mlp.shared_expert.gate_proj.weight", K::kSharedExperts, 5,
           R::kLinearWeight},
          {"model.layers.5.mlp.shared_expert.down_proj.weight", K::kSharedExperts, 5,
           R::kLinearWeight},
          {"model.layers.5.mlp.shared_expert_gate.weight", K::kRouter, 5, R::kLinearWeight},
          {"model.layers.0.mlp.gate_proj.weight", K::kDenseMlp, 0, R::kLinearWeight},
          {"model.layers.9.mlp.experts.gate_up_proj", K::kRoutedExperts, 9, R::kLinearWeight},
          {"model.layers.9.mlp.experts.down_proj", K::kRoutedExperts, 9, R::kLinearWeight},
          {"model.layers.5.mlp.experts.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
          {"model.layers.5.mlp.experts.x.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
          {"model.layers.5.mlp.shared_experts.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
          {"model.layers.5.block_sparse_moe.gate.weight", K::kUnrecognized, -1, R::kParam},
          {"model.layers.48.mlp.gate.weight", K::kUnrecognized, -1, R::kParam},
      });
}

TEST(Arch, Mixtral) {
  ArchInfo a = arch_of(ArchFamily::kMixtral, 32);
  check(a, {
               {"model.layers.0.self_attn.k_proj.weight", K::kAttention, 0, R::kLinearWeight},
               {"model.layers.0.block_sparse_moe.gate.weight", K::kRouter, 0, R::kLinearWeight},
               {"model.layers.0.block_sparse_moe.experts.7.w1.weight", K::kRoutedExperts, 0,
                R::kLinearWeight},
               {"model.layers.0.block_sparse_moe.experts.7.w2.weight", K::kRoutedExperts, 0,
                R::kLinearWeight},
               {"model.layers.0.block_sparse_moe.experts.7.w3.weight", K::kRoutedExperts, 0,
                R::kLinearWeight},
               {"model.layers.0.block_sparse_moe.experts.7.w4.weight", K::kUnrecognized, -1,
                R::kParam},
               {"model.layers.0.mlp.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
           });
}

TEST(Arch, Glm4Moe) {
  // GLM-4.5: 92 decoder layers and its MTP layer 92 (num_nextn_predict_layers 1).
  ArchInfo a = arch_of(ArchFamily::kGlm4Moe, 92);
  check(a, {
               {"model.layers.0.self_attn.q_proj.weight", K::kAttention, 0, R::kLinearWeight},
               {"model.layers.0.self_attn.q_proj.bias", K::kAttention, 0, R::kBias},
               {"model.layers.0.self_attn.v_proj.bias", K::kAttention, 0, R::kBias},
               {"model.layers.0.self_attn.q_norm.weight", K::kNorm, 0, R::kParam},
               {"model.layers.0.self_attn.k_norm.weight", K::kNorm, 0, R::kParam},
               {"model.layers.0.mlp.down_proj.weight", K::kDenseMlp, 0, R::kLinearWeight},
               {"model.layers.3.mlp.gate.weight", K::kRouter, 3, R::kLinearWeight},
               {"model.layers.3.mlp.gate.e_score_correction_bias", K::kRouter, 3, R::kParam},
               {"model.layers.3.mlp.experts.159.up_proj.weight", K::kRoutedExperts, 3,
                R::kLinearWeight},
               {"model.layers.3.mlp.shared_experts.down_proj.weight", K::kSharedExperts, 3,
                R::kLinearWeight},
               {"model.layers.91.mlp.experts.0.down_proj.weight_scale_inv", K::kRoutedExperts, 91,
                R::kQuantAux},
               {"model.layers.92.eh_proj.weight", K::kMtp, 92, R::kParam},
               {"model.layers.92.shared_head.norm.weight", K::kMtp, 92, R::kParam},
               {"model.layers.92.mlp.experts.3.gate_proj.weight", K::kMtp, 92, R::kLinearWeight},
               {"model.layers.0.self_attn.kv_b_proj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.3.mlp.shared_expert.up_proj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.layers.3.block_sparse_moe.gate.weight", K::kUnrecognized, -1, R::kParam},
           });
}

TEST(Arch, MiniMaxM2) {
  ArchInfo a = arch_of(ArchFamily::kMiniMaxM2, 62);
  check(a,
        {
            {"model.layers.0.self_attn.q_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.q_proj.weight_scale_inv", K::kAttention, 0, R::kQuantAux},
            {"model.layers.0.self_attn.q_norm.weight", K::kNorm, 0, R::kParam},
            {"model.layers.0.block_sparse_moe.gate.weight", K::kRouter, 0, R::kLinearWeight},
            {"model.layers.0.block_sparse_moe.e_score_correction_bias", K::kRouter, 0, R::kParam},
            {"model.layers.61.block_sparse_moe.experts.255.w1.weight", K::kRoutedExperts, 61,
             R::kLinearWeight},
            {"model.layers.61.block_sparse_moe.experts.255.w2.weight", K::kRoutedExperts, 61,
             R::kLinearWeight},
            {"model.layers.61.block_sparse_moe.experts.255.w3.weight", K::kRoutedExperts, 61,
             R::kLinearWeight},
            {"model.layers.0.block_sparse_moe.gate.e_score_correction_bias", K::kUnrecognized, -1,
             R::kParam},
            {"model.layers.0.mlp.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
            {"model.layers.62.self_attn.q_proj.weight", K::kUnrecognized, -1, R::kParam},
        });
}

// gpt-oss as the released MXFP4 checkpoints and transformers' bf16 ones name it, and the
// per-expert modules the forward reads (docs/FORWARD.md "gpt-oss").
TEST(Arch, GptOss) {
  ArchInfo a = arch_of(ArchFamily::kGptOss, 24);
  check(a,
        {
            {"model.layers.0.self_attn.q_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.o_proj.bias", K::kAttention, 0, R::kBias},
            {"model.layers.0.self_attn.sinks", K::kAttention, 0, R::kParam},
            {"model.layers.3.mlp.router.weight", K::kRouter, 3, R::kLinearWeight},
            {"model.layers.3.mlp.router.bias", K::kRouter, 3, R::kBias},
            {"model.layers.3.mlp.experts.gate_up_proj", K::kRoutedExperts, 3, R::kLinearWeight},
            {"model.layers.3.mlp.experts.down_proj", K::kRoutedExperts, 3, R::kLinearWeight},
            {"model.layers.3.mlp.experts.gate_up_proj_bias", K::kRoutedExperts, 3, R::kBias},
            {"model.layers.3.mlp.experts.down_proj_bias", K::kRoutedExperts, 3, R::kBias},
            {"model.layers.3.mlp.experts.gate_up_proj_blocks", K::kRoutedExperts, 3,
             R::kLinearWeight},
            {"model.layers.3.mlp.experts.gate_up_proj_scales", K::kRoutedExperts, 3, R::kQuantAux},
            {"model.layers.3.mlp.experts.down_proj_scales", K::kRoutedExperts, 3, R::kQuantAux},
            {"model.layers.3.mlp.experts.31.gate_up_proj.weight", K::kRoutedExperts, 3,
             R::kLinearWeight},
            {"model.layers.3.mlp.experts.31.down_proj.bias", K::kRoutedExperts, 3, R::kBias},
            {"model.layers.3.mlp.experts.31.gate_proj.weight", K::kUnrecognized, -1, R::kParam},
            {"model.layers.3.mlp.gate.weight", K::kUnrecognized, -1, R::kParam},
            {"model.layers.24.self_attn.sinks", K::kUnrecognized, -1, R::kParam},
        });
  // The fixture: sliding_attention (window 4) on layers 0 and 2, full attention on 1 and 3.
  ModelConfig c =
      read_model_config(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/gpt_oss");
  const ArchInfo g = resolve_arch(c);
  EXPECT_EQ(layer_sliding_window(g, c, 0), 4);
  EXPECT_EQ(layer_sliding_window(g, c, 1), 0);
  EXPECT_EQ(layer_sliding_window(g, c, 2), 4);
  EXPECT_EQ(layer_sliding_window(g, c, 3), 0);
  EXPECT_TRUE(layer_is_moe(g, c, 3));
  EXPECT_FALSE(layer_is_linear_attention(g, c, 0));
  // Without layer_types: transformers' default, the even layers slide.
  c.text.erase("layer_types");
  EXPECT_EQ(layer_sliding_window(g, c, 2), 4);
  EXPECT_EQ(layer_sliding_window(g, c, 3), 0);
  EXPECT_EQ(layer_sliding_window(resolve_arch(c), c, 0), 4);
  EXPECT_EQ(layer_sliding_window(arch_of(ArchFamily::kLlama, 4), c, 0), 0);
}

TEST(Arch, DeepseekV3) {
  ArchInfo a = arch_of(ArchFamily::kDeepseekV3, 61);
  check(
      a,
      {
          {"model.layers.0.self_attn.q_a_proj.weight", K::kAttention, 0, R::kLinearWeight},
          {"model.layers.0.self_attn.q_a_proj.weight_scale_inv", K::kAttention, 0, R::kQuantAux},
          {"model.layers.0.self_attn.q_a_layernorm.weight", K::kNorm, 0, R::kParam},
          {"model.layers.0.self_attn.q_b_proj.weight", K::kAttention, 0, R::kLinearWeight},
          {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", K::kAttention, 0,
           R::kLinearWeight},
          {"model.layers.0.self_attn.kv_a_layernorm.weight", K::kNorm, 0, R::kParam},
          {"model.layers.0.self_attn.kv_b_proj.weight", K::kAttention, 0, R::kLinearWeight},
          {"model.layers.0.self_attn.o_proj.weight", K::kAttention, 0, R::kLinearWeight},
          {"model.layers.0.mlp.gate_proj.weight", K::kDenseMlp, 0, R::kLinearWeight},
          {"model.layers.3.mlp.gate.weight", K::kRouter, 3, R::kLinearWeight},
          {"model.layers.3.mlp.gate.e_score_correction_bias", K::kRouter, 3, R::kParam},
          {"model.layers.3.mlp.experts.255.gate_proj.weight", K::kRoutedExperts, 3,
           R::kLinearWeight},
          {"model.layers.60.mlp.experts.0.down_proj.weight_scale_inv", K::kRoutedExperts, 60,
           R::kQuantAux},
          // compressed-tensors INT4 (Kimi-K2-Thinking).
          {"model.layers.3.mlp.experts.1.up_proj.weight_packed", K::kRoutedExperts, 3,
           R::kLinearWeight},
          {"model.layers.3.mlp.experts.1.up_proj.weight_shape", K::kRoutedExperts, 3, R::kQuantAux},
          {"model.layers.3.mlp.shared_experts.up_proj.weight", K::kSharedExperts, 3,
           R::kLinearWeight},
          // MTP: layer 61 of a 61-layer model, whatever the module.
          {"model.layers.61.eh_proj.weight", K::kMtp, 61, R::kParam},
          {"model.layers.61.enorm.weight", K::kMtp, 61, R::kParam},
          {"model.layers.61.shared_head.head.weight", K::kMtp, 61, R::kParam},
          {"model.layers.61.embed_tokens.weight", K::kMtp, 61, R::kParam},
          {"model.layers.61.mlp.experts.9.gate_proj.weight", K::kMtp, 61, R::kLinearWeight},
          {"model.layers.61.self_attn.kv_b_proj.weight", K::kMtp, 61, R::kLinearWeight},
          {"model.layers.0.self_attn.k_proj.weight", K::kUnrecognized, -1, R::kParam},
          {"model.layers.3.mlp.shared_expert.up_proj.weight", K::kUnrecognized, -1, R::kParam},
          {"model.layers.3.mlp.gate.e_score_correction", K::kUnrecognized, -1, R::kParam},
          {"mtp.layers.0.input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
      });
}

TEST(Arch, KimiLinear) {
  ArchInfo a = arch_of(ArchFamily::kKimiLinear, 27);
  check(a,
        {
            {"model.layers.0.self_attn.q_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.q_conv1d.weight", K::kAttention, 0, R::kParam},
            {"model.layers.0.self_attn.v_conv1d.weight", K::kAttention, 0, R::kParam},
            {"model.layers.0.self_attn.f_a_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.f_b_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.b_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.g_a_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.g_b_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.self_attn.A_log", K::kAttention, 0, R::kParam},
            {"model.layers.0.self_attn.dt_bias", K::kAttention, 0, R::kParam},
            {"model.layers.0.self_attn.o_norm.weight", K::kNorm, 0, R::kParam},
            {"model.layers.3.self_attn.kv_a_proj_with_mqa.weight", K::kAttention, 3,
             R::kLinearWeight},
            {"model.layers.3.self_attn.kv_a_layernorm.weight", K::kNorm, 3, R::kParam},
            {"model.layers.3.self_attn.kv_b_proj.weight", K::kAttention, 3, R::kLinearWeight},
            {"model.layers.0.mlp.down_proj.weight", K::kDenseMlp, 0, R::kLinearWeight},
            // transformers 5.x save_pretrained: the dense layer under block_sparse_moe.
            {"model.layers.0.block_sparse_moe.gate_proj.weight", K::kDenseMlp, 0, R::kLinearWeight},
            {"model.layers.0.block_sparse_moe.up_proj.weight", K::kDenseMlp, 0, R::kLinearWeight},
            {"model.layers.1.block_sparse_moe.gate.weight", K::kRouter, 1, R::kLinearWeight},
            {"model.layers.1.block_sparse_moe.gate.e_score_correction_bias", K::kRouter, 1,
             R::kParam},
            {"model.layers.1.block_sparse_moe.experts.255.w2.weight", K::kRoutedExperts, 1,
             R::kLinearWeight},
            {"model.layers.1.block_sparse_moe.shared_experts.gate_proj.weight", K::kSharedExperts,
             1, R::kLinearWeight},
            {"model.layers.26.input_layernorm.weight", K::kNorm, 26, R::kParam},
            // The in-tree transformers port's renamed keys are not the checkpoint's.
            {"model.layers.0.self_attn.beta_proj.weight", K::kUnrecognized, -1, R::kParam},
            {"model.layers.1.mlp.experts.0.w1.weight", K::kUnrecognized, -1, R::kParam},
            {"model.layers.27.input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
        });
}

TEST(Arch, Qwen3Next) {
  ArchInfo a = arch_of(ArchFamily::kQwen3Next, 48);
  check(a,
        {
            {"model.layers.0.linear_attn.in_proj_qkvz.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.linear_attn.in_proj_ba.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.0.linear_attn.conv1d.weight", K::kAttention, 0, R::kParam},
            {"model.layers.0.linear_attn.A_log", K::kAttention, 0, R::kParam},
            {"model.layers.0.linear_attn.dt_bias", K::kAttention, 0, R::kParam},
            {"model.layers.0.linear_attn.norm.weight", K::kNorm, 0, R::kParam},
            {"model.layers.0.linear_attn.out_proj.weight", K::kAttention, 0, R::kLinearWeight},
            {"model.layers.3.self_attn.q_proj.weight", K::kAttention, 3, R::kLinearWeight},
            {"model.layers.3.self_attn.k_norm.weight", K::kNorm, 3, R::kParam},
            {"model.layers.3.mlp.shared_expert_gate.weight", K::kRouter, 3, R::kLinearWeight},
            {"model.layers.3.mlp.experts.511.down_proj.weight", K::kRoutedExperts, 3,
             R::kLinearWeight},
            {"mtp.layers.0.mlp.experts.0.gate_proj.weight", K::kMtp, -1, R::kLinearWeight},
            {"mtp.layers.0.input_layernorm.weight", K::kMtp, -1, R::kParam},
            {"mtp.fc.weight", K::kMtp, -1, R::kLinearWeight},
            {"mtp.pre_fc_norm_hidden.weight", K::kMtp, -1, R::kParam},
            {"model.layers.48.mlp.gate.weight", K::kUnrecognized, -1, R::kParam},
            {"model.layers.0.linear_attn.in_proj_qkv.weight", K::kUnrecognized, -1, R::kParam},
        });
}

TEST(Arch, Qwen35Moe) {
  // Qwen3.5-MoE as the hub ships it: the wrapper qwen3_5_moe, the language model under
  // model.language_model., fused routed experts, the vision tower under model.visual. and the MTP
  // module at the top level.
  ArchInfo a = arch_of(ArchFamily::kQwen35Moe, 40, /*multimodal=*/true);
  resolve_wrapper_prefixes(a,
                           {"model.language_model.embed_tokens.weight",
                            "model.language_model.layers.0.input_layernorm.weight",
                            "lm_head.weight", "model.visual.blocks.0.attn.qkv.weight"},
                           "ckpt");
  check(a, {
               {"model.language_model.layers.0.linear_attn.in_proj_qkv.weight", K::kAttention, 0,
                R::kLinearWeight},
               {"model.language_model.layers.0.linear_attn.in_proj_z.weight", K::kAttention, 0,
                R::kLinearWeight},
               {"model.language_model.layers.0.linear_attn.in_proj_b.weight", K::kAttention, 0,
                R::kLinearWeight},
               {"model.language_model.layers.0.linear_attn.in_proj_a.weight", K::kAttention, 0,
                R::kLinearWeight},
               {"model.language_model.layers.0.linear_attn.conv1d.weight", K::kAttention, 0,
                R::kParam},
               {"model.language_model.layers.0.linear_attn.A_log", K::kAttention, 0, R::kParam},
               {"model.language_model.layers.0.linear_attn.norm.weight", K::kNorm, 0, R::kParam},
               {"model.language_model.layers.3.self_attn.q_proj.weight", K::kAttention, 3,
                R::kLinearWeight},
               {"model.language_model.layers.3.self_attn.q_norm.weight", K::kNorm, 3, R::kParam},
               {"model.language_model.layers.3.mlp.experts.gate_up_proj", K::kRoutedExperts, 3,
                R::kLinearWeight},
               {"model.language_model.layers.3.mlp.experts.down_proj", K::kRoutedExperts, 3,
                R::kLinearWeight},
               {"model.language_model.layers.39.mlp.experts.255.up_proj.weight", K::kRoutedExperts,
                39, R::kLinearWeight},
               {"model.language_model.layers.3.mlp.shared_expert.up_proj.weight", K::kSharedExperts,
                3, R::kLinearWeight},
               {"model.language_model.layers.3.mlp.shared_expert_gate.weight", K::kRouter, 3,
                R::kLinearWeight},
               {"model.language_model.layers.3.mlp.gate.weight", K::kRouter, 3, R::kLinearWeight},
               {"model.language_model.norm.weight", K::kNorm, -1, R::kParam},
               {"lm_head.weight", K::kLmHead, -1, R::kLinearWeight},
               {"model.visual.blocks.0.attn.qkv.weight", K::kVision, -1, R::kParam},
               {"model.visual.merger.linear_fc2.bias", K::kVision, -1, R::kParam},
               {"mtp.layers.0.mlp.experts.0.gate_proj.weight", K::kMtp, -1, R::kLinearWeight},
               {"mtp.layers.0.self_attn.q_proj.weight", K::kMtp, -1, R::kLinearWeight},
               {"mtp.fc.weight", K::kMtp, -1, R::kLinearWeight},
               {"mtp.norm.weight", K::kMtp, -1, R::kParam},
               // Qwen3-Next's fused projections are not Qwen3.5's.
               {"model.language_model.layers.0.linear_attn.in_proj_qkvz.weight", K::kUnrecognized,
                -1, R::kParam},
               {"model.layers.0.linear_attn.in_proj_qkv.weight", K::kUnrecognized, -1, R::kParam},
           });
}

TEST(Arch, MultimodalWrapper) {
  ArchInfo a = arch_of(ArchFamily::kDeepseekV3, 27, /*multimodal=*/true);
  check(a, {
               {"language_model.model.embed_tokens.weight", K::kEmbedding, -1, R::kParam},
               {"language_model.model.norm.weight", K::kNorm, -1, R::kParam},
               {"language_model.lm_head.weight", K::kLmHead, -1, R::kLinearWeight},
               {"language_model.model.layers.0.self_attn.kv_b_proj.weight", K::kAttention, 0,
                R::kLinearWeight},
               {"language_model.model.layers.4.mlp.experts.63.up_proj.weight_packed",
                K::kRoutedExperts, 4, R::kLinearWeight},
               {"language_model.model.layers.4.mlp.gate.weight", K::kRouter, 4, R::kLinearWeight},
               {"model.language_model.layers.2.mlp.shared_experts.down_proj.weight",
                K::kSharedExperts, 2, R::kLinearWeight},
               {"lm_head.weight", K::kLmHead, -1, R::kLinearWeight},
               {"vision_tower.encoder.blocks.0.wqkv.weight", K::kVision, -1, R::kParam},
               {"vision_tower.patch_embed.proj.weight", K::kVision, -1, R::kParam},
               {"multi_modal_projector.pre_norm.weight", K::kProjector, -1, R::kParam},
               {"multi_modal_projector.linear_1.weight", K::kProjector, -1, R::kParam},
               {"mm_projector.proj.0.weight", K::kProjector, -1, R::kParam},
               // The language model's names without the wrapper's prefix are not the checkpoint's.
               {"model.layers.0.self_attn.kv_b_proj.weight", K::kUnrecognized, -1, R::kParam},
               {"model.embed_tokens.weight", K::kUnrecognized, -1, R::kParam},
               {"language_model.model.layers.27.input_layernorm.weight", K::kMtp, 27, R::kParam},
               {"language_model.layers.0.input_layernorm.weight", K::kUnrecognized, -1, R::kParam},
               {"audio_tower.layers.0.weight", K::kUnrecognized, -1, R::kParam},
           });
}

// resolve_wrapper_prefixes: the language model found however the wrapper nests it (up to
// kMaxWrapperDepth components), refused clearly when deeper or ambiguous.
TEST(Arch, WrapperPrefixesUnwrapped) {
  ArchInfo a = arch_of(ArchFamily::kDeepseekV3, 4, /*multimodal=*/true);
  resolve_wrapper_prefixes(
      a,
      {"outer.model.language_model.embed_tokens.weight",
       "outer.model.language_model.layers.0.input_layernorm.weight", "outer.lm_head.weight",
       "outer.model.visual.blocks.0.qkv.weight", "outer.model.mm_projector.proj.0.weight"},
      "ckpt");
  EXPECT_EQ(a.lm_prefix, "outer.model.language_model.");
  EXPECT_EQ(a.head_prefix, "outer.");
  check(a, {
               {"outer.model.language_model.layers.0.self_attn.kv_b_proj.weight", K::kAttention, 0,
                R::kLinearWeight},
               {"outer.model.language_model.embed_tokens.weight", K::kEmbedding, -1, R::kParam},
               {"outer.lm_head.weight", K::kLmHead, -1, R::kLinearWeight},
               {"outer.model.visual.blocks.0.qkv.weight", K::kVision, -1, R::kParam},
               {"outer.model.mm_projector.proj.0.weight", K::kProjector, -1, R::kParam},
               {"model.layers.0.self_attn.kv_b_proj.weight", K::kUnrecognized, -1, R::kParam},
               // An export's FP8 KV-cache scales (format.md §3), also on MLA.
               {"outer.model.language_model.layers.2.self_attn.k_proj.k_scale", K::kAttention, 2,
                R::kQuantAux},
               {"outer.model.language_model.layers.2.self_attn.k_proj.weight", K::kUnrecognized, -1,
                R::kParam},
           });
  // Qwen2-VL style: the decoder at model., the tower at visual.
  ArchInfo q = arch_of(ArchFamily::kLlama, 2, true);
  resolve_wrapper_prefixes(q,
                           {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                            "lm_head.weight", "visual.blocks.0.attn.qkv.weight"},
                           "ckpt");
  EXPECT_EQ(q.lm_prefix, "model.");
  EXPECT_EQ(q.head_prefix, "");
  check(q, {{"visual.blocks.0.attn.qkv.weight", K::kVision, -1, R::kParam},
            {"model.layers.0.mlp.up_proj.weight", K::kDenseMlp, 0, R::kLinearWeight}});
  // Not multimodal: nothing to do.
  ArchInfo plain = arch_of(ArchFamily::kLlama, 2);
  resolve_wrapper_prefixes(plain, {"x.y.embed_tokens.weight"}, "ckpt");
  EXPECT_EQ(plain.lm_prefix, "");
}

TEST(Arch, WrapperPrefixesRefused) {
  ArchInfo a = arch_of(ArchFamily::kDeepseekV3, 4, true);
  expect_error(
      [&] {
        resolve_wrapper_prefixes(
            a, {"a.b.c.d.e.embed_tokens.weight", "a.b.c.d.e.layers.0.input_layernorm.weight"},
            "ckpt");
      },
      {"ckpt", "more than 4 levels deep", "a.b.c.d.e.embed_tokens.weight"});
  expect_error(
      [&] {
        resolve_wrapper_prefixes(a,
                                 {"x.embed_tokens.weight", "x.layers.0.mlp.gate.weight",
                                  "y.embed_tokens.weight", "y.layers.0.mlp.gate.weight"},
                                 "ckpt");
      },
      {"several language models", "x.embed_tokens.weight", "y.embed_tokens.weight"});
  expect_error([&] { resolve_wrapper_prefixes(a, {"vision_tower.w.weight"}, "ckpt"); },
               {"ckpt", "no <prefix>embed_tokens.weight"});
}

TEST(Arch, QuantizedKinds) {
  EXPECT_TRUE(kind_is_quantized_by_default(K::kAttention));
  EXPECT_TRUE(kind_is_quantized_by_default(K::kDenseMlp));
  EXPECT_TRUE(kind_is_quantized_by_default(K::kRoutedExperts));
  EXPECT_TRUE(kind_is_quantized_by_default(K::kSharedExperts));
  for (K k : {K::kRouter, K::kEmbedding, K::kLmHead, K::kNorm, K::kVision, K::kProjector, K::kMtp,
              K::kOther, K::kUnrecognized}) {
    EXPECT_FALSE(kind_is_quantized_by_default(k)) << tensor_kind_name(k);
  }
}

TEST(Arch, KindNamesAreDistinct) {
  std::vector<std::string> names;
  for (int i = 0; i < kNumTensorKinds; ++i) {
    std::string n(tensor_kind_name(static_cast<K>(i)));
    EXPECT_FALSE(n.empty());
    for (const std::string& m : names)
      EXPECT_NE(n, m);
    names.push_back(n);
  }
}

TEST(Arch, MoeLayers) {
  ModelConfig c;
  // DeepSeek-V3: 3 dense layers, then MoE every layer.
  c.num_experts = 256;
  c.first_k_dense_replace = 3;
  c.moe_layer_freq = 1;
  ArchInfo ds = arch_of(ArchFamily::kDeepseekV3, 61);
  EXPECT_FALSE(layer_is_moe(ds, c, 0));
  EXPECT_FALSE(layer_is_moe(ds, c, 2));
  EXPECT_TRUE(layer_is_moe(ds, c, 3));
  EXPECT_TRUE(layer_is_moe(ds, c, 60));
  c.moe_layer_freq = 2;  // remote code: also i % freq == 0
  EXPECT_TRUE(layer_is_moe(ds, c, 4));
  EXPECT_FALSE(layer_is_moe(ds, c, 5));

  // Qwen MoE: (i+1) % step == 0, minus mlp_only_layers.
  ModelConfig q;
  q.num_experts = 128;
  q.decoder_sparse_step = 2;
  q.mlp_only_layers = {3};
  ArchInfo qm = arch_of(ArchFamily::kQwenMoe, 8);
  EXPECT_FALSE(layer_is_moe(qm, q, 0));
  EXPECT_TRUE(layer_is_moe(qm, q, 1));
  EXPECT_FALSE(layer_is_moe(qm, q, 3));
  EXPECT_TRUE(layer_is_moe(qm, q, 5));
  q.num_experts = 0;
  EXPECT_FALSE(layer_is_moe(qm, q, 1));

  // Qwen3-Next as Qwen MoE; Qwen3.5: every layer (its config class has neither field).
  EXPECT_FALSE(layer_is_moe(arch_of(ArchFamily::kQwen3Next, 8), q, 1));
  q.num_experts = 512;
  EXPECT_TRUE(layer_is_moe(arch_of(ArchFamily::kQwen3Next, 8), q, 1));
  EXPECT_FALSE(layer_is_moe(arch_of(ArchFamily::kQwen3Next, 8), q, 3));
  EXPECT_FALSE(layer_is_moe(arch_of(ArchFamily::kQwen3Next, 8), q, 2));
  for (int64_t l : {0, 1, 2, 3})
    EXPECT_TRUE(layer_is_moe(arch_of(ArchFamily::kQwen35Moe, 8), q, l)) << l;

  ModelConfig d;
  EXPECT_FALSE(layer_is_moe(arch_of(ArchFamily::kLlama, 4), d, 0));
  d.num_experts = 8;
  EXPECT_TRUE(layer_is_moe(arch_of(ArchFamily::kMixtral, 4), d, 0));
  EXPECT_TRUE(layer_is_moe(arch_of(ArchFamily::kMiniMaxM2, 4), d, 0));

  // GLM-4.5: dense below first_k_dense_replace, MoE after (moe_layer_freq plays no part); a
  // config without the key has transformers' default, 1.
  ModelConfig g;
  g.num_experts = 160;
  g.moe_layer_freq = 2;
  g.text = Json::object();
  ArchInfo glm = arch_of(ArchFamily::kGlm4Moe, 92);
  EXPECT_FALSE(layer_is_moe(glm, g, 0));
  EXPECT_TRUE(layer_is_moe(glm, g, 1));
  g.first_k_dense_replace = 3;
  g.text["first_k_dense_replace"] = 3;
  EXPECT_FALSE(layer_is_moe(glm, g, 2));
  EXPECT_TRUE(layer_is_moe(glm, g, 3));
  EXPECT_TRUE(layer_is_moe(glm, g, 4));
}

// Kimi-Linear's two config spellings (spec/architectures.md §4): the remote code's
// linear_attn_config with 1-based layer lists and first_k_dense_replace, transformers 5.x's
// layer_types / mlp_layer_types. The 48B-A3B layout: MLA at 1-based 4, 8, ..., 24, 27.
TEST(Arch, KimiLinearLayerKinds) {
  const std::string remote = R"({"model_type": "kimi_linear", "num_hidden_layers": 27,
      "num_experts": 256, "num_experts_per_token": 8, "first_k_dense_replace": 1,
      "moe_layer_freq": 1, "linear_attn_config": {"head_dim": 128, "num_heads": 32,
      "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
      "full_attn_layers": [4, 8, 12, 16, 20, 24, 27]}})";
  ModelConfig c = parse_model_config(Json::parse(remote), "remote.json");
  EXPECT_EQ(c.num_experts_per_tok, 8);
  ArchInfo a = resolve_arch(c);
  for (int64_t l = 0; l < 27; ++l) {
    const bool mla = l == 3 || l == 7 || l == 11 || l == 15 || l == 19 || l == 23 || l == 26;
    EXPECT_EQ(layer_is_linear_attention(a, c, l), !mla) << l;
    EXPECT_EQ(layer_is_moe(a, c, l), l >= 1) << l;
  }
  // transformers 5.x spelling of a 3-layer model; agreeing lists in both spellings are fine.
  Json j = Json::parse(R"({"model_type": "kimi_linear", "num_hidden_layers": 3, "num_experts": 4,
      "num_experts_per_token": 2, "layer_types": ["linear_attention", "full_attention",
      "linear_attention"], "mlp_layer_types": ["dense", "sparse", "sparse"]})");
  c = parse_model_config(j, "t5.json");
  a = resolve_arch(c);
  EXPECT_TRUE(layer_is_linear_attention(a, c, 0));
  EXPECT_FALSE(layer_is_linear_attention(a, c, 1));
  EXPECT_FALSE(layer_is_moe(a, c, 0));
  EXPECT_TRUE(layer_is_moe(a, c, 2));
  j["linear_attn_config"] = Json::parse(R"({"kda_layers": [1, 3], "full_attn_layers": [2]})");
  j["first_k_dense_replace"] = 1;
  c = parse_model_config(j, "both.json");
  EXPECT_FALSE(layer_is_linear_attention(a, c, 1));
  EXPECT_TRUE(layer_is_moe(a, c, 1));
  // Disagreements and gaps are errors naming the keys.
  auto error = [&](const Json& cfg, bool moe) {
    ModelConfig m = parse_model_config(cfg, "bad.json");
    try {
      if (moe) {
        layer_is_moe(a, m, 1);
      } else {
        layer_is_linear_attention(a, m, 1);
      }
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  Json bad = j;
  bad["linear_attn_config"]["kda_layers"] = Json::parse("[1, 2, 3]");
  bad["linear_attn_config"]["full_attn_layers"] = Json::parse("[]");
  EXPECT_NE(error(bad, false).find("disagree"), std::string::npos) << error(bad, false);
  bad = j;
  bad["linear_attn_config"]["kda_layers"] = Json::parse("[0, 3]");  // 0-based by mistake
  EXPECT_NE(error(bad, false).find("1-based"), std::string::npos) << error(bad, false);
  bad = j;
  bad.erase("layer_types");
  bad.erase("linear_attn_config");
  EXPECT_NE(error(bad, false).find("which layers are KDA is unknown"), std::string::npos);
  bad = j;
  bad["first_k_dense_replace"] = 2;
  EXPECT_NE(error(bad, true).find("must agree"), std::string::npos) << error(bad, true);
  // Other families: no linear attention, except Qwen3-Next's interval.
  ModelConfig d;
  EXPECT_FALSE(layer_is_linear_attention(arch_of(ArchFamily::kDeepseekV3, 4), d, 0));
  d.num_hidden_layers = 8;
  EXPECT_TRUE(layer_is_linear_attention(arch_of(ArchFamily::kQwen3Next, 8), d, 0));
  EXPECT_FALSE(layer_is_linear_attention(arch_of(ArchFamily::kQwen3Next, 8), d, 3));
  EXPECT_TRUE(layer_is_linear_attention(arch_of(ArchFamily::kQwen35Moe, 8), d, 2));
  EXPECT_FALSE(layer_is_linear_attention(arch_of(ArchFamily::kQwen35Moe, 8), d, 7));
  d.text = Json::object();
  d.text["full_attention_interval"] = 2;
  EXPECT_TRUE(layer_is_linear_attention(arch_of(ArchFamily::kQwen35Moe, 8), d, 2));
  EXPECT_FALSE(layer_is_linear_attention(arch_of(ArchFamily::kQwen35Moe, 8), d, 3));
}

// DeepSeek-V3.2's indexer: wk and weights_proj read the attention block's input (as q_a_proj and
// kv_a_proj_with_mqa do), wq_b reads the q LoRA output (as q_b_proj does); ModelOpt 0.47's export
// shares NVFP4 scales by input, so these are the groups (spelled out by hand).
TEST(Groups, IndexerProjectionsShareTheirInputsGroup) {
  const std::string a = "model.layers.3.self_attn.";
  for (const char* m : {"q_a_proj", "kv_a_proj_with_mqa", "indexer.wk", "indexer.weights_proj"})
    EXPECT_EQ(shared_input_group_key(a + m), a.substr(0, a.size() - 1) + ".{attention input}") << m;
  for (const char* m : {"q_b_proj", "indexer.wq_b"})
    EXPECT_EQ(shared_input_group_key(a + m), a.substr(0, a.size() - 1) + ".{q_b_proj input}") << m;
  // Not fused for the servers: each keeps its own fused group (itself).
  EXPECT_EQ(fused_group_key(a + "indexer.wk"), a + "indexer.wk");
  EXPECT_EQ(fused_group_key(a + "q_b_proj"), a + "q_b_proj");
  // kv_b_proj reads the kv LoRA output alone.
  EXPECT_EQ(shared_input_group_key(a + "kv_b_proj"), a + "kv_b_proj");
}

}  // namespace
}  // namespace strata
