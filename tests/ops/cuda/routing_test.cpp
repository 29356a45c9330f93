// ops/cuda/routing.h against the routing formulas of spec/architectures.md (§2 softmax top-k,
// §3 noaux_tc), written here from ops::softmax, ops::sigmoid and ops::top_k.
#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "ops/cuda/routing.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// The k-th and (k+1)-th largest of v differ by more than `gap` (relative): a choice that does
// not hinge on the last ulps of exp.
bool clear_cut(std::vector<float> v, int64_t k, float gap) {
  if (k >= static_cast<int64_t>(v.size())) return true;
  std::sort(v.begin(), v.end(), std::greater<float>());
  return v[k - 1] - v[k] > gap * std::fabs(v[k - 1]);
}

// Softmax routing, spec §2: p = softmax(logits) in fp32; the top K of p; weight = p (divided by
// the sum of the top K when norm); counts[e] = tokens routed to e. Tokens whose K-th and
// (K+1)-th p are within 1e-5 are left out (expf may order them either way).
TEST_F(CudaOps, SoftmaxRoutingFollowsTheFormula) {
  const int64_t T = 50;
  for (const auto& [E, K, norm] : std::vector<std::tuple<int64_t, int64_t, bool>>{
           {60, 4, true}, {60, 4, false}, {512, 10, true}, {1024, 32, false}}) {
    const auto logits = normal(T * E, 2.0f);
    gpu::DeviceBuffer dl = up(logits), dc = buffer(T * K * 4), dw = buffer(T * K * 4);
    gpu::DeviceBuffer dn = up(std::vector<int32_t>(E, 0));
    route_softmax_topk(dl.as<float>(), T, E, K, norm, dc.as<int32_t>(), dw.as<float>(),
                       dn.as<int32_t>(), st());
    const auto chosen = down<int32_t>(dc, T * K);
    const auto weight = down<float>(dw, T * K);
    const auto counts = down<int32_t>(dn, E);
    std::vector<float> p = logits;
    ops::softmax(p.data(), T, E);
    std::vector<int32_t> want_counts(E, 0);
    int checked = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < K; ++j)
        ++want_counts[chosen[t * K + j]];  // whatever it chose, counted once per slot
      std::vector<float> row(p.begin() + t * E, p.begin() + (t + 1) * E);
      if (!clear_cut(row, K, 1e-5f)) continue;
      ++checked;
      const auto idx = ops::top_k(row.data(), E, K);
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j)
        sum += row[idx[j]];
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_EQ(chosen[t * K + j], idx[j]) << "token " << t << " slot " << j;
        const float w = row[idx[j]] / (norm ? sum : 1.0f);
        ASSERT_NEAR(weight[t * K + j], w, 2e-6f * w) << "token " << t;
      }
    }
    EXPECT_GT(checked, T * 9 / 10);
    EXPECT_EQ(counts, want_counts);
  }
}

// Ties go to the lower expert, as ops::top_k: logits on a few levels (many exact ties, equal p on
// both sides), every token compared.
TEST_F(CudaOps, SoftmaxRoutingBreaksTiesToTheLowerExpert) {
  const int64_t T = 64, E = 16, K = 5;
  std::uniform_int_distribution<int> level(-3, 3);
  std::vector<float> logits(T * E);
  for (float& v : logits)
    v = static_cast<float>(level(rng())) * 0.75f;
  gpu::DeviceBuffer dl = up(logits), dc = buffer(T * K * 4), dw = buffer(T * K * 4);
  gpu::DeviceBuffer dn = up(std::vector<int32_t>(E, 0));
  route_softmax_topk(dl.as<float>(), T, E, K, true, dc.as<int32_t>(), dw.as<float>(),
                     dn.as<int32_t>(), st());
  const auto chosen = down<int32_t>(dc, T * K);
  std::vector<float> p = logits;
  ops::softmax(p.data(), T, E);
  for (int64_t t = 0; t < T; ++t) {
    const auto idx = ops::top_k(&p[t * E], E, K);
    for (int64_t j = 0; j < K; ++j)
      ASSERT_EQ(chosen[t * K + j], idx[j]) << "token " << t << " slot " << j;
  }
}

// spec §3, noaux_tc, one token: s = sigmoid(logit) in fp32; choice = s + bias; a group's score is
// the sum of its two largest choices; keep the topk_group best groups; top-k of choice among
// their experts (ties to the lower index); weight = s (normalised) * scaling.
void route_reference(const float* x, int64_t E, int64_t K, const float* bias, int64_t groups,
                     int64_t keep_groups, bool norm, float scaling, int32_t* chosen,
                     float* weight) {
  std::vector<float> sg(E), ch(E);
  for (int64_t e = 0; e < E; ++e) {
    sg[e] = 1.0f / (1.0f + std::exp(-x[e]));
    ch[e] = bias ? sg[e] + bias[e] : sg[e];
  }
  const int64_t per = E / groups;
  std::vector<std::pair<float, int64_t>> gs;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<float> v(ch.begin() + g * per, ch.begin() + (g + 1) * per);
    std::sort(v.begin(), v.end(), std::greater<>());
    gs.push_back({v[0] + (per > 1 ? v[1] : 0.0f), g});
  }
  std::stable_sort(gs.begin(), gs.end(), [](auto a, auto b) { return a.first > b.first; });
  std::vector<std::pair<float, int64_t>> cand;
  for (int64_t j = 0; j < keep_groups; ++j)
    for (int64_t i = 0; i < per; ++i)
      cand.push_back({ch[gs[j].second * per + i], gs[j].second * per + i});
  std::stable_sort(cand.begin(), cand.end(), [](auto a, auto b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j)
    sum += sg[cand[j].second];
  for (int64_t j = 0; j < K; ++j) {
    chosen[j] = static_cast<int32_t>(cand[j].second);
    weight[j] = (norm ? sg[cand[j].second] / (sum + 1e-20f) : sg[cand[j].second]) * scaling;
  }
}

TEST_F(CudaOps, SigmoidGroupedRoutingFollowsTheFormula) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  struct Case {
    int64_t E, K, groups, keep;
    bool norm, bias;
  };
  for (Case c :
       {Case{8, 3, 4, 2, true, true}, Case{64, 6, 8, 3, true, true}, Case{16, 2, 1, 1, false, true},
        Case{256, 8, 8, 4, true, true}, Case{12, 3, 4, 2, true, false},
        Case{384, 8, 1, 1, true, true},         // Kimi-K2's 384 experts, one group
        Case{1024, 16, 64, 7, false, true}}) {  // the widest router and most groups taken
    const int64_t T = 97;
    std::vector<float> x(static_cast<size_t>(T * c.E)), bias(static_cast<size_t>(c.E));
    for (float& v : x)
      v = nd(rng);
    for (float& v : bias)
      v = 0.1f * nd(rng);
    gpu::DeviceBuffer dx = up(x), db = up(bias);
    gpu::DeviceBuffer dc = buffer(static_cast<uint64_t>(T * c.K) * 4);
    gpu::DeviceBuffer dw = buffer(static_cast<uint64_t>(T * c.K) * 4);
    gpu::DeviceBuffer dn = up(std::vector<int32_t>(static_cast<size_t>(c.E), 0));
    const float* b = c.bias ? db.as<float>() : nullptr;
    route_sigmoid_grouped(dx.as<float>(), T, c.E, c.K, b, c.groups, c.keep, c.norm, 2.5f,
                          dc.as<int32_t>(), dw.as<float>(), dn.as<int32_t>(), st());
    const auto chosen = down<int32_t>(dc, static_cast<size_t>(T * c.K));
    const auto weight = down<float>(dw, static_cast<size_t>(T * c.K));
    const auto counts = down<int32_t>(dn, static_cast<size_t>(c.E));
    std::vector<int32_t> want_counts(static_cast<size_t>(c.E), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> rc(static_cast<size_t>(c.K));
      std::vector<float> rw(static_cast<size_t>(c.K));
      route_reference(&x[t * c.E], c.E, c.K, c.bias ? bias.data() : nullptr, c.groups, c.keep,
                      c.norm, 2.5f, rc.data(), rw.data());
      for (int64_t j = 0; j < c.K; ++j) {
        ASSERT_EQ(chosen[t * c.K + j], rc[j]) << "E=" << c.E << " token " << t << " slot " << j;
        EXPECT_NEAR(weight[t * c.K + j], rw[j], 1e-6f * std::fabs(rw[j]) + 1e-12f);
        ++want_counts[static_cast<size_t>(rc[j])];
      }
    }
    EXPECT_EQ(counts, want_counts);
  }
}

// Shapes the kernels cannot take are refused before the launch with a strata::Error.
TEST_F(CudaOps, RoutingRefusesUnsupportedShapes) {
  // The shapes the launchers below refuse, named before any launch (the backend's sizing pass).
  EXPECT_EQ(routing_unsupported(1024, 32), "");
  EXPECT_EQ(grouped_routing_unsupported(256, 8, 8, 4), "");
  EXPECT_EQ(routing_unsupported(64, 33), "num_experts_per_tok 33 exceeds the GPU router's 32");
  EXPECT_EQ(routing_unsupported(1025, 8), "1025 experts exceed the GPU router's 1024");
  EXPECT_NE(grouped_routing_unsupported(60, 4, 7, 2), "");  // 7 does not divide 60
  EXPECT_NE(grouped_routing_unsupported(64, 4, 8, 9), "");  // keeps more groups than there are
  EXPECT_NE(grouped_routing_unsupported(64, 4, 0, 1), "");
  EXPECT_NE(grouped_routing_unsupported(2048, 4, 8, 4), "");
  gpu::DeviceBuffer any = buffer(1 << 16);
  EXPECT_THROW(route_softmax_topk(any.as<float>(), 4, 64, 33, true, any.as<int32_t>(),
                                  any.as<float>(), any.as<int32_t>(), st()),
               Error);
  EXPECT_THROW(route_softmax_topk(any.as<float>(), 4, 1025, 8, true, any.as<int32_t>(),
                                  any.as<float>(), any.as<int32_t>(), st()),
               Error);
  EXPECT_THROW(route_sigmoid_grouped(any.as<float>(), 4, 60, 4, nullptr, 7, 2, true, 1.0f,
                                     any.as<int32_t>(), any.as<float>(), any.as<int32_t>(), st()),
               Error);
  EXPECT_THROW(route_sigmoid_grouped(any.as<float>(), 4, 64, 4, nullptr, 8, 9, true, 1.0f,
                                     any.as<int32_t>(), any.as<float>(), any.as<int32_t>(), st()),
               Error);
}

}  // namespace
}  // namespace strata::ops::cuda
