// FP8 per-tensor (format.md §2) and the FP8 KV-cache scales (§3), as NVIDIA ModelOpt's unified
// Hugging Face export computes them on the GPU.
//
//   weight_scale = fl32(A * fl32(1/448))     A = per-tensor weight amax
//   weight       = e4m3(clamp(round_src(W / round_src(weight_scale)), -448, 448))
//   input_scale  = fl32(amax' * fl32(1/448)) amax' = 448 when amax is 0 or NaN (so the scale is
//                                            exactly 1.0), FLT_MAX when +inf, FLT_MIN when below
//   k/v scale    = fl32(amax * fl32(1/448))  refused when amax is 0 or not finite
// round_src rounds to the weight's own dtype (bf16, f16; nothing for f32), round to nearest even.
//
// Where each rule comes from (ModelOpt export/unified_export_hf.py, export/quant_utils.py):
// - weight_scale: a per-tensor max-calibrated amax is a 0-d CUDA tensor, and the export divides
//   it by the Python float 448.0. PyTorch evaluates "CUDA tensor / Python number" as a product
//   with the fp32 reciprocal (the rule of format.md §1), not as a true division. (ModelOpt's
//   other branch, for a 1-d amax, divides in Python double and would give fl32(A/448).)
// - weight: the export computes `W.to(dtype) / weight_scale` with the scale a 0-d fp32 tensor on
//   the weight's device. Type promotion keeps the weight's dtype (a 0-d operand does not promote
//   a dimensioned one), and the CUDA kernel loads every operand in that dtype: the scale is
//   rounded to bf16 (f16) before the division, the fp32 quotient is rounded to bf16 (f16), and
//   that value is cast to float8_e4m3fn. format.md §2 states the quotient's bf16 rounding
//   but not the divisor's.
// - PyTorch's cast to float8_e4m3fn does not saturate: 464 rounds to 448 (tie to even), anything
//   larger becomes NaN. ModelOpt does not clamp. Clamping to ±448 first gives the same byte for
//   every quotient up to 464, which covers every valid input (A >= max|W| keeps |W/scale| within
//   about 448 * (1 + 2^-8)); it differs only where ModelOpt would write NaN.
// - input_scale: TensorQuantizer.export_amax replaces an amax of 0 or NaN by maxbound (448) and
//   clamps to [FLT_MIN, FLT_MAX]; the scale is then that amax over 448.0 on the GPU.
// - k/v scales: the raw observer amax over 448 on the GPU (no substitution: ModelOpt would write
//   0 for an amax of 0, which makes vLLM divide by zero, so strata refuses instead).
#pragma once

#include <string_view>

#include "core/tensor.h"
#include "quant/encode.h"

namespace strata {

// fl32(1/448) = 0x1.24924ap-9, the reciprocal PyTorch's CUDA division by 448.0 multiplies with
// (ModelOpt's scales are amax / 448.0 on a CUDA tensor: a product by this constant).
inline constexpr float kInv448 = 1.0f / 448.0f;

// One FP8-quantized weight W[..., out, in]:
//   weight  F8_E4M3  [..., out, in]  same layout as W, one byte per element
//   scale   F32      []              weight_scale
// Dequantization: W ~= f32(weight) * scale.
struct Fp8Weight {
  Tensor weight;
  Tensor scale;
};

// weight_scale for a per-tensor weight amax A: fl32(A * fl32(1/448)).
float fp8_weight_scale(float weight_amax);

// input_scale for an activation amax, with ModelOpt's substitutions (header comment). Never
// fails: an amax of 0 or NaN gives 1.0.
float fp8_input_scale(float activation_amax);

// k_scale / v_scale for a KV-cache observer amax (format.md §3). Throws strata::Error naming
// `name` when the amax is 0, negative or not finite.
float fp8_kv_cache_scale(float amax, std::string_view name);

// Quantizes a BF16/F16/F32 weight (any shape with at least one dimension) with per-tensor amax
// `weight_amax` (>= max|W|). Throws strata::Error naming `name` for another dtype, a non-finite
// element, or an amax that is not a positive finite number at least max|W|.
Fp8Weight fp8_quantize(const Tensor& weight, float weight_amax, std::string_view name);

// As fp8_quantize, for an amax that may be below max|W| (a searched amax, quant/scale_search.h):
// elements beyond it saturate to ±448 (ModelOpt's export would cast them to NaN, see above).
Fp8Weight fp8_quantize_clipped(const Tensor& weight, float weight_amax, std::string_view name);

// Inverse mapping to an F32 tensor of the original shape.
Tensor fp8_dequantize(const Fp8Weight& q);

// ---- activations: what an FP8 server computes on (strata compare's simulation) ---------------
// FP8 per-tensor static fake quantization of x[n] in place with scale s (the export's
// input_scale, or a KV cache's k_scale / v_scale; 1.0 for a cast KV cache without scales):
//   x = f32(e4m3(clamp(x / s, -448, 448))) * s             e4m3 round to nearest even
// as ModelOpt's FP8 fake quantizer (tensor_quant.py, _fp8_eager: clamp, cast, scale back) and a
// server's static FP8 quantization (vLLM's scaled_fp8_quant, its FP8 KV cache: a saturating
// cast) compute it, with a true fp32 division where those multiply by a reciprocal (which can move
// a value that sits exactly on a rounding boundary by one step). NaN stays NaN. Throws
// strata::Error naming `name` when s is not a positive finite number.
void fp8_fake_quantize(float* x, int64_t n, float scale, std::string_view name);

// ---- FP8 per 128x128 block, weight-only (ModelOpt 0.47's fp8_pb_wo)
// ------------------------------ What ModelOpt 0.47's unified HF export writes for an E4M3 weight
// quantizer with block_sizes
// {-1: 128, -2: 128} (its Kimi-K3 recipe's attention; hf_ptq's fake-quant path names the format
// fp8_pb_wo, quant_algo "fp8_pb_wo" in lower case, no group_size, no input scale). For W[out, in],
// blocks of 128 rows x 128 columns, the last row/column block partial when out or in is not a
// multiple of 128 (ModelOpt pads with zeros, which changes no block max):
//   a[R, C]     = max |W| over block (R, C)                      R < ceil(out/128), C <
//   ceil(in/128) a'          = 448 where a == 0 (TensorQuantizer.export_amax: an all-zero block
//   gets scale 1),
//                 clamped to [FLT_MIN, FLT_MAX]
//   scale[R, C] = fl32(a' * fl32(1/448))                         as fp8_weight_scale (GPU rule)
//   weight[r,c] = e4m3(clamp(fl32(f32(W[r,c]) / scale[r/128, c/128]), -448, 448))
// The quotient is an fp32 true division: FP8QTensor.quantize divides the weight by the scales
// expanded to a full fp32 tensor (tensor / tensor, which promotes to fp32 and divides on CPU and
// GPU alike; no rounding to the weight's dtype, unlike per-tensor FP8). ModelOpt on a CPU divides
// the scale truly (fl32(a'/448)), one ulp off the GPU's product for some blocks.
// Tensors: weight F8_E4M3 [out, in]; weight_scale F32 [ceil(out/128), 1, ceil(in/128), 1] (the
// block-reduced amax as ModelOpt keeps it, dimensions of 1 included), or [] (0-d) when the weight
// is a single block. Dequantization: W ~= f32(weight[r, c]) * scale[r/128, c/128].
inline constexpr int64_t kFp8PbBlock = 128;

// Fused groups: ModelOpt's export unifies the weight amax of the modules reading one input
// (q/k/v, gate/up, MLA q_a/kv_a: _fuse_shared_input_modules -> preprocess_linear_fusion) for
// fp8_pb_wo as for per-tensor formats, but only where the amax has one element: a group of
// single-block weights shares the group's max (one scale), multi-block weights keep their own.
//
// The encoding above (Fp8Weight::scale holds the block scales). `group_amax` > 0 replaces a single
// block's a (the caller's group max, at least max|W|); 0 uses the weight's own; a multi-block
// weight must be given 0. Throws strata::Error naming `name` for a dtype other than bf16/f16/f32,
// a weight that is not 2-D, a non-finite element, or a group_amax below max|W|.
Fp8Weight fp8_pb_quantize(const Tensor& weight, std::string_view name, float group_amax = 0.0f);
// Whether a weight [out, in] is one 128x128 block (its fp8_pb_wo scale is 0-d).
bool fp8_pb_single_block(const Shape& shape);
// Inverse mapping to an F32 [out, in] tensor; the scale [] or [ceil(out/128), 1, ceil(in/128), 1].
Tensor fp8_pb_dequantize(const Fp8Weight& q);

namespace quant_detail {
Fp8Weight fp8_quantize_with(Encoders encoders, const Tensor& weight, float weight_amax,
                            std::string_view name, bool clip = false);
}  // namespace quant_detail

}  // namespace strata
