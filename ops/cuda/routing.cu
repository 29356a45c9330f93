// MoE routing on the device (host launchers: ops/cuda/routing.h), one warp per token: softmax
// top-k (Qwen MoE) and sigmoid group-limited top-k (DeepSeek-V3 noaux_tc). The warp computes each
// expert's value once into shared memory (the lanes over the experts, coalesced), selects by warp
// reductions, and lane 0 does what sums in order (the softmax denominator, the top-k weights), so
// every result is the one a thread computing the token alone in expert order gets.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "core/error.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/routing.h"

namespace strata::ops::cuda {
namespace {

using launch::launched;
using launch::st;

constexpr int kMaxTopK = 32;
constexpr int kMaxGroups = 64;
constexpr int kWarps = 4;          // tokens a block
constexpr int kMaxExperts = 1024;  // 2 floats an expert a warp: 4 warps within 48 KiB
constexpr unsigned kAll = 0xffffffffu;

// The next pick of ops::top_k's repeated selection over v[0, n) (shared memory), the indices in
// picked[0, j) (shared memory) excluded: scanning in order, the first candidate e0 is taken and
// replaced by any later one that is strictly larger. So the pick is e0 when v[e0] is NaN (nothing
// compares larger than it), else the largest value that is not NaN, ties to the lower index. The
// whole warp calls it and gets the pick.
__device__ int warp_select(const float* v, int n, const int32_t* picked, int j) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  int e0 = INT_MAX, be = INT_MAX;
  float bv = 0.0f;
  for (int e = lane; e < n; e += 32) {
    bool taken = false;
    for (int i = 0; i < j; ++i)
      taken |= picked[i] == e;
    if (taken) continue;
    e0 = min(e0, e);
    const float x = v[e];
    if (isnan(x)) continue;
    if (be == INT_MAX || x > bv) {
      be = e;
      bv = x;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    e0 = min(e0, __shfl_xor_sync(kAll, e0, off));
    const float ov = __shfl_xor_sync(kAll, bv, off);
    const int oe = __shfl_xor_sync(kAll, be, off);
    if (oe != INT_MAX && (be == INT_MAX || ov > bv || (ov == bv && oe < be))) {
      be = oe;
      bv = ov;
    }
  }
  return be == INT_MAX || isnan(v[e0]) ? e0 : be;
}

// Each warp's shared memory: two rows of E floats, then its picks and group scores.
struct WarpSmem {
  float* a;
  float* b;
  int32_t* picks;  // [kMaxTopK]
  float* groups;   // [kMaxGroups]
  int32_t* kept;   // [kMaxGroups]
};
__device__ WarpSmem warp_smem(int64_t E) {
  extern __shared__ float smem[];
  const int w = static_cast<int>(threadIdx.x >> 5);
  const int64_t per_warp = 2 * E + kMaxTopK + 2 * kMaxGroups;
  float* base = smem + w * per_warp;
  return WarpSmem{base, base + E, reinterpret_cast<int32_t*>(base + 2 * E), base + 2 * E + kMaxTopK,
                  reinterpret_cast<int32_t*>(base + 2 * E + kMaxTopK + kMaxGroups)};
}
uint64_t smem_bytes(int64_t E) {
  return static_cast<uint64_t>(kWarps) * (2 * E + kMaxTopK + 2 * kMaxGroups) * 4;
}

__global__ void k_route(const float* logits, int64_t T, int64_t E, int64_t K, bool norm,
                        int32_t* chosen, float* weight, int32_t* counts) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;  // a whole warp
  const int lane = static_cast<int>(threadIdx.x & 31);
  const WarpSmem m = warp_smem(E);
  const float* x = logits + t * E;
  float mx = -INFINITY;  // fmaxf ignores NaN, so any order gives the max
  for (int64_t e = lane; e < E; e += 32)
    mx = fmaxf(mx, x[e]);
  for (int off = 16; off > 0; off >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, off));
  for (int64_t e = lane; e < E; e += 32)
    m.a[e] = expf(x[e] - mx);
  __syncwarp();
  float inv = 0.0f;
  if (lane == 0) {  // the denominator in fp64, in expert order (ops::softmax)
    double sum = 0.0;
    for (int64_t e = 0; e < E; ++e)
      sum += m.a[e];
    inv = static_cast<float>(1.0 / sum);
  }
  inv = __shfl_sync(kAll, inv, 0);
  // p_e = exp(x_e - mx) * inv, as ops::softmax rounds it.
  for (int64_t e = lane; e < E; e += 32)
    m.b[e] = m.a[e] * inv;
  __syncwarp();
  for (int j = 0; j < K; ++j) {
    const int pick = warp_select(m.b, static_cast<int>(E), m.picks, j);
    if (lane == 0) m.picks[j] = pick;
    __syncwarp();
  }
  if (lane == 0) {
    float total = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      total += m.b[m.picks[j]];
    for (int64_t j = 0; j < K; ++j) {
      chosen[t * K + j] = m.picks[j];
      weight[t * K + j] = m.b[m.picks[j]] / (norm ? total : 1.0f);
      atomicAdd(&counts[m.picks[j]], 1);
    }
  }
}

// DeepSeek-V3's noaux_tc routing, the CPU's SigmoidMoe::route step by step: s = 1 / (1 +
// exp(-logit)); choice = s + bias; group score = sum of the group's top 2 choices (top 1 when a
// group has one expert); keep the topk_group best groups; top K of choice among the kept experts;
// weight = s (/ (sum + 1e-20) when norm) * scaling. Ties go to the lower index.
__global__ void k_route_sigmoid(const float* logits, int64_t T, int64_t E, int64_t K,
                                const float* bias, int64_t n_group, int64_t topk_group, bool norm,
                                float scaling, int32_t* chosen, float* weight, int32_t* counts) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;  // a whole warp
  const int lane = static_cast<int>(threadIdx.x & 31);
  const WarpSmem m = warp_smem(E);
  const float* x = logits + t * E;
  float* score = m.a;
  float* choice = m.b;
  for (int64_t e = lane; e < E; e += 32) {
    score[e] = 1.0f / (1.0f + expf(-x[e]));
    choice[e] = bias ? score[e] + bias[e] : score[e];
  }
  __syncwarp();
  const int per = static_cast<int>(E / n_group);
  for (int g = 0; g < n_group; ++g) {  // each group's top 2 (one: a group of one expert)
    const float* in_group = choice + static_cast<int64_t>(g) * per;
    const int first = warp_select(in_group, per, m.picks, 0);
    if (lane == 0) m.picks[0] = first;
    __syncwarp();
    float sum = 0.0f;
    sum += in_group[first];
    if (per >= 2) sum += in_group[warp_select(in_group, per, m.picks, 1)];
    if (lane == 0) m.groups[g] = sum;
    __syncwarp();
  }
  for (int j = 0; j < topk_group; ++j) {
    const int kept = warp_select(m.groups, static_cast<int>(n_group), m.kept, j);
    if (lane == 0) m.kept[j] = kept;
    __syncwarp();
  }
  uint64_t keep = 0;
  for (int64_t j = 0; j < topk_group; ++j)
    keep |= uint64_t{1} << m.kept[j];
  for (int64_t e = lane; e < E; e += 32)  // the experts of groups not kept can no longer win
    if (!((keep >> (e / per)) & 1)) choice[e] = -INFINITY;
  __syncwarp();
  for (int j = 0; j < K; ++j) {
    const int pick = warp_select(choice, static_cast<int>(E), m.picks, j);
    if (lane == 0) m.picks[j] = pick;
    __syncwarp();
  }
  if (lane == 0) {
    float total = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      total += score[m.picks[j]];
    for (int64_t j = 0; j < K; ++j) {
      float w = score[m.picks[j]];
      if (norm) w /= (total + 1e-20f);
      chosen[t * K + j] = m.picks[j];
      weight[t * K + j] = w * scaling;
      atomicAdd(&counts[m.picks[j]], 1);
    }
  }
}

}  // namespace

std::string routing_unsupported(int64_t E, int64_t K) {
  if (K > kMaxTopK) return str("num_experts_per_tok ", K, " exceeds the GPU router's ", kMaxTopK);
  if (E > kMaxExperts) return str(E, " experts exceed the GPU router's ", kMaxExperts);
  return "";
}

std::string grouped_routing_unsupported(int64_t E, int64_t K, int64_t n_group, int64_t topk_group) {
  if (!(n_group >= 1 && n_group <= kMaxGroups && E % n_group == 0 && topk_group >= 1 &&
        topk_group <= n_group))
    return str("n_group ", n_group, " / topk_group ", topk_group,
               " unsupported by the GPU router (n_group <= ", kMaxGroups, " dividing the experts)");
  return routing_unsupported(E, K);
}

void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm,
                        int32_t* chosen, float* weight, int32_t* counts, void* s) {
  if (T == 0) return;
  const std::string why = routing_unsupported(E, K);
  STRATA_CHECK(why.empty(), "GPU routing: ", why, "; use --device cpu");
  k_route<<<static_cast<unsigned>((T + kWarps - 1) / kWarps), 32 * kWarps, smem_bytes(E), st(s)>>>(
      logits, T, E, K, norm, chosen, weight, counts);
  launched("route_softmax_topk");
}
void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                           int64_t n_group, int64_t topk_group, bool norm, float scaling,
                           int32_t* chosen, float* weight, int32_t* counts, void* s) {
  if (T == 0) return;
  const std::string why = grouped_routing_unsupported(E, K, n_group, topk_group);
  STRATA_CHECK(why.empty(), "GPU routing: ", why, "; use --device cpu");
  k_route_sigmoid<<<static_cast<unsigned>((T + kWarps - 1) / kWarps), 32 * kWarps, smem_bytes(E),
                    st(s)>>>(logits, T, E, K, bias, n_group, topk_group, norm, scaling, chosen,
                             weight, counts);
  launched("route_sigmoid_grouped");
}

}  // namespace strata::ops::cuda
