// Rotary position embedding on the device (host launcher: ops/cuda/rope.h), one thread per
// (token, head, rotated pair).
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/rope.h"

namespace strata::ops::cuda {
namespace {

using launch::bf16r;
using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__global__ void k_rope(float* x, int64_t T, int64_t nH, int64_t stride, int64_t offset, int64_t rot,
                       const int64_t* pos, const float* inv_freq, double af, bool interleaved,
                       bool rounded) {
  const int64_t half = rot / 2;
  FOR_N(idx, T * nH * half) {
    const int64_t i = idx % half, th = idx / half, t = th / nH;
    const float angle = inv_freq[i] * static_cast<float>(pos[t]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)) * af);
    const float s = static_cast<float>(sin(static_cast<double>(angle)) * af);
    float* v = x + th * stride + offset;
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a], x1 = v[b];
    if (rounded) {  // cos and sin in bf16, each product and sum rounded (ops::rope's bf16)
      const float cb = bf16r(c), sb = bf16r(s);
      v[a] = bf16r(__fsub_rn(bf16r(__fmul_rn(x0, cb)), bf16r(__fmul_rn(x1, sb))));
      v[b] = bf16r(__fadd_rn(bf16r(__fmul_rn(x1, cb)), bf16r(__fmul_rn(x0, sb))));
      continue;
    }
    v[a] = x0 * c - x1 * s;
    v[b] = x1 * c + x0 * s;
  }
}

}  // namespace

void rope(float* x, int64_t T, int64_t n_heads, int64_t stride, int64_t offset, int64_t rot_dim,
          const int64_t* pos, const float* inv_freq, double attention_factor, bool interleaved,
          void* s, bool bf16) {
  const int64_t n = T * n_heads * (rot_dim / 2);
  if (n == 0) return;
  k_rope<<<blocks_for(n), kThreads, 0, st(s)>>>(x, T, n_heads, stride, offset, rot_dim, pos,
                                                inv_freq, attention_factor, interleaved, bf16);
  launched("rope");
}

}  // namespace strata::ops::cuda
