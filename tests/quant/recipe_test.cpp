// Recipes (quant/recipe.h): the glob matcher on hand-worked cases, the decision of every built-in
// recipe on hub names of every family (expected formats written by hand from each recipe's stated
// intent, docs/RECIPES.md), rule semantics (later wins, enable re-enables, imports), and every
// error case with the file and rule it must name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "quant/recipe.h"

namespace {

using strata::glob_match;
using strata::KvCacheFormat;
using strata::QFormat;

// ---- glob ---------------------------------------------------------------------------------------

TEST(GlobMatch, StarCrossesDots) {
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*", "model.layers.0.mlp.up_proj"));
  EXPECT_TRUE(glob_match("**", "x"));
  EXPECT_TRUE(glob_match("*.experts.*", "model.layers.1.mlp.experts.7.up_proj"));
  EXPECT_TRUE(glob_match("*.experts.*", "model.layers.2.block_sparse_moe.experts.5.w1"));
  EXPECT_TRUE(glob_match("*mlp*", "model.layers.0.mlp.down_proj"));
  EXPECT_TRUE(glob_match("mtp.*", "mtp.layers.0.mlp.experts.0.gate_proj"));
  EXPECT_FALSE(glob_match("mtp.*", "model.mtp.fc"));  // anchored at the start
  EXPECT_FALSE(glob_match("*lm_head", "lm_head.x"));  // anchored at the end
}

TEST(GlobMatch, ExpertsIsNotSharedExperts) {
  EXPECT_FALSE(glob_match("*.experts.*", "model.layers.3.mlp.shared_experts.up_proj"));
  EXPECT_FALSE(glob_match("*.experts.*", "model.layers.3.mlp.shared_experts.down_proj."));
  EXPECT_FALSE(glob_match("*.experts.*", "model.layers.1.mlp.shared_expert.gate_proj"));
  EXPECT_TRUE(glob_match("*experts*", "model.layers.3.mlp.shared_experts.up_proj"));
}

TEST(GlobMatch, RouterPatternNeedsTheTrailingDot) {
  // "*mlp.gate.*" is written for quantizer names; the module itself matches with a '.' appended.
  EXPECT_FALSE(glob_match("*mlp.gate.*", "model.layers.1.mlp.gate"));
  EXPECT_TRUE(glob_match("*mlp.gate.*", "model.layers.1.mlp.gate."));
  EXPECT_FALSE(glob_match("*mlp.gate.*", "model.layers.1.mlp.gate_proj."));
  EXPECT_FALSE(glob_match("*mlp.gate.*", "model.layers.1.mlp.shared_expert_gate."));
}

TEST(GlobMatch, CaseSensitive) {
  EXPECT_FALSE(glob_match("*LM_HEAD*", "lm_head"));
  EXPECT_FALSE(glob_match("*lm_head*", "LM_HEAD"));
  EXPECT_FALSE(glob_match("[A-Z]", "a"));
  EXPECT_TRUE(glob_match("*lm_head*", "language_model.lm_head"));
}

TEST(GlobMatch, QuestionMark) {
  EXPECT_TRUE(glob_match("layer?", "layer1"));
  EXPECT_FALSE(glob_match("layer?", "layer"));
  EXPECT_FALSE(glob_match("layer?", "layer12"));
  EXPECT_TRUE(glob_match("?", "."));
}

TEST(GlobMatch, Sets) {
  EXPECT_TRUE(glob_match("[abc]x", "bx"));
  EXPECT_FALSE(glob_match("[abc]x", "dx"));
  EXPECT_FALSE(glob_match("[!abc]x", "bx"));
  EXPECT_TRUE(glob_match("[!abc]x", "dx"));
  EXPECT_FALSE(glob_match("[^abc]x", "ax"));
  EXPECT_TRUE(glob_match("[^abc]x", "zx"));
  EXPECT_TRUE(glob_match("[a-c]", "b"));
  EXPECT_TRUE(glob_match("[a-c]", "c"));
  EXPECT_FALSE(glob_match("[a-c]", "d"));
  EXPECT_TRUE(glob_match("*.[qkv]_proj", "model.layers.0.self_attn.k_proj"));
  EXPECT_FALSE(glob_match("*.[qkv]_proj", "model.layers.0.self_attn.o_proj"));
  EXPECT_TRUE(glob_match("*.experts.[0-9].*", "model.layers.1.mlp.experts.7.up_proj"));
  EXPECT_FALSE(glob_match("*.experts.[0-9].*", "model.layers.1.mlp.experts.17.up_proj"));
  // ']' first in a set is a member; '-' first or last is a member.
  EXPECT_TRUE(glob_match("[]]", "]"));
  EXPECT_TRUE(glob_match("[!]]", "a"));
  EXPECT_FALSE(glob_match("[!]]", "]"));
  EXPECT_TRUE(glob_match("[a-]", "-"));
  EXPECT_TRUE(glob_match("[-a]", "-"));
  // An unclosed '[' is an ordinary character.
  EXPECT_TRUE(glob_match("[", "["));
  EXPECT_TRUE(glob_match("[ab", "[ab"));
  EXPECT_FALSE(glob_match("[ab", "a"));
  // A set matches exactly one character.
  EXPECT_FALSE(glob_match("[ab]", ""));
  EXPECT_FALSE(glob_match("[ab]", "ab"));
}

TEST(GlobMatch, BackslashEscapes) {
  EXPECT_TRUE(glob_match("\\*", "*"));
  EXPECT_FALSE(glob_match("\\*", "a"));
  EXPECT_TRUE(glob_match("a\\?", "a?"));
  EXPECT_FALSE(glob_match("a\\?", "ab"));
}

TEST(GlobMatch, Backtracking) {
  EXPECT_TRUE(glob_match("*a*b*c", "xaybzc"));
  EXPECT_TRUE(glob_match("*ab", "aab"));
  EXPECT_TRUE(glob_match("a*b*c", "abcbc"));
  EXPECT_FALSE(glob_match("a*b*c", "abcb"));
  EXPECT_TRUE(glob_match("*.experts.*.w1", "model.layers.2.block_sparse_moe.experts.5.w1"));
  EXPECT_FALSE(glob_match("*.experts.*.w1", "model.layers.2.block_sparse_moe.experts.5.w12"));
  EXPECT_TRUE(glob_match("", ""));
  EXPECT_FALSE(glob_match("", "a"));
  // Many stars against a long non-match stays fast (no exponential backtracking).
  EXPECT_FALSE(glob_match("a*a*a*a*a*a*a*a*b", std::string(200, 'a')));
}

// ---- built-in recipes on every family
// ------------------------------------------------------------

// What a module is, as the recipes' intent distinguishes it (ModelOpt 0.47's presets, written
// by hand from their YAML: configs/ptq/presets/model/*.yaml and units/default_disabled_quantizers).
enum class Cls {
  kAttention,  // q/k/v, KDA q/k/v, linear-attention projections: quantized by the "all" scopes
  kOProj,      // attention output projections: "all" scopes and omlp_only
  kMla,        // MLA q_a/q_b/kv_a_with_mqa/kv_b, KDA f_a/f_b/g_a/g_b/b_proj: "all" scopes but the
               // mla_bf16 ones (ModelOpt quantizes them since 0.43)
  kDenseMlp,   // quantized by all, mlp_only and omlp_only
  kExpert,     // routed experts: quantized by every scope
  kShared,     // shared experts (also Kimi-Linear's under block_sparse_moe, and its dense layers
               // there): all, mlp_only and omlp_only; not experts_only (ModelOpt's
               // `*block_sparse_moe*` sees transformers 5's in-memory `mlp` and reaches nothing)
  kNever,      // routers, gates, lm_head, embeddings, norms, vision, projector, MTP, in_proj_a/b
};

struct Module {
  const char* name;
  Cls cls;
};

const std::vector<Module>& modules() {
  static const std::vector<Module> m = {
      // Llama / Qwen dense
      {"model.layers.0.self_attn.q_proj", Cls::kAttention},
      {"model.layers.0.self_attn.k_proj", Cls::kAttention},
      {"model.layers.0.self_attn.v_proj", Cls::kAttention},
      {"model.layers.0.self_attn.o_proj", Cls::kOProj},
      {"model.layers.0.mlp.gate_proj", Cls::kDenseMlp},
      {"model.layers.0.mlp.up_proj", Cls::kDenseMlp},
      {"model.layers.0.mlp.down_proj", Cls::kDenseMlp},
      {"lm_head", Cls::kNever},
      {"model.embed_tokens", Cls::kNever},
      {"model.norm", Cls::kNever},
      {"model.layers.0.input_layernorm", Cls::kNever},
      {"model.layers.0.self_attn.q_norm", Cls::kNever},
      // Qwen3-MoE
      {"model.layers.1.mlp.experts.7.gate_proj", Cls::kExpert},
      {"model.layers.1.mlp.experts.7.up_proj", Cls::kExpert},
      {"model.layers.1.mlp.experts.127.down_proj", Cls::kExpert},
      {"model.layers.1.mlp.gate", Cls::kNever},
      // Qwen2-MoE shared expert and its gate
      {"model.layers.1.mlp.shared_expert.gate_proj", Cls::kShared},
      {"model.layers.1.mlp.shared_expert.down_proj", Cls::kShared},
      {"model.layers.1.mlp.shared_expert_gate", Cls::kNever},
      // DeepSeek-V3 / Kimi-K2: MLA, first dense layers, router, shared and routed experts
      {"model.layers.3.self_attn.q_a_proj", Cls::kMla},
      {"model.layers.3.self_attn.q_b_proj", Cls::kMla},
      {"model.layers.3.self_attn.kv_a_proj_with_mqa", Cls::kMla},
      {"model.layers.3.self_attn.kv_b_proj", Cls::kMla},
      {"model.layers.3.self_attn.o_proj", Cls::kOProj},
      {"model.layers.3.self_attn.q_a_layernorm", Cls::kNever},
      {"model.layers.3.self_attn.kv_a_layernorm", Cls::kNever},
      {"model.layers.3.mlp.gate", Cls::kNever},
      {"model.layers.3.mlp.shared_experts.gate_proj", Cls::kShared},
      {"model.layers.3.mlp.shared_experts.up_proj", Cls::kShared},
      {"model.layers.3.mlp.shared_experts.down_proj", Cls::kShared},
      {"model.layers.3.mlp.experts.200.down_proj", Cls::kExpert},
      {"model.layers.60.mlp.experts.0.gate_proj", Cls::kExpert},
      // Mixtral
      {"model.layers.2.block_sparse_moe.experts.5.w1", Cls::kExpert},
      {"model.layers.2.block_sparse_moe.experts.5.w2", Cls::kExpert},
      {"model.layers.2.block_sparse_moe.experts.5.w3", Cls::kExpert},
      {"model.layers.2.block_sparse_moe.gate", Cls::kNever},
      // Kimi Linear: KDA q/k/v/o, the gate bottlenecks and b_proj; MoE under block_sparse_moe
      // with shared experts, and transformers 5.x's dense first layer under block_sparse_moe too
      {"model.layers.0.self_attn.q_proj", Cls::kAttention},
      {"model.layers.0.self_attn.v_proj", Cls::kAttention},
      {"model.layers.0.self_attn.o_proj", Cls::kOProj},
      {"model.layers.0.self_attn.f_a_proj", Cls::kMla},
      {"model.layers.0.self_attn.f_b_proj", Cls::kMla},
      {"model.layers.0.self_attn.g_a_proj", Cls::kMla},
      {"model.layers.0.self_attn.g_b_proj", Cls::kMla},
      {"model.layers.0.self_attn.b_proj", Cls::kMla},
      {"model.layers.0.self_attn.o_norm", Cls::kNever},
      {"model.layers.0.block_sparse_moe.gate_proj", Cls::kShared},
      {"model.layers.0.block_sparse_moe.down_proj", Cls::kShared},
      {"model.layers.1.block_sparse_moe.gate", Cls::kNever},
      {"model.layers.1.block_sparse_moe.shared_experts.gate_proj", Cls::kShared},
      {"model.layers.1.block_sparse_moe.experts.3.w2", Cls::kExpert},
      // Qwen3-Next: linear attention and MTP
      {"model.layers.0.linear_attn.in_proj_qkvz", Cls::kAttention},
      {"model.layers.0.linear_attn.out_proj", Cls::kAttention},
      {"model.layers.0.linear_attn.in_proj_ba", Cls::kNever},
      {"model.layers.0.linear_attn.norm", Cls::kNever},
      {"mtp.layers.0.mlp.experts.0.gate_proj", Cls::kNever},
      {"mtp.layers.0.self_attn.q_proj", Cls::kNever},
      {"mtp.fc", Cls::kNever},
      // Qwen3.5: the Gated DeltaNet's split projections (a and b in the source dtype, as
      // ModelOpt's in_proj_a / in_proj_b rules), the vision tower under model.visual.
      {"model.language_model.layers.0.linear_attn.in_proj_qkv", Cls::kAttention},
      {"model.language_model.layers.0.linear_attn.in_proj_z", Cls::kAttention},
      {"model.language_model.layers.0.linear_attn.in_proj_b", Cls::kNever},
      {"model.language_model.layers.0.linear_attn.in_proj_a", Cls::kNever},
      {"model.language_model.layers.3.self_attn.q_proj", Cls::kAttention},
      {"model.visual.blocks.0.attn.qkv", Cls::kNever},
      {"model.visual.merger.linear_fc1", Cls::kNever},
      // Multimodal wrappers: the language model keeps its prefix
      {"language_model.model.layers.0.self_attn.q_proj", Cls::kAttention},
      {"language_model.model.layers.0.mlp.down_proj", Cls::kDenseMlp},
      {"language_model.model.layers.1.mlp.experts.3.up_proj", Cls::kExpert},
      {"language_model.model.layers.1.mlp.shared_experts.up_proj", Cls::kShared},
      {"language_model.model.layers.1.mlp.gate", Cls::kNever},
      {"language_model.model.layers.1.self_attn.kv_b_proj", Cls::kMla},
      {"language_model.lm_head", Cls::kNever},
      {"model.language_model.layers.0.mlp.up_proj", Cls::kDenseMlp},
      {"vision_tower.encoder.blocks.0.mlp.fc0", Cls::kNever},
      {"vision_tower.encoder.blocks.0.wqkv", Cls::kNever},
      {"model.visual.blocks.0.mlp.fc1", Cls::kNever},
      {"multi_modal_projector.linear_1", Cls::kNever},
      {"mm_projector.proj.0", Cls::kNever},
  };
  return m;
}

enum class Scope { kAll, kAllMlaBf16, kExpertsOnly, kMlpOnly, kOmlpOnly };

QFormat expected(Scope scope, QFormat f, Cls c) {
  const bool all = scope == Scope::kAll || scope == Scope::kAllMlaBf16;
  switch (c) {
    case Cls::kAttention:
      return all ? f : QFormat::kNone;
    case Cls::kOProj:
      return all || scope == Scope::kOmlpOnly ? f : QFormat::kNone;
    case Cls::kMla:
      return scope == Scope::kAll ? f : QFormat::kNone;
    case Cls::kDenseMlp:
    case Cls::kShared:
      return scope == Scope::kExpertsOnly ? QFormat::kNone : f;
    case Cls::kExpert:
      return f;
    case Cls::kNever:
      return QFormat::kNone;
  }
  return QFormat::kNone;
}

struct Qformat {
  const char* name;
  Scope scope;
  QFormat format;
};

const std::vector<Qformat>& qformats() {
  static const std::vector<Qformat> b = {
      {"fp8", Scope::kAll, QFormat::kFp8},
      {"fp8_mla_bf16", Scope::kAllMlaBf16, QFormat::kFp8},
      {"mxfp8", Scope::kAll, QFormat::kMxfp8},
      {"nvfp4", Scope::kAll, QFormat::kNvfp4},
      {"nvfp4_experts_only", Scope::kExpertsOnly, QFormat::kNvfp4},
      {"nvfp4_mla_bf16", Scope::kAllMlaBf16, QFormat::kNvfp4},
      {"nvfp4_mlp_only", Scope::kMlpOnly, QFormat::kNvfp4},
      {"nvfp4_omlp_only", Scope::kOmlpOnly, QFormat::kNvfp4},
      {"w4a16_nvfp4", Scope::kAll, QFormat::kW4A16Nvfp4},
  };
  return b;
}

const std::vector<std::pair<const char*, KvCacheFormat>>& kv_modes() {
  static const std::vector<std::pair<const char*, KvCacheFormat>> k = {
      {"fp8", KvCacheFormat::kFp8},
      {"fp8_cast", KvCacheFormat::kFp8Cast},
      {"fp8_affine", KvCacheFormat::kFp8Affine},
      {"none", KvCacheFormat::kNone},
      {"nvfp4", KvCacheFormat::kNvfp4},
      {"nvfp4_cast", KvCacheFormat::kNvfp4Cast},
      {"nvfp4_affine", KvCacheFormat::kNvfp4Affine}};
  return k;
}

// ModelOpt 0.47's general/ptq recipes strata has: scope, format, KV mode, and whether the routed
// experts' input amax is pinned (input_amax 2688).
struct General {
  const char* name;
  Scope scope;
  QFormat format;
  KvCacheFormat kv;
  bool pinned = false;
};

const std::vector<General>& generals() {
  static const std::vector<General> g = {
      {"general/ptq/fp8_default-kv_fp8", Scope::kAll, QFormat::kFp8, KvCacheFormat::kFp8},
      {"general/ptq/fp8_default-kv_fp8_cast", Scope::kAll, QFormat::kFp8, KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_default-kv_fp8", Scope::kAll, QFormat::kNvfp4, KvCacheFormat::kFp8},
      {"general/ptq/nvfp4_default-kv_fp8_cast", Scope::kAll, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_default-kv_nvfp4_cast", Scope::kAll, QFormat::kNvfp4,
       KvCacheFormat::kNvfp4Cast},
      {"general/ptq/nvfp4_experts_only-kv_fp8", Scope::kExpertsOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8},
      {"general/ptq/nvfp4_experts_only-kv_fp8_cast", Scope::kExpertsOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_experts_only_input_scale1-kv_fp8_cast", Scope::kExpertsOnly,
       QFormat::kNvfp4, KvCacheFormat::kFp8Cast, true},
      // The mse recipes: the quantizers of their max twins (their algorithm: RecipeAlgorithm).
      {"general/ptq/nvfp4_experts_only_mse-kv_fp8_cast", Scope::kExpertsOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_mlp_only_mse-kv_fp8_cast", Scope::kMlpOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_mlp_only-kv_fp8", Scope::kMlpOnly, QFormat::kNvfp4, KvCacheFormat::kFp8},
      {"general/ptq/nvfp4_mlp_only-kv_fp8_cast", Scope::kMlpOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_mlp_only-novit-kv_fp8", Scope::kMlpOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8},
      {"general/ptq/nvfp4_omlp_only-kv_fp8", Scope::kOmlpOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8},
      {"general/ptq/nvfp4_omlp_only-kv_fp8_cast", Scope::kOmlpOnly, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/nvfp4_weight_only-kv_fp16", Scope::kAll, QFormat::kW4A16Nvfp4,
       KvCacheFormat::kNone},
      {"general/ptq/nvfp4_weight_only-kv_fp8_cast", Scope::kAll, QFormat::kW4A16Nvfp4,
       KvCacheFormat::kFp8Cast},
      {"general/ptq/mxfp4_mlp_weight_only", Scope::kMlpOnly, QFormat::kMxfp4, KvCacheFormat::kNone},
      {"general/ptq/nvfp4_mlp_weight_only", Scope::kMlpOnly, QFormat::kW4A16Nvfp4Bs32,
       KvCacheFormat::kNone},
      {"general/ptq/nvfp4_act_headroom-kv_fp8_cast", Scope::kAll, QFormat::kNvfp4,
       KvCacheFormat::kFp8Cast},
  };
  return g;
}

TEST(BuiltinRecipes, ListIsExactlyTheExpectedSet) {
  std::vector<std::string> want;
  for (const Qformat& q : qformats()) {
    for (const auto& [kv, f] : kv_modes())
      want.push_back(std::string(q.name) + "-kv_" + kv);
  }
  for (const General& g : generals())
    want.push_back(g.name);
  want.push_back("models/moonshotai/Kimi-K3/ptq/nvfp4_experts-fp8_pb_attention");
  std::sort(want.begin(), want.end());
  const std::vector<strata::RecipeInfo> all = strata::builtin_recipes();
  ASSERT_EQ(all.size(), want.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].name, want[i]);  // sorted by name
    EXPECT_FALSE(all[i].description.empty()) << all[i].name;
    EXPECT_EQ(all[i].description.find('\n'), std::string::npos) << all[i].name;
  }
}

void expect_decisions(const strata::Recipe& r, Scope scope, QFormat format, bool pinned) {
  for (const Module& m : modules()) {
    const strata::RuleDecision d = strata::recipe_decide(r, m.name);
    EXPECT_EQ(d.format, expected(scope, format, m.cls))
        << r.name << " on " << m.name << ": got " << strata::qformat_name(d.format);
    if (d.format != QFormat::kNone) {
      EXPECT_EQ(d.input_amax.has_value(), pinned) << r.name << " on " << m.name;
      if (pinned && d.input_amax) EXPECT_EQ(*d.input_amax, 2688.0f);
    }
  }
}

TEST(BuiltinRecipes, DecisionsOnEveryFamily) {
  for (const Qformat& q : qformats()) {
    for (const auto& [kv, f] : kv_modes()) {
      const std::string name = std::string(q.name) + "-kv_" + kv;
      const strata::Recipe r = strata::load_recipe(name);
      EXPECT_EQ(r.name, name);
      EXPECT_EQ(r.kv_cache, f) << name;
      expect_decisions(r, q.scope, q.format, false);
    }
  }
  for (const General& g : generals()) {
    const strata::Recipe r = strata::load_recipe(g.name);
    EXPECT_EQ(r.name, g.name);
    EXPECT_EQ(r.kv_cache, g.kv) << g.name;
    EXPECT_EQ(r.calibration, std::string(g.name).find("act_headroom") != std::string::npos
                                 ? strata::CalibrationMethod::kNvfp4ActHeadroom
                                 : strata::CalibrationMethod::kMax)
        << g.name;
    expect_decisions(r, g.scope, g.format, g.pinned);
  }
}

TEST(RecipeRules, HeadroomAlgorithm) {
  // ModelOpt's spelling: the activation method with the weights' own algorithm inside it.
  const strata::Recipe r = strata::parse_recipe(
      "algorithm: {method: nvfp4_act_headroom, anchor_percentile: 1, upper_percentile: 99.99, "
      "rho: 16384, weight_scale_algorithm: {method: mse}}\nrules: [{pattern: \"*\", format: "
      "nvfp4}]\n",
      "t.yaml");
  EXPECT_EQ(r.calibration, strata::CalibrationMethod::kNvfp4ActHeadroom);
  EXPECT_EQ(r.algorithm.method, strata::WeightCalib::Method::kMse);
  const strata::Recipe plain = strata::parse_recipe(
      "algorithm: nvfp4_act_headroom\nrules: [{pattern: \"*\", format: "
      "nvfp4}]\n",
      "t.yaml");
  EXPECT_EQ(plain.calibration, strata::CalibrationMethod::kNvfp4ActHeadroom);
  EXPECT_EQ(plain.algorithm.method, strata::WeightCalib::Method::kMax);
  EXPECT_EQ(
      strata::parse_recipe("rules: [{pattern: \"*\", format: nvfp4}]\n", "t.yaml").calibration,
      strata::CalibrationMethod::kMax);
  for (const char* bad :
       {"{method: nvfp4_act_headroom, rho: 8192}", "{method: nvfp4_act_headroom, num_bins: 256}"}) {
    EXPECT_THROW(strata::parse_recipe(std::string("algorithm: ") + bad +
                                          "\nrules: [{pattern: \"*\", format: nvfp4}]\n",
                                      "t.yaml"),
                 strata::Error)
        << bad;
  }
}

TEST(BuiltinRecipes, DecidingRuleAndOrigin) {
  const strata::Recipe r = strata::load_recipe("nvfp4-kv_fp8");
  // Rule 1 of the qformat gives "*" nvfp4; then default_disabled's rules follow in order
  // (ModelOpt 0.47's default_disabled_quantizers order: block_sparse_moe.gate first).
  ASSERT_GE(r.rules.size(), 9u);
  EXPECT_EQ(r.rules[0].pattern, "*");
  EXPECT_EQ(r.rules[0].origin, "recipes/qformat/nvfp4.yaml rule 1");
  EXPECT_FALSE(r.rules[0].imported);
  EXPECT_EQ(r.rules[1].pattern, "*block_sparse_moe.gate.*");
  EXPECT_EQ(r.rules[1].origin, "recipes/units/default_disabled.yaml rule 1");
  EXPECT_TRUE(r.rules[1].imported);

  strata::RuleDecision d = strata::recipe_decide(r, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(d.rule, 0);
  d = strata::recipe_decide(r, "model.layers.1.mlp.gate");
  ASSERT_GE(d.rule, 0);
  EXPECT_EQ(r.rules[d.rule].pattern, "*mlp.gate.*");
  EXPECT_EQ(r.rules[d.rule].origin, "recipes/units/default_disabled.yaml rule 8");
  d = strata::recipe_decide(r, "lm_head");
  ASSERT_GE(d.rule, 0);
  EXPECT_EQ(r.rules[d.rule].pattern, "*lm_head*");
  EXPECT_EQ(r.rules[d.rule].origin, "recipes/units/default_disabled.yaml rule 6");

  // experts_only: an attention module matches no rule at all.
  const strata::Recipe e = strata::load_recipe("nvfp4_experts_only-kv_none");
  d = strata::recipe_decide(e, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(d.rule, -1);
  EXPECT_EQ(d.format, QFormat::kNone);
}

TEST(BuiltinRecipes, NameForHfPtqFlags) {
  EXPECT_EQ(strata::recipe_name_for("nvfp4", "fp8_cast"), "nvfp4-kv_fp8_cast");
  EXPECT_EQ(strata::recipe_name_for("nvfp4_experts_only", "none"), "nvfp4_experts_only-kv_none");
  EXPECT_EQ(strata::recipe_name_for("nvfp4_mlp_only", "fp8"), "nvfp4_mlp_only-kv_fp8");
  EXPECT_EQ(strata::recipe_name_for("w4a16_nvfp4", "nvfp4"), "w4a16_nvfp4-kv_nvfp4");
  EXPECT_EQ(strata::recipe_name_for("fp8", "nvfp4_cast"), "fp8-kv_nvfp4_cast");
  EXPECT_EQ(strata::recipe_name_for("mxfp8", "none"), "mxfp8-kv_none");
  EXPECT_EQ(strata::recipe_name_for("nvfp4", "fp8_affine"), "nvfp4-kv_fp8_affine");
  EXPECT_EQ(strata::recipe_name_for("fp8", "nvfp4_affine"), "fp8-kv_nvfp4_affine");
  for (const auto& [q, kv, what] : std::vector<std::tuple<const char*, const char*, const char*>>{
           {"int4_awq", "fp8", "--qformat int4_awq is not a built-in qformat"},
           {"", "fp8", "--qformat  is not a built-in qformat"},
           {"nvfp4", "nvfp4_rotate", "--kv_cache_qformat nvfp4_rotate is not a KV-cache mode"},
           {"nvfp4", "nvfp4_rotate", "nvfp4_rotate (a Hadamard rotation of K) is not"}}) {
    try {
      strata::recipe_name_for(q, kv);
      ADD_FAILURE() << q << " + " << kv << " should be refused";
    } catch (const strata::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  }
}

TEST(BuiltinRecipes, UnknownGeneralRecipeListsTheOnesStrataHas) {
  try {
    strata::load_recipe("general/ptq/nvfp4_no_such_recipe");
    ADD_FAILURE() << "an unknown general recipe should be refused";
  } catch (const strata::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown recipe 'general/ptq/nvfp4_no_such_recipe'"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("nvfp4_experts_only_input_scale1-kv_fp8_cast"), std::string::npos) << msg;
  }
}

TEST(BuiltinRecipes, ModelOptRecipesStrataLacksNameWhatIsMissing) {
  // One line each, naming what is missing, never a substitute.
  for (const auto& [name, what] : std::vector<std::pair<const char*, const char*>>{
           {"general/ptq/nvfp4_default-kv_none-gptq", "GPTQ"},
           {"general/ptq/nvfp4_experts_only-kv_fp8_layerwise", "layerwise max calibration"},
           {"general/ptq/nvfp4_experts_only-kv_fp8_layerwise_offload", "layerwise max calibration"},
           {"general/ptq/int4_blockwise_weight_only", "INT4"}}) {
    try {
      strata::load_recipe(name);
      ADD_FAILURE() << name << " should be refused";
    } catch (const strata::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("recipe '") + name + "' is ModelOpt 0.47's, not strata's"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST(BuiltinRecipes, KimiK3ModelRecipe) {
  // ModelOpt 0.47's models/moonshotai/Kimi-K3/ptq/nvfp4_experts-fp8_pb_attention, by its name.
  const strata::Recipe r =
      strata::load_recipe("models/moonshotai/Kimi-K3/ptq/nvfp4_experts-fp8_pb_attention");
  EXPECT_EQ(r.kv_cache, strata::KvCacheFormat::kNone);
  const auto expert = strata::recipe_decide(r, "model.layers.3.block_sparse_moe.experts.7.w1");
  EXPECT_EQ(expert.format, strata::QFormat::kNvfp4);
  EXPECT_EQ(expert.input_amax, 2688.0f);
  for (const char* m :
       {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.b_proj",
        "model.layers.0.self_attn.f_a_proj", "model.layers.0.self_attn.f_b_proj",
        "model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.g_proj",
        "model.layers.3.self_attn.q_a_proj", "model.layers.3.self_attn.q_b_proj",
        "model.layers.3.self_attn.kv_a_proj_with_mqa", "model.layers.3.self_attn.kv_b_proj"}) {
    EXPECT_EQ(strata::recipe_decide(r, m).format, strata::QFormat::kFp8PbWo) << m;
  }
  for (const char* m : {"model.layers.3.block_sparse_moe.shared_experts.down_proj",
                        "model.layers.3.block_sparse_moe.gate", "model.layers.0.mlp.up_proj",
                        "model.layers.0.self_attn.g_a_proj", "lm_head"}) {
    EXPECT_EQ(strata::recipe_decide(r, m).format, strata::QFormat::kNone) << m;
  }
  EXPECT_EQ(strata::qformat_quant_algo(strata::QFormat::kFp8PbWo), "fp8_pb_wo");
  EXPECT_EQ(strata::qformat_group_size(strata::QFormat::kFp8PbWo), 0);
  EXPECT_FALSE(strata::qformat_has_input_scale(strata::QFormat::kFp8PbWo));
  EXPECT_EQ(strata::qformat_from_name("fp8_pb_wo"), strata::QFormat::kFp8PbWo);
}

TEST(BuiltinRecipes, UnknownModelRecipeListsTheOnesStrataHas) {
  try {
    strata::load_recipe("models/moonshotai/Kimi-K3/ptq/no_such_recipe");
    ADD_FAILURE() << "an unknown models/ recipe should be refused";
  } catch (const strata::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("nvfp4_experts-fp8_pb_attention"), std::string::npos) << msg;
  }
}

TEST(RecipeRules, InputAmaxNeedsAnActivationFormat) {
  const strata::Recipe r = strata::parse_recipe(R"(
rules:
  - {pattern: "*", format: nvfp4, input_amax: 448}
  - {pattern: "*mlp*", format: fp8}
)",
                                                "t.yaml");
  EXPECT_EQ(strata::recipe_decide(r, "model.layers.0.self_attn.q_proj").input_amax, 448.0f);
  EXPECT_FALSE(strata::recipe_decide(r, "model.layers.0.mlp.up_proj").input_amax.has_value());
  for (const char* bad : {"{pattern: \"*\", format: w4a16_nvfp4, input_amax: 2688}",
                          "{pattern: \"*\", format: nvfp4, input_amax: -1}",
                          "{pattern: \"*\", format: nvfp4, input_amax: x}"}) {
    EXPECT_THROW(strata::parse_recipe(std::string("rules:\n  - ") + bad + "\n", "t.yaml"),
                 strata::Error)
        << bad;
  }
}

// ---- rule semantics
// -------------------------------------------------------------------------------

TEST(RecipeRules, LaterRuleWins) {
  const strata::Recipe r = strata::parse_recipe(R"(
kv_cache: none
rules:
  - {pattern: "*", format: nvfp4}
  - {pattern: "*mlp*", format: fp8}
  - {pattern: "*down_proj", enable: false}
)",
                                                "t.yaml");
  EXPECT_EQ(r.kv_cache, KvCacheFormat::kNone);
  EXPECT_EQ(r.rules[1].origin, "t.yaml rule 2");
  EXPECT_EQ(strata::recipe_decide(r, "model.layers.0.self_attn.q_proj").format, QFormat::kNvfp4);
  strata::RuleDecision d = strata::recipe_decide(r, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(d.format, QFormat::kFp8);
  EXPECT_EQ(d.rule, 1);
  d = strata::recipe_decide(r, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(d.format, QFormat::kNone);
  EXPECT_EQ(d.rule, 2);
}

TEST(RecipeRules, EnableTrueBringsBackTheEarlierFormat) {
  const strata::Recipe r = strata::parse_recipe(R"(
rules:
  - {pattern: "*", format: fp8}
  - {pattern: "*.experts.*", format: nvfp4}
  - {pattern: "*.experts.*", enable: false}
  - {pattern: "*.experts.0.*", enable: true}
  - {pattern: "*self_attn*", enable: true}
)",
                                                "t.yaml");
  strata::RuleDecision d = strata::recipe_decide(r, "model.layers.1.mlp.experts.0.up_proj");
  EXPECT_EQ(d.format, QFormat::kNvfp4);  // the last format given, not the first
  EXPECT_EQ(d.rule, 3);
  d = strata::recipe_decide(r, "model.layers.1.mlp.experts.1.up_proj");
  EXPECT_EQ(d.format, QFormat::kNone);
  EXPECT_EQ(d.rule, 2);
  d = strata::recipe_decide(r, "model.layers.1.self_attn.q_proj");  // already on: stays fp8
  EXPECT_EQ(d.format, QFormat::kFp8);
  EXPECT_EQ(d.rule, 4);
}

TEST(RecipeRules, EnableTrueWithoutAFormatForThisModuleHasNoEffect) {
  const strata::Recipe r = strata::parse_recipe(R"(
rules:
  - {pattern: "*mlp*", format: fp8}
  - {pattern: "*self_attn*", enable: true}
)",
                                                "t.yaml");
  const strata::RuleDecision d = strata::recipe_decide(r, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(d.format, QFormat::kNone);
  EXPECT_EQ(d.rule, -1);
}

// RecipeMatcher gives recipe_decide's decision for every module, and counts each rule's hits as
// recipe_decide's matches would: on a recipe whose patterns are blind to digit runs (decisions
// remembered per key) and on ones that are not (a digit, '?', a set, an escape: matched in full).
TEST(RecipeMatcher, SameDecisionsAndHitsAsRecipeDecide) {
  const std::vector<std::string> modules = {
      "model.layers.0.self_attn.q_proj",
      "model.layers.10.self_attn.q_proj",
      "model.layers.1.mlp.experts.0.up_proj",
      "model.layers.1.mlp.experts.17.up_proj",
      "model.layers.12.mlp.experts.1.up_proj",
      "model.layers.1.mlp.experts.01.down_proj",
      "model.layers.3.mlp.shared_experts.gate_proj",
      "model.layers.3.mlp.gate",
      "model.layers.3.mlp.gate_proj",
      "lm_head",
      "model.layers.2.block_sparse_moe.gate",
      "mtp.layers.0.mlp.experts.0.gate_proj",
      "model.layers.61.self_attn.kv_a_proj_with_mqa",
      "x9y.layers.7",
      "model.layers.1.mlp.experts.7.w1",
      "model.layers.1.mlp.experts.77.w1",
  };
  const std::vector<std::string> recipes = {
      // Digit-blind: the built-in kind.
      "rules:\n  - {pattern: \"*.experts.*\", format: nvfp4}\n  - import: default_disabled\n",
      "rules:\n  - {pattern: \"*\", format: fp8}\n  - {pattern: \"*self_attn*\", enable: false}\n"
      "  - {pattern: \"*q_proj\", enable: true}\n  - {pattern: \"*mlp.gate.*\", format: nvfp4}\n",
      // Not digit-blind: each of these must be matched on the full name.
      "rules:\n  - {pattern: \"*\", format: fp8}\n  - {pattern: \"*.experts.1.*\", enable: "
      "false}\n",
      "rules:\n  - {pattern: \"*layers.1?.*\", format: nvfp4}\n",
      "rules:\n  - {pattern: \"*experts.[0-1].*\", format: nvfp4}\n  - {pattern: \"*w1\", "
      "enable: false}\n",
      "rules:\n  - {pattern: \"*\\\\.7*\", format: nvfp4}\n",
      // Digits beside letters keep a recipe digit-blind; beside a dot or a star they do not.
      "rules:\n  - {pattern: \"*\", format: nvfp4}\n  - {pattern: \"*v1.*\", enable: false}\n",
      "rules:\n  - {pattern: \"*\", format: nvfp4}\n  - {pattern: \"*.1*\", enable: false}\n",
      "rules:\n  - {pattern: \"*\", format: nvfp4}\n  - {pattern: \"*2\", enable: false}\n",
  };
  for (const std::string& yaml : recipes) {
    SCOPED_TRACE(yaml);
    const strata::Recipe r = strata::parse_recipe(yaml, "t.yaml");
    strata::RecipeMatcher m(r);
    std::vector<int64_t> hits(r.rules.size(), 0);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass decides from what was remembered
      for (const std::string& module : modules) {
        SCOPED_TRACE(module);
        const strata::RuleDecision want = strata::recipe_decide(r, module);
        const strata::RuleDecision got = m.decide(module);
        EXPECT_EQ(got.format, want.format);
        EXPECT_EQ(got.rule, want.rule);
        EXPECT_EQ(got.input_amax, want.input_amax);
        for (size_t i = 0; i < r.rules.size(); ++i)
          hits[i] += glob_match(r.rules[i].pattern, module) ||
                     glob_match(r.rules[i].pattern, module + ".");
      }
    }
    EXPECT_EQ(m.rule_hits(), hits);
  }
}

// Hand-worked: the keys of a digit-blind recipe collapse numbers, and a pattern with a digit
// tells experts 1 and 17 apart.
TEST(RecipeMatcher, HandWorkedDecisions) {
  const strata::Recipe blind = strata::parse_recipe(
      "rules:\n  - {pattern: \"*.experts.*\", format: nvfp4}\n  - {pattern: \"*down*\", "
      "enable: false}\n",
      "t.yaml");
  strata::RecipeMatcher a(blind);
  EXPECT_EQ(a.decide("model.layers.4.mlp.experts.17.up_proj").format, QFormat::kNvfp4);
  EXPECT_EQ(a.decide("model.layers.40.mlp.experts.1.up_proj").format, QFormat::kNvfp4);
  EXPECT_EQ(a.decide("model.layers.4.mlp.experts.17.down_proj").format, QFormat::kNone);
  EXPECT_EQ(a.decide("model.layers.4.mlp.shared_experts.up_proj").format, QFormat::kNone);
  EXPECT_EQ(a.rule_hits(), (std::vector<int64_t>{3, 1}));

  const strata::Recipe digits =
      strata::parse_recipe("rules:\n  - {pattern: \"*.experts.1.*\", format: nvfp4}\n", "t.yaml");
  strata::RecipeMatcher b(digits);
  EXPECT_EQ(b.decide("model.layers.4.mlp.experts.17.up_proj").format, QFormat::kNone);
  EXPECT_EQ(b.decide("model.layers.4.mlp.experts.1.up_proj").format, QFormat::kNvfp4);
  EXPECT_EQ(b.decide("model.layers.4.mlp.experts.1.up_proj").rule, 0);
  EXPECT_EQ(b.rule_hits(), (std::vector<int64_t>{2}));
}

TEST(RecipeRules, TopLevelImportsGoFirstRuleImportsInPlace) {
  // Top-level imports precede the recipe's rules, so "*" below wins over default_disabled.
  const strata::Recipe first = strata::parse_recipe(R"(
imports: [default_disabled]
kv_cache: fp8
rules:
  - {pattern: "*", format: fp8}
)",
                                                    "t.yaml");
  EXPECT_EQ(first.kv_cache, KvCacheFormat::kFp8);
  EXPECT_EQ(first.rules.front().origin, "recipes/units/default_disabled.yaml rule 1");
  EXPECT_EQ(first.rules.back().origin, "t.yaml rule 1");
  EXPECT_EQ(strata::recipe_decide(first, "lm_head").format, QFormat::kFp8);

  // A rule-level import splices the unit where it stands: here last, so it wins.
  const strata::Recipe last = strata::parse_recipe(R"(
rules:
  - {pattern: "*", format: fp8}
  - import: default_disabled
  - {pattern: "*lm_head*", format: nvfp4}
)",
                                                   "t.yaml");
  EXPECT_EQ(strata::recipe_decide(last, "model.layers.0.mlp.gate").format, QFormat::kNone);
  EXPECT_EQ(strata::recipe_decide(last, "lm_head").format, QFormat::kNvfp4);
  EXPECT_EQ(last.rules.back().origin, "t.yaml rule 3");
}

TEST(RecipeRules, UserRecipeFromAPath) {
  const std::filesystem::path p =
      std::filesystem::temp_directory_path() / ("strata_recipe_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(p);
  const std::string file = (p / "mine.yaml").string();
  {
    std::ofstream f(file);
    f << "description: mine\nkv_cache: fp8\nrules:\n  - {pattern: \"*.experts.*\", format: "
         "mxfp8}\n  - import: default_disabled\n";
  }
  const strata::Recipe r = strata::load_recipe(file);
  EXPECT_EQ(r.name, file);
  EXPECT_EQ(r.description, "mine");
  EXPECT_EQ(r.kv_cache, KvCacheFormat::kFp8);
  EXPECT_EQ(r.rules.front().origin, file + " rule 1");
  EXPECT_EQ(strata::recipe_decide(r, "model.layers.2.block_sparse_moe.experts.5.w1").format,
            QFormat::kMxfp8);
  std::filesystem::remove_all(p);
}

TEST(RecipeFormats, NamesAndBlocks) {
  for (QFormat f : {QFormat::kNone, QFormat::kNvfp4, QFormat::kW4A16Nvfp4, QFormat::kFp8,
                    QFormat::kMxfp8, QFormat::kW4A16Nvfp4Bs32, QFormat::kMxfp4}) {
    EXPECT_EQ(strata::qformat_from_name(strata::qformat_name(f)), f);
  }
  // ModelOpt 0.47's names: nvfp4_bs32 weight-only is W4A16_NVFP4 with group_size 32; MXFP4 is
  // its internal lower-case "mxfp4" with no group_size.
  EXPECT_EQ(strata::qformat_name(QFormat::kW4A16Nvfp4Bs32), "w4a16_nvfp4_bs32");
  EXPECT_EQ(strata::qformat_name(QFormat::kMxfp4), "mxfp4");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kW4A16Nvfp4Bs32), "W4A16_NVFP4");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kMxfp4), "mxfp4");
  EXPECT_EQ(strata::qformat_block(QFormat::kW4A16Nvfp4Bs32), 32);
  EXPECT_EQ(strata::qformat_block(QFormat::kMxfp4), 32);
  EXPECT_EQ(strata::qformat_group_size(QFormat::kW4A16Nvfp4Bs32), 32);
  EXPECT_EQ(strata::qformat_group_size(QFormat::kMxfp4), 0);
  EXPECT_EQ(strata::qformat_group_size(QFormat::kNvfp4), 16);
  EXPECT_EQ(strata::qformat_group_size(QFormat::kMxfp8), 32);
  EXPECT_EQ(strata::qformat_group_size(QFormat::kFp8), 0);
  EXPECT_TRUE(strata::qformat_has_input_scale(QFormat::kNvfp4));
  EXPECT_TRUE(strata::qformat_has_input_scale(QFormat::kFp8));
  EXPECT_FALSE(strata::qformat_has_input_scale(QFormat::kW4A16Nvfp4Bs32));
  EXPECT_FALSE(strata::qformat_has_input_scale(QFormat::kMxfp4));
  EXPECT_EQ(strata::qformat_name(QFormat::kW4A16Nvfp4), "w4a16_nvfp4");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kNvfp4), "NVFP4");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kW4A16Nvfp4), "W4A16_NVFP4");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kFp8), "FP8");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kMxfp8), "MXFP8");
  EXPECT_EQ(strata::qformat_quant_algo(QFormat::kNone), "");
  EXPECT_EQ(strata::qformat_block(QFormat::kNvfp4), 16);
  EXPECT_EQ(strata::qformat_block(QFormat::kW4A16Nvfp4), 16);
  EXPECT_EQ(strata::qformat_block(QFormat::kMxfp8), 32);
  EXPECT_EQ(strata::qformat_block(QFormat::kFp8), 1);
  EXPECT_FALSE(strata::qformat_from_name("NVFP4").has_value());
  EXPECT_EQ(strata::kv_cache_format_from_name("fp8"), KvCacheFormat::kFp8);
  EXPECT_EQ(strata::kv_cache_format_from_name("none"), KvCacheFormat::kNone);
  EXPECT_EQ(strata::kv_cache_format_from_name("fp8_cast"), KvCacheFormat::kFp8Cast);
  EXPECT_EQ(strata::kv_cache_format_from_name("nvfp4"), KvCacheFormat::kNvfp4);
  EXPECT_EQ(strata::kv_cache_format_from_name("nvfp4_cast"), KvCacheFormat::kNvfp4Cast);
  EXPECT_EQ(strata::kv_cache_format_from_name("fp8_affine"), KvCacheFormat::kFp8Affine);
  EXPECT_EQ(strata::kv_cache_format_from_name("nvfp4_affine"), KvCacheFormat::kNvfp4Affine);
  EXPECT_FALSE(strata::kv_cache_format_from_name("nvfp4_rotate").has_value());
  // ModelOpt 0.47 (quant_utils._compute_kv_cache_dtype): an FP8 KV cache is FP8 with or without
  // biases; an NVFP4 one with biases is NVFP4_AFFINE. Both calibrate k/v scales and biases.
  EXPECT_EQ(strata::kv_cache_quant_algo(KvCacheFormat::kFp8Affine), "FP8");
  EXPECT_EQ(strata::kv_cache_quant_algo(KvCacheFormat::kNvfp4Affine), "NVFP4_AFFINE");
  EXPECT_TRUE(strata::kv_cache_calibrated(KvCacheFormat::kFp8Affine));
  EXPECT_TRUE(strata::kv_cache_affine(KvCacheFormat::kNvfp4Affine));
  EXPECT_FALSE(strata::kv_cache_affine(KvCacheFormat::kNvfp4));
  EXPECT_FALSE(strata::kv_cache_format_from_name("FP8").has_value());
  // Calibrated modes write k/v scales; cast modes only kv_cache_quant_algo (ModelOpt 0.47).
  EXPECT_TRUE(strata::kv_cache_calibrated(KvCacheFormat::kFp8));
  EXPECT_TRUE(strata::kv_cache_calibrated(KvCacheFormat::kNvfp4));
  EXPECT_FALSE(strata::kv_cache_calibrated(KvCacheFormat::kFp8Cast));
  EXPECT_FALSE(strata::kv_cache_calibrated(KvCacheFormat::kNvfp4Cast));
  EXPECT_FALSE(strata::kv_cache_calibrated(KvCacheFormat::kNone));
  EXPECT_EQ(strata::kv_cache_quant_algo(KvCacheFormat::kFp8Cast), "FP8");
  EXPECT_EQ(strata::kv_cache_quant_algo(KvCacheFormat::kNvfp4), "NVFP4");
  EXPECT_EQ(strata::kv_cache_quant_algo(KvCacheFormat::kNvfp4Cast), "NVFP4");
  EXPECT_EQ(strata::kv_cache_quant_algo(KvCacheFormat::kNone), "");
}

// ---- errors
// ---------------------------------------------------------------------------------------

// The message parse_recipe throws for `yaml`; fails the test when it does not throw.
std::string error_of(const std::string& yaml) {
  try {
    strata::parse_recipe(yaml, "bad.yaml");
  } catch (const strata::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << yaml;
  return "";
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

TEST(RecipeErrors, UnknownRuleKey) {
  const std::string m =
      error_of("rules:\n  - {pattern: \"*\", format: nvfp4}\n  - {pattern: \"x\", formt: fp8}\n");
  EXPECT_HAS(m, "bad.yaml rule 2: unknown key 'formt'");
}

TEST(RecipeErrors, UnknownTopLevelKey) {
  EXPECT_HAS(error_of("rule:\n  - {pattern: \"*\", format: nvfp4}\n"),
             "bad.yaml: unknown key 'rule'");
}

TEST(RecipeErrors, UnknownFormat) {
  EXPECT_HAS(error_of("rules:\n  - {pattern: \"*\", format: int4}\n"),
             "bad.yaml rule 1: unknown format 'int4'");
  EXPECT_HAS(error_of("rules:\n  - {pattern: \"*\", format: none}\n"),
             "bad.yaml rule 1: unknown format 'none'");
}

TEST(RecipeErrors, BothFormatAndEnable) {
  EXPECT_HAS(error_of("rules:\n  - {pattern: \"*\", format: fp8}\n  - {pattern: \"*mlp*\", "
                      "format: fp8, enable: false}\n"),
             "bad.yaml rule 2 ('*mlp*'): give either format or enable, not both");
}

TEST(RecipeErrors, NeitherFormatNorEnable) {
  EXPECT_HAS(error_of("rules:\n  - {pattern: \"*\"}\n"),
             "bad.yaml rule 1 ('*'): give a format or enable");
}

TEST(RecipeErrors, EnableTrueWithNothingToReenable) {
  EXPECT_HAS(error_of("rules:\n  - {pattern: \"*\", enable: false}\n  - {pattern: \"*mlp*\", "
                      "enable: true}\n"),
             "bad.yaml rule 2: enable: true re-enables");
}

TEST(RecipeErrors, EnableNotABool) {
  EXPECT_HAS(error_of("rules:\n  - {pattern: \"*\", enable: maybe}\n"),
             "bad.yaml rule 1: enable must be true or false");
}

TEST(RecipeErrors, MissingPattern) {
  EXPECT_HAS(error_of("rules:\n  - {format: fp8}\n"), "bad.yaml rule 1: missing 'pattern'");
}

TEST(RecipeErrors, UnknownImport) {
  const std::string m =
      error_of("rules:\n  - {pattern: \"*\", format: fp8}\n  - import: default_disable\n");
  EXPECT_HAS(m, "bad.yaml rule 2: unknown unit 'default_disable'");
  EXPECT_HAS(m, "default_disabled");  // lists the units there are
  EXPECT_HAS(error_of("imports: [nope]\nrules:\n  - {pattern: \"*\", format: fp8}\n"),
             "bad.yaml imports entry 1: unknown unit 'nope'");
  EXPECT_HAS(error_of("rules:\n  - {import: default_disabled, pattern: \"*\"}\n"),
             "bad.yaml rule 1: an import rule has the single key 'import'");
}

TEST(RecipeErrors, YamlSyntaxError) {
  const std::string m = error_of("rules:\n  - {pattern: \"*\", format: nvfp4\n");
  EXPECT_HAS(m, "bad.yaml: YAML syntax error at line ");
  // An unquoted '*' is a YAML alias: also a syntax error, not a silent empty pattern.
  EXPECT_HAS(error_of("rules:\n  - {pattern: *, format: nvfp4}\n"), "bad.yaml: YAML syntax error");
}

TEST(RecipeErrors, BadShapes) {
  EXPECT_HAS(error_of("- a\n- b\n"), "bad.yaml: a recipe is a mapping");
  EXPECT_HAS(error_of("kv_cache: none\n"), "bad.yaml: 'rules' must be a non-empty list");
  EXPECT_HAS(error_of("rules: []\n"), "bad.yaml: 'rules' must be a non-empty list");
  EXPECT_HAS(error_of("rules:\n  - just a string\n"), "bad.yaml rule 1: a rule must be a mapping");
  EXPECT_HAS(error_of("kv_cache: fp4\nrules:\n  - {pattern: \"*\", format: fp8}\n"),
             "bad.yaml: unknown kv_cache 'fp4'");
}

TEST(RecipeErrors, UnknownBuiltinAndMissingFile) {
  try {
    strata::load_recipe("nvfp4-kv_fp16");
    ADD_FAILURE();
  } catch (const strata::Error& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, "unknown recipe 'nvfp4-kv_fp16'");
    EXPECT_HAS(m, "none, fp8, fp8_cast, fp8_affine, nvfp4, nvfp4_cast, nvfp4_affine");
  }
  try {
    strata::load_recipe("/nonexistent/dir/r.yaml");
    ADD_FAILURE();
  } catch (const strata::Error& e) {
    EXPECT_HAS(std::string(e.what()), "/nonexistent/dir/r.yaml: cannot open");
  }
}

// ---- algorithm: ModelOpt's weight calibration, as its recipes spell it --------------------------

using strata::load_recipe;
using strata::mse_multipliers;
using strata::parse_recipe;
using strata::Recipe;
using strata::WeightCalib;

TEST(RecipeAlgorithm, DefaultsAndSpellings) {
  EXPECT_EQ(parse_recipe("rules:\n  - {pattern: \"*\", format: nvfp4}\n", "r.yaml").algorithm,
            WeightCalib{});
  const Recipe a = parse_recipe(
      "algorithm: {method: mse, fp8_scale_sweep: true, layerwise: {enable: false}}\n"
      "rules:\n  - {pattern: \"*\", format: nvfp4}\n",
      "r.yaml");
  EXPECT_EQ(a.algorithm.method, WeightCalib::Method::kMse);
  EXPECT_TRUE(a.algorithm.fp8_scale_sweep);
  // local_hessian sweeps by default (LocalHessianCalibConfig), mse does not (MseCalibConfig).
  const Recipe h = parse_recipe(
      "algorithm: local_hessian\nrules:\n  - {pattern: \"*\", format: nvfp4}\n", "r.yaml");
  EXPECT_EQ(h.algorithm.method, WeightCalib::Method::kLocalHessian);
  EXPECT_TRUE(h.algorithm.fp8_scale_sweep);
  const Recipe m = parse_recipe(
      "algorithm:\n  method: mse\n  step_size: 0.05\n  start_multiplier: 0.5\n"
      "  stop_multiplier: 2\nrules:\n  - {pattern: \"*\", format: fp8}\n",
      "r.yaml");
  EXPECT_FALSE(m.algorithm.fp8_scale_sweep);
  EXPECT_EQ(m.algorithm.step_size, 0.05);
  EXPECT_EQ(mse_multipliers(m.algorithm).size(), 31u);
  EXPECT_EQ(load_recipe("general/ptq/nvfp4_experts_only_mse-kv_fp8_cast").algorithm,
            (WeightCalib{WeightCalib::Method::kMse, true}));
  EXPECT_EQ(load_recipe("general/ptq/nvfp4_experts_only-kv_fp8_cast").algorithm, WeightCalib{});
}

TEST(RecipeAlgorithm, Errors) {
  const std::string r = "rules:\n  - {pattern: \"*\", format: nvfp4}\n";
  EXPECT_HAS(error_of("algorithm: gptq\n" + r), "bad.yaml algorithm: unknown method 'gptq'");
  EXPECT_HAS(error_of("algorithm: {method: mse, fp8_sweep: true}\n" + r),
             "bad.yaml algorithm: unknown key 'fp8_sweep' for method mse");
  EXPECT_HAS(error_of("algorithm: {method: max, fp8_scale_sweep: true}\n" + r),
             "unknown key 'fp8_scale_sweep' for method max");
  EXPECT_HAS(error_of("algorithm: {method: mse, layerwise: {enable: true}}\n" + r),
             "only layerwise: {enable: false} is accepted");
  EXPECT_HAS(error_of("algorithm: {method: local_hessian, block_size: 32}\n" + r),
             "block_size must be 16");
  EXPECT_HAS(error_of("algorithm: {method: mse, step_size: -1}\n" + r),
             "step_size must be positive");
  EXPECT_HAS(error_of("algorithm: {fp8_scale_sweep: true}\n" + r), "give a method name");
}
}  // namespace
