// NVFP4 (format.md §1): 4-bit E2M1 elements in blocks of 16 along the input dimension, one
// F8_E4M3 scale per block and one F32 scale per tensor, as NVIDIA ModelOpt exports them.
//
// Arithmetic, all in IEEE fp32 (round to nearest even) from the exact decoded weight values;
// A is the per-tensor weight amax (the group max for a fused group, format.md §4):
//   weight_scale_2 = A * fl32(1/2688)                       (see "reciprocal rule" below)
//   s_b            = a_b / fl32(6 * weight_scale_2)         a_b = max |W| over the block
//   s_b == 0 -> 1.0; clamp to [2^-9, 448]; weight_scale[b] = e4m3(s_b)
//   x              = W / fl32(f32(weight_scale[b]) * weight_scale_2)
//   code           = e2m1(x): nearest, ties to even, |x| > 5 -> 6, sign bit = (x < 0)
//
// Reciprocal rule: ModelOpt computes weight_scale_2 and input_scale as `amax / 2688.0` on a CUDA
// tensor; PyTorch evaluates "CUDA tensor / Python number" as a multiplication by the fp32
// reciprocal, so the result is fl32(A * fl32(1/2688)), which differs from the correctly rounded
// A/2688 in the last bit for about one value in five. We match the GPU (format.md §1).
//
// ModelOpt (nvfp4_tensor.py, get_weights_scaling_factor) clamps s_b only from below (2^-9); the
// upper clamp at 448 here changes nothing for a valid A >= max|W| (then s_b <= 448 * (1 + 2^-22),
// which e4m3 rounds to 448 anyway); ModelOpt would write NaN where it mattered.
// For bf16/f16 weights ModelOpt's block amax is taken in the source dtype and converted to fp32
// (exact), and W / (scale product) promotes to fp32 (both operands have dimensions), so every
// step above is fp32 arithmetic on exact values: what this file computes.
#pragma once

#include <span>
#include <string_view>

#include "core/tensor.h"
#include "quant/encode.h"

namespace strata {

inline constexpr int64_t kNvfp4BlockSize = 16;
// ModelOpt's nvfp4_bs32 (configs/numerics/nvfp4_bs32.yaml, the nvfp4_mlp_weight_only recipe): the
// same arithmetic on blocks of 32 inputs; weight_scale is then [..., out, in/32]. Weight-only:
// exported as W4A16_NVFP4 with group_size 32.
inline constexpr int64_t kNvfp4Bs32BlockSize = 32;

// One NVFP4-quantized weight W[..., out, in] (any leading dimensions, blocks along the last):
//   packed        U8       [..., out, in/2]   byte j of a row = code(W[2j]) | code(W[2j+1]) << 4
//                                              (even element in the low nibble); code bits:
//                                              bit 3 sign, bits 0-2 index into
//                                              {0, 0.5, 1, 1.5, 2, 3, 4, 6}
//   block_scale   F8_E4M3  [..., out, in/16]  row-major, not swizzled: element [r, b] scales
//                                              W[r, 16b .. 16b+15]
//   global_scale  F32      []                 weight_scale_2
// Dequantization: W[r, c] ~= e2m1(code) * fl32(f32(block_scale[r, c/16]) * global_scale).
struct Nvfp4Weight {
  Tensor packed;
  Tensor block_scale;
  Tensor global_scale;
};

// weight_scale_2 for a per-tensor (or fused-group) weight amax A: fl32(A * fl32(1/2688)).
float nvfp4_global_scale(float weight_amax);

// input_scale for an activation amax: fl32(amax * fl32(1/2688)). Throws strata::Error naming
// `name` when amax is 0, negative or not finite (format.md §1: refuse to export it).
float nvfp4_input_scale(float activation_amax, std::string_view name);

// Quantizes a BF16/F16/F32 weight with per-tensor amax `weight_amax` (>= max|W|; the group max
// for fused groups). Throws strata::Error naming `name` for another dtype, an input dimension
// not divisible by the block (16, or kNvfp4Bs32BlockSize), a non-finite element, or an amax that
// is not a positive finite number at least max|W| (an all-zero weight has no finite NVFP4
// encoding in ModelOpt: exclude it).
Nvfp4Weight nvfp4_quantize(const Tensor& weight, float weight_amax, std::string_view name,
                           int64_t block = kNvfp4BlockSize);

// As nvfp4_quantize (blocks of 16), with the block scale bytes given (one per block, row-major
// [..., out, in/16], each a positive finite e4m3 value) instead of computed from the block amaxes:
// a searched scale (quant/scale_search.h). Codes are e2m1(W / fl32(f32(scale) * weight_scale_2))
// as above; a value beyond 6 times its block's scale saturates to ±6.
Nvfp4Weight nvfp4_quantize_with_scales(const Tensor& weight, float weight_amax,
                                       std::span<const uint8_t> block_scales,
                                       std::string_view name);

// Inverse mapping to an F32 tensor of the original shape (the block size follows from the
// shapes).
Tensor nvfp4_dequantize(const Nvfp4Weight& q);

// ---- activations: what a W4A4 server computes on (strata compare's simulation) --------------
// NVFP4 fake quantization of x[rows, cols] in place (cols % 16 == 0): a dynamic E4M3 scale per
// block of 16 consecutive values of a row under the static global scale s (the export's
// input_scale; for an NVFP4 KV cache, k/v scale · 448 / 2688), as ModelOpt's NVFP4 fake
// quantizer computes it (kernels/quantization/common/nvfp4_quant.py, fp8_quantize_scale and
// fp4_round_magnitude), every step an IEEE fp32 operation:
//   a_b = max |x| over the block
//   d_b = f32(e4m3(min(a_b / fl32(6 * s), 448))) * s       e4m3 round to nearest even
//   d_b = 1 when d_b < 1e-5 (or NaN): a block whose scale underflows
//   x   = sign(x) * m(|x| / d_b) * d_b                    m: the nearest of {0, 0.5, 1, 1.5, 2,
//                                                          3, 4, 6}, ties to even, > 5 gives 6
// A server (vLLM's scaled_fp4_quant, TensorRT-LLM) computes the same block scale and codes; it
// multiplies by reciprocals where this divides, which can move a value that sits exactly on a
// rounding boundary by one code. Throws strata::Error naming `name` when cols % 16 != 0 or s is
// not a positive finite number.
void nvfp4_fake_quantize(float* x, int64_t rows, int64_t cols, float global_scale,
                         std::string_view name);

namespace quant_detail {
Nvfp4Weight nvfp4_quantize_with(Encoders encoders, const Tensor& weight, float weight_amax,
                                std::string_view name, int64_t block = kNvfp4BlockSize,
                                std::span<const uint8_t> block_scales = {});
}  // namespace quant_detail

}  // namespace strata
