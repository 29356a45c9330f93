#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "model/cuda/kernels.h"
#include "model/cuda/launch.cuh"

namespace strata::gpu {
namespace {

using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__device__ __forceinline__ uint16_t f32_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ __forceinline__ float bf16_bits_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ float load_as_f32(const void* src, int dt, int64_t i) {
  switch (dt) {
    case 0:
      return static_cast<const float*>(src)[i];
    case 1:
      return __half2float(static_cast<const __half*>(src)[i]);
    default:
      return bf16_bits_f32(static_cast<const uint16_t*>(src)[i]);
  }
}

int dtype_code(DType d) {
  switch (d) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    default:
      fail("GPU forward: weights of dtype ", dtype_name(d),
           " are not supported (F32, F16, BF16); use --device cpu");
  }
}

__global__ void k_to_f32(const void* src, int dt, float* dst, int64_t n) {
  FOR_N(i, n) dst[i] = load_as_f32(src, dt, i);
}
__global__ void k_to_bf16(const void* src, int dt, uint16_t* dst, int64_t n) {
  FOR_N(i, n)
  dst[i] = dt == 2 ? static_cast<const uint16_t*>(src)[i] : f32_bf16_bits(load_as_f32(src, dt, i));
}
__global__ void k_cast_bf16(const float* x, uint16_t* y, int64_t n) {
  FOR_N(i, n) y[i] = f32_bf16_bits(x[i]);
}
__global__ void k_bf16_f32(const uint16_t* x, float* y, int64_t n) {
  FOR_N(i, n) y[i] = bf16_bits_f32(x[i]);
}
__global__ void k_round_bf16(float* x, int64_t n) {
  FOR_N(i, n) x[i] = bf16_bits_f32(f32_bf16_bits(x[i]));
}

// One block per row.
__global__ void k_rms_norm(const float* x, int64_t dim, const float* w, float eps, float* y) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    s += static_cast<double>(xr[i]) * xr[i];
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_down_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x < 32) {
    s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0;
    for (int o = 16; o > 0; o >>= 1)
      s += __shfl_down_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) part[0] = s;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(static_cast<float>(part[0] / static_cast<double>(dim)) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

// One warp per row (rows of up to a few thousand values: a block per row would leave most of
// its threads idle and spend more on scheduling than on the row). Same fp64 sum of squares.
__global__ void k_rms_norm_warp(const float* x, int64_t rows, int64_t dim, const float* w,
                                float eps, float* y) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double s = 0.0;
  for (int64_t i = lane; i < dim; i += 32)
    s += static_cast<double>(xr[i]) * xr[i];
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  const float inv = 1.0f / sqrtf(static_cast<float>(s / static_cast<double>(dim)) + eps);
  for (int64_t i = lane; i < dim; i += 32)
    yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

__global__ void k_add(float* x, const float* y, int64_t n) {
  FOR_N(i, n) x[i] += y[i];
}
__global__ void k_add_bias(float* y, int64_t rows, int64_t cols, const float* b) {
  FOR_N(i, rows * cols) y[i] += b[i % cols];
}
__global__ void k_swiglu(const float* g, const float* u, int64_t n, float* h) {
  FOR_N(i, n) {
    const float x = g[i];
    h[i] = x / (1.0f + expf(-x)) * u[i];
  }
}
__global__ void k_add_sigmoid_gated(float* y, const float* s, const float* g, int64_t T,
                                    int64_t H) {
  FOR_N(i, T * H) {
    const float w = 1.0f / (1.0f + expf(-g[i / H]));
    y[i] += w * s[i];
  }
}

__global__ void k_rope(float* x, int64_t T, int64_t nH, int64_t stride, int64_t offset, int64_t rot,
                       const int64_t* pos, const float* inv_freq, double af, bool interleaved) {
  const int64_t half = rot / 2;
  FOR_N(idx, T * nH * half) {
    const int64_t i = idx % half, th = idx / half, t = th / nH;
    const float angle = inv_freq[i] * static_cast<float>(pos[t]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)) * af);
    const float s = static_cast<float>(sin(static_cast<double>(angle)) * af);
    float* v = x + th * stride + offset;
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x1 * c + x0 * s;
  }
}

// One warp per (token, head); lanes split the head dimension. Online softmax in fp32.
constexpr int kMaxDvPerLane = 8;  // dv <= 256
__global__ void k_attention(const float* q, int64_t qs, const float* k, int64_t ks, const float* v,
                            int64_t vs, int64_t T, int64_t nH, int64_t nKV, int64_t dq, int64_t dv,
                            float scale, const int64_t* start, float* out) {
  const int64_t warp = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= T * nH) return;
  const int64_t t = warp / nH, h = warp % nH, kvh = h / (nH / nKV);
  const float* qi = q + t * qs + h * dq;
  float m = -INFINITY, l = 0.0f;
  float acc[kMaxDvPerLane];
  for (int i = 0; i < kMaxDvPerLane; ++i)
    acc[i] = 0.0f;
  for (int64_t j = start[t]; j <= t; ++j) {
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

// One warp per row (i, j) of S [batch, L, L]: p_j = exp(scale*s_j - max) for j <= i, / sum.
__global__ void k_causal_softmax(float* s, int64_t rows, int64_t L, float scale) {
  const int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t i = row % L;
  float* r = s + row * L;
  float mx = -INFINITY;
  for (int64_t j = lane; j <= i; j += 32)
    mx = fmaxf(mx, r[j] * scale);
  for (int o = 16; o > 0; o >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  double sum = 0.0;
  for (int64_t j = lane; j <= i; j += 32) {
    const float p = expf(r[j] * scale - mx);
    r[j] = p;
    sum += p;
  }
  for (int o = 16; o > 0; o >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = lane; j < L; j += 32)
    r[j] = j <= i ? r[j] * inv : 0.0f;
}

__global__ void k_amax(const float* x, int64_t n, uint32_t* slot) {
  uint32_t m = 0;
  FOR_N(i, n) m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(slot, m);
}

// One warp per row.
__global__ void k_amax_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot,
                            int64_t per_row, uint32_t* slots) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (r >= rows) return;
  uint32_t m = 0;
  for (int64_t c = threadIdx.x & 31; c < cols; c += 32)
    m = max(m, __float_as_uint(x[r * cols + c]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) != 0 || m == 0) return;
  for (int64_t j = 0; j < per_row; ++j)
    atomicMax(&slots[row_slot[r * per_row + j]], m);
}

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

// e4m3fn byte -> fp32 exactly: S.EEEE.MMM, bias 7, subnormals below E = 0, S.1111.111 NaN.
__device__ __forceinline__ float e4m3_f32(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  float v;
  if (e == 0xFu && m == 7u) {
    v = __uint_as_float(0x7FC00000u);
  } else if (e == 0) {
    v = static_cast<float>(m) * 0x1p-9f;  // subnormal: m/8 · 2^-6
  } else {
    v = __uint_as_float(((e + 120u) << 23) | (m << 20));  // 2^(e-7) · (1 + m/8)
  }
  return (b & 0x80u) ? -v : v;
}

// DeepSeek FP8 blocks (io/source_weights.h decompress_fp8_block): w[r, c] = bf16(e4m3(w8[r, c]) *
// scale_inv[r / block, c / block]), one fp32 product rounded to bf16; stored as bf16 bits or as
// the fp32 value of that bf16.
__global__ void k_dequant_fp8_block(const uint8_t* w, int64_t out, int64_t in, int64_t block,
                                    const void* scale, int scale_dt, void* dst, bool to_bf16) {
  const int64_t blocks_per_row = (in + block - 1) / block;
  FOR_N(i, out * in) {
    const int64_t r = i / in, c = i % in;
    const float sc = load_as_f32(scale, scale_dt, (r / block) * blocks_per_row + c / block);
    const uint16_t b = f32_bf16_bits(__fmul_rn(e4m3_f32(w[i]), sc));
    if (to_bf16) {
      static_cast<uint16_t*>(dst)[i] = b;
    } else {
      static_cast<float*>(dst)[i] = bf16_bits_f32(b);
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

__global__ void k_copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                            int64_t rows, int64_t cols) {
  FOR_N(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
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

void convert_to_f32(const void* src, DType dtype, float* dst, int64_t n, void* s) {
  if (n == 0) return;
  k_to_f32<<<blocks_for(n), kThreads, 0, st(s)>>>(src, dtype_code(dtype), dst, n);
  launched("convert_to_f32");
}
void convert_to_bf16(const void* src, DType dtype, uint16_t* dst, int64_t n, void* s) {
  if (n == 0) return;
  k_to_bf16<<<blocks_for(n), kThreads, 0, st(s)>>>(src, dtype_code(dtype), dst, n);
  launched("convert_to_bf16");
}
void dequant_fp8_block(const uint8_t* w, int64_t out, int64_t in, int64_t block, const void* scale,
                       DType scale_dtype, void* dst, bool to_bf16, void* s) {
  if (out * in == 0) return;
  k_dequant_fp8_block<<<blocks_for(out * in), kThreads, 0, st(s)>>>(
      w, out, in, block, scale, dtype_code(scale_dtype), dst, to_bf16);
  launched("dequant_fp8_block");
}
void cast_bf16(const float* x, uint16_t* y, int64_t n, void* s) {
  if (n == 0) return;
  k_cast_bf16<<<blocks_for(n), kThreads, 0, st(s)>>>(x, y, n);
  launched("cast_bf16");
}
void bf16_to_f32(const uint16_t* x, float* y, int64_t n, void* s) {
  if (n == 0) return;
  k_bf16_f32<<<blocks_for(n), kThreads, 0, st(s)>>>(x, y, n);
  launched("bf16_to_f32");
}
void round_bf16(float* x, int64_t n, void* s) {
  if (n == 0) return;
  k_round_bf16<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n);
  launched("round_bf16");
}
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              void* s) {
  if (rows == 0) return;
  STRATA_ASSERT(rows < (1ll << 31));
  if (dim <= 8192) {
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
    k_rms_norm_warp<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(x, rows, dim, w, eps, y);
  } else {
    k_rms_norm<<<static_cast<unsigned>(rows), 256, 0, st(s)>>>(x, dim, w, eps, y);
  }
  launched("rms_norm");
}
void add(float* x, const float* y, int64_t n, void* s) {
  if (n == 0) return;
  k_add<<<blocks_for(n), kThreads, 0, st(s)>>>(x, y, n);
  launched("add");
}
void add_bias(float* y, int64_t rows, int64_t cols, const float* b, void* s) {
  if (rows * cols == 0) return;
  k_add_bias<<<blocks_for(rows * cols), kThreads, 0, st(s)>>>(y, rows, cols, b);
  launched("add_bias");
}
void swiglu(const float* g, const float* u, int64_t n, float* h, void* s) {
  if (n == 0) return;
  k_swiglu<<<blocks_for(n), kThreads, 0, st(s)>>>(g, u, n, h);
  launched("swiglu");
}
void add_sigmoid_gated(float* y, const float* sv, const float* g, int64_t T, int64_t H, void* s) {
  if (T * H == 0) return;
  k_add_sigmoid_gated<<<blocks_for(T * H), kThreads, 0, st(s)>>>(y, sv, g, T, H);
  launched("add_sigmoid_gated");
}
void rope(float* x, int64_t T, int64_t n_heads, int64_t stride, int64_t offset, int64_t rot_dim,
          const int64_t* pos, const float* inv_freq, double attention_factor, bool interleaved,
          void* s) {
  const int64_t n = T * n_heads * (rot_dim / 2);
  if (n == 0) return;
  k_rope<<<blocks_for(n), kThreads, 0, st(s)>>>(x, T, n_heads, stride, offset, rot_dim, pos,
                                                inv_freq, attention_factor, interleaved);
  launched("rope");
}
void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t T, int64_t n_heads, int64_t n_kv, int64_t dq, int64_t dv,
               float scale, const int64_t* seq_start_of_token, float* out, void* s) {
  if (T == 0) return;
  STRATA_CHECK(dv <= 32 * kMaxDvPerLane, "GPU attention: value head dim ", dv,
               " exceeds 256; use --device cpu");
  const int64_t threads = T * n_heads * 32;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  STRATA_ASSERT(blocks < (1ll << 31));
  k_attention<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(
      q, q_stride, k, k_stride, v, v_stride, T, n_heads, n_kv, dq, dv, scale, seq_start_of_token,
      out);
  launched("attention");
}
void amax(const float* x, int64_t n, uint32_t* slot, void* s) {
  if (n == 0) return;
  k_amax<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n, slot);
  launched("amax");
}
void amax_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot, uint32_t* slots,
               void* s, int64_t per_row) {
  if (rows == 0) return;
  STRATA_ASSERT(rows < (1ll << 31));
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  k_amax_rows<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(x, rows, cols, row_slot,
                                                                     per_row, slots);
  launched("amax_rows");
}
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
void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols, void* s) {
  if (rows * cols == 0) return;
  k_copy_cols<<<blocks_for(rows * cols), kThreads, 0, st(s)>>>(src, src_stride, dst, dst_stride,
                                                               rows, cols);
  launched("copy_cols");
}
void mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn, int64_t dr,
            int64_t dv, float* k, float* v, void* s) {
  if (T == 0) return;
  k_mla_kv<<<blocks_for(T * n_heads * (dn + dr)), kThreads, 0, st(s)>>>(kv, kr, T, n_heads, dn, dr,
                                                                        dv, k, v);
  launched("mla_kv");
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
                 int64_t H, float* y, void* s) {
  if (T * H == 0) return;
  k_combine<<<blocks_for(T * H), kThreads, 0, st(s)>>>(outg, pos, weight, T, K, H, y);
  launched("moe_combine");
}

void causal_softmax(float* s, int64_t batch, int64_t L, float scale, void* st_) {
  const int64_t rows = batch * L;
  if (rows == 0) return;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  STRATA_ASSERT(blocks < (1ll << 31));
  k_causal_softmax<<<static_cast<unsigned>(blocks), kThreads, 0, st(st_)>>>(s, rows, L, scale);
  launched("causal_softmax");
}

void gemm_batched_qk(void* handle, const float* const* q, int64_t q_stride, const float* const* k,
                     int64_t k_stride, float* const* s, int64_t L, int64_t dq, int64_t batch,
                     bool tf32) {
  if (batch == 0 || L == 0) return;
  // Row-major S[L, L] = Q[L, dq] K[L, dq]^T: column-major S^T = K^T' ... as gemm(): A = K (op T,
  // lda k_stride), B = Q (op N, ldb q_stride), C = S (ldc L).
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t r = cublasGemmBatchedEx(
      static_cast<cublasHandle_t>(handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(L),
      static_cast<int>(L), static_cast<int>(dq), &alpha, reinterpret_cast<const void* const*>(k),
      CUDA_R_32F, static_cast<int>(k_stride), reinterpret_cast<const void* const*>(q), CUDA_R_32F,
      static_cast<int>(q_stride), &beta, reinterpret_cast<void* const*>(s), CUDA_R_32F,
      static_cast<int>(L), static_cast<int>(batch),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
  STRATA_CHECK(r == CUBLAS_STATUS_SUCCESS, "cuBLAS: attention scores (", batch, " x [", L, ", ", dq,
               "]) failed (status ", static_cast<int>(r), ")");
}

void gemm_batched_pv(void* handle, const float* const* p, const float* const* v, int64_t v_stride,
                     float* const* o, int64_t o_stride, int64_t L, int64_t dv, int64_t batch,
                     bool tf32) {
  if (batch == 0 || L == 0) return;
  // Row-major O[L, dv] = P[L, L] V[L, dv]: column-major O^T = V^T P^T: A = V (op N, lda
  // v_stride), B = P (op N, ldb L), C = O (ldc o_stride).
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t r = cublasGemmBatchedEx(
      static_cast<cublasHandle_t>(handle), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(dv),
      static_cast<int>(L), static_cast<int>(L), &alpha, reinterpret_cast<const void* const*>(v),
      CUDA_R_32F, static_cast<int>(v_stride), reinterpret_cast<const void* const*>(p), CUDA_R_32F,
      static_cast<int>(L), &beta, reinterpret_cast<void* const*>(o), CUDA_R_32F,
      static_cast<int>(o_stride), static_cast<int>(batch),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
  STRATA_CHECK(r == CUBLAS_STATUS_SUCCESS, "cuBLAS: attention output (", batch, " x [", L, ", ", dv,
               "]) failed (status ", static_cast<int>(r), ")");
}

void* gemm_handle_create(void* stream) {
  cublasHandle_t h;
  STRATA_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cuBLAS: cannot create a handle");
  cublasSetStream(h, st(stream));
  return h;
}
void gemm_handle_destroy(void* handle) {
  if (handle) cublasDestroy(static_cast<cublasHandle_t>(handle));
}
void gemm(void* handle, const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K,
          bool bf16) {
  if (M == 0 || N == 0) return;
  // Row-major y[M, N] = x[M, K] w[N, K]^T is column-major y^T[N, M] = w^T... : with w read as
  // column-major [K, N] (ld K) transposed, and x as column-major [K, M] (ld K).
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t c = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
  const cublasStatus_t r = cublasGemmEx(
      static_cast<cublasHandle_t>(handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
      static_cast<int>(M), static_cast<int>(K), &alpha, w, t, static_cast<int>(K), x, t,
      static_cast<int>(K), &beta, y, CUDA_R_32F, static_cast<int>(N), c, CUBLAS_GEMM_DEFAULT);
  STRATA_CHECK(r == CUBLAS_STATUS_SUCCESS, "cuBLAS: gemm [", M, ", ", K, "] x [", N, ", ", K,
               "]^T failed (status ", static_cast<int>(r), ")");
}

}  // namespace strata::gpu
