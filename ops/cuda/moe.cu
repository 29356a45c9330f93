// Routed-expert dispatch on the device (host launchers: ops/cuda/moe.h): slots grouped by
// expert, rows gathered into expert order, expert outputs combined in slot order.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/moe.h"

namespace strata::ops::cuda {
namespace {

using launch::bf16r;
using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__global__ void k_scatter(const int32_t* chosen, int64_t S, const int32_t* offsets, int32_t* cursor,
                          int32_t* pos, int32_t* row_expert) {
  FOR_N(s, S) {
    const int32_t e = chosen[s];
    const int32_t p = offsets[e] + atomicAdd(&cursor[e], 1);
    pos[s] = p;
    row_expert[p] = e;
  }
}

template <typename V>
__global__ void k_gather(const V* n, int64_t T, int64_t H, int64_t K, const int32_t* pos, V* xg) {
  FOR_N(i, T * K * H) {
    const int64_t s = i / H, c = i % H;
    xg[static_cast<int64_t>(pos[s]) * H + c] = n[(s / K) * H + c];
  }
}

__global__ void k_combine(const float* outg, const int32_t* pos, const float* weight, int64_t T,
                          int64_t K, int64_t H, float* y) {
  FOR_N(i, T * H) {
    const int64_t t = i / H, c = i % H;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      acc += weight[t * K + j] * outg[static_cast<int64_t>(pos[t * K + j]) * H + c];
    y[i] = acc;
  }
}

// The backend's bf16_ops: the token's slots in increasing expert order (pos grows with the
// expert: offsets[e] + arrival), each output times its weight rounded to bf16 and added to the
// bf16 sum (CpuBackend::moe).
__global__ void k_combine_bf16(const float* outg, const int32_t* pos, const float* weight,
                               int64_t T, int64_t K, int64_t H, float* y) {
  FOR_N(i, T * H) {
    const int64_t t = i / H, c = i % H;
    const int32_t* pt = pos + t * K;
    float acc = 0.0f;
    int32_t last = -1;
    for (int64_t n = 0; n < K; ++n) {
      int64_t jmin = -1;
      for (int64_t j = 0; j < K; ++j) {
        if (pt[j] > last && (jmin < 0 || pt[j] < pt[jmin])) jmin = j;
      }
      last = pt[jmin];
      const float term =
          bf16r(__fmul_rn(weight[t * K + jmin], outg[static_cast<int64_t>(last) * H + c]));
      acc = bf16r(__fadd_rn(acc, term));
    }
    y[i] = acc;
  }
}

__global__ void k_moe_add_bias(float* y, int64_t S, int64_t width, const int32_t* row_expert,
                               const float* const* bias) {
  FOR_N(i, S * width) {
    const float* b = bias[row_expert[i / width]];
    if (b) y[i] += b[i % width];
  }
}

// One warp per slot: the token's max |x| (bits, NaN winning as in k_amax_rows), written with the
// slot's expert at the slot's row.
__global__ void k_dispatch_meta(const float* n, int64_t S, int64_t H, int64_t K,
                                const int32_t* chosen, const int32_t* pos, int32_t* meta) {
  const int64_t s = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (s >= S) return;
  const float* x = n + (s / K) * H;
  uint32_t m = 0;
  for (int64_t c = threadIdx.x & 31; c < H; c += 32)
    m = max(m, __float_as_uint(x[c]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) != 0) return;
  const int64_t r = pos[s];
  meta[2 * r] = chosen[s];
  meta[2 * r + 1] = static_cast<int32_t>(m);
}

__global__ void k_receive_meta(const int32_t* meta, int64_t rows, int32_t* row_expert,
                               uint32_t* slots) {
  FOR_N(r, rows) {
    const int32_t e = meta[2 * r];
    row_expert[r] = e;
    const uint32_t m = static_cast<uint32_t>(meta[2 * r + 1]);
    if (m != 0) atomicMax(&slots[e], m);
  }
}

}  // namespace

void moe_dispatch_meta(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                       const int32_t* pos, int32_t* meta, void* s) {
  const int64_t S = T * K;
  if (S == 0) return;
  const int64_t blocks = (S * 32 + kThreads - 1) / kThreads;
  k_dispatch_meta<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(n, S, H, K, chosen, pos,
                                                                         meta);
  launched("moe_dispatch_meta");
}
void moe_receive_meta(const int32_t* meta, int64_t rows, int32_t* row_expert, uint32_t* slots,
                      void* s) {
  if (rows == 0) return;
  k_receive_meta<<<blocks_for(rows), kThreads, 0, st(s)>>>(meta, rows, row_expert, slots);
  launched("moe_receive_meta");
}
void moe_add_bias(float* y, int64_t S, int64_t width, const int32_t* row_expert,
                  const float* const* bias, void* s) {
  if (S * width == 0) return;
  k_moe_add_bias<<<blocks_for(S * width), kThreads, 0, st(s)>>>(y, S, width, row_expert, bias);
  launched("moe_add_bias");
}
void moe_scatter(const int32_t* chosen, int64_t slots, const int32_t* offsets, int32_t* cursor,
                 int32_t* pos, int32_t* row_expert, void* s) {
  if (slots == 0) return;
  k_scatter<<<blocks_for(slots), kThreads, 0, st(s)>>>(chosen, slots, offsets, cursor, pos,
                                                       row_expert);
  launched("moe_scatter");
}
void moe_gather(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* pos, float* xg,
                void* s) {
  if (T * K * H == 0) return;
  k_gather<<<blocks_for(T * K * H), kThreads, 0, st(s)>>>(n, T, H, K, pos, xg);
  launched("moe_gather");
}
void moe_gather(const uint16_t* n, int64_t T, int64_t H, int64_t K, const int32_t* pos,
                uint16_t* xg, void* s) {
  if (T * K * H == 0) return;
  k_gather<<<blocks_for(T * K * H), kThreads, 0, st(s)>>>(n, T, H, K, pos, xg);
  launched("moe_gather");
}
void moe_combine(const float* outg, const int32_t* pos, const float* weight, int64_t T, int64_t K,
                 int64_t H, float* y, void* s, bool bf16) {
  if (T * H == 0) return;
  if (bf16) {
    k_combine_bf16<<<blocks_for(T * H), kThreads, 0, st(s)>>>(outg, pos, weight, T, K, H, y);
    launched("moe_combine");
    return;
  }
  k_combine<<<blocks_for(T * H), kThreads, 0, st(s)>>>(outg, pos, weight, T, K, H, y);
  launched("moe_combine");
}

}  // namespace strata::ops::cuda
