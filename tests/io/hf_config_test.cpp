// config.json parsing. The configs below are hand-written in the shape of the real ones
// (Llama-3.1, Qwen3, Qwen3-MoE, Mixtral, DeepSeek-V3, Kimi-K2, Kimi-VL, DeepSeek-VL2, and the
// transformers 5.x spellings), trimmed to the fields that matter.
#include <gtest/gtest.h>

#include "io/hf_config.h"
#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;

ModelConfig parse(const std::string& text) {
  return parse_model_config(json_parse_strict(text, "config.json"), "config.json");
}

TEST(HfConfig, Llama31) {
  ModelConfig c = parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": false, "mlp_bias": false, "tie_word_embeddings": false})");
  EXPECT_EQ(c.path, "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.text_model_type, "llama");
  EXPECT_EQ(c.text_key, "");
  EXPECT_EQ(c.architectures, (std::vector<std::string>{"LlamaForCausalLM"}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // derived: 4096 / 32
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.num_experts, 0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.quantization_config.has_value());
  EXPECT_EQ(c.raw["mlp_bias"], false);
}

TEST(HfConfig, Qwen3DenseExplicitHeadDim) {
  // Qwen3-0.6B: head_dim 128 although hidden / heads is 64; rope_scaling null.
  ModelConfig c = parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null,
    "attention_bias": false, "tie_word_embeddings": true, "sliding_window": null})");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rope.factor, 1.0);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(HfConfig, Qwen3Moe) {
  ModelConfig c = parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,
    "rope_theta": 1000000.0, "torch_dtype": "bfloat16"})");
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.n_shared_experts, 0);

  ModelConfig d = parse(R"({"model_type": "qwen3_moe", "num_experts": 8,
    "num_experts_per_tok": 2, "decoder_sparse_step": 2, "mlp_only_layers": [0, 3]})");
  EXPECT_EQ(d.decoder_sparse_step, 2);
  EXPECT_EQ(d.mlp_only_layers, (std::vector<int64_t>{0, 3}));
}

TEST(HfConfig, MixtralLocalExperts) {
  ModelConfig c = parse(R"({"model_type": "mixtral", "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "rope_theta": 1000000.0, "torch_dtype": "bfloat16"})");
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.head_dim, 128);
}

TEST(HfConfig, DeepSeekV3) {
  ModelConfig c = parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "norm_topk_prob": true, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "rope_theta": 10000, "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16",
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]}})");
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale, 1.0);
  EXPECT_DOUBLE_EQ(c.rope.mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c.rope.attention_factor.has_value());
  ASSERT_TRUE(c.quantization_config.has_value());
  EXPECT_EQ((*c.quantization_config)["quant_method"], "fp8");
}

TEST(HfConfig, KimiK2) {
  ModelConfig c = parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
    "hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64,
    "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "rope_theta": 50000.0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "torch_dtype": "bfloat16"})");
  EXPECT_EQ(c.model_type, "kimi_k2");
  EXPECT_EQ(c.num_experts, 384);
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 1.0);
}

TEST(HfConfig, KimiVlTextConfigWithNullLoraRank) {
  ModelConfig c = parse(R"({
    "architectures": ["KimiVLForConditionalGeneration"], "model_type": "kimi_vl",
    "torch_dtype": "bfloat16", "media_placeholder_token_id": 163605,
    "vision_config": {"model_type": "moonvit", "hidden_size": 1152, "num_attention_heads": 16},
    "text_config": {"model_type": "deepseek_v3", "hidden_size": 2048,
      "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
      "vocab_size": 163840, "q_lora_rank": null, "kv_lora_rank": 512,
      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
      "moe_intermediate_size": 1408, "first_k_dense_replace": 1, "rope_theta": 800000.0,
      "tie_word_embeddings": false}})");
  EXPECT_EQ(c.model_type, "kimi_vl");
  EXPECT_EQ(c.text_key, "text_config");
  EXPECT_EQ(c.text_model_type, "deepseek_v3");
  EXPECT_EQ(c.text["hidden_size"], 2048);
  EXPECT_EQ(c.hidden_size, 2048);  // the text model's, not the vision tower's
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.q_lora_rank, 0);  // null: no q_a_proj, a plain q_proj
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_DOUBLE_EQ(c.rope.theta, 800000.0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");  // from the top level
}

TEST(HfConfig, LanguageConfigNesting) {
  ModelConfig c = parse(R"({"model_type": "deepseek_vl_v2",
    "language_config": {"model_type": "deepseek_v2", "hidden_size": 2560,
      "num_attention_heads": 10, "torch_dtype": "float16", "n_routed_experts": 72,
      "num_experts_per_tok": 6},
    "torch_dtype": "bfloat16", "tie_word_embeddings": true})");
  EXPECT_EQ(c.text_key, "language_config");
  EXPECT_EQ(c.text_model_type, "deepseek_v2");
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.torch_dtype, "float16");  // the language model's own wins
  EXPECT_TRUE(c.tie_word_embeddings);   // falls back to the top level
  EXPECT_EQ(c.num_experts, 72);
}

// A wrapper of a wrapper: the language model's config is unwrapped level by level, at most 4.
TEST(HfConfig, NestedTextConfigUnwrapped) {
  ModelConfig c = parse(R"({"model_type": "kimi_k25", "vision_config": {"hidden_size": 7},
    "text_config": {"model_type": "outer_text", "hidden_size": 9,
      "language_config": {"model_type": "kimi_k2", "hidden_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "vocab_size": 384,
        "quantization_config": {"quant_method": "compressed-tensors"}}}})");
  EXPECT_EQ(c.text_key, "text_config.language_config");
  EXPECT_EQ(c.text_model_type, "kimi_k2");
  EXPECT_EQ(c.hidden_size, 64);  // the innermost language model's
  EXPECT_EQ(c.num_hidden_layers, 3);
  ASSERT_TRUE(c.quantization_config.has_value());
  EXPECT_EQ((*c.quantization_config)["quant_method"], "compressed-tensors");
  const std::string deep = R"({"model_type": "kimi_k25", "text_config": {"text_config":
    {"text_config": {"text_config": {"text_config": {"model_type": "kimi_k2"}}}}}})";
  expect_error([&] { parse(deep); }, {"nested more than 4 levels deep",
                                      "text_config.text_config.text_config.text_config"});
  expect_error(
      [] {
        parse(R"({"model_type": "x", "text_config": {"text_config": {}, "language_config": {}}})");
      },
      {"\"text_config.text_config\" and \"text_config.language_config\"", "ambiguous"});
}

TEST(HfConfig, Transformers5Spellings) {
  ModelConfig c = parse(R"({"model_type": "llama", "dtype": "bfloat16",
    "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": null,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}})");
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.num_key_value_heads, 32);  // null: defaults to the attention heads
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);

  ModelConfig q = parse(R"({"model_type": "qwen3_next", "text_config": {
    "model_type": "qwen3_next_text", "hidden_size": 2048, "num_attention_heads": 16,
    "head_dim": 256, "partial_rotary_factor": 0.25,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
      "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}}})");
  EXPECT_EQ(q.rope.type, "default");
  EXPECT_DOUBLE_EQ(q.rope.theta, 1e7);
  EXPECT_DOUBLE_EQ(q.rope.partial_rotary_factor, 0.25);
  EXPECT_EQ(q.head_dim, 256);
  EXPECT_EQ(q.text["rope_parameters"]["mrope_section"][0], 11);  // unknown keys stay readable

  // 4.x and 5.x spellings present together agree: fine.
  ModelConfig both = parse(R"({"model_type": "llama", "rope_theta": 500000.0,
    "torch_dtype": "bfloat16", "dtype": "bfloat16",
    "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0},
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0}})");
  EXPECT_EQ(both.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(both.rope.factor, 4.0);
}

TEST(HfConfig, Defaults) {
  ModelConfig c = parse(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})");
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_DOUBLE_EQ(c.rope.theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.torch_dtype, "");
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
}

TEST(HfConfig, Errors) {
  expect_error([] { parse("[]"); }, {"config.json", "must be a JSON object"});
  expect_error([] { parse(R"({"hidden_size": 8})"); }, {"config.json", "missing \"model_type\""});
  expect_error([] { parse(R"({"model_type": "llama", "hidden_size": "4096"})"); },
               {"config.json", "key \"hidden_size\" must be an integer", "\"4096\""});
  expect_error([] { parse(R"({"model_type": "llama", "hidden_size": 4096.5})"); },
               {"config.json", "\"hidden_size\" must be an integer"});
  expect_error([] { parse(R"({"model_type": "llama", "num_hidden_layers": -2})"); },
               {"\"num_hidden_layers\" must be a non-negative integer"});
  expect_error([] { parse(R"({"model_type": 3})"); }, {"\"model_type\" must be a string"});
  expect_error([] { parse(R"({"model_type": "x", "architectures": "Llama"})"); },
               {"\"architectures\" must be an array of strings"});
  expect_error([] { parse(R"({"model_type": "x", "rope_scaling": [1]})"); },
               {"\"rope_scaling\" must be an object"});
  expect_error([] { parse(R"({"model_type": "x", "rope_scaling": {"factor": "8"}})"); },
               {"\"rope_scaling.factor\" must be a number"});
  expect_error([] { parse(R"({"model_type": "x", "tie_word_embeddings": 1})"); },
               {"\"tie_word_embeddings\" must be true or false"});
  expect_error([] { parse(R"({"model_type": "x", "mlp_only_layers": [1, "2"]})"); },
               {"\"mlp_only_layers\" must be an array of non-negative integers"});
  expect_error([] { parse(R"({"model_type": "x", "text_config": 5})"); },
               {"\"text_config\" must be an object"});
  expect_error([] { parse(R"({"model_type": "x", "text_config": {"num_attention_heads": 1.5}})"); },
               {"config.json", "\"text_config.num_attention_heads\" must be an integer"});
  expect_error([] { parse(R"({"model_type": "x", "text_config": {}, "language_config": {}})"); },
               {"both \"text_config\" and \"language_config\""});
  expect_error([] { parse(R"({"model_type": "x", "quantization_config": "fp8"})"); },
               {"\"quantization_config\" must be an object"});
}

TEST(HfConfig, KimiLinearSpellings) {
  // The remote code's (and transformers 5.x's) names for top-k, shared experts and
  // renormalisation (spec/architectures.md §4).
  ModelConfig c = parse(R"({"model_type": "kimi_linear", "num_experts": 256,
    "num_experts_per_token": 8, "num_shared_experts": 1, "moe_renormalize": true,
    "moe_intermediate_size": 1024, "first_k_dense_replace": 1})");
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_TRUE(c.norm_topk_prob);
  expect_error(
      [] {
        parse(R"({"model_type": "x", "num_experts": 8, "num_experts_per_tok": 2,
                  "num_experts_per_token": 4})");
      },
      {"\"num_experts_per_tok\" is 2", "\"num_experts_per_token\" is 4", "must agree"});
  expect_error(
      [] {
        parse(R"({"model_type": "x", "n_shared_experts": 1, "num_shared_experts": 2})");
      },
      {"\"n_shared_experts\" is 1", "\"num_shared_experts\" is 2"});
  expect_error(
      [] { parse(R"({"model_type": "x", "norm_topk_prob": true, "moe_renormalize": false})"); },
      {"\"norm_topk_prob\"", "\"moe_renormalize\"", "must agree"});
}

TEST(HfConfig, DisagreeingSpellingsAreErrors) {
  expect_error(
      [] {
        parse(R"({"model_type": "x", "rope_theta": 10000,
                               "rope_parameters": {"rope_theta": 500000}})");
      },
      {"config.json", "\"rope_theta\" is 10000", "\"rope_parameters.rope_theta\" is 500000"});
  expect_error(
      [] {
        parse(R"({"model_type": "x",
                               "rope_scaling": {"type": "yarn", "rope_type": "linear"}})");
      },
      {"\"rope_scaling.rope_type\"", "\"rope_scaling.type\"", "must agree"});
  expect_error(
      [] {
        parse(R"({"model_type": "x", "num_experts": 8, "n_routed_experts": 16,
                               "num_experts_per_tok": 2})");
      },
      {"\"num_experts\" is 8", "\"n_routed_experts\" is 16"});
  expect_error(
      [] {
        parse(R"({"model_type": "x", "torch_dtype": "float16",
                               "dtype": "bfloat16"})");
      },
      {"\"torch_dtype\" is float16", "\"dtype\" is bfloat16"});
  expect_error(
      [] {
        parse(R"({"model_type": "x", "rope_parameters": {
                               "full_attention": {"rope_theta": 1e6},
                               "sliding_attention": {"rope_theta": 1e4}}})");
      },
      {"\"rope_parameters.full_attention\" is an object", "not supported"});
}

TEST(HfConfig, InconsistentShapesAreErrors) {
  expect_error(
      [] { parse(R"({"model_type": "x", "hidden_size": 100, "num_attention_heads": 3})"); },
      {"head_dim cannot be derived"});
  expect_error(
      [] {
        parse(R"({"model_type": "x", "hidden_size": 96, "num_attention_heads": 6,
                               "num_key_value_heads": 4})");
      },
      {"not a multiple of num_key_value_heads 4"});
  expect_error([] { parse(R"({"model_type": "x", "num_experts": 8, "num_experts_per_tok": 9})"); },
               {"num_experts_per_tok 9"});
  expect_error([] { parse(R"({"model_type": "x", "rope_theta": 0})"); },
               {"rope_theta must be positive"});
}

TEST(HfConfig, ReadFromDirectory) {
  test::TempDir dir;
  expect_error([&] { read_model_config(dir.path()); }, {dir.path(), "no config.json"});
  test::write_bytes(dir.file("config.json"), R"({"model_type": "llama", "model_type": "qwen3"})");
  expect_error([&] { read_model_config(dir.path()); },
               {dir.file("config.json"), "duplicate key \"model_type\""});
  test::write_bytes(dir.file("config.json"), R"({"model_type": "qwen3", "hidden_size": 8,
    "num_attention_heads": 2})");
  ModelConfig c = read_model_config(dir.path());
  EXPECT_EQ(c.path, dir.file("config.json"));
  EXPECT_EQ(c.head_dim, 4);
}

}  // namespace
}  // namespace strata
