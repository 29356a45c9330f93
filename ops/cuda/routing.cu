// MoE routing on the device (host launchers: ops/cuda/routing.h), one thread per token: softmax
// top-k (Qwen MoE) and sigmoid group-limited top-k (DeepSeek-V3 noaux_tc).
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/routing.h"

namespace strata::ops::cuda {
namespace {

using launch::launched;
using launch::st;

constexpr int kMaxTopK = 32;

// pick[0, k) = the top k of value(e) over e in [0, n) by repeated selection, largest first, ties
// to the lower index (ops::top_k).
template <typename Value>
__device__ void select_top_k(int64_t n, int64_t k, Value value, int32_t* pick) {
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    float bv = -INFINITY;
    for (int64_t e = 0; e < n; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i)
        taken |= pick[i] == e;
      if (taken) continue;
      const float v = value(e);
      if (best < 0 || v > bv) {
        best = static_cast<int32_t>(e);
        bv = v;
      }
    }
    pick[j] = best;
  }
}
__global__ void k_route(const float* logits, int64_t T, int64_t E, int64_t K, bool norm,
                        int32_t* chosen, float* weight, int32_t* counts) {
  FOR_N(t, T) {
    const float* x = logits + t * E;
    float mx = -INFINITY;
    for (int64_t e = 0; e < E; ++e)
      mx = fmaxf(mx, x[e]);
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e)
      sum += expf(x[e] - mx);
    const float inv = static_cast<float>(1.0 / sum);
    // Top K by repeated selection; p_e = exp(x_e - mx) * inv, as ops::softmax rounds it.
    int32_t pick[kMaxTopK];
    float val[kMaxTopK];
    float total = 0.0f;
    auto prob = [&](int64_t e) { return expf(x[e] - mx) * inv; };
    select_top_k(E, K, prob, pick);
    for (int64_t j = 0; j < K; ++j) {
      val[j] = prob(pick[j]);
      total += val[j];
    }
    for (int64_t j = 0; j < K; ++j) {
      chosen[t * K + j] = pick[j];
      weight[t * K + j] = val[j] / (norm ? total : 1.0f);
      atomicAdd(&counts[pick[j]], 1);
    }
  }
}

constexpr int kMaxGroups = 64;
// DeepSeek-V3's noaux_tc routing, one thread per token, the CPU's SigmoidMoe::route step by step:
// s = 1 / (1 + exp(-logit)); choice = s + bias; group score = sum of the group's top 2 choices
// (top 1 when a group has one expert); keep the topk_group best groups; top K of choice among
// the kept experts; weight = s (/ (sum + 1e-20) when norm) * scaling. Ties go to the lower index.
__global__ void k_route_sigmoid(const float* logits, int64_t T, int64_t E, int64_t K,
                                const float* bias, int64_t n_group, int64_t topk_group, bool norm,
                                float scaling, int32_t* chosen, float* weight, int32_t* counts) {
  FOR_N(t, T) {
    const float* x = logits + t * E;
    auto score = [&](int64_t e) { return 1.0f / (1.0f + expf(-x[e])); };
    auto choice = [&](int64_t e) { return bias ? score(e) + bias[e] : score(e); };
    const int64_t per = E / n_group;
    float group_score[kMaxGroups];
    for (int64_t g = 0; g < n_group; ++g) {
      auto in_group = [&](int64_t i) { return choice(g * per + i); };
      int32_t top2[2];
      select_top_k(per, per >= 2 ? 2 : 1, in_group, top2);
      float sum = 0.0f;
      sum += in_group(top2[0]);
      if (per >= 2) sum += in_group(top2[1]);
      group_score[g] = sum;
    }
    int32_t kept[kMaxGroups];
    select_top_k(
        n_group, topk_group, [&](int64_t g) { return group_score[g]; }, kept);
    uint64_t keep = 0;
    for (int64_t j = 0; j < topk_group; ++j)
      keep |= uint64_t{1} << kept[j];
    int32_t pick[kMaxTopK];
    select_top_k(
        E, K, [&](int64_t e) { return (keep >> (e / per)) & 1 ? choice(e) : -INFINITY; }, pick);
    float total = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      total += score(pick[j]);
    for (int64_t j = 0; j < K; ++j) {
      float w = score(pick[j]);
      if (norm) w /= (total + 1e-20f);
      chosen[t * K + j] = pick[j];
      weight[t * K + j] = w * scaling;
      atomicAdd(&counts[pick[j]], 1);
    }
  }
}

}  // namespace

void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm,
                        int32_t* chosen, float* weight, int32_t* counts, void* s) {
  if (T == 0) return;
  STRATA_CHECK(K <= kMaxTopK, "GPU routing: num_experts_per_tok ", K,
               " exceeds 32; use --device cpu");
  k_route<<<static_cast<unsigned>((T + 127) / 128), 128, 0, st(s)>>>(logits, T, E, K, norm, chosen,
                                                                     weight, counts);
  launched("route_softmax_topk");
}
void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                           int64_t n_group, int64_t topk_group, bool norm, float scaling,
                           int32_t* chosen, float* weight, int32_t* counts, void* s) {
  if (T == 0) return;
  STRATA_CHECK(K <= kMaxTopK, "GPU routing: num_experts_per_tok ", K,
               " exceeds 32; use --device cpu");
  STRATA_CHECK(n_group >= 1 && n_group <= kMaxGroups && E % n_group == 0 && topk_group >= 1 &&
                   topk_group <= n_group,
               "GPU routing: n_group ", n_group, " / topk_group ", topk_group,
               " unsupported (n_group <= 64 dividing the experts); use --device cpu");
  k_route_sigmoid<<<static_cast<unsigned>((T + 127) / 128), 128, 0, st(s)>>>(
      logits, T, E, K, bias, n_group, topk_group, norm, scaling, chosen, weight, counts);
  launched("route_sigmoid_grouped");
}

}  // namespace strata::ops::cuda
