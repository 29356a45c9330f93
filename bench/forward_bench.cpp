// CPU forward throughput: tokens per second through one decoder layer and through the whole
// model, for fixture-shaped models scaled up (the shapes of tests/fixtures, widened; the
// kimi_linear row has KDA layers only, 8 heads x 128).
//
//   build/default/bin/forward_bench [--tokens N] [--seq LEN]
//
// Writes random bf16 checkpoints into a temporary directory with strata's own writer, then runs
// embed + every layer + logits over N tokens in sequences of LEN and prints a table.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors_writer.h"
#include "model/forward.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

struct Spec {
  const char* name;
  const char* config;  // config.json text
};

Tensor random_bf16(Shape shape, std::mt19937& g, float scale) {
  Tensor t = Tensor::zeros(DType::kBF16, shape);
  std::normal_distribution<float> d(0.0f, scale);
  uint16_t* p = t.mutable_data<uint16_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(d(g));
  return t;
}

void add(NamedTensors& out, std::mt19937& g, const std::string& name, Shape shape) {
  const bool norm = name.find("norm") != std::string::npos;
  Tensor t = random_bf16(shape, g, norm ? 0.0f : 1.0f / std::sqrt(static_cast<float>(shape.back())));
  if (norm) {
    uint16_t* p = t.mutable_data<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = f32_to_bf16(1.0f);
  }
  out.emplace_back(name, std::move(t));
}

// Kimi-Linear KDA tensors (spec/architectures.md §4); A_log and dt_bias give decays in (0, 1).
void add_kda(NamedTensors& w, std::mt19937& g, const ModelConfig& c, const std::string& p) {
  const int64_t H = c.hidden_size, nH = c.text["linear_num_heads"].get<int64_t>();
  const int64_t d = c.text["linear_head_dim"].get<int64_t>(), D = nH * d;
  const int64_t K = c.text["linear_conv_kernel_dim"].get<int64_t>();
  for (const char* m : {"q_proj", "k_proj", "v_proj"}) add(w, g, p + "self_attn." + m + ".weight", {D, H});
  for (const char* m : {"q_conv1d", "k_conv1d", "v_conv1d"}) add(w, g, p + "self_attn." + m + ".weight", {D, 1, K});
  add(w, g, p + "self_attn.o_proj.weight", {H, D});
  add(w, g, p + "self_attn.f_a_proj.weight", {d, H});
  add(w, g, p + "self_attn.f_b_proj.weight", {D, d});
  add(w, g, p + "self_attn.g_a_proj.weight", {d, H});
  add(w, g, p + "self_attn.g_b_proj.weight", {D, d});
  add(w, g, p + "self_attn.b_proj.weight", {nH, H});
  add(w, g, p + "self_attn.o_norm.weight", {d});
  Tensor a_log = Tensor::zeros(DType::kF32, {1, 1, nH, 1}), dt = Tensor::zeros(DType::kF32, {D});
  for (int64_t h = 0; h < nH; ++h) a_log.mutable_data<float>()[h] = std::log(1.0f + static_cast<float>(h));
  for (int64_t i = 0; i < D; ++i) dt.mutable_data<float>()[i] = -3.0f;
  w.emplace_back(p + "self_attn.A_log", std::move(a_log));
  w.emplace_back(p + "self_attn.dt_bias", std::move(dt));
}

// Tensors for a checkpoint of the given config, by the same names the forward reads.
NamedTensors make_weights(const ModelConfig& c) {
  std::mt19937 g(1234);
  NamedTensors w;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const bool kimi = c.model_type == "kimi_linear";
  add(w, g, "model.embed_tokens.weight", {V, H});
  add(w, g, "model.norm.weight", {H});
  add(w, g, "lm_head.weight", {V, H});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(w, g, p + "input_layernorm.weight", {H});
    add(w, g, p + "post_attention_layernorm.weight", {H});
    if (kimi) {  // every layer KDA; layer 0 dense, then MoE under block_sparse_moe (w1/w3/w2)
      add_kda(w, g, c, p);
      const int64_t I = l == 0 ? c.intermediate_size : c.moe_intermediate_size;
      const std::string m = p + (l == 0 ? "mlp." : "block_sparse_moe.");
      if (l > 0) {
        add(w, g, m + "gate.weight", {c.num_experts, H});
        for (int64_t e = 0; e < c.num_experts; ++e) {
          const std::string x = m + "experts." + std::to_string(e) + ".";
          add(w, g, x + "w1.weight", {I, H});
          add(w, g, x + "w3.weight", {I, H});
          add(w, g, x + "w2.weight", {H, I});
        }
      }
      const std::string d = l == 0 ? m : m + "shared_experts.";
      const int64_t Id = l == 0 ? I : I * c.n_shared_experts;
      add(w, g, d + "gate_proj.weight", {Id, H});
      add(w, g, d + "up_proj.weight", {Id, H});
      add(w, g, d + "down_proj.weight", {H, Id});
      continue;
    }
    if (c.kv_lora_rank > 0) {
      const int64_t nH = c.num_attention_heads, dq = c.qk_nope_head_dim + c.qk_rope_head_dim;
      add(w, g, p + "self_attn.q_a_proj.weight", {c.q_lora_rank, H});
      add(w, g, p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank});
      add(w, g, p + "self_attn.q_b_proj.weight", {nH * dq, c.q_lora_rank});
      add(w, g, p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H});
      add(w, g, p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank});
      add(w, g, p + "self_attn.kv_b_proj.weight", {nH * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
      add(w, g, p + "self_attn.o_proj.weight", {H, nH * c.v_head_dim});
    } else {
      const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
      add(w, g, p + "self_attn.q_proj.weight", {q, H});
      add(w, g, p + "self_attn.k_proj.weight", {kv, H});
      add(w, g, p + "self_attn.v_proj.weight", {kv, H});
      add(w, g, p + "self_attn.o_proj.weight", {H, q});
    }
    if (c.num_experts == 0 || (c.kv_lora_rank > 0 && l < c.first_k_dense_replace)) {
      const int64_t I = c.intermediate_size;
      add(w, g, p + "mlp.gate_proj.weight", {I, H});
      add(w, g, p + "mlp.up_proj.weight", {I, H});
      add(w, g, p + "mlp.down_proj.weight", {H, I});
      continue;
    }
    const int64_t I = c.moe_intermediate_size;
    add(w, g, p + "mlp.gate.weight", {c.num_experts, H});
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      add(w, g, x + "gate_proj.weight", {I, H});
      add(w, g, x + "up_proj.weight", {I, H});
      add(w, g, x + "down_proj.weight", {H, I});
    }
    if (c.n_shared_experts > 0) {
      const int64_t Is = I * c.n_shared_experts;
      add(w, g, p + "mlp.shared_experts.gate_proj.weight", {Is, H});
      add(w, g, p + "mlp.shared_experts.up_proj.weight", {Is, H});
      add(w, g, p + "mlp.shared_experts.down_proj.weight", {H, Is});
    }
  }
  return w;
}

const Spec kSpecs[] = {
    {"llama", R"({"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":1024,
      "intermediate_size":2816,"num_hidden_layers":2,"num_attention_heads":16,"num_key_value_heads":4,
      "head_dim":64,"vocab_size":8192,"rms_norm_eps":1e-5,"rope_theta":500000.0})"},
    {"qwen3_moe", R"({"model_type":"qwen3_moe","architectures":["Qwen3MoeForCausalLM"],"hidden_size":1024,
      "intermediate_size":2816,"num_hidden_layers":2,"num_attention_heads":16,"num_key_value_heads":4,
      "head_dim":64,"vocab_size":8192,"rms_norm_eps":1e-6,"rope_theta":1000000.0,"num_experts":32,
      "num_experts_per_tok":4,"moe_intermediate_size":512,"norm_topk_prob":true,"decoder_sparse_step":1,
      "mlp_only_layers":[]})"},
    {"deepseek_v3", R"({"model_type":"deepseek_v3","architectures":["DeepseekV3ForCausalLM"],"hidden_size":1024,
      "intermediate_size":2816,"num_hidden_layers":2,"num_attention_heads":16,"num_key_value_heads":16,
      "vocab_size":8192,"rms_norm_eps":1e-6,"q_lora_rank":384,"kv_lora_rank":128,"qk_nope_head_dim":64,
      "qk_rope_head_dim":32,"v_head_dim":64,"n_routed_experts":32,"n_shared_experts":1,"num_experts_per_tok":4,
      "moe_intermediate_size":512,"n_group":4,"topk_group":2,"routed_scaling_factor":2.5,
      "first_k_dense_replace":0,"norm_topk_prob":true,"scoring_func":"sigmoid","topk_method":"noaux_tc",
      "rope_theta":10000.0})"},
    {"kimi_linear", R"({"model_type":"kimi_linear","architectures":["KimiLinearForCausalLM"],"hidden_size":1024,
      "intermediate_size":2816,"num_hidden_layers":2,"num_attention_heads":16,"num_key_value_heads":16,
      "vocab_size":8192,"rms_norm_eps":1e-5,"kv_lora_rank":128,"qk_nope_head_dim":64,"qk_rope_head_dim":32,
      "v_head_dim":64,"num_experts":32,"num_shared_experts":1,"num_experts_per_token":4,
      "moe_intermediate_size":512,"num_expert_group":1,"topk_group":1,"routed_scaling_factor":2.446,
      "moe_renormalize":true,"linear_num_heads":8,"linear_head_dim":128,"linear_conv_kernel_dim":4,
      "layer_types":["linear_attention","linear_attention"],"mlp_layer_types":["dense","sparse"]})"},
};

}  // namespace

int main(int argc, char** argv) {
  int64_t n_tokens = 2048, seq = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--tokens") n_tokens = std::atoll(argv[i + 1]);
    if (a == "--seq") seq = std::atoll(argv[i + 1]);
  }
  const fs::path root = fs::temp_directory_path() / ("strata_forward_bench_" + std::to_string(getpid()));
  std::printf("%-12s %8s %8s %12s %14s %14s\n", "model", "layers", "tokens", "params/layer", "layer tok/s",
              "model tok/s");
  for (const Spec& s : kSpecs) {
    const fs::path dir = root / s.name;
    fs::create_directories(dir);
    write_file_atomic((dir / "config.json").string(), s.config);
    ModelConfig config = read_model_config(dir.string());
    NamedTensors w = make_weights(config);
    int64_t layer_params = 0;
    for (auto& [name, t] : w) {
      if (name.rfind("model.layers.0.", 0) == 0) layer_params += t.numel();
    }
    write_safetensors((dir / "model.safetensors").string(), w);
    w.clear();
    Checkpoint ckpt = Checkpoint::open(dir.string());
    auto fwd = ModelForward::create(config, ckpt);
    std::vector<std::vector<int32_t>> seqs;
    std::mt19937 g(7);
    for (int64_t done = 0; done < n_tokens; done += seq) {
      std::vector<int32_t> ids(static_cast<size_t>(std::min(seq, n_tokens - done)));
      for (auto& id : ids) id = static_cast<int32_t>(g() % config.vocab_size);
      seqs.push_back(ids);
    }
    Batch batch = Batch::from_sequences(seqs);
    std::vector<float> h(batch.n_tokens() * config.hidden_size), logits(batch.n_tokens() * config.vocab_size);
    auto t0 = std::chrono::steady_clock::now();
    fwd->embed(batch, h.data());
    double layer_seconds = 0;
    for (int64_t l = 0; l < fwd->num_layers(); ++l) {
      auto layer = fwd->layer(l);
      auto a = std::chrono::steady_clock::now();
      layer->forward(batch, h.data(), nullptr);
      layer_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    }
    fwd->logits(batch, h.data(), logits.data());
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-12s %8lld %8lld %12lld %14.0f %14.0f\n", s.name, static_cast<long long>(fwd->num_layers()),
                static_cast<long long>(batch.n_tokens()), static_cast<long long>(layer_params),
                batch.n_tokens() * fwd->num_layers() / layer_seconds, batch.n_tokens() / total);
  }
  fs::remove_all(root);
  return 0;
}
