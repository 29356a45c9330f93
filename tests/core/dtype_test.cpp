// Conversions checked against hand-worked values from the format definitions, and exhaustively
// against the definition of round-to-nearest-even: every code decodes to a value that encodes
// back to itself, every midpoint between neighbours goes to the neighbour with an even code, and
// anything off the midpoint goes to the nearer one.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace strata {
namespace {

TEST(DType, NamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    auto back = dtype_from_safetensors_name(dtype_safetensors_name(d));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, d);
  }
  EXPECT_FALSE(dtype_from_safetensors_name("F8_E4M3FN").has_value());
  EXPECT_FALSE(dtype_from_safetensors_name("bf16").has_value());
  EXPECT_EQ(dtype_bytes(DType::kE2M1, 32), 16u);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 3), 6u);
  EXPECT_THROW(dtype_bytes(DType::kE2M1, 3), Error);
}

TEST(DType, E4M3HandWorked) {
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);    // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);  // largest finite
  EXPECT_EQ(f32_to_e4m3(-448.0f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // tie between 448 (even) and 480 (NaN slot)
  EXPECT_EQ(f32_to_e4m3(464.5f), 0x7F);  // rounds past 448: NaN, no saturation
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7F);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFF);
  EXPECT_EQ(f32_to_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e4m3(0x1p-9f), 0x01);     // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);    // half of it: tie to even (0)
  EXPECT_EQ(f32_to_e4m3(0x1.8p-10f), 0x01);  // 0.75 of it rounds up
  EXPECT_EQ(f32_to_e4m3(0x1.8p-9f), 0x02);   // 1.5 quanta: tie, 2 is even
  EXPECT_EQ(f32_to_e4m3(0x1p-6f), 0x08);     // smallest normal
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);     // 1 + 1/16: tie between 1 and 1.125 -> 1
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);     // 1 + 3/16: tie between 1.125 and 1.25 -> 1.25
  EXPECT_FLOAT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_FLOAT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_FALSE(std::isnan(e4m3_to_f32(0x78)));  // 256, exponent field 15 is still finite
  EXPECT_FLOAT_EQ(e4m3_to_f32(0x78), 256.0f);
}

TEST(DType, E5M2HandWorked) {
  EXPECT_EQ(f32_to_e5m2(1.0f), 0x3C);
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7C);  // tie rounds to the even code, which is inf
  EXPECT_EQ(f32_to_e5m2(INFINITY), 0x7C);
  EXPECT_EQ(f32_to_e5m2(-INFINITY), 0xFC);
  EXPECT_EQ(f32_to_e5m2(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e5m2(0x1p-16f), 0x01);
  EXPECT_TRUE(std::isinf(e5m2_to_f32(0x7C)));
  EXPECT_TRUE(std::isnan(e5m2_to_f32(0x7D)));
}

TEST(DType, E8M0HandWorked) {
  EXPECT_EQ(f32_to_e8m0(1.0f), 127);
  EXPECT_EQ(f32_to_e8m0(2.0f), 128);
  EXPECT_EQ(f32_to_e8m0(1.4f), 127);
  EXPECT_EQ(f32_to_e8m0(1.5f), 128);  // mantissa exactly half, normal input: up
  EXPECT_EQ(f32_to_e8m0(1.75f), 128);
  EXPECT_EQ(f32_to_e8m0(0.25f), 125);
  EXPECT_EQ(f32_to_e8m0(-4.0f), 129);  // sign ignored
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(INFINITY), 0xFF);
  EXPECT_EQ(f32_to_e8m0(NAN), 0xFF);
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(0x00400000u)), 0);  // subnormal half: tie stays
  EXPECT_EQ(f32_to_e8m0(std::bit_cast<float>(0x00600000u)), 1);
  EXPECT_EQ(f32_to_e8m0(0x1.8p127f), 0xFF);  // rounds past 2^127
  EXPECT_FLOAT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(std::bit_cast<uint32_t>(e8m0_to_f32(0)), 0x00400000u);  // 2^-127
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
}

TEST(DType, E2M1HandWorked) {
  // The table of format.md §1.
  const float in[] = {0.0f, 0.25f, 0.26f, 0.5f, 0.75f, 1.0f, 1.25f, 1.3f,  1.5f, 1.75f,
                      2.0f, 2.5f,  2.6f,  3.0f, 3.5f,  4.0f, 5.0f,  5.01f, 6.0f, 7.0f};
  const uint8_t want[] = {0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7, 7, 7};
  for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); ++i) {
    EXPECT_EQ(f32_to_e2m1(in[i]), want[i]) << in[i];
    EXPECT_EQ(f32_to_e2m1(-in[i]), in[i] > 0.0f ? (want[i] | 0x8) : 0) << -in[i];
  }
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0x8);  // negative that rounds to zero keeps the sign
  EXPECT_EQ(f32_to_e2m1(-0.0f), 0x0);  // sign bit is x < 0
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xF);
  EXPECT_EQ(f32_to_e2m1(NAN), 0x7);
  EXPECT_FLOAT_EQ(e2m1_to_f32(0xF), -6.0f);
  EXPECT_FLOAT_EQ(e2m1_to_f32(0x5), 3.0f);
}

TEST(DType, Bf16AndF16HandWorked) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F7FFFFFu)), 0x7F80);  // overflows to inf
  EXPECT_EQ(f32_to_bf16(NAN), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie to even is inf
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_FLOAT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_FLOAT_EQ(bf16_to_f32(0xC040), -3.0f);
}

// Exhaustive RNE check for an 8-bit format given its decode and encode.
void check_rne_exhaustive(const char* name, int codes, const std::function<float(uint8_t)>& decode,
                          const std::function<uint8_t(float)>& encode) {
  // Non-negative finite codes in increasing order of value.
  std::vector<std::pair<float, uint8_t>> values;
  for (int c = 0; c < codes; ++c) {
    float v = decode(static_cast<uint8_t>(c));
    if (std::isfinite(v) && !std::signbit(v)) values.push_back({v, static_cast<uint8_t>(c)});
  }
  std::sort(values.begin(), values.end());
  for (auto [v, c] : values)
    ASSERT_EQ(encode(v), c) << name << " value " << v;
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    auto [lo, clo] = values[i];
    auto [hi, chi] = values[i + 1];
    float mid = (lo + hi) / 2;  // exact: neighbours differ by one quantum
    uint8_t even = (clo % 2 == 0) ? clo : chi;
    EXPECT_EQ(encode(mid), even) << name << " midpoint " << mid;
    EXPECT_EQ(encode(std::nextafter(mid, lo)), clo) << name << " below " << mid;
    EXPECT_EQ(encode(std::nextafter(mid, hi)), chi) << name << " above " << mid;
  }
}

TEST(DType, E4M3ExhaustiveRne) {
  check_rne_exhaustive("e4m3", 256, e4m3_to_f32, f32_to_e4m3);
}
TEST(DType, E5M2ExhaustiveRne) {
  check_rne_exhaustive("e5m2", 256, e5m2_to_f32, f32_to_e5m2);
}
TEST(DType, E2M1ExhaustiveRne) {
  check_rne_exhaustive("e2m1", 16, e2m1_to_f32, f32_to_e2m1);
}

TEST(DType, Bf16MatchesTruncationArithmetic) {
  // Independent formulation for bf16: add 0x7FFF plus the lowest kept bit, then truncate.
  uint32_t state = 12345;
  for (int i = 0; i < 200000; ++i) {
    state = state * 1664525u + 1013904223u;
    float x = std::bit_cast<float>(state);
    if (std::isnan(x)) continue;
    uint32_t u = std::bit_cast<uint32_t>(x);
    uint32_t rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16;
    ASSERT_EQ(f32_to_bf16(x), static_cast<uint16_t>(rounded)) << std::hex << u;
  }
}

// The fast bf16 encoder against the reference: every sign, exponent and top-7 mantissa
// combination (all 2^16 bf16 codes) with the low 16 bits at and around the rounding boundary,
// plus a million random patterns (NaNs among them).
TEST(DType, Bf16FastMatchesReference) {
  int64_t bad = 0;
  auto check = [&](uint32_t u) {
    const float x = std::bit_cast<float>(u);
    if (f32_to_bf16_fast(x) != f32_to_bf16(x) && bad++ < 5)
      ADD_FAILURE() << std::hex << u << ": fast " << f32_to_bf16_fast(x) << ", reference "
                    << f32_to_bf16(x);
  };
  for (uint32_t high = 0; high < (1u << 16); ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      check((high << 16) | low);
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 1000000; ++i)
    check(static_cast<uint32_t>(rng()));
  EXPECT_EQ(bad, 0);
}

TEST(DType, F16RoundTripsEveryCode) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    float v = f16_to_f32(static_cast<uint16_t>(c));
    if (std::isnan(v)) continue;
    ASSERT_EQ(f32_to_f16(v), c) << std::hex << c;
  }
}

TEST(DType, LoadF32) {
  const uint8_t packed[] = {0x2F, 0x9A};  // codes 0xF, 0x2, 0xA, 0x9
  EXPECT_FLOAT_EQ(load_f32(DType::kE2M1, packed, 0), -6.0f);
  EXPECT_FLOAT_EQ(load_f32(DType::kE2M1, packed, 1), 1.0f);
  EXPECT_FLOAT_EQ(load_f32(DType::kE2M1, packed, 2), -1.0f);
  EXPECT_FLOAT_EQ(load_f32(DType::kE2M1, packed, 3), -0.5f);
  const int64_t i64[] = {-3, 1ll << 40};
  EXPECT_FLOAT_EQ(load_f32(DType::kI64, i64, 0), -3.0f);
  EXPECT_FLOAT_EQ(load_f32(DType::kI64, i64, 1), 0x1p40f);
}

}  // namespace
}  // namespace strata
