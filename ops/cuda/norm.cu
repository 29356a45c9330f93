// Row norms on the device (host launchers: ops/cuda/norm.h): RMSNorm, one warp or one block per
// row; L2 norm with a scale, one warp per row. Sums of squares in fp64.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/norm.h"

namespace strata::ops::cuda {
namespace {

using launch::kThreads;
using launch::launched;
using launch::st;

// One block per row.
__global__ void k_rms_norm(const float* x, int64_t dim, const float* w, float eps, float w_offset,
                           float* y) {
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
                                float eps, float w_offset, float* y) {
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
  if (w && w_offset != 0.0f) {
    for (int64_t i = lane; i < dim; i += 32)
      yr[i] = xr[i] * inv * (w_offset + w[i]);
    return;
  }
  for (int64_t i = lane; i < dim; i += 32)
    yr[i] = xr[i] * inv * (w ? w[i] : 1.0f);
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
              void* s, float w_offset) {
  if (rows == 0) return;
  STRATA_ASSERT(rows < (1ll << 31));
  if (dim <= 8192) {
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
    k_rms_norm_warp<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(x, rows, dim, w, eps,
                                                                           w_offset, y);
  } else {
    k_rms_norm<<<static_cast<unsigned>(rows), 256, 0, st(s)>>>(x, dim, w, eps, w_offset, y);
  }
  launched("rms_norm");
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
