// Launch helpers shared by the .cu files of ops/cuda/ (device code only; never included by
// host code): the stream cast, the block count of a grid-stride loop, and the check after a
// launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace strata::ops::cuda::launch {

inline cudaStream_t st(void* s) {
  return static_cast<cudaStream_t>(s);
}

constexpr int kThreads = 256;
// Blocks of kThreads for a grid-stride loop over n elements (at least one, at most 65535 x 32).
inline int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 32 ? (b < 1 ? 1 : b) : 65535 * 32);
}

// x rounded to the nearest bf16 value (ties to even), as a float: ops::bf16 on the device (a NaN
// stays a NaN). The kernels' rounding under the backend's bf16_ops (ops/backend.h).
__device__ __forceinline__ float bf16r(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u += 0x7fffu + ((u >> 16) & 1u);
  return __uint_as_float(u & 0xffff0000u);
}

// Throws strata::Error naming the kernel when its launch failed.
inline void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  STRATA_CHECK(e == cudaSuccess, "CUDA kernel ", what, ": ", cudaGetErrorString(e));
}

}  // namespace strata::ops::cuda::launch

// Grid-stride loop over [0, n).
#define FOR_N(i, n)                                                         \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); \
       i += (int64_t)gridDim.x * blockDim.x)
