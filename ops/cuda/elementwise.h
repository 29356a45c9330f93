// Element-wise steps of the forward on the device (ops/cuda/elementwise.cu); conventions:
// ops/cuda/convert.h. All fp32. nvcc may fuse a multiply and an add into one rounding where the
// CPU rounds twice, and expf is within 2 ulp of the host's exp: a few ulp from the CPU at most;
// add, add_bias and copy_cols are exact. `bf16`: the rounding of the CPU backend's bf16_ops
// (ops/backend.h), step for step, the products and sums between the roundings unfused.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// x[n] += y[n]
void add(float* x, const float* y, int64_t n, void* stream);
// y[rows, cols] += b[cols] (ops::linear's bias, added after the GEMM)
void add_bias(float* y, int64_t rows, int64_t cols, const float* b, void* stream);
// ops::swiglu: h[n] = silu(g) * u (`bf16`: silu(g) rounded, then the product). h may equal g or u.
void swiglu(const float* g, const float* u, int64_t n, float* h, void* stream, bool bf16 = false);
// ops::swiglu_clamped: h[n] from gate/up interleaved in gu[n, 2] (gpt-oss); h must not overlap
// gu. NaN propagates as on the CPU (std::min / std::clamp, not fminf). `bf16`: each step rounded
// as ops::swiglu_clamped's.
void swiglu_clamped(const float* gu, int64_t n, float alpha, float limit, float* h, void* stream,
                    bool bf16 = false);
// y[T, H] += sigmoid(g[T]) * s[T, H] (Qwen MoE's gated shared expert; ops::sigmoid). `bf16`: g,
// the sigmoid, the product and the sum each rounded (CpuBackend::add_sigmoid_gated).
void add_sigmoid_gated(float* y, const float* s, const float* g, int64_t T, int64_t H, void* stream,
                       bool bf16 = false);
// dst[r, 0:cols] = src[r, 0:cols] for r < rows; strides in elements (splitting fused
// projections, e.g. MLA's [c | k_rope]).
void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols, void* stream);
// x[n] = sigmoid(x[n]), in place (ops::sigmoid).
void sigmoid_inplace(float* x, int64_t n, void* stream);
// x[n] *= sigmoid(g[n]) (`bf16`: the sigmoid rounded, then the product).
void mul_sigmoid(float* x, const float* g, int64_t n, void* stream, bool bf16 = false);

}  // namespace strata::ops::cuda
