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
#pragma once

#include <optional>

#include "core/tensor.h"
#include "quant/nvfp4.h"

namespace strata {

// The largest scale byte over 32-blocks holding a non-zero code; -1 when every code is zero.
// blocks U8 [out, in/32, 16], scales U8 [out, in/32].
int mxfp4_max_scale(const Tensor& blocks, const Tensor& scales);

// The exact NVFP4 encoding above for a group whose largest scale byte is `group_max` (at least
// this weight's own); std::nullopt when it does not exist (a span beyond 17 binades, an E8M0 NaN
// 0xFF, or group_max < 0).
std::optional<Nvfp4Weight> mxfp4_to_nvfp4_exact(const Tensor& blocks, const Tensor& scales,
                                                int group_max);

}  // namespace strata
