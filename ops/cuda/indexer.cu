// DeepSeek-V3.2's lightning indexer on the device (host launcher: ops/cuda/indexer.h): one block
// per query scores the query's causal keys into shared memory, selects the top_k by a radix
// select and writes the query's row of the keep mask.
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>

#include "core/error.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::launched;
using launch::st;

constexpr int kBlock = 256;
constexpr int kMaxHeads = 64;

// Larger float, larger key (NaNs aside).
__device__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void k_index_topk(const float* q, const float* k, const float* w, int64_t nH, int64_t d,
                             float scale, float w_scale, int64_t top_k, const int64_t* start,
                             uint32_t* keep, int64_t words) {
  extern __shared__ float smem[];
  using Scan = cub::BlockScan<int, kBlock>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_need;
  const int64_t t = blockIdx.x;
  const int64_t first = start[t], n = t - first + 1;  // the causal keys of query t
  uint32_t* row = keep + t * words;
  if (n <= top_k) {  // every causal key
    for (int64_t wd = threadIdx.x; wd < words; wd += kBlock) {
      const int64_t lo = wd * 32;
      row[wd] = lo + 32 <= n ? 0xffffffffu : (lo >= n ? 0u : (1u << (n - lo)) - 1u);
    }
    return;
  }
  float* qs = smem;         // [nH, d]
  float* ws = qs + nH * d;  // [nH]
  float* sc = ws + nH;      // [n] scores, then their order keys
  for (int64_t i = threadIdx.x; i < nH * d; i += kBlock)
    qs[i] = q[t * nH * d + i];
  for (int64_t h = threadIdx.x; h < nH; h += kBlock)
    ws[h] = w[t * nH + h] * w_scale;
  __syncthreads();
  // Thread per key: per-head dots accumulated in registers, 4 dims at a time.
  for (int64_t j = threadIdx.x; j < n; j += kBlock) {
    const float4* kj = reinterpret_cast<const float4*>(k + (first + j) * d);
    float acc[kMaxHeads];
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h)
      acc[h] = 0.0f;
    for (int64_t c4 = 0; c4 < d / 4; ++c4) {
      const float4 kv = kj[c4];
#pragma unroll
      for (int h = 0; h < kMaxHeads; ++h) {
        if (h < nH) {
          const float* qh = qs + h * d + 4 * c4;
          acc[h] = fmaf(qh[0], kv.x, acc[h]);
          acc[h] = fmaf(qh[1], kv.y, acc[h]);
          acc[h] = fmaf(qh[2], kv.z, acc[h]);
          acc[h] = fmaf(qh[3], kv.w, acc[h]);
        }
      }
    }
    float s = 0.0f;
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h) {
      if (h < nH) s = fmaf(ws[h], fmaxf(acc[h] * scale, 0.0f), s);
    }
    reinterpret_cast<uint32_t*>(sc)[j] = order_key(s);
  }
  // Radix select of the top_k-th largest key, 8 bits at a time from the top.
  const uint32_t* key = reinterpret_cast<const uint32_t*>(sc);
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_need = static_cast<int>(top_k);
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kBlock)
      hist[i] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    const uint32_t hi_mask = shift == 24 ? 0u : ~((1u << (shift + 8)) - 1u);
    for (int64_t j = threadIdx.x; j < n; j += kBlock) {
      const uint32_t u = key[j];
      if ((u & hi_mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xff], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int need = s_need;
      int digit = 255;
      for (; digit > 0; --digit) {
        if (hist[digit] >= need) break;
        need -= hist[digit];
      }
      s_need = need;  // how many keys equal to the final prefix are still to take
      s_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
    }
    __syncthreads();
  }
  const uint32_t thr = s_prefix;
  const int need = s_need;
  // Bits: every key above thr, and the first `need` keys equal to it, in key order.
  int carry = 0;
  for (int64_t base = 0; base < words; base += kBlock) {
    const int64_t wd = base + threadIdx.x;
    uint32_t gt = 0, eq = 0;
    if (wd < words) {
      for (int bb = 0; bb < 32; ++bb) {
        const int b = (bb + threadIdx.x) & 31;  // staggered: neighbours read other banks
        const int64_t j = wd * 32 + b;
        if (j >= n) continue;
        gt |= static_cast<uint32_t>(key[j] > thr) << b;
        eq |= static_cast<uint32_t>(key[j] == thr) << b;
      }
    }
    int before = 0, total = 0;
    Scan(scan_tmp).ExclusiveSum(__popc(eq), before, total);
    __syncthreads();  // scan_tmp is reused next tile
    if (wd < words) {
      int rank = carry + before;
      uint32_t take = 0;
      for (int b = 0; b < 32 && rank < need; ++b) {
        if (eq >> b & 1u) {
          take |= 1u << b;
          ++rank;
        }
      }
      row[wd] = gt | take;
    }
    carry += total;
  }
}

}  // namespace

void index_topk(const float* q, const float* k, const float* w, int64_t T, int64_t n_heads,
                int64_t d, float scale, float w_scale, int64_t top_k,
                const int64_t* seq_start_of_token, uint32_t* keep, int64_t words, void* s) {
  if (T == 0) return;
  STRATA_CHECK(n_heads >= 1 && n_heads <= kMaxHeads && d % 4 == 0,
               "GPU lightning indexer: index_n_heads ", n_heads, " (at most ", kMaxHeads,
               ") and index_head_dim ", d,
               " (a multiple of 4) are not supported; use --device cpu");
  STRATA_ASSERT(top_k >= 1 && T < (1ll << 31));
  const size_t bytes = static_cast<size_t>(n_heads * d + n_heads + 32 * words) * sizeof(float);
  int device = 0, limit = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  STRATA_CHECK(bytes + 8192 <= static_cast<size_t>(limit), "GPU lightning indexer: sequences of ",
               32 * words, " tokens need ", bytes, " bytes of shared memory per block, over the ",
               "device's ", limit, "; use shorter calibration sequences or --device cpu");
  cudaFuncSetAttribute(k_index_topk, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(bytes));
  k_index_topk<<<static_cast<unsigned>(T), kBlock, bytes, st(s)>>>(
      q, k, w, n_heads, d, scale, w_scale, top_k, seq_start_of_token, keep, words);
  launched("index_topk");
}

}  // namespace strata::ops::cuda
