// Causal attention on the device (host launchers: ops/cuda/attention.h): the warp-per-query
// kernel, the causal softmax between the batched attention GEMMs (ops/cuda/gemm.h), and the
// assembly of MLA's per-head keys and values.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::bf16r;
using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

// One warp per (token, head); lanes split the head dimension. Online softmax in fp32.
constexpr int kMaxDvPerLane = 8;  // dv <= 256
__global__ void k_attention(const float* q, int64_t qs, const float* k, int64_t ks, const float* v,
                            int64_t vs, int64_t T, int64_t nH, int64_t nKV, int64_t dq, int64_t dv,
                            float scale, const int64_t* start, float* out, int64_t window,
                            const float* sinks, const uint32_t* keep, int64_t keep_words) {
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= T * nH) return;
  const int64_t t = warp / nH, h = warp % nH, kvh = h / (nH / nKV);
  const float* qi = q + t * qs + h * dq;
  // A sink is one more logit with no value: it starts the running max and sum (exp(0) = 1).
  float m = sinks ? sinks[h] : -INFINITY, l = sinks ? 1.0f : 0.0f;
  float acc[kMaxDvPerLane];
  for (int i = 0; i < kMaxDvPerLane; ++i)
    acc[i] = 0.0f;
  const int64_t first = window > 0 && t - window + 1 > start[t] ? t - window + 1 : start[t];
  const uint32_t* kept = keep ? keep + t * keep_words : nullptr;
  for (int64_t j = first; j <= t; ++j) {
    if (kept) {
      const int64_t p = j - start[t];
      if (!(kept[p >> 5] >> (p & 31) & 1u)) continue;
    }
    const float* kj = k + j * ks + kvh * dq;
    float s = 0.0f;
    for (int64_t d = lane; d < dq; d += 32)
      s += qi[d] * kj[d];
    for (int o = 16; o > 0; o >>= 1)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= scale;
    const float m2 = fmaxf(m, s);
    const float corr = expf(m - m2), p = expf(s - m2);
    l = l * corr + p;
    const float* vj = v + j * vs + kvh * dv;
    for (int i = 0; i < kMaxDvPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dv) acc[i] = acc[i] * corr + p * vj[d];
    }
    m = m2;
  }
  float* oi = out + (t * nH + h) * dv;
  for (int i = 0; i < kMaxDvPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < dv) oi[d] = acc[i] / l;
  }
}

// k_attention as the backend's bf16_ops rounds (ops::Bf16Attention; kFlash or kEager): the
// softmax's max first (and, for kEager, its sum), then the weighted values, so that every
// exponential is rounded against the row's final max as the CPU does.
__global__ void k_attention_bf16(const float* q, int64_t qs, const float* k, int64_t ks,
                                 const float* v, int64_t vs, int64_t T, int64_t nH, int64_t nKV,
                                 int64_t dq, int64_t dv, float scale, const int64_t* start,
                                 float* out, int64_t window, const float* sinks,
                                 const uint32_t* keep, int64_t keep_words, bool eager) {
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= T * nH) return;
  const int64_t t = warp / nH, h = warp % nH, kvh = h / (nH / nKV);
  const float* qi = q + t * qs + h * dq;
  const int64_t first = window > 0 && t - window + 1 > start[t] ? t - window + 1 : start[t];
  const uint32_t* kept = keep ? keep + t * keep_words : nullptr;
  auto skip = [&](int64_t j) {
    const int64_t p = j - start[t];
    return kept && !(kept[p >> 5] >> (p & 31) & 1u);
  };
  // The score of key j: fp32 (kFlash), or q·k and its product with scale in bf16 (kEager).
  auto score = [&](int64_t j) {
    const float* kj = k + j * ks + kvh * dq;
    float s = 0.0f;
    for (int64_t d = lane; d < dq; d += 32)
      s += qi[d] * kj[d];
    for (int o = 16; o > 0; o >>= 1)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    return eager ? bf16r(__fmul_rn(bf16r(s), scale)) : __fmul_rn(s, scale);
  };
  float m = sinks ? sinks[h] : -INFINITY;
  for (int64_t j = first; j <= t; ++j) {
    if (!skip(j)) m = fmaxf(m, score(j));
  }
  // As ops::attention_causal (ops.cpp softmax_row), the sum in fp64. kFlash: e_j = exp(s_j - m),
  // rounded before it weighs v_j; out / fp32(sum). kEager: e_j = exp(bf16(s_j - m));
  // p_j = bf16(e_j * fp32(1 / sum)), summed with v in fp32.
  double l = 0.0;
  if (eager) {
    for (int64_t j = first; j <= t; ++j) {
      if (!skip(j)) l += expf(bf16r(__fsub_rn(score(j), m)));
    }
    if (sinks) l += expf(bf16r(__fsub_rn(sinks[h], m)));
  }
  const float inv = eager ? static_cast<float>(1.0 / l) : 0.0f;
  float acc[kMaxDvPerLane];
  for (int i = 0; i < kMaxDvPerLane; ++i)
    acc[i] = 0.0f;
  for (int64_t j = first; j <= t; ++j) {
    if (skip(j)) continue;
    float p;
    if (eager) {
      p = bf16r(__fmul_rn(expf(bf16r(__fsub_rn(score(j), m))), inv));
    } else {
      const float e = expf(__fsub_rn(score(j), m));
      l += e;
      p = bf16r(e);
    }
    const float* vj = v + j * vs + kvh * dv;
    for (int i = 0; i < kMaxDvPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dv) acc[i] += p * vj[d];
    }
  }
  if (!eager && sinks) l += expf(__fsub_rn(sinks[h], m));
  float* oi = out + (t * nH + h) * dv;
  for (int i = 0; i < kMaxDvPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < dv) oi[d] = bf16r(eager ? acc[i] : __fdiv_rn(acc[i], static_cast<float>(l)));
  }
}

// One warp per row (i, j) of S [batch, L, L]: p_j = exp(scale*s_j - max) for first <= j <= i,
// / sum (first = 0, or i - window + 1 with a window; a sink joins the max and the sum).
__global__ void k_causal_softmax(float* s, int64_t rows, int64_t L, float scale, int64_t window,
                                 const float* sinks, int64_t nH, const uint32_t* const* keep_rows,
                                 int64_t keep_words, int rounding) {
  const int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t i = row % L;
  const int64_t first = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
  float* r = s + row * L;
  const float sink = sinks ? sinks[(row / L) % nH] : -INFINITY;
  const uint32_t* kept = keep_rows ? keep_rows[row / L] + i * keep_words : nullptr;
  auto in = [&](int64_t j) { return !kept || (kept[j >> 5] >> (j & 31) & 1u) != 0; };
  if (rounding == 2) {  // kEager: q·k and its product with the scale in bf16
    for (int64_t j = first + lane; j <= i; j += 32)
      r[j] = bf16r(__fmul_rn(bf16r(r[j]), scale));
    __syncwarp();
    scale = 1.0f;
  }
  float mx = sink;
  for (int64_t j = first + lane; j <= i; j += 32) {
    if (in(j)) mx = fmaxf(mx, r[j] * scale);
  }
  for (int o = 16; o > 0; o >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0.0;
  for (int64_t j = first + lane; j <= i; j += 32) {
    float p;
    if (rounding == 2) {
      p = in(j) ? expf(bf16r(__fsub_rn(r[j], mx))) : 0.0f;
    } else {
      p = in(j) ? expf(__fsub_rn(__fmul_rn(r[j], scale), mx)) : 0.0f;  // rounded as the CPU
    }
    r[j] = p;
    sum += p;
  }
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (sinks) sum += rounding == 2 ? expf(bf16r(__fsub_rn(sink, mx))) : expf(sink - mx);
  const float inv = static_cast<float>(1.0 / sum);
  __syncwarp();  // r[j] was written by lane (j - first) % 32, and is read below by lane j % 32
  // kFlash: exp(s - max) rounded before it weighs v, divided by the fp32 sum (here, before the
  // P·V GEMM instead of after it). kEager: each probability rounded.
  for (int64_t j = lane; j < L; j += 32) {
    const bool live = j >= first && j <= i;
    if (rounding == 1) {
      r[j] = live ? __fmul_rn(bf16r(r[j]), inv) : 0.0f;
    } else if (rounding == 2) {
      r[j] = live ? bf16r(__fmul_rn(r[j], inv)) : 0.0f;
    } else {
      r[j] = live ? r[j] * inv : 0.0f;
    }
  }
}

// k[t, h, :] = [kv[t, h, 0:dn] | kr[t, :]], v[t, h, :] = kv[t, h, dn:dn+dv].
__global__ void k_mla_kv(const float* kv, const float* kr, int64_t T, int64_t nH, int64_t dn,
                         int64_t dr, int64_t dv, float* k, float* v) {
  const int64_t dq = dn + dr, dkv = dn + dv;
  FOR_N(i, T * nH * dq) {
    const int64_t th = i / dq, c = i % dq, t = th / nH;
    k[i] = c < dn ? kv[th * dkv + c] : kr[t * dr + (c - dn)];
  }
  FOR_N(i, T * nH * dv) {
    const int64_t th = i / dv, c = i % dv;
    v[i] = kv[th * dkv + dn + c];
  }
}

}  // namespace

void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t T, int64_t n_heads, int64_t n_kv, int64_t dq, int64_t dv,
               float scale, const int64_t* seq_start_of_token, float* out, void* s, int64_t window,
               const float* sinks, const uint32_t* keep, int64_t keep_words,
               AttentionRounding rounding) {
  if (T == 0) return;
  STRATA_CHECK(dv <= 32 * kMaxDvPerLane, "GPU attention: value head dim ", dv,
               " exceeds 256; use --device cpu");
  const int64_t threads = T * n_heads * 32;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  STRATA_ASSERT(blocks < (1ll << 31));
  if (rounding != AttentionRounding::kNone) {
    k_attention_bf16<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(
        q, q_stride, k, k_stride, v, v_stride, T, n_heads, n_kv, dq, dv, scale, seq_start_of_token,
        out, window, sinks, keep, keep_words, rounding == AttentionRounding::kEager);
    launched("attention");
    return;
  }
  k_attention<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(
      q, q_stride, k, k_stride, v, v_stride, T, n_heads, n_kv, dq, dv, scale, seq_start_of_token,
      out, window, sinks, keep, keep_words);
  launched("attention");
}

void mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn, int64_t dr,
            int64_t dv, float* k, float* v, void* s) {
  if (T == 0) return;
  k_mla_kv<<<blocks_for(T * n_heads * (dn + dr)), kThreads, 0, st(s)>>>(kv, kr, T, n_heads, dn, dr,
                                                                        dv, k, v);
  launched("mla_kv");
}

void causal_softmax(float* s, int64_t batch, int64_t L, float scale, void* st_, int64_t window,
                    const float* sinks, int64_t n_heads, const uint32_t* const* keep_rows,
                    int64_t keep_words, AttentionRounding rounding) {
  const int64_t rows = batch * L;
  if (rows == 0) return;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  STRATA_ASSERT(blocks < (1ll << 31));
  k_causal_softmax<<<static_cast<unsigned>(blocks), kThreads, 0, st(st_)>>>(
      s, rows, L, scale, window, sinks, n_heads, keep_rows, keep_words, static_cast<int>(rounding));
  launched("causal_softmax");
}

}  // namespace strata::ops::cuda
