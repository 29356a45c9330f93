// Internal building blocks shared by quant/nvfp4, quant/fp8 and quant/mxfp8: input checks, row
// loading, and fast scalar encoders that are bit-identical to the reference conversions in
// core/dtype.h (tests/quant/encode_test.cpp compares them exhaustively on the rounding-relevant
// bit patterns; the full 2^32 sweep is a disabled test run by hand).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/tensor.h"

namespace strata::quant_detail {

// Which scalar encoders a quantizer uses: core/dtype.h's reference conversions or the fast ones
// below. The public entry points use kFast; tests and bench/quant_bench.cpp call the `_with`
// variants declared in each format's header to compare the two.
enum class Encoders { kReference, kFast };

// Throws strata::Error unless `weight` is a non-empty BF16, F16 or F32 tensor with at least one
// dimension whose last dimension is a multiple of `block` (the message names `name` and `format`).
void check_weight(const Tensor& weight, std::string_view name, int64_t block,
                  std::string_view format);

// Decodes `count` elements starting at element `first` of a BF16/F16/F32 tensor into fp32
// (exact: every bf16/f16 value is an fp32 value). Throws strata::Error naming `name` and the
// element index if one is NaN or infinite: no format can give such a weight a finite scale.
void load_finite_f32(const Tensor& weight, int64_t first, int64_t count, float* out,
                     std::string_view name);

// Rounds an fp32 value to `dtype` (BF16, F16 or F32) and back, round to nearest even, as a
// PyTorch cast to that dtype does.
float round_to(DType dtype, float x);

// Same result as f32_to_e4m3 for every input (no saturation: |x| > 464, inf and NaN give 0x7F
// with the sign bit), without the generic double-precision path.
inline uint8_t fast_f32_to_e4m3(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFF;
  if (a >= 0x43E80000) {                            // |x| >= 464 (or inf/NaN)
    return sign | (a == 0x43E80000 ? 0x7E : 0x7F);  // 464 is the tie 448|480: even is 448
  }
  if (a < 0x3C800000) {  // |x| < 2^-6: e4m3 subnormal, quanta of 2^-9
    // |x| * 2^9 is exact; adding and subtracting 2^23 rounds it to an integer, ties to even.
    const float q = std::bit_cast<float>(a) * 512.0f;
    const float r = (q + 8388608.0f) - 8388608.0f;
    return sign | static_cast<uint8_t>(r);  // 0..8; 8 is the smallest normal, code 0x08
  }
  // Normal: keep exponent and the top 3 mantissa bits, round the lower 20 bits to nearest even.
  // A carry out of the mantissa moves into the exponent, which is the right result.
  const uint32_t rounded = a + 0x7FFFF + ((a >> 20) & 1);
  return sign | static_cast<uint8_t>((rounded >> 20) - ((127 - 7) << 3));
}

// Same result as bf16_to_f32(f32_to_bf16(x)) for every finite x and for infinities (NaN is
// not handled: callers pass finite values).
inline float fast_round_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return std::bit_cast<float>((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000u);
}

// Same result as f32_to_e2m1 for every input: saturating, NaN and inf give 7, sign bit is x < 0.
inline uint8_t fast_f32_to_e2m1(float x) {
  const uint8_t sign = x < 0.0f ? 0x8 : 0;
  const float a = std::fabs(x);
  if (!(a <= 5.0f)) return sign | 0x7;  // > 5, inf and NaN
  // Each threshold passed moves one code up; the midpoints 0.25, 1.25, 2.5, 5 round down (to the
  // even neighbour), 0.75, 1.75, 3.5 round up (format.md §1, 5).
  const int code =
      (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f);
  return sign | static_cast<uint8_t>(code);
}

}  // namespace strata::quant_detail
