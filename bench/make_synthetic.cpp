// Writes a synthetic bf16 Llama checkpoint of about the requested size (with --experts E: a
// Qwen3-MoE one shaped like tests/fixtures/models/qwen3_moe, E routed experts of width
// --moe_intermediate, top-2, q/k norms), for bench/quantize_bench.sh and bench/mpi_bench.sh: config.json, one shard per decoder layer plus one for the embedding,
// final norm and lm_head, and model.safetensors.index.json. Weights are pseudo-random (xorshift,
// scaled by 1/sqrt(fan-in)), so the forward stays finite; only one layer is held in memory at a
// time.
//
//   build/dev/bin/make_synthetic DIR [--gib 3.0] [--hidden 2048] [--intermediate 5632]
//                                    [--vocab 32000] [--experts 0] [--moe_intermediate 512]
//
// Layers = (size - embedding - lm_head) / one layer's bytes, at least 1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/dtype.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

uint64_t g_state = 0x9e3779b97f4a7c15ull;

// Uniform in [-scale, scale) via xorshift64*: cheap enough to write GiBs in seconds.
Tensor random_bf16(Shape shape, float scale) {
  Tensor t = Tensor::zeros(DType::kBF16, shape);
  uint16_t* p = t.mutable_data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    g_state ^= g_state >> 12;
    g_state ^= g_state << 25;
    g_state ^= g_state >> 27;
    const uint64_t r = g_state * 0x2545f4914f6cdd1dull;
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = f32_to_bf16((2.0f * u - 1.0f) * scale);
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

void add(NamedTensors& out, const std::string& name, Shape shape) {
  const float scale = std::sqrt(3.0f / static_cast<float>(shape.back()));  // unit variance out
  out.emplace_back(name, random_bf16(std::move(shape), scale));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: make_synthetic DIR [--gib G] [--hidden H] [--intermediate I] "
                 "[--vocab V] [--experts E] [--moe_intermediate M]\n");
    return 2;
  }
  const fs::path dir = argv[1];
  double gib = 3.0;
  int64_t H = 2048, I = 5632, V = 32000, E = 0, M = 512;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--gib") gib = std::atof(argv[i + 1]);
    if (a == "--hidden") H = std::atoll(argv[i + 1]);
    if (a == "--intermediate") I = std::atoll(argv[i + 1]);
    if (a == "--vocab") V = std::atoll(argv[i + 1]);
    if (a == "--experts") E = std::atoll(argv[i + 1]);
    if (a == "--moe_intermediate") M = std::atoll(argv[i + 1]);
  }
  const int64_t head_dim = 128, heads = H / head_dim, kv_heads = std::max<int64_t>(heads / 4, 1);
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  const double mlp = E > 0 ? static_cast<double>(E * 3 * M * H + E * H + 2 * head_dim)
                           : static_cast<double>(3 * I * H);
  const double layer_bytes = 2.0 * (static_cast<double>(2 * q * H + 2 * kv * H + 2 * H) + mlp);
  const double outside = 2.0 * static_cast<double>(2 * V * H + H);
  const int64_t layers =
      std::max<int64_t>(1, static_cast<int64_t>((gib * 1073741824.0 - outside) / layer_bytes));
  fs::create_directories(dir);
  const std::string arch =
      E > 0 ? "\"model_type\":\"qwen3_moe\",\"architectures\":[\"Qwen3MoeForCausalLM\"],\"num_experts\":" +
                  std::to_string(E) +
                  ",\"num_experts_per_tok\":2,\"moe_intermediate_size\":" + std::to_string(M) +
                  ",\"norm_topk_prob\":true,\"decoder_sparse_step\":1,\"mlp_only_layers\":[]"
            : std::string("\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"]");
  const std::string config =
      "{" + arch + ",\"hidden_size\":" +
      std::to_string(H) + ",\"intermediate_size\":" + std::to_string(I) +
      ",\"num_hidden_layers\":" + std::to_string(layers) +
      ",\"num_attention_heads\":" + std::to_string(heads) +
      ",\"num_key_value_heads\":" + std::to_string(kv_heads) +
      ",\"head_dim\":" + std::to_string(head_dim) + ",\"vocab_size\":" + std::to_string(V) +
      ",\"rms_norm_eps\":1e-5,\"rope_theta\":500000.0,\"torch_dtype\":\"bfloat16\"}\n";
  write_file_atomic((dir / "config.json").string(), config);

  const int64_t shards = layers + 1;
  auto shard_name = [&](int64_t i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors",
                  static_cast<long long>(i + 1), static_cast<long long>(shards));
    return std::string(buf);
  };
  std::string index = "{\"metadata\":{},\"weight_map\":{";
  bool first = true;
  auto write_shard = [&](int64_t i, const NamedTensors& t) {
    write_safetensors((dir / shard_name(i)).string(), t);
    for (const auto& [name, tensor] : t) {
      index += (first ? "" : ",") + ("\"" + name + "\":\"" + shard_name(i) + "\"");
      first = false;
    }
  };
  {
    NamedTensors t;
    add(t, "model.embed_tokens.weight", {V, H});
    t.emplace_back("model.norm.weight", ones_bf16(H));
    add(t, "lm_head.weight", {V, H});
    write_shard(0, t);
  }
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    NamedTensors t;
    t.emplace_back(p + "input_layernorm.weight", ones_bf16(H));
    t.emplace_back(p + "post_attention_layernorm.weight", ones_bf16(H));
    add(t, p + "self_attn.q_proj.weight", {q, H});
    add(t, p + "self_attn.k_proj.weight", {kv, H});
    add(t, p + "self_attn.v_proj.weight", {kv, H});
    add(t, p + "self_attn.o_proj.weight", {H, q});
    if (E > 0) {
      t.emplace_back(p + "self_attn.q_norm.weight", ones_bf16(head_dim));
      t.emplace_back(p + "self_attn.k_norm.weight", ones_bf16(head_dim));
      add(t, p + "mlp.gate.weight", {E, H});
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        add(t, x + "gate_proj.weight", {M, H});
        add(t, x + "up_proj.weight", {M, H});
        add(t, x + "down_proj.weight", {H, M});
      }
    } else {
      add(t, p + "mlp.gate_proj.weight", {I, H});
      add(t, p + "mlp.up_proj.weight", {I, H});
      add(t, p + "mlp.down_proj.weight", {H, I});
    }
    write_shard(l + 1, t);
  }
  index += "}}\n";
  write_file_atomic((dir / "model.safetensors.index.json").string(), index);
  std::printf("%s: %s, %lld layers, hidden %lld, intermediate %lld, vocab %lld, %.2f GiB\n",
              dir.c_str(), E > 0 ? ("qwen3_moe, " + std::to_string(E) + " experts").c_str() : "llama",
              static_cast<long long>(layers), static_cast<long long>(H),
              static_cast<long long>(I), static_cast<long long>(V),
              (outside + layer_bytes * static_cast<double>(layers)) / 1073741824.0);
  return 0;
}
