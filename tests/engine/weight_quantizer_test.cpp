// engine/weight_quantizer.h on the CPU backend, against the quant/ encoders called with amaxes
// this test computes itself: a fused NVFP4 group shares the max |w| of all its planned modules
// (a module left to another rank included), an FP8 module uses its own, MXFP8 none.
#include "engine/weight_quantizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu_backend.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "quant/scale_search.h"

namespace strata {
namespace {

struct Weights {
  std::map<std::string, std::vector<uint16_t>> bf16;  // per module, [rows, cols]
  std::map<std::string, float> amax;                  // max |w| of each, from the floats
};

PlannedModule module(const std::string& name, QFormat f, int64_t layer, int64_t rows,
                     int64_t cols) {
  PlannedModule m;
  m.module = name;
  m.format = f;
  m.layer = layer;
  m.shape = {rows, cols};
  return m;
}

Tensor bf16_tensor(const std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
  Tensor t = Tensor::zeros(DType::kBF16, {rows, cols});
  std::memcpy(t.mutable_bytes(), v.data(), v.size() * 2);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

TEST(WeightQuantizer, GroupsAmaxesAsTheExporterDoes) {
  const int64_t R = 32, C = 64;
  QuantPlan plan;
  plan.num_layers = 2;
  const std::string p0 = "model.layers.0.", p1 = "model.layers.1.";
  for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"})
    plan.modules.push_back(module(p0 + n, QFormat::kNvfp4, 0, R, C));
  plan.modules.push_back(module(p0 + "self_attn.o_proj", QFormat::kFp8, 0, R, C));
  plan.modules.push_back(module(p0 + "mlp.down_proj", QFormat::kMxfp8, 0, R, C));
  plan.modules.push_back(module(p0 + "mlp.gate_proj", QFormat::kNone, 0, R, C));
  plan.modules.push_back(module(p1 + "self_attn.q_proj", QFormat::kNvfp4, 1, R, C));
  // Each module's weights scaled differently; q/k/v's max is k_proj's, which is not quantized here.
  Weights w;
  std::mt19937 rng(7);
  float scale = 0.5f;
  for (const PlannedModule& m : plan.modules) {
    std::normal_distribution<float> d(0.0f, m.module == p0 + "self_attn.k_proj" ? 40.0f : scale);
    scale *= 1.7f;
    std::vector<uint16_t>& v = w.bf16[m.module];
    float a = 0.0f;
    for (int64_t i = 0; i < R * C; ++i) {
      v.push_back(f32_to_bf16(d(rng)));
      a = std::max(a, std::fabs(bf16_to_f32(v.back())));
    }
    w.amax[m.module] = a;
  }
  // k_proj is another rank's: not quantized here, still in its group's amax.
  WeightQuantizer q(plan, 0,
                    [&](const PlannedModule& m) { return m.module != p0 + "self_attn.k_proj"; });
  ops::CpuBackend cpu(nullptr, nullptr);
  auto stored = [&](const std::string& module) {
    return ops::StoredWeight{w.bf16.at(module).data(), DType::kBF16, R, C};
  };
  const PrecomputedWeights out = q.quantize(0, cpu, stored);
  ASSERT_EQ(out.size(), 4u);  // q, v, o, down (not k: another rank's; not gate: unquantized)
  ASSERT_GT(w.amax[p0 + "self_attn.k_proj"], w.amax[p0 + "self_attn.v_proj"]);
  const float qkv = std::max({w.amax[p0 + "self_attn.q_proj"], w.amax[p0 + "self_attn.k_proj"],
                              w.amax[p0 + "self_attn.v_proj"]});
  for (const char* n : {"self_attn.q_proj", "self_attn.v_proj"}) {
    const std::string M = p0 + n;
    const Nvfp4Weight ref = nvfp4_quantize(bf16_tensor(w.bf16[M], R, C), qkv, M);
    const QuantizedWeight& got = out.at(M);
    ASSERT_TRUE(got.nvfp4.has_value()) << M;
    EXPECT_TRUE(same_bytes(got.nvfp4->packed, ref.packed)) << M;
    EXPECT_TRUE(same_bytes(got.nvfp4->block_scale, ref.block_scale)) << M;
    EXPECT_EQ(got.nvfp4->global_scale.item_f32(0), nvfp4_global_scale(qkv)) << M;
  }
  const std::string O = p0 + "self_attn.o_proj";
  const Fp8Weight fo = fp8_quantize(bf16_tensor(w.bf16[O], R, C), w.amax[O], O);
  ASSERT_TRUE(out.at(O).fp8.has_value());
  EXPECT_TRUE(same_bytes(out.at(O).fp8->weight, fo.weight));
  EXPECT_EQ(out.at(O).fp8->scale.item_f32(0), fp8_weight_scale(w.amax[O]));
  const std::string D = p0 + "mlp.down_proj";
  const Mxfp8Weight md = mxfp8_quantize(bf16_tensor(w.bf16[D], R, C), D);
  ASSERT_TRUE(out.at(D).mxfp8.has_value());
  EXPECT_TRUE(same_bytes(out.at(D).mxfp8->weight, md.weight));
  EXPECT_TRUE(same_bytes(out.at(D).mxfp8->scale, md.scale));
  // Layer 1 alone: its own group.
  const PrecomputedWeights out1 = q.quantize(1, cpu, stored);
  const std::string Q1 = p1 + "self_attn.q_proj";
  EXPECT_EQ(out1.at(Q1).nvfp4->global_scale.item_f32(0), nvfp4_global_scale(w.amax[Q1]));
  EXPECT_EQ(q.max_groups(), 2);  // layer 0: q/k/v and o_proj
  EXPECT_EQ(q.encoded_bytes(), static_cast<uint64_t>(R * C + R * C / 32));  // MXFP8's
}

// A fused-experts plan (gpt-oss, export/plan.h): every expert of one projection in a layer shares
// the max |w| of all of them, for NVFP4 and for FP8 alike; gate_up and down are separate groups,
// and an expert another rank writes still counts.
TEST(WeightQuantizer, FusedExpertsShareTheProjectionsAmax) {
  const int64_t R = 32, C = 32, E = 4;
  for (QFormat f : {QFormat::kNvfp4, QFormat::kFp8}) {
    QuantPlan plan;
    plan.num_layers = 1;
    plan.fused_experts = true;
    const std::string x = "model.layers.0.mlp.experts.";
    for (int64_t e = 0; e < E; ++e) {
      for (const char* leaf : {"down_proj", "gate_up_proj"})
        plan.modules.push_back(module(x + std::to_string(e) + "." + leaf, f, 0, R, C));
    }
    std::sort(plan.modules.begin(), plan.modules.end(),
              [](const PlannedModule& a, const PlannedModule& b) { return a.module < b.module; });
    Weights w;
    std::mt19937 rng(11);
    float scale = 0.25f;
    for (const PlannedModule& m : plan.modules) {
      std::normal_distribution<float> d(0.0f, scale);
      scale *= 1.6f;  // the largest amax is the last expert's of each projection
      std::vector<uint16_t>& v = w.bf16[m.module];
      float a = 0.0f;
      for (int64_t i = 0; i < R * C; ++i) {
        v.push_back(f32_to_bf16(d(rng)));
        a = std::max(a, std::fabs(bf16_to_f32(v.back())));
      }
      w.amax[m.module] = a;
    }
    const std::string last_gate_up = x + std::to_string(E - 1) + ".gate_up_proj";
    WeightQuantizer q(plan, 0, [&](const PlannedModule& m) { return m.module != last_gate_up; });
    ops::CpuBackend cpu(nullptr, nullptr);
    const PrecomputedWeights out = q.quantize(0, cpu, [&](const std::string& module) {
      return ops::StoredWeight{w.bf16.at(module).data(), DType::kBF16, R, C};
    });
    ASSERT_EQ(out.size(), static_cast<size_t>(2 * E - 1));
    EXPECT_EQ(q.max_groups(), 2);
    for (const char* leaf : {"down_proj", "gate_up_proj"}) {
      float group = 0.0f;
      for (int64_t e = 0; e < E; ++e)
        group = std::max(group, w.amax[x + std::to_string(e) + "." + leaf]);
      for (int64_t e = 0; e < E; ++e) {
        const std::string M = x + std::to_string(e) + "." + leaf;
        if (M == last_gate_up) continue;
        if (e == 0) {
          ASSERT_LT(w.amax[M], group) << M;  // its own amax would give other bytes
        }
        const Tensor t = bf16_tensor(w.bf16[M], R, C);
        if (f == QFormat::kNvfp4) {
          const Nvfp4Weight ref = nvfp4_quantize(t, group, M);
          EXPECT_TRUE(same_bytes(out.at(M).nvfp4->packed, ref.packed)) << M;
          EXPECT_EQ(out.at(M).nvfp4->global_scale.item_f32(0), nvfp4_global_scale(group)) << M;
        } else {
          const Fp8Weight ref = fp8_quantize(t, group, M);
          EXPECT_TRUE(same_bytes(out.at(M).fp8->weight, ref.weight)) << M;
          EXPECT_EQ(out.at(M).fp8->scale.item_f32(0), fp8_weight_scale(group)) << M;
        }
      }
    }
  }
}

// Random bf16 weights per module, each scaled by its own factor, with max |w| from the floats.
Weights random_weights(const QuantPlan& plan, int64_t R, int64_t C, uint32_t seed) {
  Weights w;
  std::mt19937 rng(seed);
  float scale = 0.25f;
  for (const PlannedModule& m : plan.modules) {
    std::normal_distribution<float> d(0.0f, scale);
    scale *= 1.3f;
    std::vector<uint16_t>& v = w.bf16[m.module];
    float a = 0.0f;
    for (int64_t i = 0; i < R * C; ++i) {
      v.push_back(f32_to_bf16(d(rng)));
      a = std::max(a, std::fabs(bf16_to_f32(v.back())));
    }
    w.amax[m.module] = a;
  }
  return w;
}

// ModelOpt 0.47 shares one weight amax between each routed expert's gate_proj and up_proj in FP8
// too (transformers 5's per-expert gate_up_proj, one quantizer; sync_moe_gate_up_amax), but not
// between a dense MLP's. NVFP4 shares weight_scale_2 over every projection reading the attention
// block's input (Kimi-Linear KDA: q/k/v/f_a/g_a/b_proj), among the members of one format only.
// Expected scales from the hand-taken max over the members named here.
TEST(WeightQuantizer, ExpertGateUpAndSharedInputGroups) {
  const int64_t R = 32, C = 64;
  QuantPlan plan;
  plan.num_layers = 1;
  const std::string p = "model.layers.0.";
  for (const char* n :
       {"mlp.experts.3.gate_proj", "mlp.experts.3.up_proj", "mlp.experts.3.down_proj",
        "mlp.experts.4.gate_proj", "mlp.experts.4.up_proj", "mlp.shared_experts.gate_proj",
        "mlp.shared_experts.up_proj"})
    plan.modules.push_back(module(p + n, QFormat::kFp8, 0, R, C));
  for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                        "self_attn.f_a_proj", "self_attn.b_proj", "self_attn.f_b_proj"})
    plan.modules.push_back(module(p + n, QFormat::kNvfp4, 0, R, C));
  plan.modules.push_back(module(p + "self_attn.g_a_proj", QFormat::kW4A16Nvfp4, 0, R, C));
  std::sort(plan.modules.begin(), plan.modules.end(),
            [](const PlannedModule& a, const PlannedModule& b) { return a.module < b.module; });
  const Weights w = random_weights(plan, R, C, 5);
  WeightQuantizer q(plan, 0, [](const PlannedModule&) { return true; });
  ops::CpuBackend cpu(nullptr, nullptr);
  const PrecomputedWeights out = q.quantize(0, cpu, [&](const std::string& module) {
    return ops::StoredWeight{w.bf16.at(module).data(), DType::kBF16, R, C};
  });
  auto amax = [&](std::initializer_list<const char*> names) {
    float a = 0.0f;
    for (const char* n : names)
      a = std::max(a, w.amax.at(p + n));
    return a;
  };
  const float e3 = amax({"mlp.experts.3.gate_proj", "mlp.experts.3.up_proj"});
  const float e4 = amax({"mlp.experts.4.gate_proj", "mlp.experts.4.up_proj"});
  const std::vector<std::pair<const char*, float>> fp8 = {
      {"mlp.experts.3.gate_proj", e3},
      {"mlp.experts.3.up_proj", e3},
      {"mlp.experts.3.down_proj", amax({"mlp.experts.3.down_proj"})},
      {"mlp.experts.4.gate_proj", e4},
      {"mlp.experts.4.up_proj", e4},
      {"mlp.shared_experts.gate_proj", amax({"mlp.shared_experts.gate_proj"})},
      {"mlp.shared_experts.up_proj", amax({"mlp.shared_experts.up_proj"})}};
  for (const auto& [n, a] : fp8) {
    const std::string M = p + n;
    ASSERT_TRUE(out.at(M).fp8.has_value()) << M;
    EXPECT_EQ(out.at(M).fp8->scale.item_f32(0), fp8_weight_scale(a)) << M;
    EXPECT_TRUE(same_bytes(out.at(M).fp8->weight,
                           fp8_quantize(bf16_tensor(w.bf16.at(M), R, C), a, M).weight))
        << M;
  }
  // The gate/up pair of expert 3 differs from either member's own amax (the test can fail).
  EXPECT_NE(w.amax.at(p + "mlp.experts.3.gate_proj"), w.amax.at(p + "mlp.experts.3.up_proj"));
  const float attn = amax({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                           "self_attn.f_a_proj", "self_attn.b_proj"});
  const std::vector<std::pair<const char*, float>> nv = {
      {"self_attn.q_proj", attn},
      {"self_attn.k_proj", attn},
      {"self_attn.v_proj", attn},
      {"self_attn.f_a_proj", attn},
      {"self_attn.b_proj", attn},
      {"self_attn.f_b_proj", amax({"self_attn.f_b_proj"})},
      {"self_attn.g_a_proj", amax({"self_attn.g_a_proj"})}};
  for (const auto& [n, a] : nv) {
    const std::string M = p + n;
    ASSERT_TRUE(out.at(M).nvfp4.has_value()) << M;
    EXPECT_EQ(out.at(M).nvfp4->global_scale.item_f32(0), nvfp4_global_scale(a)) << M;
  }
  EXPECT_LT(w.amax.at(p + "self_attn.q_proj"), attn);
}

// A NaN anywhere in a group makes its amax NaN, and the encoder refuses it naming the module.
// Under local_hessian the NVFP4 modules are quantized here too, each searched with the input
// statistics the caller gives for it (quant/scale_search.h's reference with that module's
// normalized BlockHessian), a module without statistics with the plain search; FP8 stays at max;
// the quantizer reports the widest module's statistics bytes.
TEST(WeightQuantizer, LocalHessianSearchesWithEachModulesStatistics) {
  const int64_t R = 16, C = 64;
  QuantPlan plan;
  plan.num_layers = 1;
  plan.recipe.algorithm.method = WeightCalib::Method::kLocalHessian;
  plan.recipe.algorithm.fp8_scale_sweep = true;
  const std::string p = "model.layers.0.";
  plan.modules.push_back(module(p + "mlp.down_proj", QFormat::kNvfp4, 0, R, C));
  plan.modules.push_back(module(p + "self_attn.o_proj", QFormat::kNvfp4, 0, R, C));
  plan.modules.push_back(module(p + "self_attn.q_proj", QFormat::kFp8, 0, R, C));
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Weights w;
  for (const PlannedModule& m : plan.modules) {
    std::vector<uint16_t>& v = w.bf16[m.module];
    float a = 0.0f;
    for (int64_t i = 0; i < R * C; ++i) {
      v.push_back(f32_to_bf16(i % 23 == 0 ? 8.0f * d(rng) : d(rng)));
      a = std::max(a, std::fabs(bf16_to_f32(v.back())));
    }
    w.amax[m.module] = a;
  }
  // down_proj's inputs: correlated features of growing scale; o_proj: none reached it.
  std::vector<float> x(static_cast<size_t>(24 * C));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = d(rng) * (1.0f + static_cast<float>(i % 16)) + (i % C ? 0.5f * x[i - 1] : 0.0f);
  BlockHessian stats(C);
  stats.accumulate(x.data(), 24);
  const std::vector<double> h = stats.normalized();
  WeightQuantizer q(plan, 0, [](const PlannedModule&) { return true; });
  EXPECT_TRUE(q.needs_hessians());
  EXPECT_EQ(q.hessian_bytes(), static_cast<uint64_t>(C) * 16 * 8);
  ops::CpuBackend cpu(nullptr, nullptr);
  const PrecomputedWeights out = q.quantize(
      0, cpu,
      [&](const std::string& module) {
        return ops::StoredWeight{w.bf16.at(module).data(), DType::kBF16, R, C};
      },
      [&](const std::string& module) {
        return module == p + "mlp.down_proj" ? h : std::vector<double>{};
      });
  ASSERT_EQ(out.size(), 3u);
  for (const char* n : {"mlp.down_proj", "self_attn.o_proj"}) {
    const std::string M = p + n;
    const Tensor t = bf16_tensor(w.bf16[M], R, C);
    const std::vector<double> hm = M == p + "mlp.down_proj" ? h : std::vector<double>{};
    const std::vector<uint8_t> want =
        nvfp4_search_block_scales(t, w.amax[M], plan.recipe.algorithm, hm, M);
    const Tensor& got = out.at(M).nvfp4->block_scale;
    ASSERT_EQ(got.nbytes(), want.size()) << M;
    EXPECT_EQ(std::memcmp(got.bytes(), want.data(), want.size()), 0) << M;
  }
  // The statistics changed down_proj's choice: its plain search differs somewhere.
  const Tensor down = bf16_tensor(w.bf16[p + "mlp.down_proj"], R, C);
  const std::vector<uint8_t> plain = nvfp4_search_block_scales(down, w.amax[p + "mlp.down_proj"],
                                                               plan.recipe.algorithm, {}, "down");
  EXPECT_NE(std::memcmp(out.at(p + "mlp.down_proj").nvfp4->block_scale.bytes(), plain.data(),
                        plain.size()),
            0);
  const std::string Q = p + "self_attn.q_proj";
  const Fp8Weight fq = fp8_quantize(bf16_tensor(w.bf16[Q], R, C), w.amax[Q], Q);
  EXPECT_TRUE(same_bytes(out.at(Q).fp8->weight, fq.weight));
}

TEST(WeightQuantizer, NanWeightIsRefusedNamingTheModule) {
  QuantPlan plan;
  plan.num_layers = 1;
  plan.modules.push_back(module("model.layers.0.mlp.up_proj", QFormat::kNvfp4, 0, 16, 16));
  std::vector<uint16_t> v(256, f32_to_bf16(0.25f));
  v[100] = f32_to_bf16(NAN);
  WeightQuantizer q(plan, 0, [](const PlannedModule&) { return true; });
  ops::CpuBackend cpu(nullptr, nullptr);
  try {
    q.quantize(0, cpu, [&](const std::string&) {
      return ops::StoredWeight{v.data(), DType::kBF16, 16, 16};
    });
    FAIL() << "a NaN weight was quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.up_proj"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strata
