// MXFP4 sources (gpt-oss style, io/source_weights.h kMxfp4) converted to NVFP4 in closed form.
//
// An MXFP4 weight stores E2M1 codes with one E8M0 scale 2^(e-127) per 32 inputs; NVFP4
// (format.md §1) stores the same E2M1 codes with one E4M3 scale per 16 inputs times one fp32
// weight_scale_2. With E the largest scale byte of the fused group (format.md §4: one
// weight_scale_2 per group):
//   weight_scale_2       = 2^(E - 135)                    (fp32; = 2^(E-127) / 2^8)
//   weight_scale[r, b16] = e4m3(2^(e - E + 8))            e = the scale byte of the 32-block
//                                                         holding 16-block b16
//   packed               = the MXFP4 block bytes, unchanged (same code, same nibble order)
// Then e2m1(code) * weight_scale * weight_scale_2 = e2m1(code) * 2^(e-127) exactly: the NVFP4
// weight dequantizes to the source's values bit for bit, with no calibration of the weight.
// E4M3 holds the powers of two 2^-9 .. 2^8, so this is exact when every 16-block holding a
// non-zero code has e >= E - 17 (a 16-block of zero codes gets scale 1.0, 0x38, as format.md §1
// writes all-zero blocks). Real MXFP4 checkpoints rarely span more than 17 binades in one fused
// group; when one does, the exporter falls back to quantizing the decompressed bf16 weight.
//
// MXFP4 weights written (mxfp4_mlp_weight_only, weight-only; ModelOpt 0.47's MXFP4QTensor.quantize
// as its exporter calls it), per block of 32 consecutive inputs of a row, from the exact fp32
// values of a bf16/f16/f32 weight:
//   a      = max |W| over the block
//   e      = max(ceil(log2(a / 6)), -127)        (a == 0 gives -127)
//   scale  = e + 127                             U8 (E8M0), [..., out, in/32]
//   x      = W / 2^e                             exact (a power of two)
//   code   = #{t in 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 : |x| > t} | sign
//            (every tie rounds DOWN, to the smaller magnitude: 0.75 -> 0.5, 1.75 -> 1.5,
//            3.5 -> 3, 5 -> 4; not NVFP4's ties-to-even), sign bit 3 = !(x > 0): ModelOpt takes
//            (2 - sign(x)) // 2, so a zero, also +0, is written 0x8
//   packed = code[2j] | code[2j+1] << 4           U8 [..., out, in/2]
// Dequantization: W ~= e2m1(code) * 2^(scale - 127). quant_algo "mxfp4" (hf_quant_config.json,
// no group_size; config.json's quantization_config has no config_groups for it).
#pragma once

#include <optional>
#include <string_view>

#include "core/tensor.h"
#include "quant/nvfp4.h"

namespace strata {

// The largest scale byte over 32-blocks holding a non-zero code; -1 when every code is zero.
// blocks U8 [out, in/32, 16], scales U8 [out, in/32].
inline constexpr int64_t kMxfp4BlockSize = 32;

struct Mxfp4Weight {
  Tensor packed;  // U8 [..., out, in/2]
  Tensor scale;   // U8 [..., out, in/32], E8M0 exponent + 127
};

// The encoding above. Throws strata::Error naming `name` for a dtype other than bf16/f16/f32, an
// input dimension not divisible by 32, or a non-finite element.
Mxfp4Weight mxfp4_quantize(const Tensor& weight, std::string_view name);
// Inverse mapping to an F32 tensor of the weight's shape.
Tensor mxfp4_dequantize(const Mxfp4Weight& q);

int mxfp4_max_scale(const Tensor& blocks, const Tensor& scales);

// The exact NVFP4 encoding above for a group whose largest scale byte is `group_max` (at least
// this weight's own); std::nullopt when it does not exist (a span beyond 17 binades, an E8M0 NaN
// 0xFF, or group_max < 0).
std::optional<Nvfp4Weight> mxfp4_to_nvfp4_exact(const Tensor& blocks, const Tensor& scales,
                                                int group_max);

}  // namespace strata
