// Row norms on the device (ops/cuda/norm.cu); conventions: ops/cuda/convert.h.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// ops::rms_norm: y[rows, dim] = x / sqrt(mean(x^2) + eps) * w (w may be null: no weight), the
// sum of squares in fp64 (in another order than the CPU's), then the CPU's fp32 steps; with
// w_offset != 0 the weight is (w_offset + w), as on the CPU. y may equal x. One warp per row up
// to dim 8192, one block per row above. `rounding` (the backend's bf16_ops, CpuBackend::rms_norm):
// kNormalizedFirst rounds x / rms(x) to bf16, then its product with w (LlamaRMSNorm; needs w);
// kOnce rounds the fp32 result once.
enum class NormRounding { kNone, kNormalizedFirst, kOnce };
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              void* stream, float w_offset = 0.0f, NormRounding rounding = NormRounding::kNone);

// ops::layer_norm: y[rows, dim] = (x - mean) / sqrt(var + eps) * w + b (w, b may be null), mean
// and biased variance in fp64 (in another order than the CPU's), then the CPU's fp32 steps. y
// may equal x. One warp per row.
void layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b,
                float eps, float* y, void* stream);

// Per row of x[rows, dim], in place: x = (x / sqrt(sum(x^2) + eps)) * scale, the sum in fp64
// (ops::l2_norm, then the CPU's separate multiply by scale; scale 1 is ops::l2_norm alone).
void l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale, void* stream);

}  // namespace strata::ops::cuda
