// CUDA kernels and host launchers of ops/cuda/ops_cuda.h (docs/CUDA.md). Plain kernels, one
// thread per element, row, token or (token, head) as noted at each; cuBLASLt for the GEMMs.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "ops/cuda/ops_cuda.h"

namespace strata::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr size_t kGemmWorkspace = size_t{32} << 20;  // cuBLASLt workspace (Hopper: 32 MiB)

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(e));
}

void check_launch(const char* what) {
  check(cudaGetLastError(), what);
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt error ", static_cast<int>(s), " in ", what);
}

cudaStream_t native(Stream& s) {
  return static_cast<cudaStream_t>(s.native());
}

unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(b, 1), 65535 * 64));
}

// ---- device helpers ---------------------------------------------------------------------------

__device__ __forceinline__ uint16_t bf16_bits_rne(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;  // canonical quiet NaN, as core/dtype
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf16_value(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// |x| as ordered bits: for non-negative floats (and NaN above +inf) the integer order is the
// float order, so atomicMax on the bits is an exact max that lets NaN win.
__device__ __forceinline__ unsigned abs_bits(float x) {
  return __float_as_uint(x) & 0x7FFFFFFFu;
}

__device__ __forceinline__ unsigned warp_max(unsigned v) {
  for (int o = 16; o > 0; o /= 2)
    v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// Block-wide max of v (blockDim.x a multiple of 32, <= 1024); the result is valid in thread 0.
__device__ unsigned block_max(unsigned v) {
  __shared__ unsigned part[32];
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = 0;
  if (warp == 0) {
    if (lane < static_cast<int>(blockDim.x / 32)) v = part[lane];
    v = warp_max(v);
  }
  __syncthreads();
  return v;
}

// Block-wide sum in fp64 (result valid in every thread).
__device__ double block_sum_f64(double v) {
  __shared__ double part[32];
  __shared__ double total;
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w)
      s += part[w];
    total = s;
  }
  __syncthreads();
  const double r = total;
  __syncthreads();
  return r;
}

// Block-wide max of floats (result valid in every thread; NaN is ignored like fmaxf).
__device__ float block_max_f32(float v) {
  __shared__ float part[32];
  __shared__ float total;
  for (int o = 16; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w)
      m = fmaxf(m, part[w]);
    total = m;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();
  return r;
}

// ---- element-wise kernels ---------------------------------------------------------------------

__global__ void f32_to_bf16_kernel(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = bf16_bits_rne(x[i]);
}

__global__ void bf16_to_f32_kernel(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = bf16_value(x[i]);
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = bf16_value(bf16_bits_rne(x[i]));
}

__global__ void add_bias_kernel(float* y, int64_t m, int64_t n, const float* bias) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __fadd_rn(y[i], bias[i % n]);
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* h) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float z = gate[i];
    const float silu = __fdiv_rn(z, __fadd_rn(1.0f, expf(-z)));
    h[i] = __fmul_rn(silu, up[i]);
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void add_sigmoid_gated_kernel(float* y, const float* x, const float* g, int64_t rows,
                                         int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float w = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g[i / cols])));
    y[i] = __fadd_rn(y[i], __fmul_rn(w, x[i]));
  }
}

__global__ void copy_cols_kernel(const float* src, int64_t ss, float* dst, int64_t ds, int64_t rows,
                                 int64_t cols) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * ds + c] = src[r * ss + c];
  }
}

// ---- row kernels (one block per row) ----------------------------------------------------------

__global__ void rms_norm_kernel(const float* x, int64_t dim, const float* w, float eps, float* y) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    s += static_cast<double>(xr[i]) * xr[i];
  s = block_sum_f64(s);
  const float inv =
      __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(static_cast<float>(s / static_cast<double>(dim)), eps)));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), w ? w[i] : 1.0f);
}

__global__ void softmax_kernel(float* x, int64_t dim) {
  float* xr = x + blockIdx.x * dim;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    m = fmaxf(m, xr[i]);
  m = block_max_f32(m);
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float e = expf(__fsub_rn(xr[i], m));
    xr[i] = e;
    s += e;
  }
  s = block_sum_f64(s);
  const float inv = static_cast<float>(1.0 / s);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    xr[i] = __fmul_rn(xr[i], inv);
}

// ---- RoPE: one thread per (token, head, pair) --------------------------------------------------

__global__ void rope_kernel(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride,
                            int64_t offset, int64_t half, const int64_t* pos, const float* inv_freq,
                            double attention_factor, bool interleaved) {
  const int64_t total = n_tokens * n_heads * half;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < total;
       g += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = g % half;
    const int64_t th = g / half;  // t * n_heads + h
    const int64_t t = th / n_heads;
    const float angle = __fmul_rn(inv_freq[i], static_cast<float>(pos[t]));
    // fp32 cos/sin correctly rounded (through fp64), as the CPU's std::cos(float), then scaled.
    const float c = static_cast<float>(
        static_cast<double>(static_cast<float>(cos(static_cast<double>(angle)))) *
        attention_factor);
    const float s = static_cast<float>(
        static_cast<double>(static_cast<float>(sin(static_cast<double>(angle)))) *
        attention_factor);
    float* v = x + th * head_stride + offset;
    const int64_t a = interleaved ? 2 * i : i;
    const int64_t b = interleaved ? 2 * i + 1 : i + half;
    const float x0 = v[a], x1 = v[b];
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[b] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
}

// ---- attention: one warp per (query token, head), online softmax -------------------------------

constexpr int kMaxHeadDim = 512;
constexpr int kPerLane = kMaxHeadDim / 32;

__global__ void attention_kernel(const float* q, int64_t q_stride, const float* k, int64_t k_stride,
                                 const float* v, int64_t v_stride, const int64_t* seq_offsets,
                                 int64_t n_seq, int64_t T, int64_t n_heads, int64_t group,
                                 int64_t dq, int64_t dv, float scale, float* out) {
  const int lane = threadIdx.x % 32;
  const int64_t item = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  if (item >= T * n_heads) return;
  const int64_t t = item / n_heads, h = item % n_heads, kvh = h / group;
  // The sequence holding t: the last s with seq_offsets[s] <= t.
  int64_t lo = 0, hi = n_seq - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (seq_offsets[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t start = seq_offsets[lo];
  float qr[kPerLane], acc[kPerLane];
  const float* qt = q + t * q_stride + h * dq;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < dq ? qt[d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = start; j <= t; ++j) {
    const float* kj = k + j * k_stride + kvh * dq;
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < dq) dot += qr[i] * kj[d];
    }
    const float s = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float p = expf(s - m_new);
    l = l * corr + p;
    const float* vj = v + j * v_stride + kvh * dv;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < dv) acc[i] = acc[i] * corr + p * vj[d];
    }
    m = m_new;
  }
  float* ot = out + (t * n_heads + h) * dv;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < dv) ot[d] = acc[i] * inv;
  }
}

// ---- routing: one thread per token --------------------------------------------------------------

// Whether (va, ia) comes after (vb, ib) in the order "larger value first, lower index on ties".
__device__ __forceinline__ bool after(float va, int ia, float vb, int ib) {
  return va < vb || (va == vb && ia > ib);
}

// The next element after (prev_v, prev_i) in top-k order among x[0..n) given by value(i);
// prev_i < 0 means "from the start". Returns -1 when none is left (NaNs are skipped).
template <typename Value>
__device__ int next_best(int n, float prev_v, int prev_i, Value value) {
  int best = -1;
  float best_v = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float vi = value(i);
    if (vi != vi) continue;  // NaN
    if (prev_i >= 0 && !after(vi, i, prev_v, prev_i)) continue;
    if (best < 0 || after(best_v, best, vi, i)) {
      best = i;
      best_v = vi;
    }
  }
  return best;
}

__global__ void top_k_kernel(const float* x, int64_t rows, int64_t n, int64_t k, int32_t* idx) {
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * n;
  float pv = 0.0f;
  int pi = -1;
  for (int64_t j = 0; j < k; ++j) {
    const int b = next_best(static_cast<int>(n), pv, pi, [&](int i) { return xr[i]; });
    if (b < 0) {
      idx[r * k + j] = 0;
      continue;
    }
    idx[r * k + j] = b;
    pv = xr[b];
    pi = b;
  }
}

__global__ void route_softmax_kernel(const float* logits, int64_t T, int64_t E, int64_t K,
                                     bool renormalize, int32_t* chosen, float* weight) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  const float* x = logits + t * E;
  float mx = -INFINITY;
  for (int64_t e = 0; e < E; ++e)
    mx = fmaxf(mx, x[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e)
    sum += expf(__fsub_rn(x[e], mx));
  const float inv = static_cast<float>(1.0 / sum);
  auto prob = [&](int e) { return __fmul_rn(expf(__fsub_rn(x[e], mx)), inv); };
  float pv = 0.0f, psum = 0.0f;
  int pi = -1;
  for (int64_t j = 0; j < K; ++j) {
    int b = next_best(static_cast<int>(E), pv, pi, prob);
    if (b < 0) b = 0;
    chosen[t * K + j] = b;
    pv = prob(b);
    pi = b;
    weight[t * K + j] = pv;
    psum = __fadd_rn(psum, pv);
  }
  if (renormalize) {
    for (int64_t j = 0; j < K; ++j)
      weight[t * K + j] = __fdiv_rn(weight[t * K + j], psum);
  }
}

constexpr int kMaxGroups = 64;

__global__ void route_sigmoid_kernel(const float* logits, int64_t T, int64_t E, int64_t K,
                                     const float* bias, int64_t n_group, int64_t topk_group,
                                     bool renormalize, float scaling, int32_t* chosen,
                                     float* weight) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  const float* x = logits + t * E;
  auto score = [&](int e) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x[e]))); };
  auto choice = [&](int e) { return bias ? __fadd_rn(score(e), bias[e]) : score(e); };
  const int per = static_cast<int>(E / n_group);
  float group_score[kMaxGroups];
  for (int g = 0; g < n_group; ++g) {
    auto in_group = [&](int i) { return choice(g * per + i); };
    const int a = next_best(per, 0.0f, -1, in_group);
    if (a < 0) {  // every choice NaN
      group_score[g] = -INFINITY;
      continue;
    }
    float s = __fadd_rn(0.0f, in_group(a));
    if (per >= 2) {
      const int b = next_best(per, in_group(a), a, in_group);
      s = __fadd_rn(s, in_group(b));
    }
    group_score[g] = s;
  }
  uint64_t keep = 0;
  float pv = 0.0f;
  int pi = -1;
  for (int j = 0; j < topk_group; ++j) {
    const int g =
        next_best(static_cast<int>(n_group), pv, pi, [&](int i) { return group_score[i]; });
    if (g < 0) break;
    keep |= uint64_t{1} << g;
    pv = group_score[g];
    pi = g;
  }
  auto masked = [&](int e) { return (keep >> (e / per)) & 1 ? choice(e) : -INFINITY; };
  pv = 0.0f;
  pi = -1;
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) {
    int b = next_best(static_cast<int>(E), pv, pi, masked);
    if (b < 0) b = 0;
    chosen[t * K + j] = b;
    pv = masked(b);
    pi = b;
    weight[t * K + j] = score(b);
    sum = __fadd_rn(sum, score(b));
  }
  for (int64_t j = 0; j < K; ++j) {
    float w = weight[t * K + j];
    if (renormalize) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
    weight[t * K + j] = __fmul_rn(w, scaling);
  }
}

// ---- expert sort: one block per expert
// -----------------------------------------------------------

__global__ void moe_count_kernel(const int32_t* chosen, int64_t S, int64_t* counts) {
  const int e = blockIdx.x;
  int64_t c = 0;
  for (int64_t base = 0; base < S; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    c += __syncthreads_count(s < S && chosen[s] == e);
  }
  if (threadIdx.x == 0) counts[e + 1] = c;
}

__global__ void moe_scan_kernel(int64_t* offsets, int64_t E) {
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e)
    offsets[e + 1] += offsets[e];
}

__global__ void moe_place_kernel(const int32_t* chosen, int64_t S, const int64_t* offsets,
                                 int32_t* sorted_slot, int32_t* row_of_slot) {
  __shared__ int warp_count[32];
  const int e = blockIdx.x;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t next = offsets[e];
  for (int64_t base = 0; base < S; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const bool mine = s < S && chosen[s] == e;
    const unsigned ballot = __ballot_sync(0xFFFFFFFFu, mine);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (w < warp) before += warp_count[w];
      total += warp_count[w];
    }
    if (mine) {
      const int64_t row = next + before + __popc(ballot & ((1u << lane) - 1u));
      sorted_slot[row] = static_cast<int32_t>(s);
      row_of_slot[s] = static_cast<int32_t>(row);
    }
    next += total;
    __syncthreads();
  }
}

__global__ void moe_gather_kernel(const float* x, int64_t H, const int32_t* sorted_slot, int64_t R,
                                  int64_t K, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < R * H;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / H, c = i % H;
    out[i] = x[(sorted_slot[r] / K) * H + c];
  }
}

__global__ void moe_combine_kernel(const float* expert_out, const int32_t* row_of_slot,
                                   const float* weight, int64_t T, int64_t K, int64_t H, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T * H;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / H, c = i % H;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t row = row_of_slot[t * K + j];
      acc = __fadd_rn(acc, __fmul_rn(weight[t * K + j], expert_out[row * H + c]));
    }
    y[i] = acc;
  }
}

// ---- amax ------------------------------------------------------------------------------------

template <typename Load>
__device__ void amax_body(int64_t n, float* out, Load load) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    m = max(m, load(i));
  m = block_max(m);
  if (threadIdx.x == 0 && m != 0) atomicMax(reinterpret_cast<unsigned*>(out), m);
}

__global__ void amax_kernel(const float* x, int64_t n, float* out) {
  amax_body(n, out, [&](int64_t i) { return abs_bits(x[i]); });
}

__global__ void amax_bf16_kernel(const uint16_t* x, int64_t n, float* out) {
  amax_body(n, out, [&](int64_t i) { return (static_cast<unsigned>(x[i]) & 0x7FFFu) << 16; });
}

// One block per row (grid-stride over rows); R = offsets[n_groups] is read on the device.
__global__ void amax_grouped_kernel(const float* x, int64_t cols, const int64_t* offsets,
                                    int64_t n_groups, float* out) {
  const int64_t R = offsets[n_groups];
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    unsigned m = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      m = max(m, abs_bits(x[r * cols + c]));
    m = block_max(m);
    if (threadIdx.x == 0 && m != 0) {
      int64_t lo = 0, hi = n_groups - 1;  // the last g with offsets[g] <= r
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (offsets[mid] <= r) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      atomicMax(reinterpret_cast<unsigned*>(out + lo), m);
    }
  }
}

// Fallback GEMM when cuBLASLt offers no algorithm for a shape: one thread per output, fp32
// accumulate. y[m, n] = x[m, k] · w[n, k]^T, x and w bf16.
__global__ void gemm_fallback_kernel(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w,
                                     int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    float acc = 0.0f;
    for (int64_t d = 0; d < k; ++d)
      acc += bf16_value(x[r * k + d]) * bf16_value(w[c * k + d]);
    y[i] = acc;
  }
}

// ---- cuBLASLt ----------------------------------------------------------------------------------

std::atomic<int64_t> g_fallback_gemms{0};

cublasLtHandle_t blas_handle() {
  static std::once_flag once;
  static cublasLtHandle_t handle = nullptr;
  std::call_once(once, [] { check_blas(cublasLtCreate(&handle), "cublasLtCreate"); });
  return handle;
}

uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0)
    al /= 2;
  return al;
}

template <typename T>
struct LtHandle {
  T h = nullptr;
  cublasStatus_t (*destroy)(T) = nullptr;
  ~LtHandle() {
    if (h) destroy(h);
  }
};

// y[m, n] = x[m, k] · w[n, k]^T with bf16 x, w and fp32 y. In cuBLASLt's column-major terms:
// y^T [n, m] (ld n) = op(A) · B with A = w viewed as [k, n] (ld k), op = transpose, and
// B = x^T viewed as [k, m] (ld k).
void gemm_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
               void* workspace, size_t workspace_bytes, Stream& stream) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    check(cudaMemsetAsync(y, 0, static_cast<size_t>(m * n) * sizeof(float), native(stream)),
          "linear (k = 0)");
    return;
  }
  cublasLtHandle_t lt = blas_handle();
  LtHandle<cublasLtMatmulDesc_t> op{nullptr, cublasLtMatmulDescDestroy};
  LtHandle<cublasLtMatrixLayout_t> a{nullptr, cublasLtMatrixLayoutDestroy},
      b{nullptr, cublasLtMatrixLayoutDestroy}, d{nullptr, cublasLtMatrixLayoutDestroy};
  LtHandle<cublasLtMatmulPreference_t> pref{nullptr, cublasLtMatmulPreferenceDestroy};
  check_blas(cublasLtMatmulDescCreate(&op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  check_blas(
      cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)),
      "transa");
  check_blas(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans,
                                            sizeof(no_trans)),
             "transb");
  check_blas(cublasLtMatrixLayoutCreate(&a.h, CUDA_R_16BF, k, n, k), "layout A");
  check_blas(cublasLtMatrixLayoutCreate(&b.h, CUDA_R_16BF, k, m, k), "layout B");
  check_blas(cublasLtMatrixLayoutCreate(&d.h, CUDA_R_32F, n, m, n), "layout D");
  check_blas(cublasLtMatmulPreferenceCreate(&pref.h), "preference");
  check_blas(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes, sizeof(workspace_bytes)),
             "workspace preference");
  const uint32_t align_a = alignment_of(w), align_b = alignment_of(x), align_d = alignment_of(y);
  cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                       sizeof(align_d));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(lt, op.h, a.h, b.h, d.h, d.h, pref.h, 1, &result, &found);
  const float alpha = 1.0f, beta = 0.0f;
  if (hs == CUBLAS_STATUS_SUCCESS && found > 0 &&
      cublasLtMatmul(lt, op.h, &alpha, w, a.h, x, b.h, &beta, y, d.h, y, d.h, &result.algo,
                     workspace, workspace_bytes, native(stream)) == CUBLAS_STATUS_SUCCESS) {
    return;
  }
  g_fallback_gemms.fetch_add(1);
  gemm_fallback_kernel<<<blocks_for(m * n), kThreads, 0, native(stream)>>>(x, m, k, w, n, y);
  check_launch("linear (fallback GEMM)");
}

void check_sizes(int64_t a, int64_t b, const char* what) {
  STRATA_CHECK(a >= 0 && b >= 0, "cuda ", what, ": negative size (", a, ", ", b, ")");
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------------------

void f32_to_bf16(const float* x, int64_t n, uint16_t* y, Stream& stream) {
  check_sizes(n, 0, "f32_to_bf16");
  if (n == 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(x, n, y);
  check_launch("f32_to_bf16");
}

void bf16_to_f32(const uint16_t* x, int64_t n, float* y, Stream& stream) {
  check_sizes(n, 0, "bf16_to_f32");
  if (n == 0) return;
  bf16_to_f32_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(x, n, y);
  check_launch("bf16_to_f32");
}

void round_bf16(float* x, int64_t n, Stream& stream) {
  check_sizes(n, 0, "round_bf16");
  if (n == 0) return;
  round_bf16_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(x, n);
  check_launch("round_bf16");
}

int64_t gemm_fallback_count() {
  return g_fallback_gemms.load();
}

void linear_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                 Stream& stream, const float* bias) {
  check_sizes(m, k, "linear");
  check_sizes(n, 0, "linear");
  void* ws = stream.scratch(kGemmWorkspace);
  gemm_bf16(x, m, k, w, n, y, ws, kGemmWorkspace, stream);
  if (bias && m * n > 0) {
    add_bias_kernel<<<blocks_for(m * n), kThreads, 0, native(stream)>>>(y, m, n, bias);
    check_launch("linear bias");
  }
}

void linear(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
            Stream& stream, const float* bias) {
  check_sizes(m, k, "linear");
  check_sizes(n, 0, "linear");
  // Scratch: [workspace | x as bf16], the bf16 copy 256-byte aligned.
  const size_t x_bytes = static_cast<size_t>(m * k) * sizeof(uint16_t);
  char* base = static_cast<char*>(stream.scratch(kGemmWorkspace + x_bytes));
  uint16_t* xb = reinterpret_cast<uint16_t*>(base + kGemmWorkspace);
  f32_to_bf16(x, m * k, xb, stream);
  gemm_bf16(xb, m, k, w, n, y, base, kGemmWorkspace, stream);
  if (bias && m * n > 0) {
    add_bias_kernel<<<blocks_for(m * n), kThreads, 0, native(stream)>>>(y, m, n, bias);
    check_launch("linear bias");
  }
}

void linear_grouped(const float* x, const int64_t* offsets, int64_t n_groups, int64_t k,
                    const uint16_t* const* w, int64_t n, float* y, Stream& stream) {
  check_sizes(n_groups, k, "linear_grouped");
  check_sizes(n, 0, "linear_grouped");
  STRATA_CHECK(n_groups == 0 || offsets[0] == 0, "cuda linear_grouped: offsets[0] must be 0");
  const int64_t R = n_groups > 0 ? offsets[n_groups] : 0;
  const size_t x_bytes = static_cast<size_t>(R * k) * sizeof(uint16_t);
  char* base = static_cast<char*>(stream.scratch(kGemmWorkspace + x_bytes));
  uint16_t* xb = reinterpret_cast<uint16_t*>(base + kGemmWorkspace);
  f32_to_bf16(x, R * k, xb, stream);
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t rows = offsets[g + 1] - offsets[g];
    STRATA_CHECK(rows >= 0, "cuda linear_grouped: offsets must not decrease (group ", g, ")");
    if (rows == 0) continue;
    STRATA_CHECK(w[g] != nullptr, "cuda linear_grouped: group ", g, " has rows but no weight");
    gemm_bf16(xb + offsets[g] * k, rows, k, w[g], n, y + offsets[g] * n, base, kGemmWorkspace,
              stream);
  }
}

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              Stream& stream) {
  check_sizes(rows, dim, "rms_norm");
  if (rows == 0 || dim == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, native(stream)>>>(x, dim, w, eps, y);
  check_launch("rms_norm");
}

void softmax(float* x, int64_t rows, int64_t dim, Stream& stream) {
  check_sizes(rows, dim, "softmax");
  if (rows == 0 || dim == 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, native(stream)>>>(x, dim);
  check_launch("softmax");
}

void swiglu(const float* gate, const float* up, int64_t count, float* h, Stream& stream) {
  check_sizes(count, 0, "swiglu");
  if (count == 0) return;
  swiglu_kernel<<<blocks_for(count), kThreads, 0, native(stream)>>>(gate, up, count, h);
  check_launch("swiglu");
}

void add(float* y, const float* x, int64_t n, Stream& stream) {
  check_sizes(n, 0, "add");
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(y, x, n);
  check_launch("add");
}

void add_sigmoid_gated(float* y, const float* x, const float* gate_logit, int64_t rows,
                       int64_t cols, Stream& stream) {
  check_sizes(rows, cols, "add_sigmoid_gated");
  if (rows * cols == 0) return;
  add_sigmoid_gated_kernel<<<blocks_for(rows * cols), kThreads, 0, native(stream)>>>(
      y, x, gate_logit, rows, cols);
  check_launch("add_sigmoid_gated");
}

void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols, Stream& stream) {
  check_sizes(rows, cols, "copy_cols");
  if (rows * cols == 0) return;
  copy_cols_kernel<<<blocks_for(rows * cols), kThreads, 0, native(stream)>>>(
      src, src_stride, dst, dst_stride, rows, cols);
  check_launch("copy_cols");
}

void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset,
          int64_t rot_dim, const int64_t* pos, const float* inv_freq, double attention_factor,
          bool interleaved, Stream& stream) {
  check_sizes(n_tokens, n_heads, "rope");
  STRATA_CHECK(rot_dim >= 0 && rot_dim % 2 == 0 && offset >= 0 && offset + rot_dim <= head_stride,
               "cuda rope: rot_dim ", rot_dim, " at offset ", offset,
               " must be even and fit in the head stride ", head_stride);
  const int64_t total = n_tokens * n_heads * (rot_dim / 2);
  if (total == 0) return;
  rope_kernel<<<blocks_for(total), kThreads, 0, native(stream)>>>(
      x, n_tokens, n_heads, head_stride, offset, rot_dim / 2, pos, inv_freq, attention_factor,
      interleaved);
  check_launch("rope");
}

void attention_causal(const float* q, int64_t q_stride, const float* k, int64_t k_stride,
                      const float* v, int64_t v_stride, const int64_t* seq_offsets, int64_t n_seq,
                      int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t dq, int64_t dv,
                      float scale, float* out, Stream& stream) {
  check_sizes(n_seq, T, "attention_causal");
  STRATA_CHECK(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "cuda attention_causal: ", n_heads,
               " heads are not a multiple of ", n_kv_heads, " kv heads");
  STRATA_CHECK(dq > 0 && dq <= kMaxHeadDim && dv > 0 && dv <= kMaxHeadDim,
               "cuda attention_causal: head dims (", dq, ", ", dv, ") must be in [1, ", kMaxHeadDim,
               "]");
  if (T == 0 || n_seq == 0) return;
  const int64_t warps = T * n_heads;
  const int threads = 128;
  const int64_t blocks = (warps * 32 + threads - 1) / threads;
  attention_kernel<<<static_cast<unsigned>(blocks), threads, 0, native(stream)>>>(
      q, q_stride, k, k_stride, v, v_stride, seq_offsets, n_seq, T, n_heads, n_heads / n_kv_heads,
      dq, dv, scale, out);
  check_launch("attention_causal");
}

void top_k(const float* x, int64_t rows, int64_t n, int64_t k, int32_t* idx, Stream& stream) {
  check_sizes(rows, n, "top_k");
  STRATA_CHECK(k >= 0 && k <= n, "cuda top_k: k = ", k, " must be in [0, ", n, "]");
  if (rows == 0 || k == 0) return;
  top_k_kernel<<<blocks_for(rows, 128), 128, 0, native(stream)>>>(x, rows, n, k, idx);
  check_launch("top_k");
}

void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool renormalize,
                        int32_t* chosen, float* weight, Stream& stream) {
  check_sizes(T, E, "route_softmax_topk");
  STRATA_CHECK(K >= 1 && K <= E, "cuda route_softmax_topk: K = ", K, " must be in [1, ", E, "]");
  if (T == 0) return;
  route_softmax_kernel<<<blocks_for(T, 128), 128, 0, native(stream)>>>(logits, T, E, K, renormalize,
                                                                       chosen, weight);
  check_launch("route_softmax_topk");
}

void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                           int64_t n_group, int64_t topk_group, bool renormalize, float scaling,
                           int32_t* chosen, float* weight, Stream& stream) {
  check_sizes(T, E, "route_sigmoid_grouped");
  STRATA_CHECK(n_group >= 1 && n_group <= kMaxGroups && E % n_group == 0,
               "cuda route_sigmoid_grouped: n_group ", n_group, " must divide ", E,
               " experts and be at most ", kMaxGroups);
  STRATA_CHECK(topk_group >= 1 && topk_group <= n_group, "cuda route_sigmoid_grouped: topk_group ",
               topk_group, " must be in [1, n_group = ", n_group, "]");
  STRATA_CHECK(K >= 1 && K <= E, "cuda route_sigmoid_grouped: K = ", K, " must be in [1, ", E, "]");
  if (T == 0) return;
  route_sigmoid_kernel<<<blocks_for(T, 128), 128, 0, native(stream)>>>(
      logits, T, E, K, bias, n_group, topk_group, renormalize, scaling, chosen, weight);
  check_launch("route_sigmoid_grouped");
}

void moe_sort(const int32_t* chosen, int64_t T, int64_t K, int64_t E, int32_t* sorted_slot,
              int32_t* row_of_slot, int64_t* offsets, int64_t* offsets_host, Stream& stream) {
  check_sizes(T, K, "moe_sort");
  STRATA_CHECK(E >= 1, "cuda moe_sort: no experts");
  const int64_t S = T * K;
  check(cudaMemsetAsync(offsets, 0, static_cast<size_t>(E + 1) * sizeof(int64_t), native(stream)),
        "moe_sort");
  moe_count_kernel<<<static_cast<unsigned>(E), kThreads, 0, native(stream)>>>(chosen, S, offsets);
  check_launch("moe_sort (count)");
  moe_scan_kernel<<<1, 1, 0, native(stream)>>>(offsets, E);
  check_launch("moe_sort (scan)");
  moe_place_kernel<<<static_cast<unsigned>(E), kThreads, 0, native(stream)>>>(
      chosen, S, offsets, sorted_slot, row_of_slot);
  check_launch("moe_sort (place)");
  strata::cuda::copy_to_host(offsets_host, offsets, static_cast<size_t>(E + 1) * sizeof(int64_t),
                             stream);
  STRATA_CHECK(offsets_host[E] == S, "cuda moe_sort: ", S - offsets_host[E], " of ", S,
               " routing slots name an expert outside [0, ", E, ")");
}

void moe_gather(const float* x, int64_t H, const int32_t* sorted_slot, int64_t R, int64_t K,
                float* out, Stream& stream) {
  check_sizes(H, R, "moe_gather");
  STRATA_CHECK(K >= 1, "cuda moe_gather: K must be positive");
  if (H * R == 0) return;
  moe_gather_kernel<<<blocks_for(R * H), kThreads, 0, native(stream)>>>(x, H, sorted_slot, R, K,
                                                                        out);
  check_launch("moe_gather");
}

void moe_combine(const float* expert_out, const int32_t* row_of_slot, const float* weight,
                 int64_t T, int64_t K, int64_t H, float* y, Stream& stream) {
  check_sizes(T, K, "moe_combine");
  check_sizes(H, 0, "moe_combine");
  if (T * H == 0) return;
  moe_combine_kernel<<<blocks_for(T * H), kThreads, 0, native(stream)>>>(expert_out, row_of_slot,
                                                                         weight, T, K, H, y);
  check_launch("moe_combine");
}

void amax(const float* x, int64_t n, float* out, Stream& stream) {
  check_sizes(n, 0, "amax");
  if (n == 0) return;
  amax_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, native(stream)>>>(x, n, out);
  check_launch("amax");
}

void amax_bf16(const uint16_t* x, int64_t n, float* out, Stream& stream) {
  check_sizes(n, 0, "amax_bf16");
  if (n == 0) return;
  amax_bf16_kernel<<<std::min(blocks_for(n), 1024u), kThreads, 0, native(stream)>>>(x, n, out);
  check_launch("amax_bf16");
}

void amax_grouped(const float* x, int64_t cols, const int64_t* offsets, int64_t n_groups,
                  float* out, Stream& stream) {
  check_sizes(cols, n_groups, "amax_grouped");
  if (cols == 0 || n_groups == 0) return;
  amax_grouped_kernel<<<1024, kThreads, 0, native(stream)>>>(x, cols, offsets, n_groups, out);
  check_launch("amax_grouped");
}

}  // namespace strata::ops::cuda
