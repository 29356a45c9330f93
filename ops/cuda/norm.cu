// Row norms on the device (host launchers: ops/cuda/norm.h): RMSNorm, one warp or one block per
// row; L2 norm with a scale, one warp per row. Sums of squares in fp64.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/norm.h"

namespace strata::ops::cuda {
namespace {

using launch::bf16r;
using launch::kThreads;
using launch::launched;
using launch::st;

// One output of ops::rms_norm rounded as the backend's bf16_ops does (CpuBackend::rms_norm).
__device__ __forceinline__ float rounded_norm(float x, float inv, const float* w, int64_t i,
                                              float w_offset, NormRounding rounding) {
  const float n = __fmul_rn(x, inv);
  if (rounding == NormRounding::kNormalizedFirst) return bf16r(__fmul_rn(w[i], bf16r(n)));
  if (!w) return bf16r(n);
  return bf16r(__fmul_rn(n, w_offset != 0.0f ? __fadd_rn(w_offset, w[i]) : w[i]));
}

// One block per row.
__global__ void k_rms_norm(const float* x, int64_t dim, const float* w, float eps, float w_offset,
                           float* y, NormRounding rounding) {
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
  if (rounding != NormRounding::kNone) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      yr[i] = rounded_norm(xr[i], inv, w, i, w_offset, rounding);
    return;
  }
  if (w && w_offset != 0.0f) {
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      yr[i] = xr[i] * inv * (w_offset + w[i]);
    return;
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

// One warp per row (rows of up to a few thousand values: a block per row would leave most of
// its threads idle and spend more on scheduling than on the row). Same fp64 sum of squares.
__global__ void k_rms_norm_warp(const float* x, int64_t rows, int64_t dim, const float* w,
                                float eps, float w_offset, float* y, NormRounding rounding) {
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
  if (rounding != NormRounding::kNone) {
    for (int64_t i = lane; i < dim; i += 32)
      yr[i] = rounded_norm(xr[i], inv, w, i, w_offset, rounding);
    return;
  }
  if (w && w_offset != 0.0f) {
    for (int64_t i = lane; i < dim; i += 32)
      yr[i] = xr[i] * inv * (w_offset + w[i]);
    return;
  }
  for (int64_t i = lane; i < dim; i += 32)
    yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
}

// One warp per row: the mean, then the sum of squared deviations, in fp64.
__global__ void k_layer_norm(const float* x, int64_t rows, int64_t dim, const float* w,
                             const float* b, float eps, float* y) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const float* xr = x + r * dim;
  float* yr = y + r * dim;
  double s = 0.0;
  for (int64_t i = lane; i < dim; i += 32)
    s += xr[i];
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  const double mean = s / static_cast<double>(dim);
  double sq = 0.0;
  for (int64_t i = lane; i < dim; i += 32)
    sq += (xr[i] - mean) * (xr[i] - mean);
  for (int o = 16; o > 0; o >>= 1)
    sq += __shfl_xor_sync(0xffffffffu, sq, o);
  const float m = static_cast<float>(mean);
  const float inv = 1.0f / sqrtf(static_cast<float>(sq / static_cast<double>(dim)) + eps);
  for (int64_t i = lane; i < dim; i += 32)
    yr[i] = (xr[i] - m) * inv * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
}

// One warp per row; the sum of squares in fp64.
__global__ void k_l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  float* xr = x + r * dim;
  double s = 0.0;
  for (int64_t i = lane; i < dim; i += 32)
    s += static_cast<double>(xr[i]) * xr[i];
  for (int o = 16; o > 0; o >>= 1)
    s += __shfl_xor_sync(0xffffffffu, s, o);
  const float norm = sqrtf(static_cast<float>(s) + eps);
  for (int64_t i = lane; i < dim; i += 32)
    xr[i] = (xr[i] / norm) * scale;
}

}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              void* s, float w_offset, NormRounding rounding) {
  STRATA_ASSERT(rounding != NormRounding::kNormalizedFirst || w);
  if (rows == 0) return;
  STRATA_ASSERT(rows < (1ll << 31));
  if (dim <= 8192) {
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
    k_rms_norm_warp<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(x, rows, dim, w, eps,
                                                                           w_offset, y, rounding);
  } else {
    k_rms_norm<<<static_cast<unsigned>(rows), 256, 0, st(s)>>>(x, dim, w, eps, w_offset, y,
                                                               rounding);
  }
  launched("rms_norm");
}

void layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b,
                float eps, float* y, void* s) {
  if (rows == 0) return;
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  STRATA_ASSERT(blocks < (1ll << 31));
  k_layer_norm<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(x, rows, dim, w, b, eps, y);
  launched("layer_norm");
}

void l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale, void* s) {
  if (rows == 0) return;
  constexpr int kWarps = 8;
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  STRATA_ASSERT(blocks < (1ll << 31));
  k_l2_norm_scale<<<static_cast<unsigned>(blocks), kWarps * 32, 0, st(s)>>>(x, rows, dim, eps,
                                                                            scale);
  launched("l2_norm_scale");
}

}  // namespace strata::ops::cuda
