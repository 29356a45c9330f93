#include "core/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace strata {

namespace {

struct DTypeInfo {
  std::string_view name;
  std::string_view st_name;
  int bits;
  bool floating;
};

// Indexed by DType.
constexpr DTypeInfo kInfo[kNumDTypes] = {
    {"bool", "BOOL", 8, false},     {"u8", "U8", 8, false},         {"i8", "I8", 8, false},
    {"u16", "U16", 16, false},      {"i16", "I16", 16, false},      {"u32", "U32", 32, false},
    {"i32", "I32", 32, false},      {"u64", "U64", 64, false},      {"i64", "I64", 64, false},
    {"f16", "F16", 16, true},       {"bf16", "BF16", 16, true},     {"f32", "F32", 32, true},
    {"f64", "F64", 64, true},       {"f8_e4m3", "F8_E4M3", 8, true}, {"f8_e5m2", "F8_E5M2", 8, true},
    {"f8_e8m0", "F8_E8M0", 8, true}, {"e2m1", "F4", 4, true},
};

const DTypeInfo& info(DType dtype) {
  int i = static_cast<int>(dtype);
  STRATA_ASSERT(i >= 0 && i < kNumDTypes);
  return kInfo[i];
}

// A binary floating-point format narrower than fp32, described by its fields. Rounding from
// fp32 is done in double, where every fp32 value and every quotient by a power of two is exact,
// so std::nearbyint (ties to even in the default rounding mode) gives the exact RNE result.
struct MiniFloat {
  int exp_bits;
  int man_bits;
  int bias;
  double max_finite;
};

constexpr MiniFloat kBF16{8, 7, 127, 0x1.FEp127};
constexpr MiniFloat kF16{5, 10, 15, 65504.0};
constexpr MiniFloat kE4M3{4, 3, 7, 448.0};
constexpr MiniFloat kE5M2{5, 2, 15, 57344.0};
constexpr MiniFloat kE2M1{2, 1, 1, 6.0};

// Rounds |x| (finite) to the format with ties to even. Returns the rounded magnitude; the
// caller decides what an overflow (result > max_finite) means.
double round_magnitude(const MiniFloat& f, double ax) {
  if (ax == 0.0) return 0.0;
  const int emin = 1 - f.bias;  // exponent of the smallest normal
  int e;
  std::frexp(ax, &e);  // ax = m * 2^e with m in [0.5, 1): floor(log2(ax)) = e - 1
  int exponent = std::max(e - 1, emin);
  double quantum = std::ldexp(1.0, exponent - f.man_bits);
  return std::nearbyint(ax / quantum) * quantum;
}

// Encodes a finite, representable magnitude into exponent and mantissa fields.
uint32_t encode_magnitude(const MiniFloat& f, double v) {
  if (v == 0.0) return 0;
  const int emin = 1 - f.bias;
  const double min_normal = std::ldexp(1.0, emin);
  if (v < min_normal) {  // subnormal: exponent field 0, mantissa counts quanta of 2^(emin-m)
    return static_cast<uint32_t>(std::ldexp(v, f.man_bits - emin));
  }
  int e;
  double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  uint32_t exponent_field = static_cast<uint32_t>(e - 1 + f.bias);
  uint32_t mantissa = static_cast<uint32_t>(std::ldexp(m * 2.0 - 1.0, f.man_bits));
  return (exponent_field << f.man_bits) | mantissa;
}

double decode_fields(const MiniFloat& f, uint32_t exponent_field, uint32_t mantissa) {
  if (exponent_field == 0) return std::ldexp(static_cast<double>(mantissa), 1 - f.bias - f.man_bits);
  return std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -f.man_bits),
                    static_cast<int>(exponent_field) - f.bias);
}

}  // namespace

int dtype_bits(DType dtype) { return info(dtype).bits; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }
std::string_view dtype_safetensors_name(DType dtype) { return info(dtype).st_name; }
bool dtype_is_floating(DType dtype) { return info(dtype).floating; }

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kInfo[i].st_name == name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

size_t dtype_bytes(DType dtype, int64_t numel) {
  STRATA_ASSERT(numel >= 0);
  const int bits = dtype_bits(dtype);
  if (bits == 4) {
    STRATA_CHECK(numel % 2 == 0, "a ", dtype_name(dtype), " tensor needs an even element count (two per byte), got ",
                 numel);
    return static_cast<size_t>(numel / 2);
  }
  return static_cast<size_t>(numel) * static_cast<size_t>(bits / 8);
}

// ---- bf16 ----

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float x) {
  if (std::isnan(x)) return 0x7FC0;  // PyTorch returns the canonical quiet NaN
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double v = std::isinf(x) ? INFINITY : round_magnitude(kBF16, std::fabs(static_cast<double>(x)));
  if (v > kBF16.max_finite) return sign | 0x7F80;
  return sign | static_cast<uint16_t>(encode_magnitude(kBF16, v));
}

// ---- f16 ----

float f16_to_f32(uint16_t bits) {
  const uint32_t e = (bits >> 10) & 0x1F, m = bits & 0x3FF;
  const float sign = (bits & 0x8000) ? -1.0f : 1.0f;
  if (e == 0x1F) return m == 0 ? sign * INFINITY : std::copysign(NAN, sign);
  return sign * static_cast<float>(decode_fields(kF16, e, m));
}

uint16_t f32_to_f16(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7E00;
  double v = std::isinf(x) ? INFINITY : round_magnitude(kF16, std::fabs(static_cast<double>(x)));
  if (v > kF16.max_finite) return sign | 0x7C00;
  return sign | static_cast<uint16_t>(encode_magnitude(kF16, v));
}

// ---- f8 e4m3fn ----

float e4m3_to_f32(uint8_t bits) {
  const uint32_t e = (bits >> 3) & 0xF, m = bits & 0x7;
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (e == 0xF && m == 0x7) return std::copysign(NAN, sign);
  return sign * static_cast<float>(decode_fields(kE4M3, e, m));
}

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (!std::isfinite(x)) return sign | 0x7F;
  double v = round_magnitude(kE4M3, std::fabs(static_cast<double>(x)));
  if (v > kE4M3.max_finite) return sign | 0x7F;  // no saturation: NaN, as PyTorch
  return sign | static_cast<uint8_t>(encode_magnitude(kE4M3, v));
}

// ---- f8 e5m2 ----

float e5m2_to_f32(uint8_t bits) {
  const uint32_t e = (bits >> 2) & 0x1F, m = bits & 0x3;
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (e == 0x1F) return m == 0 ? sign * INFINITY : std::copysign(NAN, sign);
  return sign * static_cast<float>(decode_fields(kE5M2, e, m));
}

uint8_t f32_to_e5m2(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  double v = std::isinf(x) ? INFINITY : round_magnitude(kE5M2, std::fabs(static_cast<double>(x)));
  if (v > kE5M2.max_finite) return sign | 0x7C;
  return sign | static_cast<uint8_t>(encode_magnitude(kE5M2, v));
}

// ---- f8 e8m0fnu ----

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);  // 0 gives 2^-127, a subnormal fp32
}

uint8_t f32_to_e8m0(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t exponent = (u >> 23) & 0xFF;
  if (exponent == 0xFF) return 0xFF;
  // The value 2^(exponent-127) * (1.m) is rounded to a power of two by looking at the mantissa
  // as a fraction f of the way to the next power: f > 0.5 rounds up; f == 0.5 is a tie broken
  // toward the even candidate, which for e8m0 is "up" when the implicit bit is 1 (normal input).
  const uint32_t mantissa = u & 0x7FFFFF;
  const uint32_t half = 0x400000;
  const bool normal = exponent != 0;
  bool up = mantissa > half || (mantissa == half && normal);
  return static_cast<uint8_t>(exponent + (up ? 1 : 0));
}

// ---- e2m1 ----

float e2m1_to_f32(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  STRATA_DEBUG_ASSERT(code < 16);
  const float m = kMagnitude[code & 0x7];
  return (code & 0x8) ? -m : m;
}

uint8_t f32_to_e2m1(float x) {
  const uint8_t sign = x < 0.0f ? 0x8 : 0;
  if (!std::isfinite(x)) return sign | 0x7;
  double v = round_magnitude(kE2M1, std::fabs(static_cast<double>(x)));
  if (v > kE2M1.max_finite) v = kE2M1.max_finite;  // saturate
  return sign | static_cast<uint8_t>(encode_magnitude(kE2M1, v));
}

// ---- generic load ----

float load_f32(DType dtype, const void* data, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(data);
  auto read = [&](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, p + static_cast<size_t>(i) * sizeof(v), sizeof(v));
    return v;
  };
  switch (dtype) {
    case DType::kBool: return p[i] ? 1.0f : 0.0f;
    case DType::kU8: return static_cast<float>(p[i]);
    case DType::kI8: return static_cast<float>(static_cast<int8_t>(p[i]));
    case DType::kU16: return static_cast<float>(read(uint16_t{}));
    case DType::kI16: return static_cast<float>(read(int16_t{}));
    case DType::kU32: return static_cast<float>(read(uint32_t{}));
    case DType::kI32: return static_cast<float>(read(int32_t{}));
    case DType::kU64: return static_cast<float>(read(uint64_t{}));
    case DType::kI64: return static_cast<float>(read(int64_t{}));
    case DType::kF16: return f16_to_f32(read(uint16_t{}));
    case DType::kBF16: return bf16_to_f32(read(uint16_t{}));
    case DType::kF32: return read(float{});
    case DType::kF64: return static_cast<float>(read(double{}));
    case DType::kF8E4M3: return e4m3_to_f32(p[i]);
    case DType::kF8E5M2: return e5m2_to_f32(p[i]);
    case DType::kF8E8M0: return e8m0_to_f32(p[i]);
    case DType::kE2M1: {
      const uint8_t byte = p[i / 2];
      return e2m1_to_f32((i % 2 == 0) ? (byte & 0xF) : (byte >> 4));
    }
  }
  STRATA_ASSERT(false, "unhandled dtype");
  return 0.0f;
}

}  // namespace strata
