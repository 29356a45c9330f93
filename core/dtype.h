// Element types and their exact scalar conversions.
//
// Byte layouts (little-endian everywhere, as safetensors stores them):
//   BF16      1 sign, 8 exponent (bias 127), 7 mantissa; the upper half of an fp32.
//   F16       IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa.
//   F8_E4M3   "e4m3fn": 1 sign, 4 exponent (bias 7), 3 mantissa. No infinities; S.1111.111 is NaN.
//             Largest finite 448 (0x7E). Smallest subnormal 2^-9 (0x01).
//   F8_E5M2   1 sign, 5 exponent (bias 15), 2 mantissa; IEEE-like with inf (0x7C) and NaN.
//   F8_E8M0   "e8m0fnu": 8 exponent bits, no sign, no mantissa: value 2^(e-127); 0xFF is NaN.
//   E2M1      "fp4": 1 sign, 2 exponent (bias 1), 1 mantissa; magnitudes {0,.5,1,1.5,2,3,4,6}
//             are codes 0..7, bit 3 is the sign. Two per byte: element 2j in the low nibble of
//             byte j, element 2j+1 in the high nibble. safetensors calls it "F4".
//
// Conversions from fp32 round to nearest, ties to even, and treat NaN, infinity and overflow
// the way PyTorch's casts do (../shared/spec/format.md):
//   to BF16 / F16: overflow gives inf; NaN stays NaN.
//   to F8_E4M3:    no saturation: anything that rounds above 448 (|x| > 464), inf and NaN
//                  become NaN (0x7F with the input's sign bit). Clamp first if you want 448.
//   to F8_E5M2:    overflow (|x| >= 61440) gives inf; NaN gives 0x7F with the sign bit.
//   to F8_E8M0:    rounds the exponent using the fp32 mantissa bits (PyTorch's rule: up when
//                  the mantissa is >= 0.5 of the way, ties up only for normal inputs), ignores
//                  the sign; NaN and inf give 0xFF.
//   to E2M1:       saturates: |x| > 5 gives 6; inf and NaN give code 7; the sign bit is x < 0,
//                  so a negative value that rounds to zero is 0x8 (NVFP4, format.md §1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kE2M1,  // two elements per byte
};

inline constexpr int kNumDTypes = static_cast<int>(DType::kE2M1) + 1;

// Bits one element occupies (4 for E2M1).
int dtype_bits(DType dtype);
// Short lower-case name for messages: "bf16", "f8_e4m3", "e2m1", ...
std::string_view dtype_name(DType dtype);
// Name in a safetensors header: "BF16", "F8_E4M3", "F4", ...
std::string_view dtype_safetensors_name(DType dtype);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
bool dtype_is_floating(DType dtype);
// Bytes for numel elements; throws strata::Error when E2M1 gets an odd count.
size_t dtype_bytes(DType dtype, int64_t numel);

// ---- scalar conversions (the reference; fast paths are tested against these) ----

float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);
// f32_to_bf16 by bit arithmetic (round to nearest even on the bits; NaN gives 0x7FC0): the same
// result for every input, several times faster. f32_to_bf16 is its reference (tests/core).
inline uint16_t f32_to_bf16_fast(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);  // (CUDA sources include this header as C++17: no std::bit_cast)
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float x);
float e4m3_to_f32(uint8_t bits);
uint8_t f32_to_e4m3(float x);
float e5m2_to_f32(uint8_t bits);
uint8_t f32_to_e5m2(float x);
float e8m0_to_f32(uint8_t bits);
uint8_t f32_to_e8m0(float x);
float e2m1_to_f32(uint8_t code);  // code in [0, 16)
uint8_t f32_to_e2m1(float x);     // returns a code in [0, 16)

// Reads element i of a buffer of the given dtype as fp32 (integers and bool convert by value,
// F64 rounds to nearest).
float load_f32(DType dtype, const void* data, int64_t i);

}  // namespace strata
