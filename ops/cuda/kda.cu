// Kimi Delta Attention's kernels (host launchers and precision notes: ops/cuda/kda.h): the
// causal convolution with SiLU and the forget gate, one thread per element; the gated delta rule,
// one block per (sequence, head), whose tokens run in order.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/kda.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::bf16r;
using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__device__ __forceinline__ float silu(float z) {
  return z / (1.0f + expf(-z));
}

__global__ void k_conv_silu(const float* x, int64_t T, int64_t C, const float* w, int64_t K,
                            const int64_t* seq_start, float* y, bool rounded) {
  FOR_N(i, T * C) {
    const int64_t t = i / C, c = i % C, first = seq_start[t];
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t s = t - (K - 1) + j;
      if (s >= first) acc += w[c * K + j] * x[s * C + c];
    }
    y[i] = rounded ? bf16r(silu(bf16r(acc))) : silu(acc);
  }
}

__global__ void k_forget_gate(float* g, int64_t T, int64_t nH, int64_t d, const float* a_log,
                              const float* dt_bias) {
  FOR_N(i, T * nH * d) {
    const int64_t hd = i % (nH * d), h = hd / d;
    const float rate = expf(a_log[h]);
    const float zb = g[i] + dt_bias[hd];
    const float softplus = zb > 20.0f ? zb : logf(1.0f + expf(zb));
    g[i] = -rate * softplus;
  }
}

// Block (sequence, head); thread j < dv owns column j of the state, kMaxDk >= dk registers
// (the loops are unrolled over kMaxDk so that S stays in registers). The token's k, q and
// exp(g) are staged in shared memory for all columns.
// At most 256 threads (dv <= 256), so that the 255 registers a thread may take always fit.
template <int kMaxDk>
__global__ void __launch_bounds__(256)
    k_gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                       const float* beta, const int64_t* bounds, int64_t nH, int dk, int dv,
                       bool head_decay, float* out) {
  const int64_t seq = blockIdx.x, h = blockIdx.y;
  const int j = threadIdx.x;
  __shared__ float ks[kMaxDk], qs[kMaxDk], decay[kMaxDk];
  float S[kMaxDk];
#pragma unroll
  for (int i = 0; i < kMaxDk; ++i)
    S[i] = 0.0f;
  const int64_t first = bounds[seq], end = bounds[seq + 1];
  for (int64_t t = first; t < end; ++t) {
    const int64_t kq = (t * nH + h) * dk, vo = (t * nH + h) * dv;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      ks[i] = k[kq + i];
      qs[i] = q[kq + i];
      decay[i] = expf(head_decay ? g[t * nH + h] : g[kq + i]);
    }
    __syncthreads();
    if (j < dv) {
      // S *= exp(g); s = S^T k (the CPU's decay, then its dot product in the same order of i).
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDk; ++i) {
        if (i < dk) {
          S[i] *= decay[i];
          s += S[i] * ks[i];
        }
      }
      const float u = beta[t * nH + h] * (v[vo + j] - s);
      // S += k u^T; o = S^T q.
      float o = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxDk; ++i) {
        if (i < dk) {
          S[i] += ks[i] * u;
          o += S[i] * qs[i];
        }
      }
      out[vo + j] = o;
    }
    __syncthreads();  // ks, qs, decay are overwritten by the next token
  }
}

}  // namespace

void kda_conv_silu(const float* x, int64_t T, int64_t C, const float* w, int64_t K,
                   const int64_t* seq_start, float* y, void* s, bool bf16) {
  if (T * C == 0) return;
  k_conv_silu<<<blocks_for(T * C), kThreads, 0, st(s)>>>(x, T, C, w, K, seq_start, y, bf16);
  launched("kda_conv_silu");
}

void kda_forget_gate(float* g, int64_t T, int64_t n_heads, int64_t d, const float* a_log,
                     const float* dt_bias, void* s) {
  if (T * n_heads * d == 0) return;
  k_forget_gate<<<blocks_for(T * n_heads * d), kThreads, 0, st(s)>>>(g, T, n_heads, d, a_log,
                                                                     dt_bias);
  launched("kda_forget_gate");
}

void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const int64_t* seq_bounds, int64_t n_seqs, int64_t n_heads,
                      int64_t dk, int64_t dv, float* out, void* s, bool head_decay) {
  if (n_seqs <= 0 || n_heads == 0) return;
  STRATA_ASSERT(dk >= 1 && dk <= 256 && dv >= 1 && dv <= 256, "gated_delta_rule: dk ", dk, ", dv ",
                dv, " (at most 256)");
  STRATA_ASSERT(n_seqs < (1ll << 31) && n_heads <= 65535);
  const dim3 grid(static_cast<unsigned>(n_seqs), static_cast<unsigned>(n_heads));
  const int threads = static_cast<int>((dv + 31) / 32 * 32);
  const int dki = static_cast<int>(dk), dvi = static_cast<int>(dv);
  if (dk <= 32) {
    k_gated_delta_rule<32><<<grid, threads, 0, st(s)>>>(q, k, v, g, beta, seq_bounds, n_heads, dki,
                                                        dvi, head_decay, out);
  } else if (dk <= 64) {
    k_gated_delta_rule<64><<<grid, threads, 0, st(s)>>>(q, k, v, g, beta, seq_bounds, n_heads, dki,
                                                        dvi, head_decay, out);
  } else if (dk <= 128) {
    k_gated_delta_rule<128><<<grid, threads, 0, st(s)>>>(q, k, v, g, beta, seq_bounds, n_heads, dki,
                                                         dvi, head_decay, out);
  } else {
    k_gated_delta_rule<256><<<grid, threads, 0, st(s)>>>(q, k, v, g, beta, seq_bounds, n_heads, dki,
                                                         dvi, head_decay, out);
  }
  launched("gated_delta_rule");
}

}  // namespace strata::ops::cuda
