// Rotary position embedding on the device (ops/cuda/rope.cu); conventions: ops/cuda/convert.h.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// ops::rope: half-split (or interleaved) RoPE in place on x[T, nH, stride], columns
// [offset, offset + rot_dim). inv_freq fp32 [rot_dim / 2] (ops::rope_inv_freq's values rounded
// to fp32), pos int64 [T]. The angle is fp32(inv_freq[i]) * fp32(pos[t]) as on the CPU; cos and
// sin are taken in fp64 and multiplied by attention_factor there, then rounded to fp32 once (the
// CPU rounds std::cos(float) to fp32 before the factor): within an ulp or two of ops::rope.
// `bf16`: rounded as ops::rope's bf16 (cos, sin, each product and sum).
void rope(float* x, int64_t T, int64_t n_heads, int64_t stride, int64_t offset, int64_t rot_dim,
          const int64_t* pos, const float* inv_freq, double attention_factor, bool interleaved,
          void* stream, bool bf16 = false);

}  // namespace strata::ops::cuda
