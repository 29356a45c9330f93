// Writes a synthetic checkpoint of about the requested size, for bench/quantize_bench.sh (Llama)
// and bench/gpu_bench.sh (Qwen3-MoE, DeepSeek-V3, Kimi-K2 INT4, gpt-oss MXFP4): config.json, one
// shard per decoder layer plus one for the embedding, final norm and lm_head, and
// model.safetensors.index.json. Weights are pseudo-random (uniform, scaled by sqrt(3 / fan-in) so
// every linear keeps unit variance and the forward stays finite); norms are ones. Shards are
// generated and written by --threads workers, one whole layer each; shard i's values depend only on
// i, so the bytes do not depend on the thread count.
//
//   build/dev/bin/make_synthetic DIR [--arch llama|qwen3_moe|deepseek_v3|kimi_k2|gpt_oss]
//                                    [--gib G] [--layers N] [--threads T] [--hidden H]
//                                    [--intermediate I] [--vocab V]
//                                    [--experts E] [--top_k K]
//
// --arch llama (the default; hidden 2048, intermediate 5632, 16/4 heads of 128, vocab 32000).
// --arch qwen3_moe: Qwen3-30B-A3B's shapes (hidden 2048, 32/4 heads of 128 with q/k norms, 128
// experts of width 768, top-8, vocab 151936) with fewer layers; --intermediate sets the expert
// width, --experts and --top_k the routed experts. The config.json is the one transformers 5.17
// writes for Qwen3MoeForCausalLM.
// --arch deepseek_v3: DeepSeek-V3's layout (model_type deepseek_v3, DeepseekV3ForCausalLM) scaled
// down, all bf16 with no quantization_config: MLA attention (q_lora_rank, kv_lora_rank, q/k 128 +
// 64 RoPE and v 128 head dims), layers 0-2 dense (first_k_dense_replace 3), then MoE layers of
// 256 routed experts, top-8, routed in 8 groups of which the best 4 are kept (n_group 8,
// topk_group 4), sigmoid scores with an e_score_correction_bias (fp32, as DeepSeek ships it),
// routed_scaling_factor 2.5, norm_topk_prob, one shared expert; vocab 129280, YaRN (factor 40)
// as its config.json has it, no MTP layer (num_nextn_predict_layers 0). Hidden 1024 (DeepSeek-V3's
// 7168 / 7), expert width 208 (2048 / 9.8), and as for kimi_k2 below the heads (one per 56 of H,
// DeepSeek-V3's proportion: 16), ranks and dense width follow the hidden size. --experts must be a
// multiple of the 8 groups with at least 2 a group, --top_k at most 4 groups' worth. 61 layers
// (DeepSeek-V3's count) make about 20.2 GB.
// --arch kimi_k2: Kimi-K2-Thinking's layout (model_type kimi_k2, the DeepSeek-V3 family) scaled
// down: MLA attention, layer 0 dense (first_k_dense_replace 1), then MoE layers of 384 routed
// experts, top-8, one group (n_group = topk_group = 1), sigmoid scores with an
// e_score_correction_bias, routed_scaling_factor 2.827 and one shared expert; vocab 163840.
// Hidden 1280 (Kimi-K2's 7168 / 5.6), expert width 384 (2048 / 5.3), and in Kimi-K2's
// proportions to the hidden size: H / 80 heads (or the next divisor of H below) with Kimi-K2's head
// dims (q/k 128 + 64 RoPE, v 128), kv_lora_rank H / 10 and q_lora_rank 3 x that (rounded up to 32),
// dense width 2.6 x H (rounded up to 128). As Kimi-K2-Thinking ships it, the routed experts are
// compressed-tensors pack-quantized INT4 (symmetric, group 32: weight_packed I32 [out, in/8],
// weight_scale BF16 [out, in/32], weight_shape I32 [2]; docs/SOURCES.md) and everything else bf16,
// with a quantization_config whose ignore list names everything but the routed experts. The INT4
// codes are triangular on [-7, 7] around 0 (one plus the sum of two uniform 3-bit draws, minus 8)
// and each group's scale is 1 / (3.24 sqrt(fan-in)) times a uniform factor in [0.5, 1.5), so the
// experts keep about unit variance and their groups differ in range. 61 layers (Kimi-K2's count)
// make about 20.8 GB.
// --arch gpt_oss: gpt-oss-120b's layout (model_type gpt_oss) scaled down: 36 layers alternating
// sliding-window (128) and full attention, 128 experts top-4, vocab 201088, head_dim 64, q/k/v/o
// biases, attention sinks, a router with a bias, YaRN (factor 32); hidden = expert width = 1600
// (gpt-oss-120b's 2880 / 1.8) with 32 query and 4 key/value heads (64 and 8 there). As gpt-oss
// ships, the experts are fused MXFP4 tensors (gate_up_proj_blocks U8 [E, 2I, H/32, 16] with gate
// and up rows interleaved, *_scales U8 E8M0 [E, 2I, H/32], gate_up_proj_bias bf16 [E, 2I]; down
// likewise [E, H, I/32, 16]) and everything else bf16, with the quantization_config
// {quant_method mxfp4, modules_to_not_convert}. The FP4 codes are uniform over the 16 e2m1 values
// (RMS 2.93) and each 32-block's exponent gives about 1 / (2.93 sqrt(fan-in)) times 2^-1, 2^0 or
// 2^1 (uniform), so the experts keep about unit gain and their blocks differ in range. 36 layers
// make about 20.1 GB. Layers: --layers N, or else as many as fit in G GiB beside the embedding and
// lm_head, at least 1.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

// xorshift64*: cheap enough to write GiBs in seconds; one stream per shard.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dull;
  }
};

// Uniform in [-scale, scale): four 16-bit draws per 64-bit step, each value's float truncated
// to bf16 (its top 16 bits; rounding would buy nothing for random weights and costs a call).
Tensor random_bf16(Rng& rng, Shape shape, float scale) {
  Tensor t = Tensor::zeros(DType::kBF16, shape);
  uint16_t* p = t.mutable_data<uint16_t>();
  const int64_t n = t.numel();
  const float step = 2.0f * scale / 65536.0f;
  for (int64_t i = 0; i < n; i += 4) {
    const uint64_t r = rng.next();
    for (int64_t j = 0; j < 4 && i + j < n; ++j) {
      const float v = static_cast<float>((r >> (16 * j)) & 0xffff) * step - scale;
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      p[i + j] = static_cast<uint16_t>(bits >> 16);
    }
  }
  return t;
}

Tensor ones_bf16(int64_t n) {
  Tensor t = Tensor::zeros(DType::kBF16, {n});
  uint16_t* p = t.mutable_data<uint16_t>();
  for (int64_t i = 0; i < n; ++i)
    p[i] = f32_to_bf16(1.0f);
  return t;
}

void add(NamedTensors& out, Rng& rng, const std::string& name, Shape shape) {
  const float scale = std::sqrt(3.0f / static_cast<float>(shape.back()));  // unit variance out
  out.emplace_back(name, random_bf16(rng, std::move(shape), scale));
}

// The INT4 codes of a compressed-tensors pack-quantized weight [out, in]: 8 nibbles to an int32,
// element 0 in the lowest. Each nibble is u = 1 + the sum of two uniform 3-bit draws, in [1, 15]
// (value u - 8 in [-7, 7]): triangular around 0 like the codes of a bell-shaped weight quantized
// symmetrically with scale amax / 7, so the weight's mean is 0. Nibbles never carry into each
// other (at most 7 + 7 + 1).
Tensor random_int4_packed(Rng& rng, int64_t out, int64_t in) {
  Tensor t = Tensor::zeros(DType::kI32, {out, (in + 7) / 8});
  uint32_t* p = t.mutable_data<uint32_t>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t a = rng.next(), b = rng.next();
    const uint64_t w = ((a >> 1) & 0x7777777777777777ull) + ((b >> 1) & 0x7777777777777777ull) +
                       0x1111111111111111ull;
    p[i] = static_cast<uint32_t>(w);
    if (i + 1 < n) p[i + 1] = static_cast<uint32_t>(w >> 32);
  }
  return t;
}

// The bf16 group scales [out, in / group] of such a weight: 1 / (3.24 sqrt(in)) (the codes' RMS is
// sqrt(2 x 63 / 12) ~ 3.24, so the weight has about unit gain) times a uniform factor in
// [0.5, 1.5).
Tensor random_int4_scales(Rng& rng, int64_t out, int64_t in, int64_t group) {
  Tensor t = Tensor::zeros(DType::kBF16, {out, in / group});
  uint16_t* p = t.mutable_data<uint16_t>();
  const float base = 1.0f / (3.24f * std::sqrt(static_cast<float>(in)));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float f = 0.5f + static_cast<float>(rng.next() >> 40) / 16777216.0f;
    p[i] = f32_to_bf16_fast(base * f);
  }
  return t;
}

// MXFP4 blocks U8 [E, out, in / 32, 16] of E weights [out, in]: two e2m1 codes a byte (element
// 2j in the low nibble), uniform over the 16 codes.
Tensor random_fp4_blocks(Rng& rng, int64_t E, int64_t out, int64_t in) {
  Tensor t = Tensor::zeros(DType::kU8, {E, out, in / 32, 16});
  uint8_t* p = t.mutable_data<uint8_t>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; i += 8) {
    const uint64_t r = rng.next();
    for (int64_t j = 0; j < 8 && i + j < n; ++j)
      p[i + j] = static_cast<uint8_t>(r >> (8 * j));
  }
  return t;
}

// Their E8M0 scales U8 [E, out, in / 32] (2^(s - 127)): the uniform codes' RMS is 2.93, so
// 2^round(log2(1 / (2.93 sqrt(in)))) gives about unit gain; each block's exponent is that plus
// -1, 0 or 1.
Tensor random_e8m0(Rng& rng, int64_t E, int64_t out, int64_t in) {
  Tensor t = Tensor::zeros(DType::kU8, {E, out, in / 32});
  uint8_t* p = t.mutable_data<uint8_t>();
  const int base =
      127 +
      static_cast<int>(std::lround(std::log2(1.0 / (2.93 * std::sqrt(static_cast<double>(in))))));
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<uint8_t>(base - 1 + static_cast<int>((rng.next() >> 32) % 3));
  return t;
}

Tensor shape_i32(int64_t out, int64_t in) {
  Tensor t = Tensor::zeros(DType::kI32, {2});
  int32_t* p = t.mutable_data<int32_t>();
  p[0] = static_cast<int32_t>(out);
  p[1] = static_cast<int32_t>(in);
  return t;
}

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

struct Shapes {
  std::string arch = "llama";
  int64_t H = 2048, I = 5632, V = 32000;
  int64_t head_dim = 128, heads = 16, kv_heads = 4;
  int64_t experts = 0, top_k = 0;  // qwen3_moe, deepseek_v3, kimi_k2, gpt_oss
  // deepseek_v3, kimi_k2 (MLA): LoRA ranks, head dims, the dense layers' width and count, the
  // routing groups (n_group, topk_group) and the INT4 group (kimi_k2's compressed experts).
  int64_t q_lora = 0, kv_lora = 0, nope = 128, rope = 64, v_dim = 128, dense_I = 0;
  int64_t first_dense = 1, shared = 1, group = 32, n_group = 1, topk_group = 1;
  int64_t window = 128;  // gpt_oss: the sliding layers' window

  // The DeepSeek-V3 family: MLA attention, dense layers below first_dense, then routed experts
  // with sigmoid scores and a correction bias, and a shared expert.
  bool mla() const { return arch == "deepseek_v3" || arch == "kimi_k2"; }
  bool moe_layer(int64_t l) const {
    return arch == "qwen3_moe" || arch == "gpt_oss" || (mla() && l >= first_dense);
  }

  // Parameters and bytes of decoder layer l and of everything outside the layers.
  double layer_params(int64_t l) const {
    const double h = static_cast<double>(H), i = static_cast<double>(I),
                 e = static_cast<double>(experts);
    if (mla()) {
      const double nh = static_cast<double>(heads), ql = static_cast<double>(q_lora),
                   kl = static_cast<double>(kv_lora);
      const double attn = ql * h + nh * static_cast<double>(nope + rope) * ql +
                          static_cast<double>(kv_lora + rope) * h +
                          nh * static_cast<double>(nope + v_dim) * kl +
                          h * nh * static_cast<double>(v_dim) + ql + kl;
      if (!moe_layer(l)) return attn + 3 * static_cast<double>(dense_I) * h + 2 * h;
      return attn + e * h + e + (e + static_cast<double>(shared)) * 3 * i * h + 2 * h;
    }
    const double q = static_cast<double>(heads * head_dim),
                 kv = static_cast<double>(kv_heads * head_dim);
    const double attn = 2 * q * h + 2 * kv * h;
    if (arch == "gpt_oss")  // biases, sinks, router with its bias, experts with their biases
      return attn + q + 2 * kv + h + static_cast<double>(heads) + e * h + e + e * 3 * i * h +
             e * (2 * i + h) + 2 * h;
    if (arch == "qwen3_moe")
      return attn + 2 * static_cast<double>(head_dim) + e * h + e * 3 * i * h + 2 * h;
    return attn + 3 * i * h + 2 * h;
  }
  double layer_bytes(int64_t l) const {
    if (arch == "gpt_oss") {  // experts at 4 bits plus one E8M0 byte per 32; the rest bf16
      const double routed = static_cast<double>(experts) * 3 * static_cast<double>(I * H);
      return 2.0 * (layer_params(l) - routed) + routed * (0.5 + 1.0 / 32.0);
    }
    if (!mla() || !moe_layer(l)) return 2.0 * layer_params(l);
    // The correction bias in fp32; kimi_k2's routed experts at 4 bits plus a bf16 scale per
    // group (and 8 bytes of shape); the rest bf16.
    const double e = static_cast<double>(experts);
    if (arch == "deepseek_v3") return 2.0 * (layer_params(l) - e) + 4.0 * e;
    const double routed = e * 3 * static_cast<double>(I * H);
    const double rest = layer_params(l) - routed - e;
    return 2.0 * rest + 4.0 * e + routed * (0.5 + 2.0 / static_cast<double>(group)) + 8.0 * 3 * e;
  }
  double outside_params() const {
    return 2.0 * static_cast<double>(V * H) + static_cast<double>(H);
  }

  std::string config(int64_t layers) const {
    const auto n = [](int64_t v) { return std::to_string(v); };
    if (arch == "llama")
      return "{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":" +
             n(H) + ",\"intermediate_size\":" + n(I) + ",\"num_hidden_layers\":" + n(layers) +
             ",\"num_attention_heads\":" + n(heads) + ",\"num_key_value_heads\":" + n(kv_heads) +
             ",\"head_dim\":" + n(head_dim) + ",\"vocab_size\":" + n(V) +
             ",\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,\"torch_dtype\":\"bfloat16\"}\n";
    if (mla()) {
      // The keys of DeepSeek-V3's and Kimi-K2-Thinking's config.json (transformers 4 style,
      // rope_scaling; no MTP layer), their sizes scaled down. Where the two differ: Kimi-K2's
      // bos/eos at its distance from the end of the vocabulary, its context, YaRN and routing
      // scale, and its INT4 experts' quantization_config.
      const bool kimi = arch == "kimi_k2";
      std::string c =
          "{\n  \"architectures\": [\"DeepseekV3ForCausalLM\"],\n"
          "  \"attention_bias\": false,\n  \"attention_dropout\": 0.0,\n"
          "  \"bos_token_id\": " +
          n(kimi ? V - 256 : 0) + ",\n  \"eos_token_id\": " + n(kimi ? V - 255 : 1) +
          ",\n  \"first_k_dense_replace\": " + n(first_dense) +
          ",\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": " + n(H) +
          ",\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": " + n(dense_I) +
          ",\n  \"kv_lora_rank\": " + n(kv_lora) +
          ",\n  \"max_position_embeddings\": " + (kimi ? "262144" : "163840") +
          ",\n  \"model_type\": \"" + arch + "\",\n  \"moe_intermediate_size\": " + n(I) +
          ",\n  \"moe_layer_freq\": 1,\n  \"n_group\": " + n(n_group) +
          ",\n  \"n_routed_experts\": " + n(experts) + ",\n  \"n_shared_experts\": " + n(shared) +
          ",\n  \"norm_topk_prob\": true,\n  \"num_attention_heads\": " + n(heads) +
          ",\n  \"num_experts_per_tok\": " + n(top_k) + ",\n  \"num_hidden_layers\": " + n(layers) +
          ",\n  \"num_key_value_heads\": " + n(heads) +
          ",\n  \"num_nextn_predict_layers\": 0,\n  \"pretraining_tp\": 1,\n"
          "  \"q_lora_rank\": " +
          n(q_lora) + ",\n  \"qk_nope_head_dim\": " + n(nope) +
          ",\n  \"qk_rope_head_dim\": " + n(rope) +
          ",\n  \"rms_norm_eps\": 1e-06,\n  \"rope_scaling\": {\n    \"beta_fast\": " +
          (kimi ? "1.0" : "32.0") +
          ",\n    \"beta_slow\": 1.0,\n    \"factor\": " + (kimi ? "64.0" : "40.0") +
          ",\n    \"mscale\": 1.0,\n    \"mscale_all_dim\": 1.0,\n"
          "    \"original_max_position_embeddings\": 4096,\n    \"type\": \"yarn\"\n  },\n"
          "  \"rope_theta\": " +
          (kimi ? "50000.0" : "10000.0") +
          ",\n  \"routed_scaling_factor\": " + (kimi ? "2.827" : "2.5") +
          ",\n  \"scoring_func\": \"sigmoid\",\n  \"tie_word_embeddings\": false,\n"
          "  \"topk_group\": " +
          n(topk_group) +
          ",\n  \"topk_method\": \"noaux_tc\",\n  \"torch_dtype\": \"bfloat16\",\n"
          "  \"use_cache\": true,\n  \"v_head_dim\": " +
          n(v_dim) + ",\n  \"vocab_size\": " + n(V);
      if (!kimi) return c + "\n}\n";
      return c +
             ",\n  \"quantization_config\": {\n    \"quant_method\": \"compressed-tensors\",\n"
             "    \"format\": \"pack-quantized\",\n    \"quantization_status\": \"compressed\",\n"
             "    \"config_groups\": {\n      \"group_0\": {\n        \"targets\": [\"Linear\"],\n"
             "        \"weights\": {\n          \"num_bits\": 4,\n          \"type\": \"int\",\n"
             "          \"symmetric\": true,\n          \"strategy\": \"group\",\n"
             "          \"group_size\": " +
             n(group) +
             ",\n          \"dynamic\": false,\n          \"actorder\": null,\n"
             "          \"observer\": \"minmax\"\n        },\n"
             "        \"input_activations\": null,\n        \"output_activations\": null\n"
             "      }\n    },\n    \"ignore\": [\n      \"lm_head\",\n"
             "      \"re:.*self_attn.*\",\n      \"re:.*shared_experts.*\",\n"
             "      \"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"\n    ],\n"
             "    \"kv_cache_scheme\": null\n  }\n}\n";
    }
    if (arch == "gpt_oss") {
      // The keys transformers 5.17 writes for GptOssForCausalLM, with the hub's MXFP4
      // quantization_config.
      std::string types;
      for (int64_t l = 0; l < layers; ++l)
        types += std::string(l ? ", " : "") +
                 (l % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
      return "{\n  \"architectures\": [\"GptOssForCausalLM\"],\n  \"attention_bias\": true,\n"
             "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": null,\n  \"dtype\": "
             "\"bfloat16\",\n  \"eos_token_id\": null,\n  \"head_dim\": " +
             n(head_dim) + ",\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": " + n(H) +
             ",\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": " + n(I) +
             ",\n  \"layer_types\": [" + types +
             "],\n  \"max_position_embeddings\": 131072,\n  \"model_type\": \"gpt_oss\",\n"
             "  \"num_attention_heads\": " +
             n(heads) + ",\n  \"num_experts_per_tok\": " + n(top_k) +
             ",\n  \"num_hidden_layers\": " + n(layers) +
             ",\n  \"num_key_value_heads\": " + n(kv_heads) +
             ",\n  \"num_local_experts\": " + n(experts) +
             ",\n  \"output_router_logits\": false,\n  \"pad_token_id\": null,\n"
             "  \"rms_norm_eps\": 1e-05,\n  \"rope_parameters\": {\n    \"beta_fast\": 32.0,\n"
             "    \"beta_slow\": 1.0,\n    \"factor\": 32.0,\n"
             "    \"original_max_position_embeddings\": 4096,\n    \"rope_theta\": 150000.0,\n"
             "    \"rope_type\": \"yarn\",\n    \"truncate\": false\n  },\n"
             "  \"router_aux_loss_coef\": 0.001,\n  \"sliding_window\": " +
             n(window) +
             ",\n  \"tie_word_embeddings\": false,\n  \"transformers_version\": \"5.17.0\",\n"
             "  \"use_cache\": true,\n  \"vocab_size\": " +
             n(V) +
             ",\n  \"quantization_config\": {\n    \"quant_method\": \"mxfp4\",\n"
             "    \"modules_to_not_convert\": [\n      \"model.layers.*.self_attn\",\n"
             "      \"model.layers.*.mlp.router\",\n      \"model.embed_tokens\",\n"
             "      \"lm_head\"\n    ]\n  }\n}\n";
    }
    // The keys and layout transformers 5.17 writes for Qwen3MoeForCausalLM (save_pretrained).
    return "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n  \"attention_bias\": false,\n"
           "  \"attention_dropout\": 0.0,\n  \"bos_token_id\": null,\n  \"decoder_sparse_step\": "
           "1,\n"
           "  \"dtype\": \"bfloat16\",\n  \"eos_token_id\": null,\n  \"head_dim\": " +
           n(head_dim) + ",\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": " + n(H) +
           ",\n  \"initializer_range\": 0.02,\n  \"intermediate_size\": 6144,\n"
           "  \"max_position_embeddings\": 40960,\n  \"mlp_only_layers\": [],\n"
           "  \"model_type\": \"qwen3_moe\",\n  \"moe_intermediate_size\": " +
           n(I) + ",\n  \"norm_topk_prob\": true,\n  \"num_attention_heads\": " + n(heads) +
           ",\n  \"num_experts_per_tok\": " + n(top_k) +
           ",\n  \"num_hidden_layers\": " + n(layers) +
           ",\n  \"num_key_value_heads\": " + n(kv_heads) +
           ",\n  \"num_local_experts\": " + n(experts) +
           ",\n  \"output_router_logits\": false,\n  \"pad_token_id\": null,\n"
           "  \"rms_norm_eps\": 1e-06,\n  \"rope_parameters\": {\n    \"rope_theta\": 1000000.0,\n"
           "    \"rope_type\": \"default\"\n  },\n  \"router_aux_loss_coef\": 0.001,\n"
           "  \"sliding_window\": null,\n  \"tie_word_embeddings\": false,\n"
           "  \"transformers_version\": \"5.17.0\",\n  \"use_cache\": true,\n"
           "  \"use_sliding_window\": false,\n  \"vocab_size\": " +
           n(V) + "\n}\n";
  }

  // One decoder layer's tensors, in the order the shard holds them.
  NamedTensors layer(int64_t l, Rng& rng) const {
    if (mla()) return mla_layer(l, rng);
    if (arch == "gpt_oss") return gpt_oss_layer(l, rng);
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
    NamedTensors t;
    t.emplace_back(p + "input_layernorm.weight", ones_bf16(H));
    t.emplace_back(p + "post_attention_layernorm.weight", ones_bf16(H));
    add(t, rng, p + "self_attn.q_proj.weight", {q, H});
    add(t, rng, p + "self_attn.k_proj.weight", {kv, H});
    add(t, rng, p + "self_attn.v_proj.weight", {kv, H});
    add(t, rng, p + "self_attn.o_proj.weight", {H, q});
    if (arch == "qwen3_moe") {
      t.emplace_back(p + "self_attn.q_norm.weight", ones_bf16(head_dim));
      t.emplace_back(p + "self_attn.k_norm.weight", ones_bf16(head_dim));
      add(t, rng, p + "mlp.gate.weight", {experts, H});
      for (int64_t e = 0; e < experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(t, rng, x + "gate_proj.weight", {I, H});
        add(t, rng, x + "up_proj.weight", {I, H});
        add(t, rng, x + "down_proj.weight", {H, I});
      }
    } else {
      add(t, rng, p + "mlp.gate_proj.weight", {I, H});
      add(t, rng, p + "mlp.up_proj.weight", {I, H});
      add(t, rng, p + "mlp.down_proj.weight", {H, I});
    }
    return t;
  }

  // A gpt-oss decoder layer: attention with biases and sinks, the router with its bias, and the
  // fused MXFP4 experts with their biases (hub names and layout).
  NamedTensors gpt_oss_layer(int64_t l, Rng& rng) const {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
    NamedTensors t;
    t.emplace_back(p + "input_layernorm.weight", ones_bf16(H));
    t.emplace_back(p + "post_attention_layernorm.weight", ones_bf16(H));
    const std::string a = p + "self_attn.";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      const int64_t out = proj[0] == 'q' ? q : proj[0] == 'o' ? H : kv;
      const int64_t in = proj[0] == 'o' ? q : H;
      add(t, rng, a + proj + ".weight", {out, in});
      t.emplace_back(a + proj + ".bias", random_bf16(rng, {out}, 0.02f));
    }
    t.emplace_back(a + "sinks", random_bf16(rng, {heads}, 1.0f));
    const std::string m = p + "mlp.";
    add(t, rng, m + "router.weight", {experts, H});
    t.emplace_back(m + "router.bias", random_bf16(rng, {experts}, 0.02f));
    for (const char* proj : {"gate_up_proj", "down_proj"}) {
      const bool down = proj[0] == 'd';
      const int64_t out = down ? H : 2 * I, in = down ? I : H;
      t.emplace_back(m + "experts." + proj + "_blocks", random_fp4_blocks(rng, experts, out, in));
      t.emplace_back(m + "experts." + proj + "_scales", random_e8m0(rng, experts, out, in));
      t.emplace_back(m + "experts." + proj + "_bias", random_bf16(rng, {experts, out}, 0.02f));
    }
    return t;
  }

  // A DeepSeek-V3 family decoder layer: MLA attention, then a dense MLP (layers below
  // first_dense) or the router, the routed experts (bf16, or kimi_k2's INT4) and the shared
  // expert.
  NamedTensors mla_layer(int64_t l, Rng& rng) const {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    NamedTensors t;
    t.emplace_back(p + "input_layernorm.weight", ones_bf16(H));
    t.emplace_back(p + "post_attention_layernorm.weight", ones_bf16(H));
    const std::string a = p + "self_attn.";
    add(t, rng, a + "q_a_proj.weight", {q_lora, H});
    t.emplace_back(a + "q_a_layernorm.weight", ones_bf16(q_lora));
    add(t, rng, a + "q_b_proj.weight", {heads * (nope + rope), q_lora});
    add(t, rng, a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, H});
    t.emplace_back(a + "kv_a_layernorm.weight", ones_bf16(kv_lora));
    add(t, rng, a + "kv_b_proj.weight", {heads * (nope + v_dim), kv_lora});
    add(t, rng, a + "o_proj.weight", {H, heads * v_dim});
    const std::string m = p + "mlp.";
    if (!moe_layer(l)) {
      add(t, rng, m + "gate_proj.weight", {dense_I, H});
      add(t, rng, m + "up_proj.weight", {dense_I, H});
      add(t, rng, m + "down_proj.weight", {H, dense_I});
      return t;
    }
    add(t, rng, m + "gate.weight", {experts, H});
    // The correction bias (fp32, as DeepSeek-V3 and Kimi-K2 store it): small, so the sigmoid
    // scores still decide the routing.
    Tensor bias = Tensor::zeros(DType::kF32, {experts});
    float* b = bias.mutable_data<float>();
    for (int64_t e = 0; e < experts; ++e)
      b[e] = static_cast<float>(rng.next() >> 40) / 16777216.0f * 0.1f - 0.05f;
    t.emplace_back(m + "gate.e_score_correction_bias", std::move(bias));
    for (int64_t e = 0; e < experts; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
        const bool down = proj[0] == 'd';
        const int64_t out = down ? H : I, in = down ? I : H;
        if (arch == "deepseek_v3") {
          add(t, rng, x + proj + ".weight", {out, in});
          continue;
        }
        t.emplace_back(x + proj + ".weight_packed", random_int4_packed(rng, out, in));
        t.emplace_back(x + proj + ".weight_scale", random_int4_scales(rng, out, in, group));
        t.emplace_back(x + proj + ".weight_shape", shape_i32(out, in));
      }
    }
    const int64_t si = I * shared;
    add(t, rng, m + "shared_experts.gate_proj.weight", {si, H});
    add(t, rng, m + "shared_experts.up_proj.weight", {si, H});
    add(t, rng, m + "shared_experts.down_proj.weight", {H, si});
    return t;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(
        stderr,
        "usage: make_synthetic DIR [--arch llama|qwen3_moe|deepseek_v3|kimi_k2|gpt_oss] [--gib G] "
        "[--layers N] "
        "[--threads T] [--hidden H] [--intermediate I] [--vocab V] [--experts E] [--top_k K]\n");
    return 2;
  }
  const fs::path dir = argv[1];
  double gib = 3.0;
  int64_t layers = 0;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Shapes s;
  int64_t hidden = 0, inter = 0, vocab = 0, experts = 0, top_k = 0;
  for (int i = 2; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "make_synthetic: %s needs a value\n", a.c_str());
      return 2;
    }
    const char* v = argv[i + 1];
    if (a == "--gib")
      gib = std::atof(v);
    else if (a == "--layers")
      layers = std::atoll(v);
    else if (a == "--threads")
      threads = std::max(1, std::atoi(v));
    else if (a == "--hidden")
      hidden = std::atoll(v);
    else if (a == "--intermediate")
      inter = std::atoll(v);
    else if (a == "--vocab")
      vocab = std::atoll(v);
    else if (a == "--experts")
      experts = std::atoll(v);
    else if (a == "--top_k")
      top_k = std::atoll(v);
    else if (a == "--arch")
      s.arch = v;
    else {
      std::fprintf(stderr, "make_synthetic: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (s.arch == "qwen3_moe") {
    s.H = 2048, s.I = 768, s.V = 151936, s.heads = 32, s.kv_heads = 4, s.experts = 128, s.top_k = 8;
  } else if (s.arch == "deepseek_v3") {
    s.H = 1024, s.I = 208, s.V = 129280, s.experts = 256, s.top_k = 8;
    s.first_dense = 3, s.n_group = 8, s.topk_group = 4;
  } else if (s.arch == "kimi_k2") {
    s.H = 1280, s.I = 384, s.V = 163840, s.experts = 384, s.top_k = 8;
  } else if (s.arch == "gpt_oss") {
    s.H = 1600, s.I = 1600, s.V = 201088, s.head_dim = 64, s.heads = 32, s.kv_heads = 4;
    s.experts = 128, s.top_k = 4;
  } else if (s.arch != "llama") {
    std::fprintf(
        stderr,
        "make_synthetic: --arch must be llama, qwen3_moe, deepseek_v3, kimi_k2 or gpt_oss, got "
        "%s\n",
        s.arch.c_str());
    return 2;
  }
  if (hidden > 0) s.H = hidden;
  if (inter > 0) s.I = inter;
  if (vocab > 0) s.V = vocab;
  if (s.arch != "llama" && experts > 0) s.experts = experts;
  if (s.arch != "llama" && top_k > 0) s.top_k = std::min(top_k, s.experts);
  if (s.arch == "llama")
    s.heads = std::max<int64_t>(s.H / s.head_dim, 1),
    s.kv_heads = std::max<int64_t>(s.heads / 4, 1);
  if (s.mla()) {
    // The proportions to the hidden size 7168 of DeepSeek-V3 and Kimi-K2: 128 and 64 heads (one
    // per 56 and 112; here one per 56 and 80, so 1024 and 1280 give 16; fewer where that does not
    // divide H: their configs have no head_dim, so readers derive one from H), kv_lora_rank 512
    // (~H / 14; here H / 10), q_lora_rank 3 x kv_lora_rank, dense width 18432 (2.57 x H).
    s.heads = std::max<int64_t>(s.H / (s.arch == "kimi_k2" ? 80 : 56), 1);
    while (s.H % s.heads != 0)
      --s.heads;
    s.kv_lora = round_up(std::max<int64_t>(s.H / 10, 1), 32);
    s.q_lora = 3 * s.kv_lora;
    s.dense_I = round_up(s.H * 26 / 10, 128);
    s.top_k = std::min(s.top_k, s.experts);
  }
  if (s.arch == "deepseek_v3" && (s.experts % s.n_group != 0 || s.experts / s.n_group < 2 ||
                                  s.top_k > s.topk_group * (s.experts / s.n_group))) {
    // transformers scores each group by its top two experts and takes top_k from topk_group
    // groups.
    std::fprintf(
        stderr,
        "make_synthetic: deepseek_v3 routes in %lld groups and keeps %lld: --experts must be a "
        "multiple of %lld with at least 2 a group, and --top_k at most the experts of %lld "
        "groups (got %lld experts, top-%lld)\n",
        static_cast<long long>(s.n_group), static_cast<long long>(s.topk_group),
        static_cast<long long>(s.n_group), static_cast<long long>(s.topk_group),
        static_cast<long long>(s.experts), static_cast<long long>(s.top_k));
    return 2;
  }
  if (s.arch == "kimi_k2") {
    if (s.H % s.group != 0 || s.I % s.group != 0) {
      std::fprintf(stderr,
                   "make_synthetic: kimi_k2 needs --hidden and --intermediate divisible by the "
                   "INT4 group %lld (got %lld and %lld)\n",
                   static_cast<long long>(s.group), static_cast<long long>(s.H),
                   static_cast<long long>(s.I));
      return 2;
    }
  }
  if (s.arch == "gpt_oss" && (s.H % 32 != 0 || s.I % 32 != 0)) {
    std::fprintf(stderr,
                 "make_synthetic: gpt_oss needs --hidden and --intermediate divisible by the "
                 "MXFP4 block 32 (got %lld and %lld)\n",
                 static_cast<long long>(s.H), static_cast<long long>(s.I));
    return 2;
  }
  const double outside = 2.0 * s.outside_params();
  if (layers <= 0) {  // as many layers as fit in the size, at least 1
    double used = outside;
    while (used + s.layer_bytes(layers) <= gib * 1073741824.0)
      used += s.layer_bytes(layers++);
    layers = std::max<int64_t>(layers, 1);
  }

  fs::create_directories(dir);
  write_file_atomic((dir / "config.json").string(), s.config(layers));

  const int64_t shards = layers + 1;
  auto shard_name = [&](int64_t i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors",
                  static_cast<long long>(i + 1), static_cast<long long>(shards));
    return std::string(buf);
  };
  // Shard 0: embedding, final norm, lm_head; shard l+1: layer l.
  auto make_shard = [&](int64_t i) {
    Rng rng(static_cast<uint64_t>(i) + 1);
    if (i > 0) return s.layer(i - 1, rng);
    NamedTensors t;
    add(t, rng, "model.embed_tokens.weight", {s.V, s.H});
    t.emplace_back("model.norm.weight", ones_bf16(s.H));
    add(t, rng, "lm_head.weight", {s.V, s.H});
    return t;
  };
  std::vector<std::vector<std::string>> names(static_cast<size_t>(shards));
  std::atomic<int64_t> next{0};
  std::mutex err_mu;
  std::string error;
  auto worker = [&]() {
    for (int64_t i = next++; i < shards; i = next++) {
      try {
        NamedTensors t = make_shard(i);
        write_safetensors((dir / shard_name(i)).string(), t, {{"format", "pt"}});
        for (const auto& nt : t)
          names[static_cast<size_t>(i)].push_back(nt.first);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (error.empty()) error = e.what();
        next = shards;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < std::min<int64_t>(threads, shards); ++w)
    pool.emplace_back(worker);
  for (auto& t : pool)
    t.join();
  if (!error.empty()) {
    std::fprintf(stderr, "make_synthetic: %s\n", error.c_str());
    return 1;
  }

  std::string index = "{\"metadata\":{},\"weight_map\":{";
  bool first = true;
  for (int64_t i = 0; i < shards; ++i)
    for (const std::string& name : names[static_cast<size_t>(i)]) {
      index += (first ? "" : ",") + ("\"" + name + "\":\"" + shard_name(i) + "\"");
      first = false;
    }
  index += "}}\n";
  write_file_atomic((dir / "model.safetensors.index.json").string(), index);
  double params = s.outside_params(), bytes = outside;
  for (int64_t l = 0; l < layers; ++l)
    params += s.layer_params(l), bytes += s.layer_bytes(l);
  std::printf("%s: %s, %lld layers, hidden %lld, intermediate %lld, vocab %lld", dir.c_str(),
              s.arch.c_str(), static_cast<long long>(layers), static_cast<long long>(s.H),
              static_cast<long long>(s.I), static_cast<long long>(s.V));
  if (s.experts > 0)
    std::printf(", %lld experts top-%lld", static_cast<long long>(s.experts),
                static_cast<long long>(s.top_k));
  if (s.mla())
    std::printf(", MLA q/kv rank %lld/%lld, %lld heads, %lld dense layers",
                static_cast<long long>(s.q_lora), static_cast<long long>(s.kv_lora),
                static_cast<long long>(s.heads),
                static_cast<long long>(std::min(s.first_dense, layers)));
  if (s.arch == "deepseek_v3")
    std::printf(", %lld groups top-%lld, routed experts bf16", static_cast<long long>(s.n_group),
                static_cast<long long>(s.topk_group));
  if (s.arch == "kimi_k2")
    std::printf(", routed experts INT4 g%lld", static_cast<long long>(s.group));
  if (s.arch == "gpt_oss")
    std::printf(", %lld/%lld heads, window %lld, experts MXFP4", static_cast<long long>(s.heads),
                static_cast<long long>(s.kv_heads), static_cast<long long>(s.window));
  std::printf(", %.2f B parameters, %.2f GiB (%.2f GB)\n", params / 1e9, bytes / 1073741824.0,
              bytes / 1e9);
  return 0;
}
