// `strata inspect` on the bundled demo checkpoint, checked against numbers computed here from the
// demo's config.json, and on broken copies of it: every broken copy must exit 1 with exactly one
// line on stderr naming the file (and the tensor, where there is one).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cli/cli_util.h"

namespace {

namespace fs = std::filesystem;
using OrderedJson = nlohmann::ordered_json;
using namespace strata_cli_test;

const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/demo/tiny-llama";
const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

// Copies the demo into <tmp>/ckpt and returns that path.
fs::path copy_demo(const TempDir& tmp) {
  fs::path dst = tmp.path() / "ckpt";
  fs::copy(kDemo, dst, fs::copy_options::recursive);
  return dst;
}

// A safetensors file split into its header (parsed) and its data section.
struct Shard {
  OrderedJson header;
  std::string data;
};

Shard read_shard(const fs::path& p) {
  std::string bytes = read_file(p);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian host assumed, as strata does
  Shard s;
  s.header = OrderedJson::parse(bytes.substr(8, n));
  s.data = bytes.substr(8 + n);
  return s;
}

void write_shard(const fs::path& p, const Shard& s) {
  std::string text = s.header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  write_file(p, out + text + s.data);
}

std::string with_commas(int64_t n) {
  std::string d = std::to_string(n), out;
  int lead = static_cast<int>(d.size() % 3);
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (static_cast<int>(i) - lead) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}

// The row of the human table whose first word is `first`.
std::string row(const std::string& text, const std::string& first) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string w;
    words >> w;
    if (w == first) return line;
  }
  return "";
}

// What the demo's config says, and the numbers that follow from it.
struct Expected {
  int64_t H, nH, nKV, d, I, V, L;
  bool tied;
  int64_t attention, mlp, embed, lm_head, norms, total;
  int64_t nvfp4, fp8;  // estimated output bytes
  int64_t linears;     // quantized weights
};

Expected expected_from_config() {
  OrderedJson c = OrderedJson::parse(read_file(fs::path(kDemo) / "config.json"));
  Expected e;
  e.H = c["hidden_size"];
  e.nH = c["num_attention_heads"];
  e.nKV = c["num_key_value_heads"];
  e.d = c.contains("head_dim") ? c["head_dim"].get<int64_t>() : e.H / e.nH;
  e.I = c["intermediate_size"];
  e.V = c["vocab_size"];
  e.L = c["num_hidden_layers"];
  e.tied = c.value("tie_word_embeddings", false);
  e.attention = e.L * (e.H * e.nH * e.d + 2 * e.H * e.nKV * e.d + e.nH * e.d * e.H);
  e.mlp = e.L * 3 * e.H * e.I;
  e.embed = e.V * e.H;
  e.lm_head = e.tied ? 0 : e.V * e.H;
  e.norms = e.L * 2 * e.H + e.H;
  e.total = e.attention + e.mlp + e.embed + e.lm_head + e.norms;
  // Linear weights [out, in] of one layer.
  const int64_t shapes[7][2] = {{e.nH * e.d, e.H}, {e.nKV * e.d, e.H}, {e.nKV * e.d, e.H},
                                {e.H, e.nH * e.d}, {e.I, e.H},         {e.I, e.H},
                                {e.H, e.I}};
  int64_t unquantized_bytes = 2 * (e.embed + e.lm_head + e.norms);  // bf16
  e.nvfp4 = unquantized_bytes;
  e.fp8 = unquantized_bytes;
  for (const auto& s : shapes) {
    const int64_t mk = s[0] * s[1];
    e.nvfp4 += e.L * (mk / 2 + mk / 16 + 4 + 4);  // packed E2M1, E4M3 block scales, 2 scalars
    e.fp8 += e.L * (mk + 4 + 4);
  }
  e.linears = 7 * e.L;
  return e;
}

int64_t demo_bytes_on_disk() {
  int64_t n = 0;
  for (const auto& f : fs::directory_iterator(kDemo)) {
    if (f.path().extension() == ".safetensors") n += static_cast<int64_t>(f.file_size());
  }
  return n;
}

TEST(Inspect, DemoJson) {
  TempDir tmp;
  RunResult r = run_strata("inspect '" + kDemo + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  OrderedJson j = OrderedJson::parse(r.out);
  Expected e = expected_from_config();

  EXPECT_EQ(j["schema"], "strata.inspect.v1");
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["family"], "llama");
  EXPECT_EQ(j["multimodal"], false);
  EXPECT_EQ(j["architectures"], OrderedJson::array({"LlamaForCausalLM"}));
  EXPECT_EQ(j["num_hidden_layers"], e.L);
  OrderedJson dense = OrderedJson::array();
  for (int64_t i = 0; i < e.L; ++i)
    dense.push_back(i);
  EXPECT_EQ(j["dense_layers"], dense);
  EXPECT_EQ(j["moe_layers"], OrderedJson::array());

  const OrderedJson& k = j["kinds"];
  EXPECT_EQ(k["attention"]["params"], e.attention);
  EXPECT_EQ(k["attention"]["tensors"], 4 * e.L);
  EXPECT_EQ(k["attention"]["bytes"], 2 * e.attention);
  EXPECT_EQ(k["dense_mlp"]["params"], e.mlp);
  EXPECT_EQ(k["dense_mlp"]["tensors"], 3 * e.L);
  EXPECT_EQ(k["embeddings"]["params"], e.embed);
  EXPECT_EQ(k["lm_head"]["params"], e.lm_head);
  EXPECT_EQ(k["norms"]["params"], e.norms);
  EXPECT_EQ(k["norms"]["tensors"], 2 * e.L + 1);
  for (const char* none : {"routed_experts", "shared_experts", "router", "vision_tower",
                           "projector", "mtp", "other", "unrecognized"}) {
    EXPECT_EQ(k[none]["tensors"], 0) << none;
    EXPECT_EQ(k[none]["params"], 0) << none;
  }
  EXPECT_EQ(j["params"], e.total);
  EXPECT_EQ(j["tensors"], 9 * e.L + 3);
  EXPECT_EQ(j["tensor_bytes"], 2 * e.total);
  EXPECT_EQ(j["bytes_on_disk"], demo_bytes_on_disk());
  ASSERT_EQ(j["shards"].size(), 2u);
  EXPECT_EQ(j["shards"][0]["file"], kShard1);
  EXPECT_EQ(j["shards"][1]["file"], kShard2);
  EXPECT_EQ(j["shards"][0]["tensors"].get<int64_t>() + j["shards"][1]["tensors"].get<int64_t>(),
            9 * e.L + 3);

  ASSERT_EQ(j["dtypes"].size(), 1u);
  EXPECT_EQ(j["dtypes"]["BF16"]["tensors"], 9 * e.L + 3);
  EXPECT_EQ(j["dtypes"]["BF16"]["elements"], e.total);
  EXPECT_EQ(j["dtypes"]["BF16"]["bytes"], 2 * e.total);

  const OrderedJson& est = j["estimates"];
  EXPECT_EQ(est["nvfp4"]["bytes"], e.nvfp4);
  EXPECT_EQ(est["nvfp4"]["quantized_tensors"], e.linears);
  EXPECT_EQ(est["fp8"]["bytes"], e.fp8);
  EXPECT_EQ(est["fp8"]["quantized_tensors"], e.linears);
  // A dense model has no routed experts: nothing changes.
  EXPECT_EQ(est["nvfp4_experts_only"]["bytes"], 2 * e.total);
  EXPECT_EQ(est["nvfp4_experts_only"]["quantized_tensors"], 0);
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
}

TEST(Inspect, DemoHuman) {
  TempDir tmp;
  RunResult r = run_strata("inspect '" + kDemo + "'", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  Expected e = expected_from_config();
  EXPECT_NE(row(r.out, "model_type").find("llama"), std::string::npos) << r.out;
  std::string layers = row(r.out, "layers");
  EXPECT_NE(layers.find(std::to_string(e.L) + ":"), std::string::npos) << layers;
  EXPECT_NE(layers.find("dense 0-" + std::to_string(e.L - 1)), std::string::npos) << layers;
  EXPECT_NE(layers.find("MoE none"), std::string::npos) << layers;
  EXPECT_NE(row(r.out, "attention").find(" " + with_commas(e.attention) + " "), std::string::npos)
      << r.out;
  EXPECT_NE(row(r.out, "dense_mlp").find(" " + with_commas(e.mlp) + " "), std::string::npos)
      << r.out;
  EXPECT_NE(row(r.out, "embeddings").find(" " + with_commas(e.embed) + " "), std::string::npos);
  EXPECT_NE(row(r.out, "norms").find(" " + with_commas(e.norms) + " "), std::string::npos);
  EXPECT_NE(row(r.out, "total").find(" " + with_commas(e.total) + " "), std::string::npos);
  EXPECT_NE(row(r.out, "BF16").find(" " + with_commas(e.total) + " "), std::string::npos);
  EXPECT_NE(row(r.out, "shards").find(with_commas(demo_bytes_on_disk()) + " bytes"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("unrecognized tensors: none"), std::string::npos) << r.out;
}

TEST(Inspect, ListsUnrecognizedTensors) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  const std::string bad = "model.layers.0.mlp.upp_proj.weight";
  Shard s = read_shard(dir / kShard1);
  OrderedJson renamed = OrderedJson::object();
  for (auto& [key, value] : s.header.items()) {
    renamed[key == "model.layers.0.mlp.up_proj.weight" ? bad : key] = value;
  }
  s.header = renamed;
  write_shard(dir / kShard1, s);
  OrderedJson index = OrderedJson::parse(read_file(dir / "model.safetensors.index.json"));
  index["weight_map"].erase("model.layers.0.mlp.up_proj.weight");
  index["weight_map"][bad] = kShard1;
  write_file(dir / "model.safetensors.index.json", index.dump());

  RunResult r = run_strata("inspect '" + dir.string() + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["unrecognized"], OrderedJson::array({bad}));
  EXPECT_EQ(j["kinds"]["unrecognized"]["tensors"], 1);
  Expected e = expected_from_config();
  EXPECT_EQ(j["kinds"]["dense_mlp"]["params"], e.mlp - e.H * e.I);

  RunResult h = run_strata("inspect '" + dir.string() + "'", tmp.path());
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_NE(h.out.find("unrecognized tensors: 1"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("  " + bad + "\n"), std::string::npos) << h.out;
}

// ---- synthetic MoE and multimodal checkpoints ---------------------------------------------

// One tensor of a hand-written checkpoint and what it is expected to be.
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  std::string kind;  // the kind inspect must report
  char quant = '-';  // 'd': a linear weight the default recipes quantize; 'e': a routed expert's
  std::string dtype = "BF16";
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

int64_t elem_bytes(const std::string& dtype) {
  return dtype == "F32" ? 4 : 2;
}

// Writes <dir>/model.safetensors (zero-filled data) and <dir>/config.json.
void write_checkpoint(const fs::path& dir, const OrderedJson& config,
                      const std::vector<Spec>& specs) {
  fs::create_directories(dir);
  Shard s;
  s.header = OrderedJson::object();
  for (const Spec& t : specs) {
    const uint64_t begin = s.data.size();
    s.data.append(static_cast<size_t>(numel(t.shape) * elem_bytes(t.dtype)), '\0');
    s.header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, s.data.size()}}};
  }
  write_shard(dir / "model.safetensors", s);
  write_file(dir / "config.json", config.dump(2));
}

// Checks the --json report's kinds, estimates and unrecognised names against the specs.
void check_report(const OrderedJson& j, const std::vector<Spec>& specs) {
  std::map<std::string, std::array<int64_t, 3>> kinds;  // tensors, params, bytes
  int64_t nvfp4 = 0, experts_only = 0, fp8 = 0, n_default = 0, n_experts = 0;
  OrderedJson unrecognized = OrderedJson::array();
  for (const Spec& t : specs) {
    const int64_t n = numel(t.shape), bytes = n * elem_bytes(t.dtype);
    auto& k = kinds[t.kind];
    k[0] += 1;
    k[1] += n;
    k[2] += bytes;
    if (t.kind == "unrecognized") unrecognized.push_back(t.name);
    // NVFP4: packed E2M1 + one E4M3 scale per 16 + weight_scale_2 + input_scale (format.md §1);
    // FP8: one byte per weight + weight_scale + input_scale (§2).
    const int64_t as_nvfp4 = n / 2 + n / 16 + 8, as_fp8 = n + 8;
    const bool quantized = t.quant == 'd' || t.quant == 'e';
    nvfp4 += quantized ? as_nvfp4 : bytes;
    fp8 += quantized ? as_fp8 : bytes;
    experts_only += t.quant == 'e' ? as_nvfp4 : bytes;
    n_default += quantized;
    n_experts += t.quant == 'e';
  }
  for (const auto& [name, k] : kinds) {
    EXPECT_EQ(j["kinds"][name]["tensors"], k[0]) << name;
    EXPECT_EQ(j["kinds"][name]["params"], k[1]) << name;
    EXPECT_EQ(j["kinds"][name]["bytes"], k[2]) << name;
  }
  for (const auto& [name, v] : j["kinds"].items()) {
    if (!kinds.count(name)) {
      EXPECT_EQ(v["tensors"], 0) << name;
    }
  }
  EXPECT_EQ(j["estimates"]["nvfp4"]["bytes"], nvfp4);
  EXPECT_EQ(j["estimates"]["nvfp4"]["quantized_tensors"], n_default);
  EXPECT_EQ(j["estimates"]["fp8"]["bytes"], fp8);
  EXPECT_EQ(j["estimates"]["nvfp4_experts_only"]["bytes"], experts_only);
  EXPECT_EQ(j["estimates"]["nvfp4_experts_only"]["quantized_tensors"], n_experts);
  std::sort(unrecognized.begin(), unrecognized.end());
  EXPECT_EQ(j["unrecognized"], unrecognized);
}

TEST(Inspect, QwenMoe) {
  // H 32, 4 heads x 8 (2 KV heads), 4 experts of width 16, layer 0 kept dense.
  OrderedJson config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                        {"model_type", "qwen3_moe"},
                        {"hidden_size", 32},
                        {"intermediate_size", 48},
                        {"num_hidden_layers", 3},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"head_dim", 8},
                        {"vocab_size", 64},
                        {"num_experts", 4},
                        {"num_experts_per_tok", 2},
                        {"moe_intermediate_size", 16},
                        {"decoder_sparse_step", 1},
                        {"mlp_only_layers", {0}},
                        {"norm_topk_prob", true},
                        {"rms_norm_eps", 1e-6},
                        {"rope_theta", 1000000.0},
                        {"tie_word_embeddings", true}};
  std::vector<Spec> specs = {{"model.embed_tokens.weight", {64, 32}, "embeddings"},
                             {"model.norm.weight", {32}, "norms"}};
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    std::vector<Spec> layer = {
        {p + "input_layernorm.weight", {32}, "norms"},
        {p + "post_attention_layernorm.weight", {32}, "norms"},
        {p + "self_attn.q_proj.weight", {32, 32}, "attention", 'd'},
        {p + "self_attn.k_proj.weight", {16, 32}, "attention", 'd'},
        {p + "self_attn.v_proj.weight", {16, 32}, "attention", 'd'},
        {p + "self_attn.o_proj.weight", {32, 32}, "attention", 'd'},
        {p + "self_attn.q_norm.weight", {8}, "norms"},
        {p + "self_attn.k_norm.weight", {8}, "norms"},
    };
    specs.insert(specs.end(), layer.begin(), layer.end());
    if (l == 0) {
      specs.push_back({p + "mlp.gate_proj.weight", {48, 32}, "dense_mlp", 'd'});
      specs.push_back({p + "mlp.up_proj.weight", {48, 32}, "dense_mlp", 'd'});
      specs.push_back({p + "mlp.down_proj.weight", {32, 48}, "dense_mlp", 'd'});
      continue;
    }
    specs.push_back({p + "mlp.gate.weight", {4, 32}, "router"});
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      specs.push_back({x + "gate_proj.weight", {16, 32}, "routed_experts", 'e'});
      specs.push_back({x + "up_proj.weight", {16, 32}, "routed_experts", 'e'});
      specs.push_back({x + "down_proj.weight", {32, 16}, "routed_experts", 'e'});
    }
  }
  // Names of other families are not Qwen-MoE names.
  specs.push_back({"model.layers.1.mlp.shared_experts.up_proj.weight", {16, 32}, "unrecognized"});
  specs.push_back({"model.layers.2.block_sparse_moe.gate.weight", {4, 32}, "unrecognized"});

  TempDir tmp;
  write_checkpoint(tmp.path() / "moe", config, specs);
  RunResult r = run_strata("inspect '" + (tmp.path() / "moe").string() + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "qwen_moe");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array({0}));
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({1, 2}));
  check_report(j, specs);

  RunResult h = run_strata("inspect '" + (tmp.path() / "moe").string() + "'", tmp.path());
  ASSERT_EQ(h.rc, 0) << h.err;
  EXPECT_NE(row(h.out, "layers").find("dense 0; MoE 1-2"), std::string::npos) << h.out;
}

TEST(Inspect, KimiLinearFixture) {
  // The transformers-saved Kimi-Linear fixture: KDA, MLA, KDA; layer 0 dense (its MLP saved under
  // block_sparse_moe.), layers 1-2 MoE; every name recognised.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/kimi_linear";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "kimi_linear");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array({0}));
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({1, 2}));
  EXPECT_EQ(j["linear_attention_layers"], OrderedJson::array({0, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["dense_mlp"]["tensors"], 3);
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 2 * 8 * 3);
  r = run_strata("inspect '" + dir + "'", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("linear attn     0, 2 (no KV cache)"), std::string::npos) << r.out;
}

TEST(Inspect, MixtralFixture) {
  // The transformers-saved Mixtral fixture: per-expert w1/w3/w2 under block_sparse_moe on all
  // three layers, the router block_sparse_moe.gate; every name recognised.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/mixtral";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "mixtral");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array());
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({0, 1, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 3 * 8 * 3);
  EXPECT_EQ(j["kinds"]["router"]["tensors"], 3);
}

TEST(Inspect, Glm4MoeFixture) {
  // The transformers-saved GLM-4.5 fixture: layer 0 dense, layers 1-2 MoE with a router, its
  // correction bias and a shared expert; q/k/v biases and q/k norms; every name recognised.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/glm4_moe";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "glm4_moe");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array({0}));
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({1, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 2 * 8 * 3);
  EXPECT_EQ(j["kinds"]["shared_experts"]["tensors"], 2 * 3);
  EXPECT_EQ(j["kinds"]["router"]["tensors"], 2 * 2);
  EXPECT_EQ(j["kinds"]["attention"]["tensors"], 3 * 7);
}

TEST(Inspect, MiniMaxM2Fixture) {
  // The transformers-saved MiniMax-M2 fixture: w1/w3/w2 experts under block_sparse_moe on all
  // three layers, the router and its correction bias beside it; every name recognised.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/minimax_m2";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "minimax_m2");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array());
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({0, 1, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 3 * 8 * 3);
  EXPECT_EQ(j["kinds"]["router"]["tensors"], 3 * 2);
}

TEST(Inspect, Qwen3NextFixture) {
  // The transformers-saved Qwen3-Next fixture: Gated DeltaNet layers 0 and 2 around a full
  // attention layer 1; layers 0-1 MoE with a shared expert and its gate, layer 2 dense
  // (mlp_only_layers); every name recognised.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_next";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "qwen3_next");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array({2}));
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({0, 1}));
  EXPECT_EQ(j["linear_attention_layers"], OrderedJson::array({0, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 2 * 8 * 3);
  EXPECT_EQ(j["kinds"]["shared_experts"]["tensors"], 2 * 3);
  EXPECT_EQ(j["kinds"]["router"]["tensors"], 2 * 2);
  EXPECT_EQ(j["kinds"]["dense_mlp"]["tensors"], 3);
  // in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias, out_proj; q/k/v/o_proj.
  EXPECT_EQ(j["kinds"]["attention"]["tensors"], 2 * 6 + 4);
}

TEST(Inspect, Qwen35MoeFixture) {
  // The transformers-saved Qwen3.5-MoE wrapper: the language model under model.language_model.
  // (Gated DeltaNet layers 0 and 2 with split projections, every layer MoE), a one-block vision
  // tower under model.visual.; every name recognised.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_5_moe";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["model_type"], "qwen3_5_moe");
  EXPECT_EQ(j["text_model_type"], "qwen3_5_moe_text");
  EXPECT_EQ(j["family"], "qwen3_5_moe");
  EXPECT_TRUE(j["multimodal"].get<bool>());
  EXPECT_EQ(j["dense_layers"], OrderedJson::array());
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({0, 1, 2}));
  EXPECT_EQ(j["linear_attention_layers"], OrderedJson::array({0, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 3 * 8 * 3);
  EXPECT_EQ(j["kinds"]["shared_experts"]["tensors"], 3 * 3);
  EXPECT_EQ(j["kinds"]["router"]["tensors"], 3 * 2);
  // in_proj_qkv/z/b/a, conv1d, A_log, dt_bias, out_proj; q/k/v/o_proj.
  EXPECT_EQ(j["kinds"]["attention"]["tensors"], 2 * 8 + 4);
  EXPECT_EQ(j["kinds"]["vision_tower"]["tensors"], 21);
}

TEST(Inspect, DeepseekV32Fixture) {
  // The transformers-saved DeepSeek-V3.2 fixture: MLA with the lightning indexer (wq_b, wk,
  // weights_proj are attention linears; k_norm's weight and bias norms), layer 0 dense (from
  // mlp_layer_types), layers 1-2 MoE with a router, its correction bias and a shared expert.
  TempDir tmp;
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/deepseek_v32";
  RunResult r = run_strata("inspect '" + dir + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["family"], "deepseek_v32");
  EXPECT_EQ(j["dense_layers"], OrderedJson::array({0}));
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({1, 2}));
  EXPECT_EQ(j["unrecognized"], OrderedJson::array());
  EXPECT_EQ(j["kinds"]["routed_experts"]["tensors"], 2 * 8 * 3);
  EXPECT_EQ(j["kinds"]["shared_experts"]["tensors"], 2 * 3);
  EXPECT_EQ(j["kinds"]["router"]["tensors"], 2 * 2);
  EXPECT_EQ(j["kinds"]["attention"]["tensors"], 3 * (5 + 3));
}

TEST(Inspect, MultimodalWrapper) {
  // Kimi-VL-style: a DeepSeek-V3 language model (MLA without q LoRA) under language_model.,
  // a vision tower and a projector. Layer 0 dense, layer 1 MoE with a shared expert.
  OrderedJson text = {{"model_type", "deepseek_v3"},
                      {"hidden_size", 32},
                      {"intermediate_size", 48},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 64},
                      {"q_lora_rank", nullptr},
                      {"kv_lora_rank", 16},
                      {"qk_nope_head_dim", 8},
                      {"qk_rope_head_dim", 8},
                      {"v_head_dim", 8},
                      {"n_routed_experts", 4},
                      {"num_experts_per_tok", 2},
                      {"moe_intermediate_size", 16},
                      {"n_shared_experts", 1},
                      {"first_k_dense_replace", 1},
                      {"moe_layer_freq", 1},
                      {"rms_norm_eps", 1e-5},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", false}};
  OrderedJson config = {{"architectures", {"KimiVLForConditionalGeneration"}},
                        {"model_type", "kimi_vl"},
                        {"text_config", text},
                        {"vision_config", {{"model_type", "moonvit"}, {"hidden_size", 32}}}};
  const std::string lm = "language_model.model.";
  std::vector<Spec> specs = {
      {lm + "embed_tokens.weight", {64, 32}, "embeddings"},
      {lm + "norm.weight", {32}, "norms"},
      {"language_model.lm_head.weight", {64, 32}, "lm_head"},
      {"vision_tower.patch_embed.proj.weight", {32, 12}, "vision_tower"},
      {"vision_tower.encoder.blocks.0.wqkv.weight", {96, 32}, "vision_tower"},
      {"multi_modal_projector.pre_norm.weight", {32}, "projector"},
      {"multi_modal_projector.linear_1.weight", {32, 32}, "projector"},
      // Not this family's names, or not under the wrapper's prefix.
      {lm + "layers.0.self_attn.q_norm.weight", {8}, "unrecognized"},
      {"model.layers.0.input_layernorm.weight", {32}, "unrecognized"},
  };
  for (int l = 0; l < 2; ++l) {
    const std::string p = lm + "layers." + std::to_string(l) + ".";
    std::vector<Spec> layer = {
        {p + "input_layernorm.weight", {32}, "norms"},
        {p + "post_attention_layernorm.weight", {32}, "norms"},
        {p + "self_attn.q_proj.weight", {32, 32}, "attention", 'd'},
        {p + "self_attn.kv_a_proj_with_mqa.weight", {24, 32}, "attention", 'd'},
        {p + "self_attn.kv_a_layernorm.weight", {16}, "norms"},
        {p + "self_attn.kv_b_proj.weight", {32, 16}, "attention", 'd'},
        {p + "self_attn.o_proj.weight", {32, 16}, "attention", 'd'},
    };
    specs.insert(specs.end(), layer.begin(), layer.end());
    if (l == 0) {
      specs.push_back({p + "mlp.gate_proj.weight", {48, 32}, "dense_mlp", 'd'});
      specs.push_back({p + "mlp.up_proj.weight", {48, 32}, "dense_mlp", 'd'});
      specs.push_back({p + "mlp.down_proj.weight", {32, 48}, "dense_mlp", 'd'});
      continue;
    }
    specs.push_back({p + "mlp.gate.weight", {4, 32}, "router"});
    specs.push_back({p + "mlp.gate.e_score_correction_bias", {4}, "router", '-', "F32"});
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      specs.push_back({x + "gate_proj.weight", {16, 32}, "routed_experts", 'e'});
      specs.push_back({x + "up_proj.weight", {16, 32}, "routed_experts", 'e'});
      specs.push_back({x + "down_proj.weight", {32, 16}, "routed_experts", 'e'});
    }
    specs.push_back({p + "mlp.shared_experts.gate_proj.weight", {16, 32}, "shared_experts", 'd'});
    specs.push_back({p + "mlp.shared_experts.up_proj.weight", {16, 32}, "shared_experts", 'd'});
    specs.push_back({p + "mlp.shared_experts.down_proj.weight", {32, 16}, "shared_experts", 'd'});
  }
  // DeepSeek's MTP layer sits after the decoder layers.
  specs.push_back({lm + "layers.2.eh_proj.weight", {32, 64}, "mtp"});
  specs.push_back({lm + "layers.2.enorm.weight", {32}, "mtp"});

  TempDir tmp;
  write_checkpoint(tmp.path() / "vl", config, specs);
  RunResult r = run_strata("inspect '" + (tmp.path() / "vl").string() + "' --json", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  OrderedJson j = OrderedJson::parse(r.out);
  EXPECT_EQ(j["model_type"], "kimi_vl");
  EXPECT_EQ(j["text_model_type"], "deepseek_v3");
  EXPECT_EQ(j["family"], "deepseek_v3");
  EXPECT_EQ(j["multimodal"], true);
  EXPECT_EQ(j["dense_layers"], OrderedJson::array({0}));
  EXPECT_EQ(j["moe_layers"], OrderedJson::array({1}));
  ASSERT_EQ(j["dtypes"].size(), 2u);
  EXPECT_EQ(j["dtypes"]["F32"]["tensors"], 1);
  EXPECT_EQ(j["dtypes"]["F32"]["bytes"], 16);
  check_report(j, specs);
}

// The compressed fixtures (tests/fixtures/make_compressed_fixtures.py): per kind, how the linear
// weights are stored and which tensors decompression reads. Counts from how the fixtures were
// built: deepseek_v3 has 3 layers (layer 0 dense), 8 routed experts of 3 projections in layers
// 1-2, MLA q_a/q_b/kv_a/kv_b/o per layer, a dense MLP in layer 0, one shared expert per MoE layer.
TEST(Inspect, CompressedSources) {
  const std::string models = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/";
  TempDir tmp;
  {
    RunResult r = run_strata("inspect '" + models + "kimi_k25_int4' --json", tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    OrderedJson j = OrderedJson::parse(r.out);
    EXPECT_EQ(j["source_quant_method"], "compressed-tensors");
    const OrderedJson& c = j["compression"];
    EXPECT_EQ(c["routed_experts"],
              OrderedJson({{"int4_pack g32",
                            {{"modules", 48},
                             {"tensors", 144},
                             {"bytes", j["kinds"]["routed_experts"]["bytes"]}}}}));
    EXPECT_EQ(c["attention"].size(), 1u);
    EXPECT_EQ(c["attention"]["bf16"]["modules"], 15);
    EXPECT_EQ(c["attention"]["bf16"]["tensors"], 0);
    ASSERT_EQ(j["decompressed_tensors"].size(), 144u);
    EXPECT_EQ(j["decompressed_tensors"][0],
              "language_model.model.layers.1.mlp.experts.0.down_proj.weight_packed");
    EXPECT_EQ(j["unrecognized"], OrderedJson::array());
    // Vision tower (10 tensors) and projector (6), as the fixture script writes them.
    EXPECT_EQ(j["kinds"]["vision_tower"]["tensors"], 10);
    EXPECT_EQ(j["kinds"]["projector"]["tensors"], 6);
    RunResult h = run_strata("inspect '" + models + "kimi_k25_int4'", tmp.path());
    ASSERT_EQ(h.rc, 0) << h.err;
    EXPECT_NE(h.out.find("routed_experts   int4_pack g32"), std::string::npos) << h.out;
  }
  {
    RunResult r = run_strata("inspect '" + models + "deepseek_v3_fp8' --json", tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    OrderedJson j = OrderedJson::parse(r.out);
    EXPECT_EQ(j["source_quant_method"], "fp8");
    const OrderedJson& c = j["compression"];
    // kv_a_proj_with_mqa stays bf16 in the fixture (its name does not end in _proj).
    EXPECT_EQ(c["attention"]["fp8_block 128x128"]["modules"], 12);
    EXPECT_EQ(c["attention"]["bf16"]["modules"], 3);
    EXPECT_EQ(c["routed_experts"]["fp8_block 128x128"]["tensors"], 96);
    EXPECT_EQ(c["dense_mlp"]["fp8_block 128x128"]["modules"], 3);
    EXPECT_EQ(c["lm_head"]["bf16"]["modules"], 1);
    EXPECT_EQ(j["decompressed_tensors"].size(), 2u * (12 + 3 + 48 + 6));
  }
  {
    RunResult r = run_strata("inspect '" + models + "deepseek_v3_mxfp4' --json", tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    OrderedJson j = OrderedJson::parse(r.out);
    EXPECT_EQ(j["compression"]["routed_experts"]["mxfp4 b32"]["modules"], 48);
    // MXFP4 holds two values per byte: the experts' parameters are their logical sizes,
    // 2 layers x 8 experts x 3 x 32 x 64.
    EXPECT_EQ(j["kinds"]["routed_experts"]["params"], 2 * 8 * 3 * 32 * 64);
  }
}

// ---- broken checkpoints --------------------------------------------------------------------

// Runs inspect on `dir` and checks the failure: exit 1 (bad input, not a crash or an internal
// error), nothing on stdout, one line on stderr holding every string in `named`.
void expect_one_line_error(const fs::path& dir, const TempDir& tmp,
                           const std::vector<std::string>& named) {
  for (const char* mode : {"", " --json"}) {
    RunResult r = run_strata("inspect '" + dir.string() + "'" + mode, tmp.path());
    EXPECT_EQ(r.rc, 1) << "stderr: " << r.err;
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.back(), '\n') << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    for (const std::string& n : named)
      EXPECT_NE(r.err.find(n), std::string::npos) << r.err;
  }
}

TEST(InspectBroken, TruncatedShard) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  fs::resize_file(dir / kShard2, fs::file_size(dir / kShard2) - 1000);
  // lm_head.weight is the last tensor of shard 2 (demo/make_demo.py).
  expect_one_line_error(dir, tmp, {kShard2, "lm_head.weight"});
}

TEST(InspectBroken, GarbageHeader) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  std::string bytes = read_file(dir / kShard1);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  for (uint64_t i = 0; i < n; ++i)
    bytes[8 + i] = static_cast<char>("\x01{garbage}\xff"[i % 11]);
  write_file(dir / kShard1, bytes);
  expect_one_line_error(dir, tmp, {kShard1});
}

TEST(InspectBroken, OversizedHeaderLength) {
  for (uint64_t n : {uint64_t{1} << 40, uint64_t{0xFFFFFFFFFFFFFFFF}, uint64_t{99'999'992}}) {
    TempDir tmp;
    fs::path dir = copy_demo(tmp);
    std::string bytes = read_file(dir / kShard2);
    std::memcpy(bytes.data(), &n, 8);
    write_file(dir / kShard2, bytes);
    SCOPED_TRACE(n);
    expect_one_line_error(dir, tmp, {kShard2});
  }
}

TEST(InspectBroken, OverlappingOffsets) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  Shard s = read_shard(dir / kShard1);
  // k_proj gets a byte range of its own size that starts inside q_proj's.
  OrderedJson& q = s.header["model.layers.0.self_attn.q_proj.weight"];
  OrderedJson& k = s.header["model.layers.0.self_attn.k_proj.weight"];
  uint64_t begin = q["data_offsets"][0].get<uint64_t>() + 64;
  uint64_t size = k["data_offsets"][1].get<uint64_t>() - k["data_offsets"][0].get<uint64_t>();
  k["data_offsets"] = {begin, begin + size};
  write_shard(dir / kShard1, s);
  expect_one_line_error(dir, tmp, {kShard1, "model.layers.0.self_attn."});
}

TEST(InspectBroken, ShapeDisagreesWithByteSpan) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  Shard s = read_shard(dir / kShard1);
  OrderedJson& k = s.header["model.layers.1.self_attn.k_proj.weight"];
  k["shape"][1] = k["shape"][1].get<int64_t>() - 1;
  write_shard(dir / kShard1, s);
  expect_one_line_error(dir, tmp, {kShard1, "model.layers.1.self_attn.k_proj.weight"});
}

TEST(InspectBroken, MissingShard) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  fs::remove(dir / kShard2);
  expect_one_line_error(dir, tmp, {kShard2});
}

TEST(InspectBroken, UnknownDtype) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  Shard s = read_shard(dir / kShard2);
  s.header["model.norm.weight"]["dtype"] = "Q9";
  write_shard(dir / kShard2, s);
  expect_one_line_error(dir, tmp, {kShard2, "model.norm.weight", "Q9"});
}

TEST(InspectBroken, MissingConfig) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  fs::remove(dir / "config.json");
  expect_one_line_error(dir, tmp, {"config.json"});
}

TEST(InspectBroken, UnsupportedModelType) {
  TempDir tmp;
  fs::path dir = copy_demo(tmp);
  OrderedJson c = OrderedJson::parse(read_file(dir / "config.json"));
  c["model_type"] = "gpt2";
  write_file(dir / "config.json", c.dump());
  expect_one_line_error(dir, tmp, {"config.json", "gpt2"});
}

TEST(InspectBroken, NotADirectory) {
  TempDir tmp;
  expect_one_line_error(tmp.path() / "does-not-exist", tmp, {"does-not-exist"});
}

}  // namespace
