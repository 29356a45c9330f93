// Device-side conversions between fp32 and the 8-bit float codes, shared by the CUDA kernels that
// encode (quant/cuda), decode (ops/cuda/convert) and fake-quantize (ops/cuda/fake_quant). Each is
// bit-identical to its host reference named below (tested against it by the kernels' GPU tests).
#pragma once

#include <cstdint>

namespace strata::cuda_fp {

__device__ __forceinline__ bool is_nan(float x) {
  return (__float_as_uint(x) & 0x7FFFFFFFu) > 0x7F800000u;
}
__device__ __forceinline__ bool is_finite(float x) {
  return (__float_as_uint(x) & 0x7F800000u) != 0x7F800000u;
}

// quant_detail::fast_f32_to_e4m3: nearest, ties to even; no saturation (|x| >= 464, infinities
// and NaN give 0x7E / 0x7F with x's sign), so callers clamp first where they must.
__device__ __forceinline__ uint8_t to_e4m3(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x43E80000u) return sign | (a == 0x43E80000u ? 0x7E : 0x7F);
  if (a < 0x3C800000u) {  // subnormal codes: m/8 * 2^-6, m = round(|x| * 2^9)
    const float q = __fmul_rn(__uint_as_float(a), 512.0f);
    const float r = __fsub_rn(__fadd_rn(q, 8388608.0f), 8388608.0f);
    return sign | static_cast<uint8_t>(r);
  }
  const uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
  return sign | static_cast<uint8_t>((rounded >> 20) - ((127 - 7) << 3));
}

// core/dtype.h e4m3_to_f32: S.EEEE.MMM, bias 7, subnormals below E = 0, S.1111.111 NaN; exact.
__device__ __forceinline__ float from_e4m3(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  float v;
  if (e == 0xFu && m == 7u) {
    v = __uint_as_float(0x7FC00000u);
  } else if (e == 0) {
    v = __fmul_rn(static_cast<float>(m), 0x1p-9f);  // m/8 * 2^-6
  } else {
    v = __uint_as_float(((e + 120u) << 23) | (m << 20));  // 2^(e-7) * (1 + m/8)
  }
  return (b & 0x80u) ? -v : v;
}

// core/dtype.h e2m1_to_f32: S.EE.M, code in [0, 16): 0, 0.5, 1, 1.5, 2, 3, 4, 6 with the sign of
// bit 3, from the code's bits (no table in local memory); exact.
__device__ __forceinline__ float from_e2m1(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const float v = e == 0 ? 0.5f * static_cast<float>(m)
                         : __uint_as_float(((e + 126u) << 23) | (m << 22));  // 2^(e-1)·(1 + m/2)
  return (code & 8u) ? -v : v;
}

// ceil(log2(d)) for a positive finite fp32 d, exactly, from its bits (quant/mxfp8.cpp).
__device__ __forceinline__ int ceil_log2(float d) {
  const uint32_t u = __float_as_uint(d);
  const int exponent_field = static_cast<int>(u >> 23);
  const uint32_t mantissa = u & 0x7FFFFFu;
  if (exponent_field == 0) {
    const int floor_log2 = (31 - __clz(static_cast<int>(mantissa))) - 149;
    return floor_log2 + ((mantissa & (mantissa - 1)) == 0 ? 0 : 1);
  }
  return exponent_field - 127 + (mantissa != 0 ? 1 : 0);
}

}  // namespace strata::cuda_fp
