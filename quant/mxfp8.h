// MXFP8 (format.md §7): F8_E4M3 elements in blocks of 32 along the input dimension, one E8M0
// power-of-two scale per block, as NVIDIA ModelOpt exports it (qtensor/mxfp8_tensor.py).
//
//   d_b     = fl32(a_b * fl32(1/448))          a_b = max |W| over the block
//   e_b     = clamp(ceil(log2(d_b)), -127, 127), or -127 when d_b is 0
//   scale   = e_b + 127                         (E8M0 byte: the block scale is 2^e_b)
//   element = e4m3(clamp(W * 2^-e_b, -448, 448))
//
// ceil(log2(d)) is computed exactly from the fp32 bits of d. ModelOpt computes `amax / 448.0` on
// the GPU (so the reciprocal product above, format.md §1's rule) and takes torch.log2 in fp32,
// then ceil. The two agree on every bf16 or f16 weight: d can be a power of two only when
// a_b = 448 * 2^k exactly (then both give k), and otherwise lies at least about 2^-9 (relative)
// away from a power of two, far beyond any fp32 log2 rounding. For fp32 weights whose block amax
// lies within about 2^-18 (relative) above 448 * 2^k, an fp32 log2 can round to the integer k and
// ModelOpt would pick the smaller exponent (and clamp the largest element to 448); strata
// keeps the exact exponent there. W * 2^-e is exact in fp32 (a power-of-two scaling) except for
// results below 2^-126, which round the same way on both sides.
#pragma once

#include <string_view>

#include "core/tensor.h"
#include "quant/encode.h"

namespace strata {

inline constexpr int64_t kMxfp8BlockSize = 32;

// One MXFP8-quantized weight W[..., out, in]:
//   weight  F8_E4M3  [..., out, in]     same layout as W, one byte per element
//   scale   U8       [..., out, in/32]  E8M0 biased exponent, row-major: element [r, b] scales
//                                       W[r, 32b .. 32b+31] by 2^(scale - 127)
// Dequantization: W[r, c] ~= f32(weight[r, c]) * 2^(scale[r, c/32] - 127).
struct Mxfp8Weight {
  Tensor weight;
  Tensor scale;
};

// The E8M0 byte for a block amax (>= 0, finite): clamp(ceil(log2(fl32(a * fl32(1/448)))), -127,
// 127) + 127, and 0 for a = 0.
uint8_t mxfp8_block_exponent(float block_amax);

// Quantizes a BF16/F16/F32 weight. Throws strata::Error naming `name` for another dtype, an input
// dimension not divisible by 32, or a non-finite element.
Mxfp8Weight mxfp8_quantize(const Tensor& weight, std::string_view name);

// Inverse mapping to an F32 tensor of the original shape.
Tensor mxfp8_dequantize(const Mxfp8Weight& q);

// MXFP8 fake quantization of x[rows, cols] in place (cols % 32 == 0): ModelOpt's MXFP8 recipe
// quantizes a linear's input dynamically, with the weight's rule above per block of 32
// consecutive values of a row (scale 2^e_b from the block's own amax, elements e4m3), and scales
// back: x = f32(e4m3(clamp(x * 2^-e_b, -448, 448))) * 2^e_b. A block holding a NaN or an infinity
// becomes NaN. Throws strata::Error naming `name` when cols % 32 != 0.
void mxfp8_fake_quantize(float* x, int64_t rows, int64_t cols, std::string_view name);

namespace quant_detail {
Mxfp8Weight mxfp8_quantize_with(Encoders encoders, const Tensor& weight, std::string_view name);
}  // namespace quant_detail

}  // namespace strata
