// Element-wise kernels of the forward (host launchers: ops/cuda/elementwise.h), one thread per
// element in a grid-stride loop.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::bf16r;
using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__global__ void k_add(float* x, const float* y, int64_t n) {
  FOR_N(i, n) x[i] += y[i];
}
__global__ void k_add_bias(float* y, int64_t rows, int64_t cols, const float* b) {
  FOR_N(i, rows * cols) y[i] += b[i % cols];
}
__global__ void k_swiglu(const float* g, const float* u, int64_t n, float* h, bool rounded) {
  FOR_N(i, n) {
    const float x = g[i];
    const float a = x / (1.0f + expf(-x));
    h[i] = rounded ? bf16r(__fmul_rn(bf16r(a), u[i])) : a * u[i];
  }
}
__global__ void k_swiglu_clamped(const float* gu, int64_t n, float alpha, float limit, float* h,
                                 bool rounded) {
  FOR_N(i, n) {
    const float a = gu[2 * i], b = gu[2 * i + 1];
    const float g = limit < a ? limit : a;                          // std::min(a, limit)
    const float u = b < -limit ? -limit : (limit < b ? limit : b);  // std::clamp(b, ±limit)
    if (rounded) {  // ops::swiglu_clamped's bf16 steps
      const float sg = bf16r(1.0f / (1.0f + expf(-bf16r(__fmul_rn(g, alpha)))));
      h[i] = bf16r(__fmul_rn(bf16r(__fadd_rn(u, 1.0f)), bf16r(__fmul_rn(g, sg))));
      continue;
    }
    h[i] = (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * alpha)))));
  }
}
__global__ void k_add_sigmoid_gated(float* y, const float* s, const float* g, int64_t T, int64_t H,
                                    bool rounded) {
  FOR_N(i, T * H) {
    if (rounded) {  // CpuBackend::add_sigmoid_gated's bf16 steps
      const float w = bf16r(1.0f / (1.0f + expf(-bf16r(g[i / H]))));
      y[i] = bf16r(__fadd_rn(y[i], bf16r(__fmul_rn(w, s[i]))));
      continue;
    }
    const float w = 1.0f / (1.0f + expf(-g[i / H]));
    y[i] += w * s[i];
  }
}

__global__ void k_copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                            int64_t rows, int64_t cols) {
  FOR_N(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    dst[r * dst_stride + c] = src[r * src_stride + c];
  }
}

__global__ void k_sigmoid(float* x, int64_t n) {
  FOR_N(i, n) x[i] = 1.0f / (1.0f + expf(-x[i]));
}
__global__ void k_mul_sigmoid(float* x, const float* g, int64_t n, bool rounded) {
  FOR_N(i, n) {
    const float w = 1.0f / (1.0f + expf(-g[i]));
    x[i] = rounded ? bf16r(__fmul_rn(x[i], bf16r(w))) : x[i] * w;
  }
}

}  // namespace

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
void swiglu(const float* g, const float* u, int64_t n, float* h, void* s, bool bf16) {
  if (n == 0) return;
  k_swiglu<<<blocks_for(n), kThreads, 0, st(s)>>>(g, u, n, h, bf16);
  launched("swiglu");
}
void swiglu_clamped(const float* gu, int64_t n, float alpha, float limit, float* h, void* s,
                    bool bf16) {
  if (n == 0) return;
  k_swiglu_clamped<<<blocks_for(n), kThreads, 0, st(s)>>>(gu, n, alpha, limit, h, bf16);
  launched("swiglu_clamped");
}
void add_sigmoid_gated(float* y, const float* sv, const float* g, int64_t T, int64_t H, void* s,
                       bool bf16) {
  if (T * H == 0) return;
  k_add_sigmoid_gated<<<blocks_for(T * H), kThreads, 0, st(s)>>>(y, sv, g, T, H, bf16);
  launched("add_sigmoid_gated");
}

void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols, void* s) {
  if (rows * cols == 0) return;
  k_copy_cols<<<blocks_for(rows * cols), kThreads, 0, st(s)>>>(src, src_stride, dst, dst_stride,
                                                               rows, cols);
  launched("copy_cols");
}

void sigmoid_inplace(float* x, int64_t n, void* s) {
  if (n == 0) return;
  k_sigmoid<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n);
  launched("sigmoid_inplace");
}

void mul_sigmoid(float* x, const float* g, int64_t n, void* s, bool bf16) {
  if (n == 0) return;
  k_mul_sigmoid<<<blocks_for(n), kThreads, 0, st(s)>>>(x, g, n, bf16);
  launched("mul_sigmoid");
}

}  // namespace strata::ops::cuda
