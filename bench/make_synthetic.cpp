// Writes a synthetic bf16 checkpoint of about the requested size, for bench/quantize_bench.sh
// (Llama) and bench/gpu_bench.sh (Qwen3-MoE): config.json, one shard per decoder layer plus one
// for the embedding, final norm and lm_head, and model.safetensors.index.json. Weights are
// pseudo-random (uniform, scaled by sqrt(3 / fan-in) so every linear keeps unit variance and the
// forward stays finite); norms are ones. Shards are generated and written by --threads workers,
// one whole layer each; shard i's values depend only on i, so the bytes do not depend on the
// thread count.
//
//   build/dev/bin/make_synthetic DIR [--arch llama|qwen3_moe] [--gib G] [--layers N]
//                                    [--threads T] [--hidden H] [--intermediate I] [--vocab V]
//
// --arch llama (the default; hidden 2048, intermediate 5632, 16/4 heads of 128, vocab 32000).
// --arch qwen3_moe: Qwen3-30B-A3B's shapes (hidden 2048, 32/4 heads of 128 with q/k norms, 128
// experts of width 768, top-8, vocab 151936) with fewer layers; --intermediate sets the expert
// width, --experts and --top_k the routed experts. The config.json is the one transformers 5.17
// writes for Qwen3MoeForCausalLM. Layers: --layers N, or else (G GiB - embedding - lm_head) / one
// layer's bytes, at least 1.
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

struct Shapes {
  std::string arch = "llama";
  int64_t H = 2048, I = 5632, V = 32000;
  int64_t head_dim = 128, heads = 16, kv_heads = 4;
  int64_t experts = 0, top_k = 0;  // qwen3_moe

  // Parameters of one decoder layer and of everything outside the layers.
  double layer_params() const {
    const double q = static_cast<double>(heads * head_dim),
                 kv = static_cast<double>(kv_heads * head_dim);
    const double h = static_cast<double>(H), i = static_cast<double>(I);
    const double attn = 2 * q * h + 2 * kv * h;
    if (arch == "qwen3_moe")
      return attn + 2 * static_cast<double>(head_dim) + static_cast<double>(experts) * h +
             static_cast<double>(experts) * 3 * i * h + 2 * h;
    return attn + 3 * i * h + 2 * h;
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
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') {
    std::fprintf(
        stderr,
        "usage: make_synthetic DIR [--arch llama|qwen3_moe] [--gib G] [--layers N] "
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
  } else if (s.arch != "llama") {
    std::fprintf(stderr, "make_synthetic: --arch must be llama or qwen3_moe, got %s\n",
                 s.arch.c_str());
    return 2;
  }
  if (hidden > 0) s.H = hidden;
  if (inter > 0) s.I = inter;
  if (vocab > 0) s.V = vocab;
  if (s.arch == "qwen3_moe" && experts > 0) s.experts = experts;
  if (s.arch == "qwen3_moe" && top_k > 0) s.top_k = std::min(top_k, s.experts);
  if (s.arch == "llama")
    s.heads = std::max<int64_t>(s.H / s.head_dim, 1),
    s.kv_heads = std::max<int64_t>(s.heads / 4, 1);
  const double layer_bytes = 2.0 * s.layer_params(), outside = 2.0 * s.outside_params();
  if (layers <= 0)
    layers =
        std::max<int64_t>(1, static_cast<int64_t>((gib * 1073741824.0 - outside) / layer_bytes));

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
  const double params = s.outside_params() + s.layer_params() * static_cast<double>(layers);
  std::printf("%s: %s, %lld layers, hidden %lld, intermediate %lld, vocab %lld", dir.c_str(),
              s.arch.c_str(), static_cast<long long>(layers), static_cast<long long>(s.H),
              static_cast<long long>(s.I), static_cast<long long>(s.V));
  if (s.experts > 0)
    std::printf(", %lld experts top-%lld", static_cast<long long>(s.experts),
                static_cast<long long>(s.top_k));
  std::printf(", %.2f B parameters, %.2f GiB (%.2f GB)\n", params / 1e9,
              2.0 * params / 1073741824.0, 2.0 * params / 1e9);
  return 0;
}
