// The CPU forward against transformers' own outputs (tests/fixtures/make_fixtures.py,
// make_cpu16.py).
//
// Three comparisons per fixture model:
//   * all-fp32 forward vs transformers in fp32 on the CPU (ref32), relative Frobenius error
//     ||ours - ref|| / ||ref|| per sequence below 1e-4: the two differ only in the order of fp32
//     sums (observed about 1e-6); observed amaxes (every linear input, K after RoPE, V) at 1e-4;
//   * bf16-between-layers forward vs transformers in bf16 on the GPU (ref16), per token and
//     layer below 3e-2 (transformers rounds after every op while strata rounds only between
//     layers: a few bf16 ulps of 2^-8 each), except in the reach of a near-tie in a selection;
//   * the bf16_ops forward (--calib_precision bf16_ops) vs transformers in bf16 on the CPU
//     (cpu16), each layer from transformers' own input to it: per token below 1e-2, most outputs
//     bit-exact, and every amax equal (ForwardBf16Ops, below).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/forward.h"

namespace strata {
namespace {

const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/";

double rel_error(const float* a, const Tensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.item_f32(i), d = a[i] - r;
    num += d * d;
    den += r * r;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class AmaxObserver : public Observer {
 public:
  void observe(std::string_view name, const float* x, int64_t rows, int64_t cols) override {
    float m = 0;
    for (int64_t i = 0; i < rows * cols; ++i)
      m = std::max(m, std::fabs(x[i]));
    auto [it, inserted] = amax.emplace(std::string(name), m);
    if (!inserted) it->second = std::max(it->second, m);
  }
  std::map<std::string, float> amax;
};

struct Fixture {
  Checkpoint ckpt;
  ModelConfig config;
  SafetensorsFile ref;
  std::vector<std::vector<int32_t>> seqs;
};

// `name` is a fixture under tests/fixtures/models/, or a directory (an absolute path) holding a
// rewritten copy of one beside its reference.safetensors.
Fixture load(const std::string& name) {
  const std::string dir = name.starts_with("/") ? name : kFixtures + name;
  Fixture f{Checkpoint::open(dir),
            read_model_config(dir),
            SafetensorsFile::open(dir + "/reference.safetensors"),
            {}};
  for (int s = 0;; ++s) {
    const TensorEntry* e = f.ref.find("tokens." + std::to_string(s));
    if (!e) break;
    Tensor t = f.ref.tensor(*e);
    f.seqs.emplace_back(t.data<int32_t>(), t.data<int32_t>() + t.numel());
  }
  return f;
}

// bf16 runs of a model with discrete selections (MoE routing and its group choice, DeepSeek-V3.2's
// indexer top-k) cannot be compared token for token everywhere: where the k-th and (k+1)-th
// candidates score nearly the same, bf16 rounding may pick the other one, and the token's output
// changes by far more than rounding; the change then reaches the later tokens of its sequence
// (attention) in every later layer. The fixture records, from transformers' fp32 run, each
// token's smallest gap at a selection boundary in each layer, relative to the row's largest
// score (ref32.margin.L.S). A gap below kTie (bf16 keeps 8 significant bits, 2^-8 = 0.4%) is a
// near-tie; from it on, the sequence's outputs are in its reach and not compared.
constexpr double kTie = 1e-2;
// Elsewhere a token's bf16 output may differ from transformers' bf16 output by at most the
// tolerance, or by kNoise times as much as transformers' own fp32 output does (both sides' bf16
// rounding, in a layer whose activations are large, can exceed the tolerance by itself).
constexpr double kNoise = 1.5;

// For sequence `seq`: per layer, the first token in the reach of a near-tie (up to that layer);
// the sequence length where none. The margins are the fp32 run's (ref32.margin); with `bf16`, also
// those of transformers' CPU bf16 run (cpu16.margin, cpu16.safetensors), where rounding the
// router's logits to bf16 can turn a gap of the fp32 run into an exact tie.
std::vector<int64_t> shadow_from(const Fixture& f, int64_t seq,
                                 const SafetensorsFile* bf16 = nullptr) {
  std::vector<int64_t> from;
  const int64_t T = static_cast<int64_t>(f.seqs[seq].size());
  int64_t first = T;
  auto scan = [&](const SafetensorsFile& file, const std::string& name) {
    const TensorEntry* e = file.find(name);
    if (!e) return;
    Tensor m = file.tensor(*e);
    for (int64_t t = 0; t < first; ++t) {
      if (m.item_f32(t) < kTie) {
        first = t;
        break;
      }
    }
  };
  for (int64_t l = 0;; ++l) {
    if (!f.ref.find("ref32.hidden." + std::to_string(l) + "." + std::to_string(seq))) break;
    const std::string ls = std::to_string(l) + "." + std::to_string(seq);
    scan(f.ref, "ref32.margin." + ls);
    if (bf16) scan(*bf16, "cpu16.margin." + ls);
    from.push_back(first);
  }
  return from;
}

// Relative L2 error of token t's row (H values) against row t of ref.
double token_error(const float* mine, const Tensor& ref, int64_t t, int64_t H) {
  double num = 0, den = 0;
  for (int64_t c = 0; c < H; ++c) {
    const double r = ref.item_f32(t * H + c), d = mine[c] - r;
    num += d * d;
    den += r * r;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
double token_error(const Tensor& a, const Tensor& ref, int64_t t, int64_t H) {
  double num = 0, den = 0;
  for (int64_t c = 0; c < H; ++c) {
    const double r = ref.item_f32(t * H + c), d = a.item_f32(t * H + c) - r;
    num += d * d;
    den += r * r;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void check_model(const std::string& name, bool bf16, double tol) {
  Fixture f = load(name);
  ASSERT_FALSE(f.seqs.empty());
  const std::string tag = bf16 ? "ref16." : "ref32.";
  if (bf16 && !f.ref.find(tag + "logits.0"))
    GTEST_SKIP() << name << ": fixture has no GPU bf16 run (regenerate on the GPU machine)";
  ForwardOptions options;
  options.bf16_between_layers = bf16;
  auto fwd = ModelForward::create(f.config, f.ckpt, options);
  const int64_t H = fwd->hidden_size(), V = fwd->vocab_size();
  AmaxObserver obs;
  int64_t tokens_checked = 0, tokens_over = 0, tokens_shadowed = 0;
  // Each sequence alone, then all together as one ragged batch: the results must agree, since
  // nothing may leak between sequences.
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<std::vector<std::vector<int32_t>>> batches;
    if (mode == 0) {
      for (auto& s : f.seqs)
        batches.push_back({s});
    } else {
      batches.push_back(f.seqs);
    }
    int seq_base = 0;
    for (auto& seqs : batches) {
      Batch batch = Batch::from_sequences(seqs);
      std::vector<float> h(batch.n_tokens() * H);
      fwd->embed(batch, h.data());
      for (int64_t l = 0; l < fwd->num_layers(); ++l) {
        fwd->layer(l)->forward(batch, h.data(), mode == 0 ? &obs : nullptr);
        for (int64_t s = 0; s < batch.n_seqs(); ++s) {
          Tensor ref = f.ref.tensor(tag + "hidden." + std::to_string(l) + "." +
                                    std::to_string(seq_base + s));
          const float* mine = &h[batch.seq_offsets[s] * H];
          if (!bf16) {
            const double err = rel_error(mine, ref);
            EXPECT_LT(err, tol) << name << " layer " << l << " seq " << seq_base + s << " mode "
                                << mode;
            continue;
          }
          // bf16: per token, since a near-tie in a selection can send one token elsewhere.
          const int64_t seq = seq_base + s;
          Tensor ref32 =
              f.ref.tensor("ref32.hidden." + std::to_string(l) + "." + std::to_string(seq));
          const std::vector<int64_t> from = shadow_from(f, seq);
          ASSERT_LT(l, static_cast<int64_t>(from.size()));
          for (int64_t t = 0; t < ref.dim(0); ++t) {
            const double ours = token_error(mine + t * H, ref, t, H);
            const double hf = token_error(ref32, ref, t, H);
            ++tokens_checked;
            if (ours <= tol) continue;
            if (t >= from[l]) {
              ++tokens_shadowed;
            } else if (ours > std::max(tol, kNoise * hf)) {
              ++tokens_over;
              ADD_FAILURE() << name << " layer " << l << " seq " << seq << " token " << t
                            << " mode " << mode << ": bf16 error " << ours
                            << " vs transformers' fp32-to-bf16 " << hf
                            << ", and no near-tie in a selection up to here";
            }
          }
        }
      }
      std::vector<float> logits(batch.n_tokens() * V);
      fwd->logits(batch, h.data(), logits.data());
      for (int64_t s = 0; s < batch.n_seqs(); ++s) {
        Tensor ref = f.ref.tensor(tag + "logits." + std::to_string(seq_base + s));
        if (!bf16) {
          EXPECT_LT(rel_error(&logits[batch.seq_offsets[s] * V], ref), tol)
              << name << " logits seq " << seq_base + s;
        }
      }
      seq_base += static_cast<int>(batch.n_seqs());
    }
  }
  if (bf16) {
    std::printf(
        "%s bf16: %lld token-layer outputs, %lld above %.0e in a near-tie's reach, %lld above "
        "and unexplained\n",
        name.c_str(), static_cast<long long>(tokens_checked / 2),
        static_cast<long long>(tokens_shadowed / 2), tol, static_cast<long long>(tokens_over / 2));
    return;
  }
  // Every linear amax transformers recorded must be observed with the same value, and K/V.
  int checked = 0;
  for (const TensorEntry& e : f.ref.entries()) {
    const std::string prefix = "ref32.amax.";
    if (e.name.rfind(prefix, 0) != 0) continue;
    std::string module = e.name.substr(prefix.size());
    if (module.find("lm_head") != std::string::npos ||
        module.find("embed_tokens") != std::string::npos || module.ends_with(".mlp.gate") ||
        module.ends_with(".block_sparse_moe.gate") ||
        module.find("shared_expert_gate") != std::string::npos || module.ends_with(".mlp.router"))
      continue;  // routers and lm_head are not quantized inputs
    const float want = f.ref.tensor(e).item_f32();
    auto it = obs.amax.find(module);
    ASSERT_NE(it, obs.amax.end()) << name << ": no observer saw " << module;
    EXPECT_NEAR(it->second, want, 1e-4 * want + 1e-6) << name << " " << module;
    ++checked;
  }
  // K and V of every softmax-attention layer; linear-attention layers (KDA, Gated DeltaNet) have
  // no KV cache: transformers records none for them and strata must report none. A multimodal
  // wrapper's language model (Qwen3.5) sits under model.language_model.
  const std::string lm =
      f.ckpt.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  for (int64_t l = 0; l < fwd->num_layers(); ++l) {
    for (const char* kv : {"k", "v"}) {
      const std::string obs_name =
          lm + "layers." + std::to_string(l) + ".self_attn." + kv + "_cache";
      const TensorEntry* e = f.ref.find("ref32.kv_amax." + std::to_string(l) + "." + kv);
      if (!e) {
        EXPECT_EQ(obs.amax.count(obs_name), 0u) << name << " " << obs_name;
        continue;
      }
      Tensor ref = f.ref.tensor(*e);
      ASSERT_TRUE(obs.amax.count(obs_name)) << obs_name;
      EXPECT_NEAR(obs.amax[obs_name], ref.item_f32(), 1e-4 * ref.item_f32())
          << name << " " << obs_name;
    }
  }
  EXPECT_GT(checked, 0);
}

class ForwardFp32 : public testing::TestWithParam<std::string> {};
TEST_P(ForwardFp32, MatchesTransformers) {
  check_model(GetParam(), false, 1e-4);
}
class ForwardBf16 : public testing::TestWithParam<std::string> {};
TEST_P(ForwardBf16, MatchesTransformersOnGpu) {
  check_model(GetParam(), true, 3e-2);
}

// --calib_precision bf16_ops (ForwardOptions::bf16_ops) against transformers' bf16 run on the CPU
// (cpu16.safetensors, tests/fixtures/make_cpu16.py): the same model class, weights and tokens,
// every op in bf16 as PyTorch runs it. Each decoder layer is run on transformers' own input to it
// (its bf16 output of the layer before; the embedding for layer 0), so that each comparison is
// one layer's rounding, not the drift of the layers before it (docs/FORWARD.md "Calibration
// precision"). Both sides round at the same points; they differ where an fp32 intermediate lands
// on the other side of a bf16 rounding boundary (other fp32 summation orders; the CPU attention
// kernel's vectorised exp; the delta rule's chunked form), an element one bf16 ulp (2^-8) apart
// that the rest of the layer carries on. Every token's relative error must stay below
// kBf16OpsTol, and their mean below kBf16OpsMeanTol and a quarter of the fp32_layers forward's
// mean in the same comparison (printed beside it, as are the errors of each forward left to run on
// its own outputs through all the layers). Tokens in the
// reach of a near-tie in a discrete selection (kTie; ref32.margin, and cpu16.margin of the bf16
// run itself, where rounding the router's logits can make a tie exact) are left out, as in the GPU
// comparison. The observed amaxes (every linear input, K and V) of the sequences no near-tie
// reaches in that layer must equal transformers' within kBf16OpsAmaxTol.
constexpr double kBf16OpsTol = 1e-2;
constexpr double kBf16OpsMeanTol = 2e-3;
constexpr double kBf16OpsAmaxTol = 1e-2;

struct PrecisionRun {
  double worst = 0.0, sum = 0.0;            // token errors, each layer from transformers' input
  double free_worst = 0.0, free_sum = 0.0;  // the forward run on its own outputs
  int64_t tokens = 0;                       // token-layer outputs compared
  int64_t shadowed = 0;                     // left out: in a near-tie's reach
  int64_t exact = 0;                        // compared outputs equal to transformers' bit for bit
  // Per sequence, the amax of every observed input; and per layer, whether the sequence is clear
  // of near-ties there.
  std::vector<std::map<std::string, float>> amax;
  std::vector<std::vector<bool>> clean;
};

// The hidden states of layer l's output for sequence `seq` in cpu16.safetensors, as fp32 [T, H].
std::vector<float> cpu16_hidden(const SafetensorsFile& cpu16, int64_t l, size_t seq) {
  Tensor t = cpu16.tensor("cpu16.hidden." + std::to_string(l) + "." + std::to_string(seq));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    out[i] = t.item_f32(i);
  return out;
}

PrecisionRun run_precision(const Fixture& f, const SafetensorsFile& cpu16, ForwardOptions options) {
  auto fwd = ModelForward::create(f.config, f.ckpt, options);
  const int64_t H = fwd->hidden_size(), L = fwd->num_layers();
  PrecisionRun run;
  for (size_t seq = 0; seq < f.seqs.size(); ++seq) {
    Batch batch = Batch::from_sequences({f.seqs[seq]});
    const int64_t T = batch.n_tokens();
    std::vector<float> embedded(T * H), own(T * H), h;
    fwd->embed(batch, embedded.data());
    own = embedded;
    const std::vector<int64_t> from = shadow_from(f, static_cast<int64_t>(seq), &cpu16);
    AmaxObserver obs;
    run.clean.emplace_back();
    for (int64_t l = 0; l < L; ++l) {
      run.clean.back().push_back(from[l] == T);
      h = l == 0 ? embedded : cpu16_hidden(cpu16, l - 1, seq);
      fwd->layer(l)->forward(batch, h.data(), &obs);
      fwd->layer(l)->forward(batch, own.data(), nullptr);
      const std::vector<float> ref = cpu16_hidden(cpu16, l, seq);
      for (int64_t t = 0; t < from[l]; ++t) {
        double num = 0, den = 0, free_num = 0;
        bool same = true;
        for (int64_t c = 0; c < H; ++c) {
          const double r = ref[t * H + c], d = h[t * H + c] - r, e = own[t * H + c] - r;
          num += d * d;
          free_num += e * e;
          den += r * r;
          same = same && d == 0;
        }
        const double e = std::sqrt(num / std::max(den, 1e-30));
        const double free_e = std::sqrt(free_num / std::max(den, 1e-30));
        run.worst = std::max(run.worst, e);
        run.sum += e;
        run.free_worst = std::max(run.free_worst, free_e);
        run.free_sum += free_e;
        run.exact += same;
        ++run.tokens;
      }
      run.shadowed += T - from[l];
    }
    run.amax.push_back(obs.amax);
  }
  return run;
}

void check_bf16_ops(const std::string& name) {
  Fixture f = load(name);
  const std::string path = kFixtures + name + "/cpu16.safetensors";
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " (tests/fixtures/make_cpu16.py)";
  SafetensorsFile cpu16 = SafetensorsFile::open(path);
  ForwardOptions ops16;
  ops16.bf16_ops = true;
  const PrecisionRun ours = run_precision(f, cpu16, ops16);
  const PrecisionRun layers = run_precision(f, cpu16, ForwardOptions{});
  auto mean = [](double sum, int64_t n) {
    return sum / static_cast<double>(std::max<int64_t>(n, 1));
  };
  EXPECT_GT(ours.tokens, 0) << name;
  EXPECT_LE(ours.worst, kBf16OpsTol) << name;
  EXPECT_LE(mean(ours.sum, ours.tokens), kBf16OpsMeanTol) << name;
  EXPECT_LT(4 * mean(ours.sum, ours.tokens), mean(layers.sum, layers.tokens)) << name;
  // Observed amaxes: every input transformers' bf16 run recorded (routers, embedding and lm_head
  // aside), the max over the sequences no near-tie reaches in the input's layer.
  const std::string lm =
      f.ckpt.has("model.language_model.embed_tokens.weight") ? "model.language_model." : "model.";
  int amaxes = 0, equal = 0, over = 0, layers_over = 0, none_clean = 0;
  double worst_amax = 0.0, worst_amax_layers = 0.0;
  for (const TensorEntry& e : cpu16.entries()) {
    std::string key;
    if (e.name.rfind("cpu16.amax.", 0) == 0) {
      key = e.name.substr(11);
      if (key.find("lm_head") != std::string::npos ||
          key.find("embed_tokens") != std::string::npos || key.ends_with(".mlp.gate") ||
          key.ends_with(".block_sparse_moe.gate") ||
          key.find("shared_expert_gate") != std::string::npos || key.ends_with(".mlp.router"))
        continue;
    } else if (e.name.rfind("cpu16.kv_amax.", 0) == 0) {
      const std::string lk = e.name.substr(14);  // "L.k"
      key = lm + "layers." + lk.substr(0, lk.find('.')) + ".self_attn." +
            lk.substr(lk.find('.') + 1) + "_cache";
    } else {
      continue;
    }
    const size_t at = key.find("layers.") + 7;
    const int64_t layer = std::stoll(key.substr(at, key.find('.', at) - at));
    const Tensor per_seq = cpu16.tensor(e);
    float want = 0.0f, mine = 0.0f, mine_layers = 0.0f;
    bool any = false;
    for (size_t s = 0; s < f.seqs.size(); ++s) {
      if (!ours.clean[s][layer]) continue;
      any = true;
      want = std::max(want, per_seq.item_f32(static_cast<int64_t>(s)));
      auto it = ours.amax[s].find(key);
      ASSERT_NE(it, ours.amax[s].end()) << name << ": no observer saw " << key;
      mine = std::max(mine, it->second);
      mine_layers = std::max(mine_layers, layers.amax[s].at(key));
    }
    if (!any) {
      ++none_clean;
      continue;
    }
    const double rel = std::fabs(mine - want) / std::max(want, 1e-30f);
    const double rel_layers = std::fabs(mine_layers - want) / std::max(want, 1e-30f);
    ++amaxes;
    equal += mine == want;
    over += rel > 5e-3;
    layers_over += rel_layers > 5e-3;
    worst_amax = std::max(worst_amax, rel);
    worst_amax_layers = std::max(worst_amax_layers, rel_layers);
    EXPECT_LE(rel, kBf16OpsAmaxTol) << name << " " << key << ": " << mine << " vs " << want;
  }
  std::printf(
      "%s vs transformers' CPU bf16 run, each layer from its input: %lld token-layer outputs "
      "(%lld in a near-tie's reach left out); bf16_ops worst %.2e mean %.2e (%lld bit-exact), "
      "fp32_layers worst %.2e mean %.2e (%lld); run on their own outputs: bf16_ops worst %.2e "
      "mean %.2e, fp32_layers worst %.2e mean %.2e; %d amaxes (%d with no sequence clear of "
      "near-ties): bf16_ops %d equal, %d more than 0.5%% off (worst %.2e), fp32_layers %d more "
      "than 0.5%% off (worst %.2e)\n",
      name.c_str(), static_cast<long long>(ours.tokens), static_cast<long long>(ours.shadowed),
      ours.worst, mean(ours.sum, ours.tokens), static_cast<long long>(ours.exact), layers.worst,
      mean(layers.sum, layers.tokens), static_cast<long long>(layers.exact), ours.free_worst,
      mean(ours.free_sum, ours.tokens), layers.free_worst, mean(layers.free_sum, layers.tokens),
      amaxes, none_clean, equal, over, worst_amax, layers_over, worst_amax_layers);
}

class ForwardBf16Ops : public testing::TestWithParam<std::string> {};
TEST_P(ForwardBf16Ops, MatchesTransformersBf16OnCpu) {
  check_bf16_ops(GetParam());
}

const auto kModels =
    testing::Values("llama", "llama_odd", "qwen3", "qwen3_moe", "qwen3_moe_nonorm", "deepseek_v3",
                    "deepseek_v3_noqlora", "kimi_linear", "mixtral", "gpt_oss", "gpt_oss_mxfp4",
                    "glm4_moe", "minimax_m2", "qwen3_next", "qwen3_5_moe", "deepseek_v32");
INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardFp32, kModels);
INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardBf16, kModels);
INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardBf16Ops, kModels);

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A copy of a fixture model whose config.json is edited by `edit`; returns the error text of
// building the forward and loading layer `layer` ("" when it succeeded).
std::string forward_error(const std::string& name, const std::function<void(Json&)>& edit,
                          const std::string& drop_tensor = "", int64_t layer = 0) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("strata_forward_test_" + name + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures + name, dir);
  Json config = json_read_file((dir / "config.json").string());
  edit(config);
  write_file_atomic((dir / "config.json").string(), config.dump());
  if (!drop_tensor.empty()) {
    SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    NamedTensors kept;
    for (const TensorEntry& e : f.entries()) {
      if (e.name != drop_tensor) kept.emplace_back(e.name, f.tensor(e).clone());
    }
    write_safetensors((dir / "model.safetensors").string(), kept);
  }
  std::string error;
  try {
    ModelConfig c = read_model_config(dir.string());
    Checkpoint ckpt = Checkpoint::open(dir.string());
    auto fwd = ModelForward::create(c, ckpt);
    fwd->layer(layer);
  } catch (const Error& e) {
    error = e.what();
  }
  fs::remove_all(dir);
  return error;
}

TEST(ForwardErrors, MathChangingFieldsAreRefused) {
  EXPECT_EQ(forward_error("llama", [](Json&) {}), "");
  EXPECT_THAT(
      forward_error("llama", [](Json& c) { c["rope_parameters"]["rope_type"] = "longrope"; }),
      testing::HasSubstr("rope type 'longrope' is not supported"));
  EXPECT_THAT(forward_error("llama", [](Json& c) { c["hidden_act"] = "gelu"; }),
              testing::HasSubstr("hidden_act"));
  EXPECT_THAT(forward_error("qwen3", [](Json& c) { c["use_sliding_window"] = true; }),
              testing::HasSubstr("use_sliding_window"));
  EXPECT_THAT(forward_error("deepseek_v3", [](Json& c) { c["scoring_func"] = "softmax"; }),
              testing::HasSubstr("scoring_func 'softmax'"));
  EXPECT_THAT(forward_error("deepseek_v3", [](Json& c) { c["topk_method"] = "greedy"; }),
              testing::HasSubstr("topk_method 'greedy'"));
  // Every known model_type has a forward now: a Llama checkpoint labelled qwen3_next is a
  // checkpoint that does not match its config.
  EXPECT_THAT(forward_error("llama", [](Json& c) { c["model_type"] = "qwen3_next"; }),
              testing::HasSubstr("'model.layers.0.linear_attn.in_proj_qkvz.weight' is missing"));
  EXPECT_THAT(forward_error("llama", [](Json& c) { c["model_type"] = "gpt_bigcode"; }),
              testing::HasSubstr("gpt_bigcode"));
}

// Kimi-Linear as the hub ships it: the remote code's config spelling (linear_attn_config with
// 1-based kda_layers, first_k_dense_replace) and the dense first layer under mlp. instead of
// transformers 5.x's block_sparse_moe.: the same weights must give transformers' logits.
TEST(ForwardKimiLinear, RemoteCodeSpellingAndHubNames) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("strata_kimi_hub_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures + std::string("kimi_linear"), dir);
  Json config = json_read_file((dir / "config.json").string());
  for (const char* key : {"layer_types", "mlp_layer_types", "linear_num_heads", "linear_head_dim",
                          "linear_conv_kernel_dim"})
    config.erase(key);
  config["linear_attn_config"] = Json::parse(R"({"head_dim": 32, "num_heads": 2,
      "short_conv_kernel_size": 4, "kda_layers": [1, 3], "full_attn_layers": [2]})");
  config["first_k_dense_replace"] = 1;
  config["moe_layer_freq"] = 1;
  config["mla_use_nope"] = true;
  config["moe_router_activation_func"] = "sigmoid";
  config["use_grouped_topk"] = true;
  write_file_atomic((dir / "config.json").string(), config.dump());
  {
    SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    NamedTensors renamed;
    int moved = 0;
    for (const TensorEntry& e : f.entries()) {
      std::string n = e.name;
      const std::string from = "model.layers.0.block_sparse_moe.";
      if (n.rfind(from, 0) == 0) {
        n = "model.layers.0.mlp." + n.substr(from.size());
        ++moved;
      }
      renamed.emplace_back(n, f.tensor(e).clone());
    }
    EXPECT_EQ(moved, 3);
    write_safetensors((dir / "model.safetensors").string(), renamed);
  }
  Fixture f{Checkpoint::open(dir.string()),
            read_model_config(dir.string()),
            SafetensorsFile::open(kFixtures + "kimi_linear/reference.safetensors"),
            {}};
  ForwardOptions options;
  options.bf16_between_layers = false;
  auto fwd = ModelForward::create(f.config, f.ckpt, options);
  for (int s = 0;; ++s) {
    const TensorEntry* e = f.ref.find("tokens." + std::to_string(s));
    if (!e) break;
    Tensor t = f.ref.tensor(*e);
    Batch batch = Batch::from_sequences(
        {std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel())});
    std::vector<float> h(batch.n_tokens() * fwd->hidden_size()),
        logits(batch.n_tokens() * fwd->vocab_size());
    fwd->embed(batch, h.data());
    for (int64_t l = 0; l < fwd->num_layers(); ++l)
      fwd->layer(l)->forward(batch, h.data(), nullptr);
    fwd->logits(batch, h.data(), logits.data());
    EXPECT_LT(rel_error(logits.data(), f.ref.tensor("ref32.logits." + std::to_string(s))), 1e-4)
        << s;
  }
  fs::remove_all(dir);
}

TEST(ForwardErrors, KimiLinearVariantsAreRefused) {
  EXPECT_EQ(forward_error("kimi_linear", [](Json&) {}), "");
  EXPECT_THAT(forward_error("kimi_linear", [](Json& c) { c["mla_use_nope"] = false; }),
              testing::HasSubstr("mla_use_nope false"));
  EXPECT_THAT(
      forward_error("kimi_linear", [](Json& c) { c["moe_router_activation_func"] = "softmax"; }),
      testing::HasSubstr("moe_router_activation_func 'softmax'"));
  EXPECT_THAT(
      forward_error(
          "kimi_linear",
          [](Json& c) { c["linear_attn_config"] = Json::parse(R"({"gate_lower_bound": -5.0})"); }),
      testing::HasSubstr("linear_attn_config.gate_lower_bound"));
  EXPECT_THAT(forward_error("kimi_linear", [](Json& c) { c["hidden_act"] = "situ"; }),
              testing::HasSubstr("hidden_act 'situ'"));
  EXPECT_THAT(
      forward_error("kimi_linear", [](Json& c) { c["layer_types"][1] = "sliding_attention"; }),
      testing::HasSubstr("'layer_types'[1] is 'sliding_attention'"));
  EXPECT_THAT(forward_error("kimi_linear", [](Json& c) { c["linear_head_dim"] = 16; }),
              testing::HasSubstr("'model.layers.0.self_attn.q_proj.weight' has shape [64, 64] but "
                                 "config.json implies [32, 64]"));
  EXPECT_THAT(forward_error("kimi_linear", [](Json& c) { c["attention_bias"] = true; }),
              testing::HasSubstr("attention_bias true"));
  EXPECT_THAT(forward_error(
                  "kimi_linear",
                  [](Json& c) {
                    c["use_grouped_topk"] = false;
                    c["num_expert_group"] = 2;
                  },
                  "", /*layer=*/1),
              testing::HasSubstr("use_grouped_topk false with num_expert_group 2 is ambiguous"));
  EXPECT_THAT(forward_error(
                  "kimi_linear", [](Json&) {}, "model.layers.0.self_attn.A_log"),
              testing::HasSubstr("'model.layers.0.self_attn.A_log' is missing"));
}

TEST(ForwardErrors, MixtralVariantsAreRefused) {
  EXPECT_EQ(forward_error("mixtral", [](Json&) {}), "");
  EXPECT_THAT(forward_error("mixtral", [](Json& c) { c["hidden_act"] = "gelu"; }),
              testing::HasSubstr("hidden_act"));
  EXPECT_THAT(forward_error("mixtral", [](Json& c) { c["num_experts_per_tok"] = 9; }),
              testing::HasSubstr("num_experts_per_tok"));
  EXPECT_THAT(forward_error("mixtral", [](Json& c) { c["intermediate_size"] = 64; }),
              testing::HasSubstr("'model.layers.0.block_sparse_moe.experts.0.w1.weight' has shape "
                                 "[96, 64] but config.json implies [64, 64]"));
  EXPECT_THAT(
      forward_error(
          "mixtral", [](Json&) {}, "model.layers.2.block_sparse_moe.experts.7.w2.weight",
          /*layer=*/2),
      testing::HasSubstr("'model.layers.2.block_sparse_moe.experts.7.w2.weight' is missing"));
  EXPECT_THAT(forward_error(
                  "mixtral", [](Json&) {}, "model.layers.1.block_sparse_moe.gate.weight",
                  /*layer=*/1),
              testing::HasSubstr("'model.layers.1.block_sparse_moe.gate.weight' is missing"));
}

// The worst relative error of the fp32 logits of a fixture copy whose config.json is edited by
// `edit` against the fixture's transformers run.
double worst_logits_error(const std::string& name, const std::function<void(Json&)>& edit) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("strata_edited_" + name + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures + name, dir);
  Json config = json_read_file((dir / "config.json").string());
  edit(config);
  write_file_atomic((dir / "config.json").string(), config.dump());
  Fixture f = load(name);
  const Checkpoint ckpt = Checkpoint::open(dir.string());
  const ModelConfig c = read_model_config(dir.string());
  ForwardOptions options;
  options.bf16_between_layers = false;
  auto fwd = ModelForward::create(c, ckpt, options);
  double worst = 0.0;
  for (size_t s = 0; s < f.seqs.size(); ++s) {
    Batch batch = Batch::from_sequences({f.seqs[s]});
    std::vector<float> h(batch.n_tokens() * fwd->hidden_size()),
        logits(batch.n_tokens() * fwd->vocab_size());
    fwd->embed(batch, h.data());
    for (int64_t l = 0; l < fwd->num_layers(); ++l)
      fwd->layer(l)->forward(batch, h.data(), nullptr);
    fwd->logits(batch, h.data(), logits.data());
    worst = std::max(worst,
                     rel_error(logits.data(), f.ref.tensor("ref32.logits." + std::to_string(s))));
  }
  fs::remove_all(dir);
  return worst;
}

void expect_same_logits(const std::string& name, const std::function<void(Json&)>& edit) {
  EXPECT_LT(worst_logits_error(name, edit), 1e-4) << name;
}

// DeepSeek-V3.2's hub config: first_k_dense_replace without mlp_layer_types, and the fields
// transformers 5.17 does not read (moe_layer_freq, topk_method, scoring_func, rope_interleave).
TEST(ForwardDeepseekV32, HubConfigSpelling) {
  expect_same_logits("deepseek_v32", [](Json& c) {
    c.erase("mlp_layer_types");
    c.erase("layer_types");
    c["moe_layer_freq"] = 1;
    c["topk_method"] = "noaux_tc";
    c["scoring_func"] = "sigmoid";
    c["rope_interleave"] = true;
  });
}

// The indexer's selection is what the fixture tests: with index_topk past every sequence the
// attention is dense, and the logits leave transformers' (sparse) ones far behind.
TEST(ForwardDeepseekV32, SparseSelectionMatters) {
  EXPECT_GT(worst_logits_error("deepseek_v32", [](Json& c) { c["index_topk"] = 64; }), 1e-2);
}

TEST(ForwardErrors, DeepseekV32VariantsAreRefused) {
  EXPECT_EQ(forward_error("deepseek_v32", [](Json&) {}), "");
  EXPECT_THAT(forward_error("deepseek_v32", [](Json& c) { c["q_lora_rank"] = nullptr; }),
              testing::HasSubstr("q_lora_rank must be set"));
  EXPECT_THAT(forward_error("deepseek_v32", [](Json& c) { c["attention_bias"] = true; }),
              testing::HasSubstr("attention_bias"));
  EXPECT_THAT(forward_error("deepseek_v32", [](Json& c) { c["scoring_func"] = "softmax"; }),
              testing::HasSubstr("scoring_func"));
  EXPECT_THAT(forward_error("deepseek_v32", [](Json& c) { c["index_head_dim"] = 8; }),
              testing::HasSubstr("index_head_dim (8) must hold the qk_rope_head_dim (16)"));
  EXPECT_THAT(forward_error(
                  "deepseek_v32", [](Json&) {}, "model.layers.0.self_attn.indexer.k_norm.bias"),
              testing::HasSubstr("'model.layers.0.self_attn.indexer.k_norm.bias' is missing"));
}

// MiniMax-M2's hub config names the rotated dims as rotary_dim (64 of head_dim 128) beside the
// fields transformers ignores; with no partial_rotary_factor, rotary_dim decides.
TEST(ForwardMiniMaxM2, HubConfigSpelling) {
  expect_same_logits("minimax_m2", [](Json& c) {
    c["rope_parameters"].erase("partial_rotary_factor");
    c["rotary_dim"] = 16;
    c["use_qk_norm"] = true;
    c["qk_norm_type"] = "per_layer";
    c["scoring_func"] = "sigmoid";
    c["use_routing_bias"] = true;
    c["shared_intermediate_size"] = 0;
    c["attn_type_list"] = Json::array({1, 1, 1});
  });
}

// GLM-4.5's hub config has partial_rotary_factor at the top level; without one, transformers'
// Glm4MoeConfig uses 0.5 (the fixture's value).
TEST(ForwardGlm4Moe, PartialRotaryFactorDefault) {
  expect_same_logits("glm4_moe", [](Json& c) {
    c.erase("partial_rotary_factor");
    c["rope_parameters"].erase("partial_rotary_factor");
  });
}

TEST(ForwardErrors, Glm4MoeVariantsAreRefused) {
  EXPECT_EQ(forward_error("glm4_moe", [](Json&) {}), "");
  EXPECT_THAT(forward_error("glm4_moe", [](Json& c) { c["hidden_act"] = "gelu"; }),
              testing::HasSubstr("hidden_act \"gelu\""));
  EXPECT_THAT(forward_error("glm4_moe", [](Json& c) { c["use_qk_norm"] = false; }),
              testing::HasSubstr("use_qk_norm is false but "
                                 "'model.layers.0.self_attn.q_norm.weight' is present"));
  EXPECT_THAT(forward_error("glm4_moe", [](Json& c) { c["attention_bias"] = false; }),
              testing::HasSubstr("attention_bias is false but "
                                 "'model.layers.0.self_attn.q_proj.bias' is present"));
  EXPECT_THAT(forward_error("glm4_moe",
                            [](Json& c) {
                              c["partial_rotary_factor"] = 0.01;
                              c["rope_parameters"]["partial_rotary_factor"] = 0.01;
                            }),
              testing::HasSubstr("rotates 0 of head_dim 32 dims"));
  EXPECT_THAT(forward_error(
                  "glm4_moe", [](Json& c) { c["n_group"] = 3; }, "", /*layer=*/1),
              testing::HasSubstr("n_group (3) must divide the routed experts (8)"));
  EXPECT_THAT(forward_error(
                  "glm4_moe", [](Json&) {}, "model.layers.1.mlp.gate.e_score_correction_bias",
                  /*layer=*/1),
              testing::HasSubstr("'model.layers.1.mlp.gate.e_score_correction_bias' is missing"));
  EXPECT_THAT(forward_error(
                  "glm4_moe", [](Json&) {}, "model.layers.2.mlp.shared_experts.up_proj.weight",
                  /*layer=*/2),
              testing::HasSubstr("'model.layers.2.mlp.shared_experts.up_proj.weight' is missing"));
}

TEST(ForwardErrors, MiniMaxM2VariantsAreRefused) {
  EXPECT_EQ(forward_error("minimax_m2", [](Json&) {}), "");
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["rotary_dim"] = 32; }),
              testing::HasSubstr("rotary_dim 32 disagrees with partial_rotary_factor 0.5"));
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["qk_norm_type"] = "per_head"; }),
              testing::HasSubstr("qk_norm_type \"per_head\" is not supported"));
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["use_qk_norm"] = false; }),
              testing::HasSubstr("use_qk_norm false is not supported"));
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["scoring_func"] = "softmax"; }),
              testing::HasSubstr("scoring_func \"softmax\" is not supported"));
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["shared_intermediate_size"] = 64; }),
              testing::HasSubstr("shared_intermediate_size 64 is not supported"));
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["routed_scaling_factor"] = 2.0; }),
              testing::HasSubstr("routed_scaling_factor 2.0 is not supported"));
  EXPECT_THAT(forward_error("minimax_m2",
                            [](Json& c) {
                              c["attn_type_list"] = {1, 0, 1};
                            }),
              testing::HasSubstr("attn_type_list holds 0"));
  EXPECT_THAT(forward_error("minimax_m2", [](Json& c) { c["sliding_window"] = 4096; }),
              testing::HasSubstr("sliding_window 4096 is not supported"));
  EXPECT_THAT(forward_error(
                  "minimax_m2", [](Json&) {}, "model.layers.0.self_attn.k_norm.weight"),
              testing::HasSubstr("minimax_m2 normalises q and k"));
  EXPECT_THAT(
      forward_error(
          "minimax_m2", [](Json&) {}, "model.layers.2.block_sparse_moe.e_score_correction_bias",
          /*layer=*/2),
      testing::HasSubstr("'model.layers.2.block_sparse_moe.e_score_correction_bias' is missing"));
  // Without a routing bias (use_routing_bias false) the layer loads.
  EXPECT_EQ(forward_error(
                "minimax_m2", [](Json& c) { c["use_routing_bias"] = false; },
                "model.layers.2.block_sparse_moe.e_score_correction_bias", /*layer=*/2),
            "");
}

// Qwen3-Next's config spellings: full_attention_interval instead of layer_types (the fixture's
// interval is 2), and the config classes' defaults (partial_rotary_factor 0.25, norm_topk_prob
// true) when the fields are absent.
TEST(ForwardQwen3Next, ConfigDefaultsAndInterval) {
  expect_same_logits("qwen3_next", [](Json& c) {
    c.erase("layer_types");
    c["full_attention_interval"] = 2;
    c.erase("partial_rotary_factor");
    c["rope_parameters"].erase("partial_rotary_factor");
    c.erase("norm_topk_prob");
  });
}

// Qwen3.5-MoE: the same in text_config; mlp_only_layers and decoder_sparse_step, which its
// config class drops, change nothing (every layer stays MoE).
TEST(ForwardQwen35Moe, ConfigDefaultsAndIgnoredFields) {
  expect_same_logits("qwen3_5_moe", [](Json& c) {
    Json& t = c["text_config"];
    t.erase("layer_types");
    t["full_attention_interval"] = 2;
    t.erase("partial_rotary_factor");
    t["rope_parameters"].erase("partial_rotary_factor");
    t["mlp_only_layers"] = Json::array({1});
    t["decoder_sparse_step"] = 2;
    t["norm_topk_prob"] = false;
  });
}

TEST(ForwardErrors, Qwen3NextVariantsAreRefused) {
  EXPECT_EQ(forward_error("qwen3_next", [](Json&) {}), "");
  EXPECT_THAT(forward_error("qwen3_next", [](Json& c) { c["hidden_act"] = "gelu"; }),
              testing::HasSubstr("hidden_act \"gelu\" is not supported by the qwen3_next"));
  EXPECT_THAT(forward_error("qwen3_next", [](Json& c) { c["linear_num_value_heads"] = 3; }),
              testing::HasSubstr("linear_num_value_heads (3) must be a multiple of "
                                 "linear_num_key_heads (2)"));
  EXPECT_THAT(
      forward_error("qwen3_next", [](Json& c) { c["layer_types"][1] = "sliding_attention"; }),
      testing::HasSubstr("'layer_types'[1] is 'sliding_attention'"));
  EXPECT_THAT(forward_error(
                  "qwen3_next", [](Json& c) { c["attention_bias"] = true; }, "", /*layer=*/1),
              testing::HasSubstr("attention_bias is true but "
                                 "'model.layers.1.self_attn.q_proj.bias' is missing"));
  EXPECT_THAT(forward_error(
                  "qwen3_next", [](Json&) {}, "model.layers.1.self_attn.q_norm.weight", 1),
              testing::HasSubstr("q_norm.weight' is missing; qwen3_next normalises q and k"));
  EXPECT_THAT(forward_error(
                  "qwen3_next", [](Json&) {}, "model.layers.0.mlp.shared_expert.gate_proj.weight"),
              testing::HasSubstr("every qwen3_next MoE layer has a shared expert"));
  EXPECT_THAT(forward_error(
                  "qwen3_next", [](Json&) {}, "model.layers.0.linear_attn.in_proj_ba.weight"),
              testing::HasSubstr("'model.layers.0.linear_attn.in_proj_ba.weight' is missing"));
  // The checkpoint's conv1d is [C, 1, 4]: a config with another kernel does not match it.
  EXPECT_THAT(forward_error("qwen3_next", [](Json& c) { c["linear_conv_kernel_dim"] = 3; }),
              testing::HasSubstr("'model.layers.0.linear_attn.conv1d.weight' has shape"));
  EXPECT_THAT(forward_error("qwen3_5_moe", [](Json& c) { c["text_config"]["num_experts"] = 0; }),
              testing::HasSubstr("num_experts must be positive for qwen3_5_moe_text"));
  EXPECT_THAT(forward_error(
                  "qwen3_5_moe", [](Json&) {},
                  "model.language_model.layers.2.linear_attn.in_proj_z.weight", 2),
              testing::HasSubstr("'model.language_model.layers.2.linear_attn.in_proj_z.weight' is "
                                 "missing"));
}

TEST(ForwardErrors, MissingOrMisshapenTensorsAreNamed) {
  EXPECT_THAT(forward_error(
                  "llama", [](Json&) {}, "model.layers.0.self_attn.k_proj.weight"),
              testing::HasSubstr("'model.layers.0.self_attn.k_proj.weight' is missing"));
  EXPECT_THAT(forward_error("llama", [](Json& c) { c["intermediate_size"] = 200; }),
              testing::HasSubstr("'model.layers.0.mlp.gate_proj.weight' has shape [256, 128] but "
                                 "config.json implies [200, 128]"));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A copy of the gpt_oss fixture with its fused experts written one module per expert and
// projection, as strata reads them (docs/QUANTIZE.md "gpt-oss"): experts.E.gate_up_proj.weight
// [2I, H] = gate_up_proj[E]^T (rows interleaved gate/up as transformers stores the columns),
// .bias = gate_up_proj_bias[E]; experts.E.down_proj.weight [H, I] = down_proj[E]^T, .bias =
// down_proj_bias[E]. Returns the directory (with the fixture's reference.safetensors).
std::string gpt_oss_per_expert_copy() {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("strata_gpt_oss_per_expert_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures + std::string("gpt_oss"), dir);
  SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
  NamedTensors out;
  for (const TensorEntry& e : f.entries()) {
    const Tensor t = f.tensor(e);
    const size_t at = e.name.find(".mlp.experts.");
    if (at == std::string::npos) {
      out.emplace_back(e.name, t.clone());
      continue;
    }
    const std::string prefix = e.name.substr(0, at) + ".mlp.experts.";
    const std::string leaf = e.name.substr(prefix.size());  // gate_up_proj, down_proj(_bias)
    EXPECT_EQ(t.dtype(), DType::kBF16) << e.name;
    const int64_t E = t.dim(0);
    const bool bias = leaf.ends_with("_bias");
    const std::string proj = bias ? leaf.substr(0, leaf.size() - 5) : leaf;
    for (int64_t x = 0; x < E; ++x) {
      const std::string name =
          prefix + std::to_string(x) + "." + proj + (bias ? ".bias" : ".weight");
      const uint16_t* src = t.data<uint16_t>();
      if (bias) {
        const int64_t n = t.dim(1);
        Tensor b = Tensor::zeros(DType::kBF16, {n});
        std::copy_n(src + x * n, n, b.mutable_data<uint16_t>());
        out.emplace_back(name, std::move(b));
        continue;
      }
      const int64_t in = t.dim(1), o = t.dim(2);  // [E, in, out] -> [out, in]
      Tensor w = Tensor::zeros(DType::kBF16, {o, in});
      uint16_t* dst = w.mutable_data<uint16_t>();
      for (int64_t r = 0; r < o; ++r)
        for (int64_t c = 0; c < in; ++c)
          dst[r * in + c] = src[(x * in + c) * o + r];
      out.emplace_back(name, std::move(w));
    }
  }
  write_safetensors((dir / "model.safetensors").string(), out);
  return dir.string();
}

TEST(ForwardGptOss, PerExpertModulesMatchTransformers) {
  const std::string dir = gpt_oss_per_expert_copy();
  check_model(dir, false, 1e-4);
  std::filesystem::remove_all(dir);
}

TEST(ForwardErrors, GptOssVariantsAreRefused) {
  EXPECT_THAT(forward_error("gpt_oss", [](Json& c) { c["sliding_window"] = nullptr; }),
              testing::HasSubstr("layer 0 is a sliding_attention layer but sliding_window is not "
                                 "a positive integer"));
  EXPECT_THAT(forward_error("gpt_oss", [](Json& c) { c["layer_types"][1] = "linear_attention"; }),
              testing::HasSubstr("'layer_types'[1] is 'linear_attention'"));
  EXPECT_THAT(forward_error("gpt_oss", [](Json& c) { c["swiglu_limit"] = 10.0; }),
              testing::HasSubstr("'swiglu_limit' is 10.0"));
  EXPECT_THAT(forward_error("gpt_oss", [](Json& c) { c["num_experts_per_tok"] = 9; }),
              testing::HasSubstr("num_experts_per_tok"));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// The llama fixture with its embedding table replaced: rows 1 and 2 hold the hand-made values
// below (fp32 or bf16 bits), every other row zeros. Returns the directory.
std::string embedding_copy(DType dtype, const std::vector<uint32_t>& row1,
                           const std::vector<uint32_t>& row2) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() /
      ("strata_embed_" + std::string(dtype_name(dtype)) + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures + std::string("llama"), dir);
  SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
  NamedTensors out;
  for (const TensorEntry& e : f.entries()) {
    if (e.name != "model.embed_tokens.weight") {
      out.emplace_back(e.name, f.tensor(e).clone());
      continue;
    }
    Tensor t = Tensor::zeros(dtype, e.shape);
    const int64_t H = e.shape[1];
    for (int64_t r : {1, 2}) {
      const std::vector<uint32_t>& row = r == 1 ? row1 : row2;
      for (size_t c = 0; c < row.size(); ++c) {
        if (dtype == DType::kF32) {
          t.mutable_data<uint32_t>()[r * H + static_cast<int64_t>(c)] = row[c];
        } else {
          t.mutable_data<uint16_t>()[r * H + static_cast<int64_t>(c)] =
              static_cast<uint16_t>(row[c]);
        }
      }
    }
    out.emplace_back(e.name, std::move(t));
  }
  write_safetensors((dir / "model.safetensors").string(), out);
  return dir.string();
}

// embed_bf16 gives, for every token and column, the bits worked out by hand below (round to
// nearest even, NaN to the canonical 0x7FC0), and embed() with bf16 rounding the same values
// widened; without rounding, embed() gives the fp32 table as stored. Sequences [1, 2, 1, 0], [2].
void check_embedding(DType dtype, const std::vector<uint32_t>& row1,
                     const std::vector<uint32_t>& row2, const std::vector<uint16_t>& want1,
                     const std::vector<uint16_t>& want2) {
  const std::string dir = embedding_copy(dtype, row1, row2);
  const ModelConfig c = read_model_config(dir);
  const Checkpoint ckpt = Checkpoint::open(dir);
  const int64_t H = c.hidden_size;
  const Batch batch = Batch::from_sequences({{1, 2, 1, 0}, {2}});
  const std::vector<int> rows = {1, 2, 1, 0, 2};
  auto want = [&](int64_t t, int64_t col) -> uint16_t {
    const int r = rows[static_cast<size_t>(t)];
    if (r == 0) return 0;
    const std::vector<uint16_t>& w = r == 1 ? want1 : want2;
    return col < static_cast<int64_t>(w.size()) ? w[static_cast<size_t>(col)] : 0;
  };
  ForwardOptions rounded;
  rounded.bf16_between_layers = true;
  auto fwd = ModelForward::create(c, ckpt, rounded);
  std::vector<uint16_t> bits(static_cast<size_t>(batch.n_tokens() * H), 0xFFFF);
  fwd->embed_bf16(batch, bits.data());
  std::vector<float> wide(bits.size());
  fwd->embed(batch, wide.data());
  for (int64_t t = 0; t < batch.n_tokens(); ++t) {
    for (int64_t col = 0; col < H; ++col) {
      const size_t i = static_cast<size_t>(t * H + col);
      EXPECT_EQ(bits[i], want(t, col)) << dtype_name(dtype) << " token " << t << " col " << col;
      uint32_t w;
      std::memcpy(&w, &wide[i], 4);
      EXPECT_EQ(w, static_cast<uint32_t>(want(t, col)) << 16) << "token " << t << " col " << col;
    }
  }
  if (dtype == DType::kF32) {
    ForwardOptions fp32;
    fp32.bf16_between_layers = false;
    auto f32 = ModelForward::create(c, ckpt, fp32);
    f32->embed(batch, wide.data());
    for (int64_t t : {0, 1}) {  // rows 1 and 2
      const std::vector<uint32_t>& row = t == 0 ? row1 : row2;
      for (size_t col = 0; col < row.size(); ++col) {
        uint32_t w;
        std::memcpy(&w, &wide[static_cast<size_t>(t * H) + col], 4);
        EXPECT_EQ(w, row[col]) << "token " << t << " col " << col;
      }
    }
  }
  const Batch bad = Batch::from_sequences({{1, static_cast<int32_t>(c.vocab_size)}});
  std::vector<uint16_t> sink(static_cast<size_t>(2 * H));
  std::string error;
  try {
    fwd->embed_bf16(bad, sink.data());
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_THAT(error, testing::HasSubstr("token id " + std::to_string(c.vocab_size) +
                                        " is outside the vocabulary"));
  std::filesystem::remove_all(dir);
}

TEST(ForwardEmbedding, Fp32TableRoundsToNearestEven) {
  // 1, 1 + 2^-8 (a tie: down to even), 1 + 3 * 2^-8 (a tie: up to even), 1 + 2^-8 + 2^-20
  // (above the tie), -2.5, a NaN with payload, +inf, the largest float (rounds to inf), the
  // smallest subnormal (to +0), -0.
  check_embedding(DType::kF32,
                  {0x3F800000, 0x3F808000, 0x3F818000, 0x3F808008, 0xC0200000, 0x7FA00001,
                   0x7F800000, 0x7F7FFFFF, 0x00000001, 0x80000000},
                  {0xFFC00001, 0x3F7FFFFF, 0x3F7F8000, 0x3F7E8000, 0xBF808001},
                  {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x7FC0, 0x7F80, 0x7F80, 0x0000, 0x8000},
                  // -NaN -> canonical; 1 - 2^-24 -> 1; 0x3F7F8000 is a tie between 0x3F7F and
                  // 0x3F80 (even); 0x3F7E8000 a tie between 0x3F7E (even) and 0x3F7F; just above
                  // the tie of -1 - 2^-8 -> away.
                  {0x7FC0, 0x3F80, 0x3F80, 0x3F7E, 0xBF81});
}

TEST(ForwardEmbedding, Bf16TableIsCopiedWithCanonicalNans) {
  check_embedding(DType::kBF16, {0x3F80, 0x7FA1, 0xFFC1, 0xFF80, 0x0001, 0x8000},
                  {0x7F81, 0xC020, 0x7FC0}, {0x3F80, 0x7FC0, 0x7FC0, 0xFF80, 0x0001, 0x8000},
                  {0x7FC0, 0xC020, 0x7FC0});
}

}  // namespace
}  // namespace strata
